// dist_optim/: DistributedOptimizer over parameters owned by two workers, stepped by a
// trainer through dist_autograd contexts. Each optimizer's parameters are checked after every
// step against PyTorch 1.13's torch.optim on the same training (float64, 1e-12): the values
// in fixtures/, written by make_fixtures.py (PyTorch is not needed to run the tests).
#include "gradwire/dist_optim/distributed_optimizer.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/trace.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/optim/adagrad.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/harness.h"
#include "support/temp_dir.h"
#include "support/trace_file.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using rpc::CallContext;
using rpc::Registry;
using rpc::RpcAgent;
using rref::RRef;
namespace da = dist_autograd;

// A parameter made and owned by the worker that runs this: seed-dependent float64 values.
Tensor make_param(int64_t seed) {
  std::vector<double> v;
  for (int64_t i = 0; i < 4; ++i)
    v.push_back(0.25 * static_cast<double>(seed + 1) - 0.1 * static_cast<double>(i));
  Tensor p = tensor(v);
  p.set_requires_grad(true);
  return p;
}

// PyTorch's parameters after each step of the training make_fixtures.py describes (the
// loss sum((p1 * x)^2) + sum(p2 * x) with x = [1, -2, 3, 0.5]; p3 gets no gradient):
// values[step - 1][param - 1].
struct Fixture {
  std::vector<std::vector<std::vector<double>>> values;
};

Fixture read_fixture(const std::string& name) {
  const std::filesystem::path path =
      std::filesystem::path(GRADWIRE_TEST_SOURCE_DIR) / "fixtures" / (name + ".txt");
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  Fixture f;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream row(line);
    size_t step = 0, param = 0;
    std::vector<double> v(4);
    row >> step >> param >> v[0] >> v[1] >> v[2] >> v[3];
    if (!row || step < 1 || param < 1 || param > 3) {
      throw std::runtime_error(path.string() + ": bad line '" + line + "'");
    }
    if (f.values.size() < step) f.values.resize(step, std::vector<std::vector<double>>(3));
    f.values[step - 1][param - 1] = v;
  }
  if (f.values.empty()) throw std::runtime_error(path.string() + " holds no steps");
  return f;
}

void expect_values(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(got.numel(), static_cast<int64_t>(want.size())) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got.data<double>()[i], want[i], 1e-12) << what << ", element " << i;
}

class DistOptim : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("make_param", [](int64_t seed) { return make_param(seed); });
    reg_.def("copy_param", [](const Tensor& v) {
      Tensor p = v.detach().clone();  // a new leaf, not a view of what arrived
      p.set_requires_grad(true);
      return p;
    });
    reg_.def("scaled",
             [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
    // The same, with a backward that fails on the owner.
    reg_.def("scaled_then_fails", [](const RRef<Tensor>& p, const Tensor& x) {
      Tensor y = mul(*p.local_value(), x);
      y.register_hook([](const Tensor&) -> Tensor { throw std::runtime_error("hook exploded"); });
      return y;
    });
    agents_ = test::start_agents(3, test::agent_options(reg_));
  }
  void TearDown() override {
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }

  // One training step through remote parameters on w1 and w2, driven by w0: backward() then
  // step(), or backward_and_step().
  void remote_step(dist_optim::DistributedOptimizer& opt, const RRef<Tensor>& p1,
                   const RRef<Tensor>& p2, bool fused = false) {
    da::Context ctx(w(0));
    Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
    Tensor a = w(0).rpc_sync<Tensor>("w1", "scaled", p1, x);
    Tensor b = w(0).rpc_sync<Tensor>("w2", "scaled", p2, x);
    if (fused) {
      opt.backward_and_step(ctx.id(), {add(sum(mul(a, a)), sum(b))});
    } else {
      da::backward(w(0), ctx.id(), {add(sum(mul(a, a)), sum(b))});
      opt.step(ctx.id());
    }
  }

  // The optimizer `options` make, stepped through a context per step, against PyTorch's
  // values after every step; with `fused`, each step is one backward_and_step().
  template <typename Options>
  void check_against_pytorch(const Options& options, const std::string& fixture,
                             bool fused = false) {
    const Fixture want = read_fixture(fixture);
    RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
    RRef<Tensor> p2 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
    RRef<Tensor> p3 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{3});
    dist_optim::DistributedOptimizer opt(w(0), options, {p1, p2, p3});
    EXPECT_EQ(opt.num_owners(), 2u);
    for (size_t s = 0; s < want.values.size(); ++s) {
      remote_step(opt, p1, p2, fused);
      const std::vector<RRef<Tensor>> params{p1, p2, p3};
      for (size_t k = 0; k < params.size(); ++k) {
        expect_values(
            params[k].to_here(), want.values[s][k],
            fixture + ": p" + std::to_string(k + 1) + " after step " + std::to_string(s + 1));
      }
    }
  }

  // `p` now holds `start` moved by one SGD step of lr 0.1 on the gradient x of sum(p * x).
  static void expect_one_step(const RRef<Tensor>& p, const Tensor& start, const std::string& what) {
    const double x[] = {1, -2, 3, 0.5};
    Tensor got = p.to_here();
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_NEAR(got.data<double>()[i], start.data<double>()[i] - 0.1 * x[i], 1e-12)
          << what << ", element " << i;
    }
  }

  Registry reg_;
  test::Agents agents_;
};

TEST_F(DistOptim, SgdWithMomentumNesterovAndWeightDecayMatchesPyTorch) {
  check_against_pytorch(
      optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
      "sgd_momentum");
}

TEST_F(DistOptim, AdamMatchesPyTorch) {
  check_against_pytorch(optim::AdamOptions{.lr = 0.01}, "adam");
}

TEST_F(DistOptim, AdamWMatchesPyTorch) {
  check_against_pytorch(optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1}, "adamw");
}

TEST_F(DistOptim, AdagradMatchesPyTorch) {
  check_against_pytorch(optim::AdagradOptions{.lr = 0.1}, "adagrad");
}

// Two trainers step at once, each with its own DistributedOptimizer over the same three
// parameters on w2: its own (trainer k's loss is sum((p_k * x)^2) / 2, whose gradient
// p_k * x^2 depends on the parameter, so a step that used another context's gradients, or
// a stale or torn parameter, would show) and a shared one (gradient x whatever it is).
// Plain SGD then has closed forms: p_k after n steps is p_k(0) * (1 - lr x^2)^n, and the
// shared parameter moves by -lr x per step of either trainer, whatever the interleaving.
TEST_F(DistOptim, TwoTrainersStepTheSameParametersConcurrently) {
  RRef<Tensor> mine[2] = {rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{1}),
                          rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2})};
  RRef<Tensor> shared = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{3});
  RRef<Tensor> idle = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{4});
  const Tensor start[2] = {mine[0].to_here(), mine[1].to_here()};
  const Tensor start_shared = shared.to_here(), start_idle = idle.to_here();
  constexpr double kLr = 0.01;
  constexpr int kSteps = 10;
  const std::vector<RRef<Tensor>> all{mine[0], mine[1], shared, idle};
  dist_optim::DistributedOptimizer a(w(0), optim::SGDOptions{.lr = kLr}, all);
  dist_optim::DistributedOptimizer b(w(0), optim::SGDOptions{.lr = kLr}, all);
  dist_optim::DistributedOptimizer* opts[2] = {&a, &b};
  std::vector<std::thread> trainers;
  for (int k = 0; k < 2; ++k) {
    trainers.emplace_back([&, k] {
      for (int s = 0; s < kSteps; ++s) {
        da::Context ctx(w(0));
        Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
        Tensor y = w(0).rpc_sync<Tensor>("w2", "scaled", mine[k], x);
        Tensor z = w(0).rpc_sync<Tensor>("w2", "scaled", shared, x);
        da::backward(w(0), ctx.id(), {add(mul(sum(mul(y, y)), 0.5), sum(z))});
        opts[k]->step(ctx.id());
      }
    });
  }
  for (auto& t : trainers)
    t.join();
  const double x[] = {1, -2, 3, 0.5};
  for (int k = 0; k < 2; ++k) {
    Tensor got = mine[k].to_here();
    for (int64_t i = 0; i < 4; ++i) {
      EXPECT_NEAR(got.data<double>()[i],
                  start[k].data<double>()[i] * std::pow(1 - kLr * x[i] * x[i], kSteps), 1e-12)
          << "trainer " << k << ", element " << i;
    }
  }
  Tensor got = shared.to_here();
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_NEAR(got.data<double>()[i], start_shared.data<double>()[i] - 2 * kSteps * kLr * x[i],
                1e-12);
  }
  // The parameter no pass reached is unchanged.
  Tensor same = idle.to_here();
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_EQ(same.data<double>()[i], start_idle.data<double>()[i]);
}

// A pass that failed leaves nothing to step: every owner refuses, naming the failure, and
// no parameter moves; the next context's pass steps as usual.
// backward_and_step() is backward() then step(): the same values after every step (one of
// the two owners is stepped early, as its part ends, the other after the pass), for an
// optimizer with state.
TEST_F(DistOptim, BackwardAndStepMatchesPyTorchAsBackwardThenStepDoes) {
  check_against_pytorch(
      optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true},
      "sgd_momentum", /*fused=*/true);
  check_against_pytorch(optim::AdamOptions{.lr = 0.01}, "adam", /*fused=*/true);
}

// backward_and_step() sends the owner whose part is the only one left its step during the
// pass: here w2's part is held (a hook on its result waits for a gate) until the trainer's
// own on_last_part hook, which backward_and_step calls after sending that step, opens it. So
// w2's step request waits on w2 for its part (one dist_optim.wait_part span there, traced in
// this process), w1 is stepped after the pass, each exactly once, and both move by -lr x.
TEST_F(DistOptim, BackwardAndStepStepsTheLastOwnerDuringThePass) {
  Future<void> gate;
  reg_.def("scaled_held", [gate](const RRef<Tensor>& p, const Tensor& x) {
    Tensor y = mul(*p.local_value(), x);
    y.register_hook([gate](const Tensor& g) -> Tensor {
      if (!gate.wait(10s)) throw std::runtime_error("the gate was never opened");
      return g;
    });
    return y;
  });
  RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
  RRef<Tensor> p2 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
  const Tensor start1 = p1.to_here(), start2 = p2.to_here();
  dist_optim::DistributedOptimizer opt(w(0), optim::SGDOptions{.lr = 0.1}, {p1, p2});
  test::TempDir dir("gradwire-dist-optim-early");
  trace::clear();
  trace::start(dir.path().string());
  std::string last_seen;
  {
    da::Context ctx(w(0));
    Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
    Tensor a = w(0).rpc_sync<Tensor>("w1", "scaled", p1, x);
    Tensor b = w(0).rpc_sync<Tensor>("w2", "scaled_held", p2, x);
    da::BackwardOptions options;
    options.on_last_part = [gate, &last_seen](uint64_t, const rpc::WorkerInfo& last) mutable {
      last_seen = last.name;
      gate.try_set_value();
    };
    opt.backward_and_step(ctx.id(), {add(sum(a), sum(b))}, options);
  }
  trace::stop();
  trace::set_directory("");  // nothing written into the removed directory at exit
  const std::string file = (dir.path() / "trace.json").string();
  trace::write(file);
  EXPECT_EQ(last_seen, "w2");
  const nlohmann::json events = test::read_trace(file);
  const auto waited = test::trace_events(events, "dist_optim.wait_part");
  ASSERT_EQ(waited.size(), 1u) << events.dump();
  EXPECT_EQ(waited[0].at("args").at("caller"), 0);
  EXPECT_EQ(waited[0].at("args").at("error"), 0);
  EXPECT_EQ(test::trace_events(events, "dist_optim.owner_step").size(), 2u);
  const auto calls = test::trace_events(events, "dist_optim.backward_and_step");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].at("args").at("early"), 1);
  // d/dp sum(p * x) = x: one SGD step moves each by -0.1 x.
  expect_one_step(p1, start1, "p1");
  expect_one_step(p2, start2, "p2");
}

// A pass that fails in backward_and_step() moves no parameter, the owner that would have
// been stepped early (the one whose part fails last) included, and reports the pass's
// error; the next good step moves them.
TEST_F(DistOptim, BackwardAndStepAfterAFailedPassMovesNothing) {
  RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
  RRef<Tensor> p2 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
  const Tensor start1 = p1.to_here(), start2 = p2.to_here();
  dist_optim::DistributedOptimizer opt(w(0), optim::SGDOptions{.lr = 0.1}, {p1, p2});
  for (int attempt = 0; attempt < 3; ++attempt) {
    da::Context ctx(w(0));
    Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
    Tensor a = w(0).rpc_sync<Tensor>("w1", "scaled", p1, x);
    Tensor b = w(0).rpc_sync<Tensor>("w2", "scaled_then_fails", p2, x);
    try {
      opt.backward_and_step(ctx.id(), {add(sum(mul(a, a)), sum(b))});
      ADD_FAILURE() << "a failed pass stepped";
    } catch (const RemoteError& e) {
      EXPECT_EQ(e.worker(), "w2") << e.what();
      EXPECT_NE(std::string(e.what()).find("hook exploded"), std::string::npos) << e.what();
    }
  }
  expect_values(p1.to_here(), std::vector<double>(start1.data<double>(), start1.data<double>() + 4),
                "p1");
  expect_values(p2.to_here(), std::vector<double>(start2.data<double>(), start2.data<double>() + 4),
                "p2");
  remote_step(opt, p1, p2, /*fused=*/true);
  // d/dp2 sum(p2 * x) = x: one SGD step moves p2 by -0.1 x.
  expect_one_step(p2, start2, "p2");
}

// The early step waits on its owner for the owner's part, and a part may outlast the
// agents' rpc_timeout (a pass is bounded by its own deadline): the step's call is bounded by
// the pass's deadline instead, so it neither times out while the part computes nor moves
// the parameter after the trainer was told it failed. Here w1's part computes for three
// times the agents' 400 ms rpc_timeout.
TEST(DistOptimShortRpcTimeout, AnEarlyStepWaitsForAPartLongerThanRpcTimeout) {
  Registry reg;
  reg.def("make_param", [](int64_t seed) { return make_param(seed); });
  reg.def("scaled_slow", [](const RRef<Tensor>& p, const Tensor& x) {
    Tensor y = mul(*p.local_value(), x);
    y.register_hook([](const Tensor& g) {
      std::this_thread::sleep_for(1200ms);  // a node that computes for a while
      return g;
    });
    return y;
  });
  rpc::AgentOptions options = test::agent_options(reg);
  options.rpc_timeout = 400ms;
  test::Agents agents = test::start_agents(2, options);
  RpcAgent& w0 = *agents[0];
  RRef<Tensor> p = rref::remote<Tensor>(w0, "w1", "make_param", int64_t{1});
  const Tensor start = p.to_here();
  dist_optim::DistributedOptimizer opt(w0, optim::SGDOptions{.lr = 0.1}, {p});
  {
    da::Context ctx(w0);
    const Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
    Tensor a = w0.rpc_sync<Tensor>("w1", "scaled_slow", p, x);
    EXPECT_NO_THROW(opt.backward_and_step(ctx.id(), {sum(a)}, da::BackwardOptions{.timeout = 20s}));
  }
  // d/dp sum(p * x) = x: one SGD step of lr 0.1, once.
  const double x[] = {1, -2, 3, 0.5};
  Tensor got = p.to_here();
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_NEAR(got.data<double>()[i], start.data<double>()[i] - 0.1 * x[i], 1e-12) << i;
  test::shutdown_agents(agents);
}

TEST_F(DistOptim, AStepAfterAFailedPassThrowsAndMovesNothing) {
  RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
  RRef<Tensor> p2 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
  const Tensor start1 = p1.to_here(), start2 = p2.to_here();
  dist_optim::DistributedOptimizer opt(w(0), optim::SGDOptions{.lr = 0.1}, {p1, p2});
  {
    da::Context ctx(w(0));
    Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
    Tensor a = w(0).rpc_sync<Tensor>("w1", "scaled", p1, x);
    Tensor b = w(0).rpc_sync<Tensor>("w2", "scaled_then_fails", p2, x);
    EXPECT_THROW(da::backward(w(0), ctx.id(), {add(sum(mul(a, a)), sum(b))}), RemoteError);
    try {
      opt.step(ctx.id());
      ADD_FAILURE() << "a step used the gradients of a failed pass";
    } catch (const RemoteError& e) {
      EXPECT_NE(std::string(e.what()).find("last backward pass"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("hook exploded"), std::string::npos) << e.what();
    }
  }
  expect_values(p1.to_here(), std::vector<double>(start1.data<double>(), start1.data<double>() + 4),
                "p1");
  expect_values(p2.to_here(), std::vector<double>(start2.data<double>(), start2.data<double>() + 4),
                "p2");
  remote_step(opt, p1, p2);
  // d/dp2 sum(p2 * x) = x: one SGD step moves p2 by -0.1 x.
  expect_one_step(p2, start2, "p2");
}

// A weight used as W.transpose(0, 1) in a batched matmul gets its gradient in the context as
// the transposed view of a dense matrix (a product of two matrices, as in nn::Linear, now
// gives it contiguous: autograd's mm rule); the owner steps it in the parameter's layout. Every
// value after every step equals, bit for bit, the same training in one process with optim/'s
// optimizers (which read .grad), for float32 and float64, shapes with and without edges beyond
// whole 4x4 blocks and 32x32 tiles, and optimizers with state (so the buffer reused across steps is
// exercised).
TEST_F(DistOptim, TransposedWeightGradientsStepAsInOneProcess) {
  reg_.def("make_matrix", [](int64_t rows, int64_t cols, int64_t seed, int64_t f64) {
    Generator gen(static_cast<uint64_t>(seed));
    Tensor w = randn({rows, cols}, &gen);
    if (f64 != 0) w = w.to(kFloat64);
    w.set_requires_grad(true);
    return w;
  });
  reg_.def("project", [](const RRef<Tensor>& w, const Tensor& x) {
    return matmul(x.unsqueeze(0), w.local_value()->transpose(0, 1)).squeeze(0);
  });
  // Whether the context's gradient for `w` here has the layout the owner converts.
  reg_.def("gradient_is_transposed", [](const CallContext& ctx, int64_t context_id,
                                        const RRef<Tensor>& w) {
    const Tensor g =
        da::get_gradients(*ctx.agent(), static_cast<uint64_t>(context_id)).at(*w.local_value());
    return !g.is_contiguous() && g.stride(0) == 1 && g.stride(1) == g.size(0);
  });
  struct Case {
    int64_t rows, cols;
    bool f64;
  };
  const Case cases[] = {{5, 7, false}, {8, 12, false}, {37, 70, false}, {6, 9, true}};
  auto run = [&](const auto& options, const std::string& name) {
    for (const Case& c : cases) {
      const std::string what = name + " " + std::to_string(c.rows) + "x" + std::to_string(c.cols) +
                               (c.f64 ? " float64" : " float32");
      RRef<Tensor> weight = rref::remote<Tensor>(w(0), "w1", "make_matrix", c.rows, c.cols,
                                                 int64_t{7}, int64_t{c.f64});
      Tensor local = weight.to_here().detach().clone();
      local.set_requires_grad(true);
      dist_optim::DistributedOptimizer opt(w(0), options, {weight});
      auto one = optim::make_functional_optimizer(options);
      Generator gen(11);
      for (int step = 0; step < 3; ++step) {
        Tensor x = randn({3, c.cols}, &gen);
        if (c.f64) x = x.to(kFloat64);
        {
          da::Context ctx(w(0));
          Tensor y = w(0).rpc_sync<Tensor>("w1", "project", weight, x);
          da::backward(w(0), ctx.id(), {sum(mul(y, y))});
          EXPECT_TRUE(w(0).rpc_sync<bool>("w1", "gradient_is_transposed",
                                          static_cast<int64_t>(ctx.id()), weight))
              << what;
          opt.step(ctx.id());
        }
        local.set_grad(Tensor());
        Tensor y = matmul(x.unsqueeze(0), local.transpose(0, 1)).squeeze(0);
        sum(mul(y, y)).backward();
        {
          autograd::NoGradGuard no_grad;
          one->step({local}, {local.grad()});
        }
        const Tensor got = weight.to_here();
        ASSERT_EQ(got.sizes(), local.sizes()) << what;
        const Tensor a = got.contiguous(), b = local.detach().contiguous();
        ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
        EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0)
            << what << ": the values differ after step " << step + 1;
      }
    }
  };
  run(optim::SGDOptions{.lr = 0.01}, "SGD");
  run(optim::SGDOptions{.lr = 0.01, .momentum = 0.9, .weight_decay = 0.01}, "SGD momentum");
  run(optim::AdamOptions{.lr = 0.01}, "Adam");
}

TEST_F(DistOptim, StateSavesAndLoads) {
  RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
  RRef<Tensor> p2 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
  dist_optim::DistributedOptimizer opt(w(0), optim::AdamOptions{.lr = 0.01}, {p1, p2});
  remote_step(opt, p1, p2);
  const StateDict saved = opt.state_dict();
  bool has_w1 = false, has_w2 = false;
  for (const auto& [key, t] : saved) {
    has_w1 = has_w1 || key.rfind("w1/", 0) == 0;
    has_w2 = has_w2 || key.rfind("w2/", 0) == 0;
  }
  EXPECT_TRUE(has_w1 && has_w2);
  // Copies of the parameters as they are now, with a new optimizer given the saved state:
  // its next step is the one the first optimizer takes (Adam's second, not a first).
  RRef<Tensor> q1 = rref::remote<Tensor>(w(0), "w1", "copy_param", p1.to_here());
  RRef<Tensor> q2 = rref::remote<Tensor>(w(0), "w2", "copy_param", p2.to_here());
  dist_optim::DistributedOptimizer resumed(w(0), optim::AdamOptions{.lr = 0.5}, {q1, q2});
  resumed.load_state_dict(saved);
  remote_step(opt, p1, p2);
  remote_step(resumed, q1, q2);
  for (auto [a, b] : {std::pair{p1, q1}, std::pair{p2, q2}}) {
    Tensor x = a.to_here(), y = b.to_here();
    for (int64_t i = 0; i < 4; ++i)
      EXPECT_NEAR(x.data<double>()[i], y.data<double>()[i], 1e-12) << i;
  }
  EXPECT_THROW(opt.load_state_dict({}), InvalidArgument);
}

TEST_F(DistOptim, ErrorsNameWhatWasWrong) {
  EXPECT_THROW(dist_optim::DistributedOptimizer(w(0), optim::SGDOptions{.lr = 0.1}, {}),
               InvalidArgument);
  EXPECT_THROW(dist_optim::DistributedOptimizer(w(0), optim::SGDOptions{.lr = -1}, {}),
               InvalidArgument);
  RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
  dist_optim::DistributedOptimizer opt(w(0), optim::SGDOptions{.lr = 0.1}, {p1});
  // A context the owner never saw: its InvalidArgument, from the owner.
  try {
    opt.step(12345);
    ADD_FAILURE() << "no error";
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.worker(), "w1");
    EXPECT_EQ(e.remote_type(), "InvalidArgument");
    EXPECT_NE(std::string(e.what()).find("no context"), std::string::npos) << e.what();
  }
  // A dead owner at step.
  w(1).shutdown(false);
  try {
    opt.step(12345);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("w1"), std::string::npos) << e.what();
  }
  agents_[1].reset();
  agents_.erase(agents_.begin() + 1);
  for (auto& a : agents_)
    a->shutdown(false);
  agents_.clear();
}

// The parameter-server pattern as processes: w1 and w2 own the parameters, w0 trains them
// through remote calls, and the values every step leaves equal PyTorch's.
TEST(DistOptimProcesses, TrainingAcrossProcessesMatchesPyTorch) {
  Registry reg;
  reg.def("make_param", [](int64_t seed) { return make_param(seed); });
  reg.def("scaled",
          [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
  const Fixture want = read_fixture("adam");
  test::RankResults results = test::run_agent_processes(
      "dist-optim", 3, test::agent_options(reg), [&](int rank, c10d::Store&, RpcAgent& agent) {
        if (rank == 0) {
          RRef<Tensor> p1 = rref::remote<Tensor>(agent, "w1", "make_param", int64_t{1});
          RRef<Tensor> p2 = rref::remote<Tensor>(agent, "w2", "make_param", int64_t{2});
          dist_optim::DistributedOptimizer opt(agent, optim::AdamOptions{.lr = 0.01}, {p1, p2});
          for (size_t s = 0; s < want.values.size(); ++s) {
            da::Context ctx(agent);
            Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
            Tensor a = agent.rpc_sync<Tensor>("w1", "scaled", p1, x);
            Tensor b = agent.rpc_sync<Tensor>("w2", "scaled", p2, x);
            da::backward(agent, ctx.id(), {add(sum(mul(a, a)), sum(b))});
            opt.step(ctx.id());
          }
          const auto& last = want.values.back();
          expect_values(p1.to_here(), last[0], "p1");
          expect_values(p2.to_here(), last[1], "p2");
        }
        agent.shutdown();
      });
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace
}  // namespace gradwire
