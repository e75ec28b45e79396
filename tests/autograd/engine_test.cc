// The engine: accumulation, retain_graph, errors, grad(), hooks, extension points
// (custom nodes, starting from (edge, gradient) pairs, gradient sinks), grad mode and
// concurrent backward passes.
#include <atomic>
#include <thread>

#include <gtest/gtest.h>

#include "recording_sink.h"

#include "gradcheck.h"
#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

using autograd::Edge;
using autograd::GraphRoot;

Tensor leaf(std::vector<double> values, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  return tensor<double>(values, shape).set_requires_grad(true);
}

std::vector<double> vec(const Tensor& t) {
  return t.to_vector<double>();
}

TEST(Engine, RequiresGradPropagatesAndLeavesAreLeaves) {
  Tensor a = leaf({1, 2});
  Tensor b = tensor<double>({3, 4});
  EXPECT_TRUE(a.requires_grad());
  EXPECT_TRUE(a.is_leaf());
  EXPECT_FALSE(b.requires_grad());
  Tensor c = a * b;
  EXPECT_TRUE(c.requires_grad());
  EXPECT_FALSE(c.is_leaf());
  ASSERT_NE(c.grad_fn(), nullptr);
  EXPECT_EQ(c.grad_fn()->name(), "MulBackward");
  EXPECT_EQ(a.grad_fn(), nullptr);
  Tensor d = b * 2.0;
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.grad_fn(), nullptr);
}

TEST(Engine, NonDifferentiableOutputsDoNotRequireGrad) {
  Tensor a = leaf({1, 5, 2});
  EXPECT_FALSE(gt(a, 1.0).requires_grad());
  EXPECT_FALSE(argmax(a, 0).requires_grad());
  EXPECT_FALSE(a.to(kInt64).requires_grad());
  auto [values, indices] = max(a, 0);
  EXPECT_TRUE(values.requires_grad());
  EXPECT_FALSE(indices.requires_grad());
  EXPECT_FALSE(one_hot(tensor<int64_t>({0, 1}), 2).requires_grad());
  EXPECT_THROW(tensor<int64_t>({1}).set_requires_grad(true), InvalidArgument);
}

TEST(Engine, DiamondAccumulatesEveryPath) {
  // y = a*a + 3a, through a shared intermediate b = 2a used by two consumers.
  Tensor a = leaf({1.5, -2.0});
  Tensor b = a * 2.0;
  Tensor y = sum(b * b + b * 3.0 + exp(b) * 0.0);
  y.backward();
  // dy/da = (2b + 3) * 2 = 8a + 6
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{18.0, -10.0}));
}

TEST(Engine, LeafGradientsAccumulateAcrossBackwardCalls) {
  Tensor a = leaf({1, 2});
  sum(a * 3.0).backward();
  sum(a * a).backward();
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{5, 7}));
  a.set_grad(Tensor());
  EXPECT_FALSE(a.grad().defined());
}

TEST(Engine, GradIsAPrivateCopy) {
  // The same gradient reaches two leaves; later in-place accumulation into one must not
  // change the other.
  Tensor a = leaf({1, 1}), b = leaf({1, 1});
  (a + b).backward(ones({2}, kFloat64), true);
  a.grad().add_(10.0);
  EXPECT_EQ(vec(b.grad()), (std::vector<double>{1, 1}));
}

TEST(Engine, RetainGraphAllowsASecondPassAndFreedGraphIsAnError) {
  Tensor a = leaf({2});
  Tensor y = sum(a * a);
  y.backward({}, /*retain_graph=*/true);
  y.backward();
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{8}));
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("MulBackward"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("retain_graph"), std::string::npos) << e.what();
  }
}

TEST(Engine, NonScalarRootNeedsAGradient) {
  Tensor a = leaf({1, 2});
  Tensor y = a * 2.0;
  try {
    y.backward();
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("scalar outputs"), std::string::npos) << e.what();
  }
  y.backward(tensor<double>({1, 10}));
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{2, 20}));
  EXPECT_THROW(y.backward(ones({3}, kFloat64)), InvalidArgument);
}

TEST(Engine, RootWithoutGradIsAnError) {
  Tensor a = tensor<double>({1, 2});
  try {
    sum(a).backward();
    FAIL() << "expected an error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("does not require grad"), std::string::npos);
  }
}

TEST(Engine, GradReturnsInputGradientsWithoutTouchingDotGrad) {
  Tensor a = leaf({1, 2}), b = leaf({3, 4});
  Tensor h = a * b;
  Tensor y = sum(h * h);
  auto g = autograd::grad({y}, {a, h}, {}, /*retain_graph=*/true);
  ASSERT_EQ(g.size(), 2u);
  // dy/da = 2 h b = 2 a b^2; dy/dh = 2h.
  EXPECT_EQ(vec(g[0]), (std::vector<double>{18, 64}));
  EXPECT_EQ(vec(g[1]), (std::vector<double>{6, 16}));
  EXPECT_FALSE(a.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_FALSE(g[0].requires_grad());
  // Unused inputs.
  Tensor c = leaf({1});
  EXPECT_THROW(autograd::grad({y}, {c}, {}, true), InvalidArgument);
  auto unused = autograd::grad({y}, {c}, {}, true, /*allow_unused=*/true);
  EXPECT_FALSE(unused[0].defined());
}

TEST(Engine, MultipleRootsWithGradients) {
  Tensor a = leaf({1, 2});
  Tensor y1 = a * 2.0, y2 = a * a;
  autograd::backward({y1, y2}, {tensor<double>({1, 1}), tensor<double>({1, 0.5})});
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{4, 4}));
}

TEST(Engine, TensorHooksCanReplaceGradients) {
  Tensor a = leaf({1, 2});
  Tensor h = a * 3.0;
  std::vector<double> seen;
  h.register_hook([&](const Tensor& g) {
    seen = vec(g);
    return g * 10.0;  // replaces the gradient flowing into h's producer
  });
  uint64_t removed = a.register_hook([](const Tensor& g) { return g * 1000.0; });
  EXPECT_TRUE(a.remove_hook(removed));
  a.register_hook([](const Tensor& g) { return g + 1.0; });  // on the leaf, before .grad
  sum(h * h).backward();
  EXPECT_EQ(seen, (std::vector<double>{6, 12}));              // dL/dh = 2h
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{181, 361}));  // 3 * 10 * 2h + 1
}

TEST(Engine, HookReturningUndefinedKeepsTheGradient) {
  Tensor a = leaf({1, 2});
  int calls = 0;
  a.register_hook([&](const Tensor&) {
    ++calls;
    return Tensor();
  });
  sum(a * 2.0).backward();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{2, 2}));
}

TEST(Engine, RetainGradKeepsNonLeafGradients) {
  Tensor a = leaf({1, 2});
  Tensor h = a * 3.0;
  h.retain_grad();
  EXPECT_TRUE(h.retains_grad());
  sum(h * h).backward();
  EXPECT_EQ(vec(h.grad()), (std::vector<double>{6, 12}));
  Tensor k = a * 2.0;
  sum(k).backward();
  EXPECT_FALSE(k.grad().defined());
}

TEST(Engine, PostAccumulateHooksFireOncePerLeafPerBackward) {
  Tensor w = leaf({1, 2});
  Tensor v = leaf({3});
  std::vector<std::vector<double>> seen;
  int v_calls = 0;
  w.register_post_accumulate_grad_hook([&](const Tensor& p) { seen.push_back(vec(p.grad())); });
  v.register_post_accumulate_grad_hook([&](const Tensor&) { ++v_calls; });
  // w reaches the loss along three paths; its hook still fires once, after the sum.
  Tensor loss = sum(w * 2.0) + sum(w * w) + sum(w * v);
  loss.backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{7, 9}));  // 2 + 2w + v
  EXPECT_EQ(v_calls, 1);
  sum(w).backward();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<double>{8, 10}));
  EXPECT_THROW((w * 2.0).register_post_accumulate_grad_hook([](const Tensor&) {}), InvalidArgument);
}

// A node kind defined outside autograd/: y = 2x forward, with a backward that also
// counts its calls; connected by hand like dist_autograd's send/recv functions.
class TimesTwoBackward : public autograd::Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    ++calls;
    return {grads[0] * 2.0};
  }
  std::string name() const override { return "TimesTwoBackward"; }
  int calls = 0;
};

TEST(Engine, CustomNodeDefinedOutsideAutograd) {
  Tensor x = leaf({1, 2, 3});
  Tensor y;
  {
    BelowAutogradGuard raw;  // the forward without recording
    y = x * 2.0;
  }
  auto node = std::make_shared<TimesTwoBackward>();
  node->set_next_edges(autograd::collect_next_edges({x}));
  autograd::set_history(y, node);
  EXPECT_EQ(y.grad_fn(), node);
  sum(y * y).backward();
  EXPECT_EQ(node->calls, 1);
  EXPECT_EQ(vec(x.grad()), (std::vector<double>{8, 16, 24}));  // 2y * 2
}

TEST(Engine, ExecuteFromNodeGradientPairs) {
  // Start in the middle of a graph, as dist_autograd does at its recv functions.
  Tensor a = leaf({1, 2});
  Tensor h = a * a;
  Tensor unused = sum(h);  // the rest of the graph, not run
  std::vector<GraphRoot> roots{{autograd::gradient_edge(h), tensor<double>({1, 1})},
                               {autograd::gradient_edge(h), tensor<double>({0.5, 0.5})}};
  autograd::execute(roots);
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{3, 6}));  // 1.5 * 2a
}

using test::RecordingSink;

TEST(Engine, GradientSinkReceivesLeafGradientsInsteadOfDotGrad) {
  Tensor w = leaf({1, 2});
  int post_calls = 0;
  w.register_post_accumulate_grad_hook([&](const Tensor&) { ++post_calls; });
  w.register_hook([](const Tensor& g) { return g * 2.0; });  // tensor hooks still apply
  auto sink = std::make_shared<RecordingSink>();
  autograd::ExecuteOptions options;
  options.sink = sink;
  Tensor loss = sum(w * w) + sum(w);
  autograd::execute(autograd::make_roots({loss}), options);
  auto got = sink->take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].first.is_same(w));
  EXPECT_EQ(vec(got[0].second), (std::vector<double>{6, 10}));  // 2 * (2w + 1)
  EXPECT_FALSE(w.grad().defined());
  EXPECT_EQ(post_calls, 1);  // post-accumulate hooks run under a sink too
}

TEST(Engine, NoGradGuardAndDetach) {
  Tensor a = leaf({1, 2});
  {
    autograd::NoGradGuard no_grad;
    EXPECT_FALSE(autograd::GradMode::is_enabled());
    Tensor b = a * 2.0;
    EXPECT_FALSE(b.requires_grad());
    {
      autograd::EnableGradGuard enable;
      EXPECT_TRUE((a * 2.0).requires_grad());
    }
    a.add_(1.0);  // in-place on a leaf is allowed without recording
  }
  EXPECT_TRUE(autograd::GradMode::is_enabled());
  EXPECT_EQ(vec(a), (std::vector<double>{2, 3}));
  Tensor d = a.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_TRUE(d.storage().is_same(a.storage()));
  Tensor y = sum(d * a);
  y.backward();
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{2, 3}));  // d is a constant
}

TEST(Engine, GradModeIsPerThread) {
  autograd::NoGradGuard no_grad;
  bool other_thread_records = false;
  std::thread t([&] { other_thread_records = (leaf({1}) * 2.0).requires_grad(); });
  t.join();
  EXPECT_TRUE(other_thread_records);
  EXPECT_FALSE((leaf({1}) * 2.0).requires_grad());
}

TEST(Engine, OutVariantsRefuseGradients) {
  Tensor a = leaf({1, 2});
  Tensor out = empty({2}, kFloat64);
  EXPECT_THROW(add_out(out, a, a), InvalidArgument);
  autograd::NoGradGuard no_grad;
  add_out(out, a, a);
  EXPECT_EQ(vec(out), (std::vector<double>{2, 4}));
}

TEST(Engine, MixedDtypeGradientsAreCastToTheInputDtype) {
  Tensor a = tensor<float>({1, 2}).set_requires_grad(true);
  Tensor b = leaf({3, 4});
  sum(a * b).backward();
  EXPECT_EQ(a.grad().dtype(), kFloat32);
  EXPECT_EQ(a.grad().to_vector<float>(), (std::vector<float>{3, 4}));
  EXPECT_EQ(b.grad().dtype(), kFloat64);
}

// Eight threads run independent backward passes at once (independent graphs over shared
// parameters, with grad(), and over their own leaves, with backward()); each must match
// the single-threaded result exactly.
TEST(Engine, ConcurrentBackwardPassesMatchSingleThreaded) {
  Tensor w1 = testing::uniform({8, 16}).set_requires_grad(true);
  Tensor w2 = testing::uniform({16, 4}, -1, 1, 2).set_requires_grad(true);
  auto loss_for = [&](int i, const Tensor& a, const Tensor& b) {
    Tensor x = testing::uniform({5, 8}, -1, 1, 100 + i);
    Tensor h = tanh(mm(x, a));
    return mean(log_softmax(mm(h, b), 1)) + sum(square(h)) * 0.01;
  };
  constexpr int kThreads = 8, kRounds = 20;
  std::vector<std::vector<double>> expected_shared(kThreads), expected_own(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    auto g = autograd::grad({loss_for(i, w1, w2)}, {w1, w2});
    expected_shared[i] = vec(cat({g[0].reshape({-1}), g[1].reshape({-1})}));
    Tensor a = w1.detach().clone().set_requires_grad(true);
    Tensor b = w2.detach().clone().set_requires_grad(true);
    loss_for(i, a, b).backward();
    expected_own[i] = vec(cat({a.grad().reshape({-1}), b.grad().reshape({-1})}));
  }
  std::atomic<int> mismatches{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kThreads)
        std::this_thread::yield();
      for (int r = 0; r < kRounds; ++r) {
        auto g = autograd::grad({loss_for(i, w1, w2)}, {w1, w2});
        if (vec(cat({g[0].reshape({-1}), g[1].reshape({-1})})) != expected_shared[i]) ++mismatches;
        Tensor a = w1.detach().clone().set_requires_grad(true);
        Tensor b = w2.detach().clone().set_requires_grad(true);
        loss_for(i, a, b).backward();
        if (vec(cat({a.grad().reshape({-1}), b.grad().reshape({-1})})) != expected_own[i])
          ++mismatches;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_FALSE(w1.grad().defined());
}

TEST(Engine, ConcurrentAccumulationIntoSharedLeaves) {
  Tensor w = leaf({1, 2, 3});
  std::atomic<int> post_calls{0};
  w.register_post_accumulate_grad_hook([&](const Tensor&) { ++post_calls; });
  constexpr int kThreads = 8, kRounds = 25;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int r = 0; r < kRounds; ++r)
        sum(w * 2.0).backward();  // integers: exact in any order
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(post_calls.load(), kThreads * kRounds);
  const double n = 2.0 * kThreads * kRounds;
  EXPECT_EQ(vec(w.grad()), (std::vector<double>{n, n, n}));
}

}  // namespace
}  // namespace gradwire
