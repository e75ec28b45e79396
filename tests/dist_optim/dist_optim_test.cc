// dist_optim/: DistributedOptimizer over parameters owned by two workers, stepped by a
// trainer through dist_autograd contexts. Each optimizer's result is checked against optim/'s
// own step on the same gradients, computed in one process (float64, 1e-12).
#include "gradwire/dist_optim/distributed_optimizer.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/autograd/engine.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/optim/adagrad.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/zero_grad.h"
#include "support/agents.h"
#include "support/harness.h"

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

// The loss both ways: sum((p1 * x)^2) + sum(p2 * x) with x = [1, -2, 3, 0.5]; `p3` takes
// no part, so it gets no gradient.
Tensor loss_of(const Tensor& p1, const Tensor& p2) {
  Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
  Tensor a = mul(p1, x);
  return add(sum(mul(a, a)), sum(mul(p2, x)));
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
    agents_ = test::start_agents(3, test::agent_options(reg_));
  }
  void TearDown() override {
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }

  // One training step through remote parameters on w1 and w2, driven by w0.
  void remote_step(dist_optim::DistributedOptimizer& opt, const RRef<Tensor>& p1,
                   const RRef<Tensor>& p2) {
    da::Context ctx(w(0));
    Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
    Tensor a = w(0).rpc_sync<Tensor>("w1", "scaled", p1, x);
    Tensor b = w(0).rpc_sync<Tensor>("w2", "scaled", p2, x);
    da::backward(w(0), ctx.id(), {add(sum(mul(a, a)), sum(b))});
    opt.step(ctx.id());
  }

  template <typename Options>
  void check_against_local(const Options& options, int steps) {
    RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
    RRef<Tensor> p2 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
    RRef<Tensor> p3 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{3});
    dist_optim::DistributedOptimizer opt(w(0), options, {p1, p2, p3});
    EXPECT_EQ(opt.num_owners(), 2u);
    // The same in one process, with optim/'s functional optimizer.
    Tensor l1 = make_param(1), l2 = make_param(2), l3 = make_param(3);
    auto local = optim::make_functional_optimizer(options);
    for (int s = 0; s < steps; ++s) {
      remote_step(opt, p1, p2);
      autograd::backward({loss_of(l1, l2)});
      local->step({l1, l2, l3}, {l1.grad(), l2.grad(), Tensor()});
      zero_grad({l1, l2});
    }
    const std::vector<std::pair<RRef<Tensor>, Tensor>> pairs{{p1, l1}, {p2, l2}, {p3, l3}};
    for (const auto& [remote, expected] : pairs) {
      const Tensor got = remote.to_here();
      const Tensor& want = expected;
      for (int64_t i = 0; i < 4; ++i)
        EXPECT_NEAR(got.data<double>()[i], want.data<double>()[i], 1e-12) << i;
    }
  }

  Registry reg_;
  test::Agents agents_;
};

TEST_F(DistOptim, SgdWithMomentumNesterovAndWeightDecayMatchesOptim) {
  check_against_local(
      optim::SGDOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true}, 3);
}

TEST_F(DistOptim, AdamAdamWAndAdagradMatchOptim) {
  check_against_local(optim::AdamOptions{.lr = 0.01}, 3);
  check_against_local(optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.1}, 3);
  check_against_local(optim::AdagradOptions{.lr = 0.1}, 3);
}

TEST_F(DistOptim, TwoTrainersStepTheSameParametersConcurrently) {
  RRef<Tensor> p1 = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
  RRef<Tensor> p2 = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
  const Tensor start1 = p1.to_here(), start2 = p2.to_here();
  // Plain SGD steps commute: two trainers' 10 steps each end where 20 steps of the summed
  // gradients would, whatever the interleaving, only if no update is lost or torn.
  dist_optim::DistributedOptimizer a(w(0), optim::SGDOptions{.lr = 0.001}, {p1, p2});
  dist_optim::DistributedOptimizer b(w(0), optim::SGDOptions{.lr = 0.001}, {p1, p2});
  // The gradient of p2 is x whatever p2 is; each step moves p2 by -lr * x.
  std::vector<std::thread> trainers;
  for (auto* opt : {&a, &b}) {
    trainers.emplace_back([&, opt] {
      for (int s = 0; s < 10; ++s) {
        da::Context ctx(w(0));
        Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
        Tensor y = w(0).rpc_sync<Tensor>("w2", "scaled", p2, x);
        da::backward(w(0), ctx.id(), {sum(y)});
        opt->step(ctx.id());
      }
    });
  }
  for (auto& t : trainers)
    t.join();
  Tensor got = p2.to_here();
  const double x[] = {1, -2, 3, 0.5};
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_NEAR(got.data<double>()[i], start2.data<double>()[i] - 20 * 0.001 * x[i], 1e-12);
  // p1 took no part: unchanged.
  Tensor same = p1.to_here();
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_EQ(same.data<double>()[i], start1.data<double>()[i]);
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
// through remote calls, and the values every process ends with equal optim/'s local run.
TEST(DistOptimProcesses, TrainingAcrossProcessesEqualsTheLocalRun) {
  Registry reg;
  reg.def("make_param", [](int64_t seed) { return make_param(seed); });
  reg.def("scaled",
          [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
  // The expected values, computed here: 4 Adam steps of the same loss.
  Tensor l1 = make_param(1), l2 = make_param(2);
  auto local = optim::make_functional_optimizer(optim::AdamOptions{.lr = 0.02});
  for (int s = 0; s < 4; ++s) {
    autograd::backward({loss_of(l1, l2)});
    local->step({l1, l2}, {l1.grad(), l2.grad()});
    zero_grad({l1, l2});
  }
  const std::vector<double> want1(l1.data<double>(), l1.data<double>() + 4);
  const std::vector<double> want2(l2.data<double>(), l2.data<double>() + 4);
  test::RankResults results = test::run_agent_processes(
      "dist-optim", 3, test::agent_options(reg), [&](int rank, c10d::Store&, RpcAgent& agent) {
        if (rank == 0) {
          RRef<Tensor> p1 = rref::remote<Tensor>(agent, "w1", "make_param", int64_t{1});
          RRef<Tensor> p2 = rref::remote<Tensor>(agent, "w2", "make_param", int64_t{2});
          dist_optim::DistributedOptimizer opt(agent, optim::AdamOptions{.lr = 0.02}, {p1, p2});
          for (int s = 0; s < 4; ++s) {
            da::Context ctx(agent);
            Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
            Tensor a = agent.rpc_sync<Tensor>("w1", "scaled", p1, x);
            Tensor b = agent.rpc_sync<Tensor>("w2", "scaled", p2, x);
            da::backward(agent, ctx.id(), {add(sum(mul(a, a)), sum(b))});
            opt.step(ctx.id());
          }
          Tensor got1 = p1.to_here(), got2 = p2.to_here();
          for (int64_t i = 0; i < 4; ++i) {
            EXPECT_NEAR(got1.data<double>()[i], want1[static_cast<size_t>(i)], 1e-12);
            EXPECT_NEAR(got2.data<double>()[i], want2[static_cast<size_t>(i)], 1e-12);
          }
        }
        agent.shutdown();
      });
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace
}  // namespace gradwire
