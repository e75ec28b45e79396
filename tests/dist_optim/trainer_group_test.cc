// Trainer groups (dist_optim::TrainerGroup): trainers of one job share one optimizer per
// owner; server-side aggregation averages K trainers' gradients per update (with the
// linear learning-rate scaling when asked); bounded staleness holds a trainer that runs
// more than S steps ahead of the slowest; a member that leaves (or whose worker is lost)
// is no longer waited for; mismatched members and bad settings are refused by name.
// Three in-process agents: w0 owns the parameter, w1 and w2 train. The loss of trainer t is
// sum(p * x_t), so its gradient is x_t whatever p is: every expected value is worked out by
// hand from p0 and the x_t.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "support/eventually.h"

namespace gradwire {
namespace {

using rpc::Registry;
using rpc::RpcAgent;
using rref::RRef;
using ::testing::HasSubstr;
namespace da = dist_autograd;
using dist_optim::DistributedOptimizer;
using dist_optim::TrainerGroup;

const std::vector<double> kP0 = {1.0, 2.0, 3.0};
const std::vector<double> kX1 = {0.5, -1.0, 2.0};  // trainer w1's gradient
const std::vector<double> kX2 = {1.5, 1.0, -4.0};  // trainer w2's gradient

class TrainerGroups : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("param", [this](const rpc::CallContext& ctx) {
      return rref::make_local(*ctx.agent(), param_);
    });
    reg_.def("scaled",
             [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
    agents_ = test::start_agents(3, test::agent_options(reg_));
    fresh_param();
  }
  void TearDown() override {
    p_.clear();
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }

  // A new parameter p0 on w0, and each trainer's reference to it.
  void fresh_param() {
    param_ = tensor(kP0);
    param_.set_requires_grad(true);
    p_.assign(3, RRef<Tensor>());
    for (int r = 1; r <= 2; ++r)
      p_[static_cast<size_t>(r)] = w(r).rpc_sync<RRef<Tensor>>("w0", "param");
  }
  std::vector<RRef<Tensor>> params(int r) { return {p_[static_cast<size_t>(r)]}; }

  // One step of trainer `r` with gradient `x` (p's gradient in its context).
  void train_step(DistributedOptimizer& opt, int r, const std::vector<double>& x) {
    da::Context ctx(w(r));
    const Tensor y = w(r).rpc_sync<Tensor>("w0", "scaled", p_[static_cast<size_t>(r)], tensor(x));
    da::backward(w(r), ctx.id(), {sum(y)});
    opt.step(ctx.id());
  }
  // The same through backward_and_step (the owner's step sent while the pass runs).
  void train_step_early(DistributedOptimizer& opt, int r, const std::vector<double>& x) {
    da::Context ctx(w(r));
    const Tensor y = w(r).rpc_sync<Tensor>("w0", "scaled", p_[static_cast<size_t>(r)], tensor(x));
    opt.backward_and_step(ctx.id(), {sum(y)});
  }
  std::vector<double> param() { return param_.detach().to_vector<double>(); }

  Registry reg_;
  test::Agents agents_;
  Tensor param_;
  std::vector<RRef<Tensor>> p_;
};

std::vector<double> expect(double lr, const std::vector<std::vector<double>>& grads) {
  std::vector<double> p = kP0;
  for (const auto& g : grads)
    for (size_t i = 0; i < p.size(); ++i)
      p[i] -= lr * g[i];
  return p;
}

void expect_near(const std::vector<double>& got, const std::vector<double>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-12) << "element " << i;
}

TEST_F(TrainerGroups, MembersShareOneOptimizerPerOwner) {
  const TrainerGroup group{.name = "job", .trainers = 2};
  DistributedOptimizer a(w(1), optim::AdamOptions{.lr = 0.1}, params(1), group);
  DistributedOptimizer b(w(2), optim::AdamOptions{.lr = 0.1}, params(2), group);
  train_step(a, 1, kX1);
  train_step(b, 2, kX2);
  // One Adam state, stepped twice (private optimizers would each hold a step count of 1).
  for (DistributedOptimizer* opt : {&a, &b}) {
    int64_t step = -1;
    for (const auto& [key, t] : opt->state_dict())
      if (key == "w0/state.0.step") step = t.item<int64_t>();
    EXPECT_EQ(step, 2);
  }
  // set_lr on one member changes the group's optimizer.
  b.set_lr(0.25);
  for (const auto& [key, t] : a.state_dict()) {
    if (key == "w0/hyper.lr") {
      EXPECT_EQ(t.item<double>(), 0.25);
    }
  }
}

TEST_F(TrainerGroups, AggregationAveragesKGradientsPerUpdate) {
  for (const auto scaling : {dist_optim::LrScaling::kNone, dist_optim::LrScaling::kLinear}) {
    fresh_param();
    const TrainerGroup group{.name = scaling == dist_optim::LrScaling::kNone ? "avg" : "linear",
                             .trainers = 2,
                             .aggregate = 2,
                             .lr_scaling = scaling};
    DistributedOptimizer a(w(1), optim::SGDOptions{.lr = 0.1}, params(1), group);
    DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.1}, params(2), group);
    // w1's step is answered only once w2's gradient has joined it in one update.
    auto first = std::async(std::launch::async, [&] { train_step(a, 1, kX1); });
    train_step(b, 2, kX2);
    first.get();
    std::vector<double> mean(3);
    for (size_t i = 0; i < 3; ++i)
      mean[i] = (kX1[i] + kX2[i]) / 2;
    expect_near(param(), expect(scaling == dist_optim::LrScaling::kNone ? 0.1 : 0.2, {mean}));
  }
}

TEST_F(TrainerGroups, StalenessBoundHoldsTheTrainerThatRunsAhead) {
  const TrainerGroup group{.name = "bounded", .trainers = 2, .max_staleness = 1};
  DistributedOptimizer a(w(1), optim::SGDOptions{.lr = 0.1}, params(1), group);
  DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.1}, params(2), group);
  train_step(a, 1, kX1);  // w1 at 1, w2 at 0: one ahead, allowed
  // A second step would put w1 two ahead: its update is applied, its answer held.
  auto second = std::async(std::launch::async, [&] { train_step(a, 1, kX1); });
  EXPECT_EQ(second.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  train_step(b, 2, kX2);  // w2 reaches 1: w1 may go on
  second.get();
  expect_near(param(), expect(0.1, {kX1, kX1, kX2}));
}

TEST_F(TrainerGroups, SynchronousGroupIsDataParallelSgd) {
  // S = 0, K = trainers: each update is the mean of both trainers' gradients, and neither
  // trainer starts a step before the other has finished the last.
  const TrainerGroup group{.name = "sync", .trainers = 2, .max_staleness = 0, .aggregate = 2};
  DistributedOptimizer a(w(1), optim::SGDOptions{.lr = 0.1}, params(1), group);
  DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.1}, params(2), group);
  // w1 steps through backward_and_step: its gradient reaches the group during its pass.
  auto w1 = std::async(std::launch::async, [&] {
    for (int k = 0; k < 3; ++k)
      train_step_early(a, 1, kX1);
  });
  for (int k = 0; k < 3; ++k)
    train_step(b, 2, kX2);
  w1.get();
  std::vector<double> mean(3);
  for (size_t i = 0; i < 3; ++i)
    mean[i] = (kX1[i] + kX2[i]) / 2;
  expect_near(param(), expect(0.1, {mean, mean, mean}));
}

TEST_F(TrainerGroups, AMemberThatLeavesIsNotWaitedFor) {
  const TrainerGroup group{.name = "leaving", .trainers = 2, .max_staleness = 0, .aggregate = 2};
  DistributedOptimizer a(w(1), optim::SGDOptions{.lr = 0.1}, params(1), group);
  auto b =
      std::make_unique<DistributedOptimizer>(w(2), optim::SGDOptions{.lr = 0.1}, params(2), group);
  // w1's gradient waits for a partner; w2 leaving applies it alone and lets w1 go on.
  auto first = std::async(std::launch::async, [&] { train_step(a, 1, kX1); });
  EXPECT_EQ(first.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  b->leave();
  first.get();
  train_step(a, 1, kX2);  // alone from now on
  expect_near(param(), expect(0.1, {kX1, kX2}));
  EXPECT_THAT(test::error_text<InvalidArgument>([&] { train_step(*b, 2, kX2); }),
              HasSubstr("step after leaving trainer group 'leaving'"));
  b.reset();  // destroying a member that left sends nothing more
}

TEST_F(TrainerGroups, AMemberWhoseWorkerIsLostLeavesByItself) {
  const TrainerGroup group{.name = "lost", .trainers = 2, .max_staleness = 0, .aggregate = 2};
  DistributedOptimizer a(w(1), optim::SGDOptions{.lr = 0.1}, params(1), group);
  auto b =
      std::make_unique<DistributedOptimizer>(w(2), optim::SGDOptions{.lr = 0.1}, params(2), group);
  auto first = std::async(std::launch::async, [&] { train_step(a, 1, kX1); });
  // w2 goes away without a word: the owner hears of the loss and stops waiting for it.
  std::shared_ptr<RpcAgent> gone = agents_[2];
  agents_.erase(agents_.begin() + 2);
  p_[2] = RRef<Tensor>();
  gone->shutdown(/*graceful=*/false);
  first.get();
  expect_near(param(), expect(0.1, {kX1}));
  b.reset();  // its leave cannot be sent; that is logged, not thrown
  // A group that lost a worker cannot shut down gracefully (w2 never agrees): end it.
  p_.clear();
  for (const auto& agent : agents_)
    agent->shutdown(/*graceful=*/false);
  agents_.clear();
}

TEST_F(TrainerGroups, MismatchedMembersAndBadSettingsAreRefused) {
  const TrainerGroup group{.name = "strict", .trainers = 2, .max_staleness = 2};
  DistributedOptimizer a(w(1), optim::SGDOptions{.lr = 0.1}, params(1), group);
  TrainerGroup other = group;
  other.max_staleness = 3;
  EXPECT_THAT(
      test::error_text<RemoteError>(
          [&] { DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.1}, params(2), other); }),
      HasSubstr("w2 cannot join trainer group 'strict' on 'w0' (rank 0): max_staleness 2 vs 3"));
  EXPECT_THAT(test::error_text<RemoteError>([&] {
                DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.2}, params(2), group);
              }),
              HasSubstr("the optimizers differ in 'hyper.lr'"));
  EXPECT_THAT(
      test::error_text<InvalidArgument>([&] {
        DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.1}, params(2),
                               TrainerGroup{.name = "x", .trainers = 2, .aggregate = 3});
      }),
      HasSubstr(
          "aggregate must be in [1, trainers = 2] (or 0: every member of the moment), got 3"));
  EXPECT_THAT(test::error_text<InvalidArgument>([&] {
                DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.1}, params(2),
                                       TrainerGroup{.name = "", .trainers = 2});
              }),
              HasSubstr("a TrainerGroup needs a name"));
  EXPECT_THAT(test::error_text<InvalidArgument>([&] {
                DistributedOptimizer b(w(2), optim::SGDOptions{.lr = 0.1}, params(2),
                                       TrainerGroup{.name = "y", .max_staleness = -2});
              }),
              HasSubstr("max_staleness must be >= 0 (or -1: unbounded), got -2"));
}

}  // namespace
}  // namespace gradwire

namespace gradwire {
namespace {

// Three trainers (w1, w2, w3) in a synchronous group that averages every member of the moment
// (aggregate 0). w3 steps and is then lost: its gradient stays in the round, but the round
// closes only once both members still there have stepped, so neither waits alone for a
// partner that will never come.
TEST(TrainerGroupLoss, ALostMembersGradientDoesNotCloseTheRoundForALiveOne) {
  rpc::Registry reg;
  Tensor param = tensor(kP0);
  param.set_requires_grad(true);
  reg.def("param",
          [&param](const rpc::CallContext& ctx) { return rref::make_local(*ctx.agent(), param); });
  reg.def("scaled",
          [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
  test::Agents agents = test::start_agents(4, test::agent_options(reg));
  std::vector<RRef<Tensor>> refs(4);
  for (int r = 1; r <= 3; ++r)
    refs[static_cast<size_t>(r)] =
        agents[static_cast<size_t>(r)]->rpc_sync<RRef<Tensor>>("w0", "param");
  const TrainerGroup group{.name = "three", .trainers = 3, .max_staleness = 0, .aggregate = 0};
  std::vector<std::unique_ptr<DistributedOptimizer>> opts(4);
  for (int r = 1; r <= 3; ++r)
    opts[static_cast<size_t>(r)] = std::make_unique<DistributedOptimizer>(
        *agents[static_cast<size_t>(r)], optim::SGDOptions{.lr = 0.1},
        std::vector<RRef<Tensor>>{refs[static_cast<size_t>(r)]}, group);
  auto step = [&](int r, const std::vector<double>& x) {
    RpcAgent& a = *agents[static_cast<size_t>(r)];
    da::Context ctx(a);
    const Tensor y = a.rpc_sync<Tensor>("w0", "scaled", refs[static_cast<size_t>(r)], tensor(x));
    da::backward(a, ctx.id(), {sum(y)});
    opts[static_cast<size_t>(r)]->step(ctx.id());
  };
  const std::vector<double> x3 = {-2.0, 0.5, 1.0};
  // w3 steps, then w1: each waits for the round (it needs all three), whose gathered
  // gradients the owner counts.
  auto pending = [&](int64_t n) {
    return testing::eventually(
        [&] { return dist_optim::trainer_group_stats(*agents[0], "three").pending == n; },
        std::chrono::seconds(10));
  };
  auto third = std::async(std::launch::async, [&] {
    try {
      step(3, x3);
    } catch (const std::exception&) {
      // its worker is shut down under it
    }
  });
  ASSERT_TRUE(pending(1));
  auto first = std::async(std::launch::async, [&] { step(1, kX1); });
  ASSERT_TRUE(pending(2));
  // Then w3's worker goes away without a word.
  std::shared_ptr<RpcAgent> gone = agents[3];
  refs[3] = RRef<Tensor>();
  gone->shutdown(/*graceful=*/false);
  third.get();
  opts[3].reset();
  // w2 steps: the round holds both live members' gradients now, and w3's, and closes.
  step(2, kX2);
  first.get();
  std::vector<double> mean(3);
  for (size_t i = 0; i < 3; ++i)
    mean[i] = (kX1[i] + kX2[i] + x3[i]) / 3;
  std::vector<double> got = param.detach().to_vector<double>();
  std::vector<double> want = expect(0.1, {mean});
  for (size_t i = 0; i < 3; ++i)
    EXPECT_NEAR(got[i], want[i], 1e-12) << "element " << i;
  const dist_optim::TrainerGroupStats after = dist_optim::trainer_group_stats(*agents[0], "three");
  EXPECT_EQ(after.members, 3);
  EXPECT_EQ(after.active, 2);
  EXPECT_EQ(after.updates, 1);
  EXPECT_THAT(test::error_text<InvalidArgument>(
                  [&] { dist_optim::trainer_group_stats(*agents[0], "none"); }),
              HasSubstr("holds no trainer group 'none'"));
  // And they go on together.
  auto again = std::async(std::launch::async, [&] { step(1, kX1); });
  step(2, kX2);
  again.get();
  opts.clear();
  refs.clear();
  agents.pop_back();
  for (const auto& agent : agents)
    agent->shutdown(/*graceful=*/false);
}

}  // namespace
}  // namespace gradwire
