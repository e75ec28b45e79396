// Graph tasks fed gradients as they arrive, end-of-pass callbacks, hooks under a gradient
// sink, leaves that get no gradient, and the checks on gradients given from outside.
#include <atomic>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include <gtest/gtest.h>

#include "recording_sink.h"

#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

using autograd::Edge;
using autograd::GraphTask;
using autograd::LeafGradient;

Tensor leaf(std::vector<double> values, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(values.size())};
  return tensor<double>(values, shape).set_requires_grad(true);
}

std::vector<double> vec(const Tensor& t) {
  return t.to_vector<double>();
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

// ---------------------------------------------------------------- end-of-pass callbacks

TEST(Callbacks, QueuedFromHooksRunOnceInOrderAfterTheLastNode) {
  Tensor w = leaf({1, 2});
  Tensor v = leaf({3});
  std::vector<std::string> log;
  w.register_post_accumulate_grad_hook([&](const Tensor&) {
    log.push_back("hook w");
    autograd::queue_callback([&] {
      // Every leaf has its gradient by now: the callback runs after the last node.
      log.push_back("callback w: v.grad=" + std::to_string(vec(v.grad())[0]));
      autograd::queue_callback([&] { log.push_back("callback from callback"); });
    });
  });
  v.register_post_accumulate_grad_hook([&](const Tensor&) {
    log.push_back("hook v");
    autograd::queue_callback([&] { log.push_back("callback v"); });
  });
  Tensor loss = sum(w * v) + sum(v * 2.0);
  loss.backward();
  // Leaves run highest sequence number first, both UINT64_MAX: either hook may come first,
  // but the callbacks come after both, in the order queued, each once.
  ASSERT_EQ(log.size(), 5u);
  EXPECT_TRUE(log[0].rfind("hook", 0) == 0 && log[1].rfind("hook", 0) == 0);
  const bool w_first = log[0] == "hook w";
  EXPECT_EQ(log[2], w_first ? "callback w: v.grad=5.000000" : "callback v");
  EXPECT_EQ(log[3], w_first ? "callback v" : "callback w: v.grad=5.000000");
  EXPECT_EQ(log[4], "callback from callback");
  log.clear();
  sum(w).backward();  // a later pass runs only what it queues itself
  EXPECT_EQ(log, (std::vector<std::string>{"hook w", "callback w: v.grad=5.000000",
                                           "callback from callback"}));
}

TEST(Callbacks, AnErrorInACallbackFailsThePass) {
  Tensor w = leaf({1, 2});
  bool second_ran = false;
  w.register_post_accumulate_grad_hook([&](const Tensor&) {
    autograd::queue_callback([] { throw InvalidArgument("bucket 3 was never reduced"); });
    autograd::queue_callback([&] { second_ran = true; });
  });
  EXPECT_CONTAINS(error_of([&] { sum(w * w).backward(); }), "bucket 3 was never reduced");
  EXPECT_FALSE(second_ran);
}

TEST(Callbacks, OutsideAPassIsAnError) {
  EXPECT_CONTAINS(error_of([] { autograd::queue_callback([] {}); }),
                  "no backward pass is running on this thread");
  EXPECT_EQ(GraphTask::current(), nullptr);
}

TEST(Callbacks, ANestedPassKeepsItsOwnCallbacks) {
  Tensor w = leaf({1});
  Tensor u = leaf({2});
  std::vector<std::string> log;
  w.register_post_accumulate_grad_hook([&](const Tensor&) {
    GraphTask* outer = GraphTask::current();
    autograd::EnableGradGuard record;  // hooks run with grad mode off, as formulas do
    sum(u * u).backward();             // a pass started from a hook is a task of its own
    EXPECT_EQ(GraphTask::current(), outer);
    autograd::queue_callback([&] { log.push_back("outer"); });
  });
  u.register_post_accumulate_grad_hook(
      [&](const Tensor&) { autograd::queue_callback([&] { log.push_back("inner"); }); });
  sum(w * 3.0).backward();
  EXPECT_EQ(log, (std::vector<std::string>{"inner", "outer"}));
  EXPECT_EQ(vec(u.grad()), (std::vector<double>{4}));
}

// ---------------------------------------------------------------- feeding a graph task

// Three outputs of one shared graph; every value and gradient is a small integer, so sums
// in any order are exact in float64 and "equal" means bit for bit.
struct SharedGraph {
  Tensor x = leaf({1, 2, 3});
  Tensor w = leaf({1, 0, 2, -1, 1, 1, 0, 3, -2}, {3, 3});
  Tensor shared = mm(w, x.view({3, 1})) * 2.0;  // [3, 1], used by all three outputs
  Tensor mid = shared + x.view({3, 1});         // a second shared node
  std::vector<Tensor> outputs{mid * 3.0, mid* mid, sum(mid* shared)};
  std::vector<Tensor> grads{tensor<double>({1, -1, 2}, {3, 1}), tensor<double>({2, 0, 1}, {3, 1}),
                            tensor<double>(std::vector<double>{1}, {})};
  // Where each output's gradient enters the graph.
  std::vector<Edge> edges() const {
    std::vector<Edge> out;
    for (const Tensor& o : outputs)
      out.push_back(autograd::gradient_edge(o));
    return out;
  }
};

TEST(GraphTaskFeeding, ThreePiecesMeetingInSharedNodesEqualOnePass) {
  SharedGraph reference;
  autograd::backward(reference.outputs, reference.grads);

  SharedGraph fed;
  auto task = std::make_shared<GraphTask>();
  const std::vector<Edge> edges = fed.edges();
  for (const Edge& e : edges)
    task->expect(e);  // what a distributed engine learns up front

  task->add_gradient(edges[0], fed.grads[0]);
  EXPECT_GT(task->run_ready(), 0u);  // the first piece's own node runs ...
  EXPECT_FALSE(task->completed());   // ... the shared nodes wait for the others
  EXPECT_FALSE(fed.x.grad().defined());
  task->add_gradient(edges[1], fed.grads[1]);
  task->run_ready();
  EXPECT_FALSE(task->completed());
  task->add_gradient(edges[2], fed.grads[2]);
  task->run_ready();
  EXPECT_TRUE(task->completed());
  task->completion().get(std::chrono::seconds(5));

  EXPECT_EQ(vec(fed.x.grad()), vec(reference.x.grad()));
  EXPECT_EQ(vec(fed.w.grad()), vec(reference.w.grad()));
  // Independently, by hand: Wx = [7, 4, 0], shared = 2Wx = [14, 8, 0], mid = [15, 10, 3].
  //   dL/dmid = 3*g0 + 2*mid*g1 + shared = [3, -3, 6] + [60, 0, 6] + [14, 8, 0] = [77, 5, 12]
  //   dL/dshared = dL/dmid + mid (from the third output) = [92, 15, 15]
  //   dL/dx = dL/dmid + 2 W^T dL/dshared = [77, 5, 12] + 2 [77, 60, 169] = [231, 125, 350]
  EXPECT_EQ(vec(fed.x.grad()), (std::vector<double>{231, 125, 350}));
  // retain_graph=false: the shared nodes ran once and freed their saved tensors.
  EXPECT_CONTAINS(error_of([&] { fed.outputs[1].backward(fed.grads[1]); }), "retain_graph");
}

TEST(GraphTaskFeeding, PiecesFromSeveralThreadsEqualOnePass) {
  SharedGraph reference;
  autograd::backward(reference.outputs, reference.grads);
  for (int round = 0; round < 20; ++round) {
    SharedGraph fed;
    auto task = std::make_shared<GraphTask>();
    std::vector<Edge> edges;
    for (const Tensor& out : fed.outputs) {
      edges.push_back(autograd::gradient_edge(out));
      task->expect(edges.back());
    }
    std::vector<std::thread> threads;
    for (size_t i = 0; i < edges.size(); ++i) {
      threads.emplace_back([&, i] {
        task->add_gradient(edges[i], fed.grads[i]);
        task->run_ready();
      });
    }
    for (auto& t : threads)
      t.join();
    task->completion().get(std::chrono::seconds(5));
    ASSERT_EQ(vec(fed.x.grad()), vec(reference.x.grad())) << "round " << round;
    ASSERT_EQ(vec(fed.w.grad()), vec(reference.w.grad())) << "round " << round;
  }
}

TEST(GraphTaskFeeding, CountsToldFromOutsideHoldTheNodeBack) {
  // A recv-like root that will receive its gradient in two messages.
  Tensor a = leaf({1, 2});
  Tensor y = a * a;
  Edge e = autograd::gradient_edge(y);
  GraphTask task;
  task.expect(e, 2);
  task.add_gradient(e, tensor<double>({1, 1}));
  EXPECT_EQ(task.run_ready(), 0u);
  task.add_gradient(e, tensor<double>({2, 3}));
  EXPECT_EQ(task.run_ready(), 2u);  // MulBackward, AccumulateGrad
  EXPECT_TRUE(task.completed());
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{6, 16}));  // (1+2, 1+3) * 2a
}

// What a distributed engine does while discovery goes on: the nodes a gradient it has not
// yet been told of could reach are held; the rest runs as gradients come.
TEST(GraphTaskHold, HeldNodesWaitAndTheTaskDoesNotFinishUntilTheHoldEnds) {
  SharedGraph reference;
  autograd::backward(reference.outputs, reference.grads);

  SharedGraph fed;
  auto task = std::make_shared<GraphTask>();
  const std::vector<Edge> edges = fed.edges();
  // Told of the first two pieces only; the third (sum(mid * shared)) reaches both shared
  // nodes and the leaves, so those are held until it is told.
  task->expect(edges[0]);
  task->expect(edges[1]);
  std::unordered_set<const autograd::Node*> below_third;
  std::vector<const autograd::Node*> stack{edges[2].function.get()};
  while (!stack.empty()) {
    const autograd::Node* n = stack.back();
    stack.pop_back();
    if (!below_third.insert(n).second) continue;
    for (const Edge& e : n->next_edges()) {
      if (e.is_valid()) stack.push_back(e.function.get());
    }
  }
  task->hold(below_third);
  task->add_gradient(edges[0], fed.grads[0]);
  task->add_gradient(edges[1], fed.grads[1]);
  EXPECT_EQ(task->run_ready(), 2u);  // the two pieces' own nodes (mid * 3, mid * mid)
  EXPECT_FALSE(task->completed());
  EXPECT_FALSE(fed.x.grad().defined()) << "a held node ran";
  // Told of the third now: its count grows, which it could not have after running.
  task->expect(edges[2]);
  task->add_gradient(edges[2], fed.grads[2]);
  EXPECT_EQ(task->run_ready(), 0u) << "still held";
  task->hold({});  // nothing is held, but the task may not finish yet
  EXPECT_GT(task->run_ready(), 0u);
  EXPECT_FALSE(task->completed()) << "finished while holding";
  task->release_hold();
  EXPECT_EQ(task->run_ready(), 0u);  // nothing left to run: it finishes
  EXPECT_TRUE(task->completed());
  task->completion().get(std::chrono::seconds(5));
  EXPECT_EQ(vec(fed.x.grad()), vec(reference.x.grad()));
  EXPECT_EQ(vec(fed.w.grad()), vec(reference.w.grad()));
  EXPECT_EQ(vec(fed.x.grad()), (std::vector<double>{231, 125, 350}));
  // After the hold has ended for good, hold() does nothing.
  task->hold(below_third);
  EXPECT_TRUE(task->completed());
}

TEST(GraphTaskHold, AHoldThatShrinksQueuesWhatLeftItAndReleasingFinishesAnEmptyTask) {
  Tensor a = leaf({1, 2});
  Tensor y = a * a;
  Edge e = autograd::gradient_edge(y);
  GraphTask task;
  task.expect(e);
  task.hold({e.function.get()});
  task.add_gradient(e, tensor<double>({1, 1}));
  EXPECT_EQ(task.run_ready(), 0u);
  task.hold({});
  EXPECT_EQ(task.run_ready(), 2u);  // MulBackward, AccumulateGrad
  EXPECT_FALSE(task.completed());
  task.release_hold();
  task.run_ready();
  EXPECT_TRUE(task.completed());
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{2, 4}));
  // A task told of nothing, held, finishes once released.
  GraphTask empty;
  empty.hold({});
  EXPECT_EQ(empty.run_ready(), 0u);
  EXPECT_FALSE(empty.completed());
  empty.release_hold();
  empty.run_ready();
  EXPECT_TRUE(empty.completed());
  // check_gradient refuses what add_gradient would, without a task.
  EXPECT_CONTAINS(error_of([&] {
                    GraphTask::check_gradient(e, tensor<double>({1, 2, 3}));
                  }),
                  "has shape [3] but the input has shape [2]");
  EXPECT_NO_THROW(GraphTask::check_gradient(e, Tensor()));
}

// finish_if_idle(): what a distributed engine calls on a thread that must not run nodes
// (a transport's) when discovery ends. It ends only a task with nothing left to do.
TEST(GraphTaskHold, FinishIfIdleEndsOnlyATaskWithNothingLeftToRun) {
  Tensor a = leaf({1, 2});
  Tensor y = a * a;
  Edge e = autograd::gradient_edge(y);
  GraphTask task;
  task.expect(e);
  task.hold({e.function.get()});
  EXPECT_FALSE(task.finish_if_idle()) << "never run: its queue is not live";
  task.add_gradient(e, tensor<double>({1, 1}));
  EXPECT_EQ(task.run_ready(), 0u);
  EXPECT_FALSE(task.finish_if_idle()) << "a node is held";
  task.hold({});
  EXPECT_FALSE(task.finish_if_idle()) << "a node is ready";
  EXPECT_EQ(task.run_ready(), 2u);
  EXPECT_FALSE(task.finish_if_idle()) << "the hold has not ended";
  EXPECT_FALSE(task.completed());
  task.release_hold();
  EXPECT_TRUE(task.finish_if_idle());
  EXPECT_TRUE(task.completed());
  task.completion().get(std::chrono::seconds(5));
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{2, 4}));
  // Once finished, neither call does anything more.
  EXPECT_FALSE(task.finish_if_idle());
  EXPECT_EQ(task.run_ready(), 0u);
  EXPECT_TRUE(task.completed());

  // A queued callback is work: finish_if_idle leaves it to run_ready(), which runs it.
  Tensor b = leaf({3});
  Tensor z = b * b;
  Edge f = autograd::gradient_edge(z);
  GraphTask with_callback;
  with_callback.expect(f);
  with_callback.hold({});
  with_callback.add_gradient(f, tensor<double>({1}));
  EXPECT_EQ(with_callback.run_ready(), 2u);
  std::atomic<int> ran{0};
  with_callback.queue_callback([&] { ++ran; });
  with_callback.release_hold();
  EXPECT_FALSE(with_callback.finish_if_idle());
  EXPECT_FALSE(with_callback.completed());
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(with_callback.run_ready(), 0u);
  EXPECT_TRUE(with_callback.completed());
  EXPECT_EQ(ran.load(), 1);
  EXPECT_EQ(vec(b.grad()), (std::vector<double>{6}));
}

TEST(GraphTaskFeeding, MisuseIsRefusedWithTypedErrors) {
  Tensor a = leaf({1, 2});
  Tensor y = a * a;
  Tensor z = a * 3.0;
  Edge e = autograd::gradient_edge(y);
  GraphTask task;
  task.expect(e);
  EXPECT_CONTAINS(
      error_of([&] { task.add_gradient(autograd::gradient_edge(z), ones({2}, kFloat64)); }),
      "no gradient is expected for input 0 of MulBackward");
  EXPECT_CONTAINS(error_of([&] { task.expect(e, 0); }), "count must be at least 1");
  task.add_gradient(e, ones({2}, kFloat64));
  EXPECT_CONTAINS(error_of([&] { task.add_gradient(e, ones({2}, kFloat64)); }),
                  "no more gradient is expected for input 0 of MulBackward");
  task.run_ready();
  EXPECT_TRUE(task.completed());
  EXPECT_CONTAINS(error_of([&] { task.expect(e); }), "the task has finished");

  GraphTask released;
  released.expect(autograd::gradient_edge(z));
  Future<void> done = released.completion();
  released.release();
  EXPECT_THROW(done.get(std::chrono::seconds(1)), InvalidArgument);
  EXPECT_CONTAINS(error_of([&] { released.run_ready(); }), "released");
}

TEST(GraphTaskFeeding, ANodeErrorFailsTheTaskAndItsCompletion) {
  Tensor a = leaf({1, 2});
  Tensor y = a * 2.0;
  y.register_hook([](const Tensor&) -> Tensor { throw InvalidArgument("hook refused"); });
  Tensor loss = sum(y);
  GraphTask task;
  Edge e = autograd::gradient_edge(loss);
  task.expect(e);
  task.add_gradient(e, ones({}, kFloat64));
  EXPECT_CONTAINS(error_of([&] { task.run_ready(); }), "hook refused");
  EXPECT_CONTAINS(error_of([&] { task.run_ready(); }), "hook refused");  // the first error
  EXPECT_THROW(task.completion().get(std::chrono::seconds(1)), InvalidArgument);
}

// ---------------------------------------------------------------- root gradients

TEST(RootGradients, WrongShapeDtypeOrInputAreRefusedNamingTheNode) {
  Tensor a = leaf({1, 2});
  Tensor y = a * a;
  Edge e = autograd::gradient_edge(y);
  auto run = [&](Edge edge, Tensor g) { autograd::execute({{std::move(edge), std::move(g)}}); };
  std::string msg = error_of([&] { run(e, ones({3}, kFloat64)); });
  EXPECT_CONTAINS(msg, "input 0 of MulBackward has shape [3] but the input has shape [2]");
  msg = error_of([&] { run(e, ones({2}, kFloat32)); });
  EXPECT_CONTAINS(msg, "MulBackward has dtype float32 but the input has dtype float64");
  msg = error_of([&] { run(Edge(e.function, 5), ones({2}, kFloat64)); });
  EXPECT_CONTAINS(msg, "input 5 of MulBackward, which has 1 input");
  // A leaf's AccumulateGrad is checked against the leaf.
  msg = error_of([&] { run(autograd::gradient_edge(a), ones({2, 1}, kFloat64)); });
  EXPECT_CONTAINS(msg, "AccumulateGrad has shape [2, 1]");
  EXPECT_FALSE(a.grad().defined());
  run(e, ones({2}, kFloat64));  // the graph is intact after the refusals
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{2, 4}));
}

// ---------------------------------------------------------------- hooks under a sink

using test::RecordingSink;

TEST(SinkHooks, HooksFireAndCanReplaceTheSunkGradient) {
  Tensor w = leaf({1, 2, 3});
  Tensor bucket = zeros({5}, kFloat64);
  Tensor view = bucket.narrow(0, 1, 3);
  std::vector<std::string> order;
  autograd::register_leaf_gradient_hook(w, [&](LeafGradient& g) {
    order.push_back("gradient hook");
    EXPECT_TRUE(g.sunk);
    EXPECT_TRUE(g.produced);
    view.copy_(g.grad);  // what DDP does: the bucket takes it, the sink gets the view
    g.grad = view;
  });
  w.register_post_accumulate_grad_hook([&](const Tensor&) { order.push_back("post hook"); });
  auto sink = std::make_shared<RecordingSink>();
  autograd::ExecuteOptions options;
  options.sink = sink;
  autograd::execute(autograd::make_roots({sum(w * w)}), options);
  EXPECT_EQ(order, (std::vector<std::string>{"gradient hook", "post hook"}));
  auto got = sink->take();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(got[0].second.is_same(view));
  EXPECT_EQ(vec(bucket), (std::vector<double>{0, 2, 4, 6, 0}));
  EXPECT_FALSE(w.grad().defined());

  // A replacement that cannot stand in for the leaf's gradient is refused.
  Tensor u = leaf({1, 2});
  autograd::register_leaf_gradient_hook(u, [](LeafGradient& g) { g.grad = zeros({3}, kFloat64); });
  EXPECT_CONTAINS(error_of([&] { autograd::execute(autograd::make_roots({sum(u)}), options); }),
                  "replaced the gradient of a float64 [2] leaf");
}

TEST(SinkHooks, WithoutASinkTheHookSeesAndMayReplaceGrad) {
  Tensor w = leaf({1, 2});
  std::vector<std::vector<double>> seen;
  const uint64_t h = autograd::register_leaf_gradient_hook(w, [&](LeafGradient& g) {
    EXPECT_FALSE(g.sunk);
    seen.push_back(vec(g.grad));
    g.grad = g.grad * 0.5;
  });
  sum(w * w).backward();
  sum(w * w).backward();
  EXPECT_EQ(seen, (std::vector<std::vector<double>>{{2, 4}, {3, 6}}));  // accumulated grad()
  EXPECT_EQ(vec(w.grad()), (std::vector<double>{1.5, 3}));
  EXPECT_TRUE(w.remove_hook(h));
  EXPECT_THROW(autograd::register_leaf_gradient_hook(w * 2.0, [](LeafGradient&) {}),
               InvalidArgument);
}

// ---------------------------------------------------------------- leaves without a gradient

// Returns a gradient for its first input only, like an op that is not differentiable in
// its second argument.
class FirstOnlyBackward : public autograd::Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return {grads[0], Tensor()}; }
  std::string name() const override { return "FirstOnlyBackward"; }
};

TEST(UndefinedLeafGradients, HooksFireWithAnUndefinedGradient) {
  Tensor a = leaf({1, 2});
  Tensor b = leaf({5, 6});
  Tensor y;
  {
    BelowAutogradGuard raw;
    y = a + b;
  }
  auto node = std::make_shared<FirstOnlyBackward>();
  node->set_next_edges(autograd::collect_next_edges({a, b}));
  autograd::set_history(y, node);

  int post_calls = 0, tensor_hook_calls = 0;
  std::vector<bool> produced;
  b.register_post_accumulate_grad_hook([&](const Tensor& p) {
    ++post_calls;
    EXPECT_FALSE(p.grad().defined());
  });
  b.register_hook([&](const Tensor& g) {
    ++tensor_hook_calls;  // not shown undefined gradients
    return g;
  });
  autograd::register_leaf_gradient_hook(b, [&](LeafGradient& g) {
    produced.push_back(g.produced);
    EXPECT_FALSE(g.grad.defined());
  });
  y.backward(ones({2}, kFloat64));
  EXPECT_EQ(post_calls, 1);
  EXPECT_EQ(tensor_hook_calls, 0);
  EXPECT_EQ(produced, (std::vector<bool>{false}));
  EXPECT_EQ(vec(a.grad()), (std::vector<double>{1, 1}));
  EXPECT_FALSE(b.grad().defined());
}

// ---------------------------------------------------------------- gradients as bucket views

TEST(BucketViews, GradBoundWithSetGradReceivesTheAccumulationInPlace) {
  Tensor w = leaf({1, 2, 3});
  Tensor v = leaf({4, 5});
  Tensor bucket = zeros({5}, kFloat64);
  w.set_grad(bucket.narrow(0, 0, 3));
  v.set_grad(bucket.narrow(0, 3, 2));
  Tensor loss = sum(w * w) + sum(v * 3.0);
  loss.backward();
  EXPECT_EQ(vec(bucket), (std::vector<double>{2, 4, 6, 3, 3}));
  EXPECT_EQ(w.grad().data_ptr(), bucket.data_ptr());
  EXPECT_EQ(static_cast<double*>(v.grad().data_ptr()), bucket.data<double>() + 3);
  sum(w).backward();
  EXPECT_EQ(vec(bucket), (std::vector<double>{3, 5, 7, 3, 3}));
}

}  // namespace
}  // namespace gradwire
