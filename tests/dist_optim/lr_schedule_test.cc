// DistributedOptimizer's learning rate: set_lr reaches every owner in one round, is checked
// before anything is sent, names an owner that is gone, and travels with the state; optim/'s
// schedules drive it, each step setting every owner's rate, so that a scheduled training
// through remote parameters equals the same training in one process (optim::SGD under the
// same schedule, whose rates are PyTorch's: tests/optim/lr_scheduler_test.cc), bit for bit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/lr_scheduler.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/error_text.h"

namespace gradwire {
namespace {

using rpc::Registry;
using rpc::RpcAgent;
using rref::RRef;
using ::testing::HasSubstr;
namespace da = dist_autograd;

Tensor make_param(int64_t seed) {
  std::vector<double> v;
  for (int64_t i = 0; i < 4; ++i)
    v.push_back(0.25 * static_cast<double>(seed + 1) - 0.1 * static_cast<double>(i));
  Tensor p = tensor(v);
  p.set_requires_grad(true);
  return p;
}

// The learning rate each owner's part of a DistributedOptimizer state dict holds.
std::vector<double> owner_lrs(dist_optim::DistributedOptimizer& opt) {
  std::vector<double> lrs;
  for (const auto& [key, t] : opt.state_dict()) {
    if (key.size() > 9 && key.compare(key.size() - 9, 9, "/hyper.lr") == 0)
      lrs.push_back(t.item<double>());
  }
  return lrs;
}

class LrDistributed : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("make_param", [](int64_t seed) { return make_param(seed); });
    reg_.def("scaled",
             [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
    agents_ = test::start_agents(3, test::agent_options(reg_));
    p1_ = rref::remote<Tensor>(w(0), "w1", "make_param", int64_t{1});
    p2_ = rref::remote<Tensor>(w(0), "w2", "make_param", int64_t{2});
  }
  void TearDown() override {
    p1_ = RRef<Tensor>();
    p2_ = RRef<Tensor>();
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }

  Registry reg_;
  test::Agents agents_;
  RRef<Tensor> p1_, p2_;
};

TEST_F(LrDistributed, SetLrReachesEveryOwner) {
  dist_optim::DistributedOptimizer opt(w(0), optim::SGDOptions{.lr = 0.05, .momentum = 0.9},
                                       {p1_, p2_});
  EXPECT_EQ(opt.lr(), 0.05);
  EXPECT_EQ(owner_lrs(opt), (std::vector<double>{0.05, 0.05}));
  opt.set_lr(0.125);
  EXPECT_EQ(opt.lr(), 0.125);
  EXPECT_EQ(owner_lrs(opt), (std::vector<double>{0.125, 0.125}));
  // As an LrTarget: one group.
  optim::LrTarget& target = opt;
  EXPECT_EQ(target.num_lr_groups(), 1u);
  target.set_group_lrs({0.25});
  EXPECT_EQ(target.group_lr(0), 0.25);
  EXPECT_EQ(owner_lrs(opt), (std::vector<double>{0.25, 0.25}));
  EXPECT_THAT(test::error_text<InvalidArgument>([&] {
                target.set_group_lrs({0.1, 0.2});
              }),
              HasSubstr("2 learning rates for 1 group"));
  EXPECT_THAT(test::error_text<InvalidArgument>([&] { (void)target.group_lr(1); }),
              HasSubstr("no learning-rate group 1"));
}

// A bad rate is refused on the trainer, naming it, and no owner's changes.
TEST_F(LrDistributed, SetLrIsCheckedBeforeAnythingIsSent) {
  dist_optim::DistributedOptimizer opt(w(0), optim::AdamOptions{.lr = 0.01}, {p1_, p2_});
  EXPECT_THAT(test::error_text<InvalidArgument>([&] { opt.set_lr(-0.5); }),
              HasSubstr("dist_optim: set_lr: lr must be >= 0, got -0.5"));
  EXPECT_THAT(test::error_text<InvalidArgument>(
                  [&] { opt.set_lr(std::numeric_limits<double>::quiet_NaN()); }),
              HasSubstr("lr must be >= 0, got nan"));
  EXPECT_EQ(opt.lr(), 0.01);
  EXPECT_EQ(owner_lrs(opt), (std::vector<double>{0.01, 0.01}));
}

// A schedule (warm-up then cosine) over a DistributedOptimizer: every step of the training
// through remote parameters equals optim::SGD's in one process under the same schedule,
// bit for bit, and each owner has the schedule's rate after each step.
TEST_F(LrDistributed, AScheduleDrivesEveryOwnerAsInOneProcess) {
  const optim::SGDOptions options{.lr = 0.1, .momentum = 0.9};
  dist_optim::DistributedOptimizer opt(w(0), options, {p1_, p2_});
  optim::SequentialLR sched(opt, optim::LinearLR(opt, 0.2, 1.0, 3),
                            optim::CosineAnnealingLR(opt, 9, 0.001), 3);
  Tensor q1 = p1_.to_here().detach().clone().set_requires_grad();
  Tensor q2 = p2_.to_here().detach().clone().set_requires_grad();
  optim::SGD local({q1, q2}, options);
  optim::SequentialLR local_sched(local, optim::LinearLR(local, 0.2, 1.0, 3),
                                  optim::CosineAnnealingLR(local, 9, 0.001), 3);
  EXPECT_EQ(opt.lr(), local.lr());
  const Tensor x = tensor(std::vector<double>{1, -2, 3, 0.5});
  for (int step = 1; step <= 8; ++step) {
    {
      da::Context ctx(w(0));
      Tensor a = w(0).rpc_sync<Tensor>("w1", "scaled", p1_, x);
      Tensor b = w(0).rpc_sync<Tensor>("w2", "scaled", p2_, x);
      da::backward(w(0), ctx.id(), {add(sum(mul(a, a)), sum(b))});
      opt.step(ctx.id());
    }
    local.zero_grad();
    Tensor a = mul(q1, x);
    add(sum(mul(a, a)), sum(mul(q2, x))).backward();
    local.step();
    sched.step();
    local_sched.step();
    const std::string where = "step " + std::to_string(step);
    EXPECT_EQ(sched.get_last_lr(), local_sched.get_last_lr()) << where;
    EXPECT_EQ(owner_lrs(opt), (std::vector<double>(2, local.lr()))) << where;
    for (auto [remote, here] : {std::pair{p1_, q1}, std::pair{p2_, q2}}) {
      const Tensor got = remote.to_here();
      EXPECT_EQ(std::memcmp(got.data_ptr(), here.data_ptr(), 4 * sizeof(double)), 0)
          << where << ": " << got.to_vector<double>()[0] << " vs " << here.to_vector<double>()[0];
    }
  }
}

// The rate travels with the state; owners whose saved rates differ are refused before
// anything is loaded.
TEST_F(LrDistributed, LoadStateDictBringsTheRate) {
  dist_optim::DistributedOptimizer opt(w(0), optim::SGDOptions{.lr = 0.3}, {p1_, p2_});
  opt.set_lr(0.07);
  const StateDict saved = opt.state_dict();
  dist_optim::DistributedOptimizer other(w(0), optim::SGDOptions{.lr = 0.5}, {p1_, p2_});
  other.load_state_dict(saved);
  EXPECT_EQ(other.lr(), 0.07);
  EXPECT_EQ(owner_lrs(other), (std::vector<double>{0.07, 0.07}));
  StateDict mixed = saved;
  for (auto& [key, t] : mixed) {
    if (key == "w2/hyper.lr") t = scalar_tensor(0.9, TensorOptions(kFloat64));
  }
  EXPECT_THAT(test::error_text<InvalidArgument>([&] { other.load_state_dict(mixed); }),
              HasSubstr("the owners' learning rates differ ('w1/hyper.lr' is 0.07, "
                        "'w2/hyper.lr' 0.9)"));
  EXPECT_EQ(owner_lrs(other), (std::vector<double>{0.07, 0.07}));
}

// An owner that is gone fails set_lr with an error naming it, after the other owner has
// answered; the trainer's rate stays the last one set everywhere, and a schedule's step
// that failed so leaves the schedule at its epoch.
TEST_F(LrDistributed, AnOwnerThatIsGoneIsNamed) {
  dist_optim::DistributedOptimizer opt(w(0), optim::SGDOptions{.lr = 0.1}, {p1_, p2_});
  optim::ExponentialLR sched(opt, 0.5);
  sched.step();
  EXPECT_EQ(opt.lr(), 0.05);
  p1_ = RRef<Tensor>();
  p2_ = RRef<Tensor>();
  w(1).shutdown(false);
  const std::string message = test::error_text<Error>([&] { opt.set_lr(0.01); });
  EXPECT_THAT(message, HasSubstr("w1"));
  EXPECT_EQ(opt.lr(), 0.05);
  EXPECT_THAT(test::error_text<Error>([&] { sched.step(); }), HasSubstr("w1"));
  EXPECT_EQ(sched.last_epoch(), 1);
  EXPECT_EQ(sched.get_last_lr(), std::vector<double>{0.05});
  agents_[1].reset();
  agents_.erase(agents_.begin() + 1);
  for (auto& a : agents_)
    a->shutdown(false);
  agents_.clear();
}

}  // namespace
}  // namespace gradwire
