// A parameter server's shard saved in the background (dist_optim::ShardCheckpointer) and
// restored, and a trainer's recovery helper (dist_optim::ServerFailover) on its own.
// Three in-process agents: w0 owns the parameter p, w1 and w2 train it. The loss of a step
// is sum(p * x), so every gradient is x: an update count says exactly what p and the
// optimizer's state must be, and a local optimizer replaying that many steps gives them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <string>
#include <vector>

#include "gradwire/checkpoint/checkpoint.h"
#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/dist_optim/failover.h"
#include "gradwire/dist_optim/shard_checkpoint.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/error_text.h"
#include "support/eventually.h"
#include "support/log_capture.h"
#include "support/temp_dir.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using dist_optim::DistributedOptimizer;
using dist_optim::ShardCheckpointer;
using dist_optim::ShardCheckpointOptions;
using dist_optim::TrainerGroup;
using rpc::RpcAgent;
using rref::RRef;
using ::testing::HasSubstr;
namespace da = dist_autograd;

constexpr int64_t kSize = 4096;
const optim::AdamOptions kAdam{.lr = 0.01};

Tensor initial() {
  return mul(arange(0, kSize, 1, kFloat64), 0.001);
}
Tensor gradient() {
  return add(mul(arange(0, kSize, 1, kFloat64), -0.002), 1.5);
}

class ShardCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("param", [this](const rpc::CallContext& ctx) {
      return rref::make_local(*ctx.agent(), param_);
    });
    reg_.def("scaled",
             [](const RRef<Tensor>& p, const Tensor& x) { return mul(*p.local_value(), x); });
    agents_ = test::start_agents(3, test::agent_options(reg_));
    param_ = initial();
    param_.set_requires_grad(true);
  }
  void TearDown() override {
    if (!agents_.empty()) test::shutdown_agents(agents_);
  }
  RpcAgent& w(int r) { return *agents_[static_cast<size_t>(r)]; }
  StateDict named() { return {{"p", param_}}; }
  ShardCheckpointOptions options(const std::string& group = "job") {
    return ShardCheckpointOptions{
        .dir = tmp_.path().string(), .every = std::chrono::duration<double>(0.02), .group = group};
  }
  // One step of trainer `r`: p's gradient is gradient().
  void train_step(DistributedOptimizer& opt, int r) {
    const RRef<Tensor> p = opt_params_.at(&opt);
    da::Context ctx(w(r));
    const Tensor y = w(r).rpc_sync<Tensor>("w0", "scaled", p, gradient());
    opt.backward_and_step(ctx.id(), {sum(y)});
  }
  std::unique_ptr<DistributedOptimizer> trainer(int r, const TrainerGroup& group) {
    const RRef<Tensor> p = w(r).rpc_sync<RRef<Tensor>>("w0", "param");
    auto opt =
        std::make_unique<DistributedOptimizer>(w(r), kAdam, std::vector<RRef<Tensor>>{p}, group);
    opt_params_[opt.get()] = p;
    return opt;
  }

  rpc::Registry reg_;
  test::Agents agents_;
  Tensor param_;
  std::map<const DistributedOptimizer*, RRef<Tensor>> opt_params_;
  test::TempDir tmp_{"gradwire-shard-checkpoint"};
};

// p and Adam's state after `n` updates with gradient(), from initial().
struct Replay {
  Tensor p = initial();
  std::unique_ptr<optim::FunctionalOptimizer> opt = optim::make_functional_optimizer(kAdam);
  int64_t n = 0;
  void advance_to(int64_t target) {
    for (; n < target; ++n)
      opt->step({p}, {gradient()});
  }
};

const checkpoint::Piece& piece(const std::vector<checkpoint::Piece>& pieces,
                               const std::string& name) {
  for (const auto& p : pieces)
    if (p.name == name) return p;
  throw std::runtime_error("no piece " + name);
}

// Each snapshot holds p and Adam's state exactly as `replay` has them after its count.
void expect_whole_updates(const checkpoint::ShardState& state, Replay& replay) {
  const int64_t n = state.counters.at("updates");
  replay.advance_to(n);
  EXPECT_TRUE(equal(piece(state.params, "p").value, replay.p)) << "after " << n << " updates";
  if (n == 0) return;
  EXPECT_EQ(state.optimizer_kind, "Adam");
  for (const auto& [key, t] : replay.opt->state_dict()) {
    if (key.rfind("state.0.", 0) != 0) continue;
    EXPECT_TRUE(equal(piece(state.optimizer, "p/" + key.substr(8)).value, t))
        << key << " after " << n << " updates";
  }
}

TEST_F(ShardCheckpoint, EverySnapshotHoldsTheStateAfterAWholeNumberOfUpdates) {
  // Two asynchronous trainers step one shared Adam as fast as they can while snapshots are
  // taken: each must be the state after some whole number of updates, never between two.
  const TrainerGroup group{.name = "job", .trainers = 2, .max_staleness = -1, .aggregate = 1};
  ShardCheckpointer ckpt(w(0), named(), options());
  auto a = trainer(1, group);
  auto b = trainer(2, group);
  constexpr int kSteps = 60;
  auto run = [&](DistributedOptimizer& opt, int r) {
    for (int k = 0; k < kSteps; ++k)
      train_step(opt, r);
  };
  auto first = std::async(std::launch::async, run, std::ref(*a), 1);
  auto second = std::async(std::launch::async, run, std::ref(*b), 2);
  std::vector<checkpoint::ShardState> states;
  while (first.wait_for(0s) != std::future_status::ready ||
         second.wait_for(0s) != std::future_status::ready) {
    states.push_back(ckpt.capture());
  }
  first.get();
  second.get();
  states.push_back(ckpt.capture());
  std::sort(states.begin(), states.end(), [](const auto& x, const auto& y) {
    return x.counters.at("updates") < y.counters.at("updates");
  });
  Replay replay;
  for (const auto& state : states)
    expect_whole_updates(state, replay);
  EXPECT_EQ(states.back().counters.at("updates"), 2 * kSteps);
  // What is written is what was captured: the snapshot read back holds the same.
  const dist_optim::SnapshotInfo info = ckpt.snapshot_now();
  EXPECT_EQ(info.updates, 2 * kSteps);
  const auto back = checkpoint::read_latest(tmp_.path().string(), "w0");
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->seq, info.seq);
  expect_whole_updates(back->state, replay);
}

TEST_F(ShardCheckpoint, KeepsTheLastKSnapshotsWrittenInTheBackground) {
  const TrainerGroup group{.name = "job", .trainers = 1};
  ShardCheckpointOptions o = options();
  o.keep_last = 2;
  std::atomic<int> written{0};
  o.on_written = [&](const dist_optim::SnapshotInfo&) { ++written; };
  ShardCheckpointer ckpt(w(0), named(), o);
  auto a = trainer(1, group);
  ckpt.start();
  // Training goes on while snapshots are written.
  int steps = 0;
  ASSERT_TRUE(testing::eventually([&] {
    train_step(*a, 1);
    ++steps;
    return written.load() >= 5;
  }));
  ckpt.stop();
  const dist_optim::CheckpointerStats stats = ckpt.stats();
  EXPECT_GE(stats.written, 5);
  EXPECT_EQ(stats.failed, 0);
  ASSERT_TRUE(stats.last.has_value());
  std::vector<int64_t> seqs;
  for (const auto& entry : std::filesystem::directory_iterator(tmp_.path() / "w0"))
    seqs.push_back(std::stoll(entry.path().filename().string()));
  std::sort(seqs.begin(), seqs.end());
  EXPECT_EQ(seqs, (std::vector<int64_t>{stats.last->seq - 1, stats.last->seq}));
  const auto newest = checkpoint::read_latest(tmp_.path().string(), "w0");
  ASSERT_TRUE(newest.has_value());
  EXPECT_EQ(newest->seq, stats.last->seq);
  EXPECT_EQ(newest->state.counters.at("updates"), stats.last->updates);
  EXPECT_LE(stats.last->updates, steps);
}

TEST_F(ShardCheckpoint, AFailedWriteIsLoggedRetriedAndTrainingGoesOn) {
  // A directory that cannot be made (its parent is a file), whoever runs the test.
  const std::filesystem::path file = tmp_.path() / "not-a-directory";
  std::ofstream(file) << "x";
  ShardCheckpointOptions o = options();
  o.dir = (file / "ckpt").string();
  ShardCheckpointer ckpt(w(0), named(), o);
  auto a = trainer(1, TrainerGroup{.name = "job", .trainers = 1});
  test::LogCapture log(2);
  ckpt.start();
  // Two failed intervals, and the trainer steps meanwhile.
  ASSERT_TRUE(testing::eventually([&] {
    train_step(*a, 1);
    return ckpt.stats().failed >= 2;
  }));
  ASSERT_TRUE(log.wait_for_errors(10s));
  train_step(*a, 1);
  ckpt.stop();
  const dist_optim::CheckpointerStats stats = ckpt.stats();
  EXPECT_EQ(stats.written, 0);
  EXPECT_THAT(stats.last_error, HasSubstr(file.string()));
  bool logged = false;
  for (const std::string& line : log.lines())
    logged = logged || (line.find("snapshot of shard 'w0'") != std::string::npos &&
                        line.find("training goes on") != std::string::npos);
  EXPECT_TRUE(logged);
}

TEST_F(ShardCheckpoint, RestoreWithNoSnapshotStartsFresh) {
  ShardCheckpointer ckpt(w(0), named(), options());
  EXPECT_FALSE(ckpt.restore().has_value());
  EXPECT_TRUE(equal(param_.detach(), initial()));
  auto a = trainer(1, TrainerGroup{.name = "job", .trainers = 1});
  train_step(*a, 1);
  Replay replay;
  replay.advance_to(1);
  EXPECT_TRUE(equal(param_.detach(), replay.p));  // a fresh Adam's first step
  EXPECT_EQ(ckpt.snapshot_now().seq, 1);
}

TEST_F(ShardCheckpoint, RestoreLoadsTheParametersAndTheGroupsOptimizerWhenItIsMade) {
  {
    ShardCheckpointer ckpt(w(0), named(), options());
    auto a = trainer(1, TrainerGroup{.name = "job", .trainers = 1});
    for (int k = 0; k < 3; ++k)
      train_step(*a, 1);
    EXPECT_EQ(ckpt.snapshot_now().updates, 3);
    train_step(*a, 1);  // after the snapshot: lost
  }
  // A fresh shard (as a restarted server makes it) and a group not made yet.
  param_ = initial();
  param_.set_requires_grad(true);
  ShardCheckpointer ckpt(w(0), named(), options("again"));
  const auto restored = ckpt.restore();
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->seq, 1);
  EXPECT_EQ(restored->updates, 3);
  Replay replay;
  replay.advance_to(3);
  EXPECT_TRUE(equal(param_.detach(), replay.p));
  // The group's first member gets the saved Adam state: its next step is the fourth.
  auto b = trainer(2, TrainerGroup{.name = "again", .trainers = 1});
  train_step(*b, 2);
  replay.advance_to(4);
  EXPECT_TRUE(equal(param_.detach(), replay.p));
  // New snapshots follow the restored one.
  const dist_optim::SnapshotInfo next = ckpt.snapshot_now();
  EXPECT_EQ(next.seq, 2);
  EXPECT_EQ(next.updates, 4);
}

TEST_F(ShardCheckpoint, RestoreRefusesASnapshotThatDoesNotFitAndLoadsNothing) {
  {
    ShardCheckpointer ckpt(w(0), named(), options());
    ckpt.snapshot_now();
  }
  const Tensor wide = zeros({kSize + 1}, kFloat64);
  ShardCheckpointer other_shape(w(0), {{"p", wide}}, options());
  std::string text = test::error_text<InvalidArgument>([&] { other_shape.restore(); });
  EXPECT_THAT(text, HasSubstr("parameter 'p'"));
  EXPECT_THAT(text, HasSubstr((tmp_.path() / "w0").string()));
  EXPECT_TRUE(equal(wide, zeros({kSize + 1}, kFloat64)));

  const Tensor q = zeros({2}, kFloat64);
  ShardCheckpointer extra(w(0), {{"p", param_}, {"q", q}}, options());
  text = test::error_text<InvalidArgument>([&] { extra.restore(); });
  EXPECT_THAT(text, HasSubstr("no parameter 'q'"));
  EXPECT_THAT(text, HasSubstr("nothing was restored"));

  EXPECT_THAT(test::error_text<InvalidArgument>([&] {
                ShardCheckpointer(w(0), named(), ShardCheckpointOptions{.dir = "x", .every = 0s});
              }),
              HasSubstr("every must be > 0"));
}

TEST(ServerFailoverAlone, LeavesOtherErrorsAloneAndTimesOutWhenNoReplacementComes) {
  rpc::Registry reg;
  Tensor param = initial();
  param.set_requires_grad(true);
  reg.def("param",
          [&](const rpc::CallContext& ctx) { return rref::make_local(*ctx.agent(), param); });
  test::Agents agents = test::start_agents(2, test::agent_options(reg));
  RpcAgent& trainer = *agents[1];
  dist_optim::ServerFailover failover(
      trainer,
      [&] { return std::vector<RRef<Tensor>>{trainer.rpc_sync<RRef<Tensor>>("w0", "param")}; },
      [&](std::vector<RRef<Tensor>> params) {
        return std::make_unique<DistributedOptimizer>(trainer, kAdam, std::move(params));
      },
      dist_optim::FailoverOptions{.rejoin_timeout = 300ms});
  // Not a server's loss: the step's own error, untouched.
  EXPECT_THAT(test::error_text<InvalidArgument>(
                  [&] { failover.run([] { throw InvalidArgument("bad batch"); }); }),
              HasSubstr("bad batch"));
  // The server is lost and nobody takes its place: the wait ends, naming it.
  agents[0]->shutdown(false);
  const std::string text = test::error_text<TimeoutError>(
      [&] { failover.run([&] { trainer.rpc_sync<Tensor>("w0", "param"); }); });
  EXPECT_THAT(text, HasSubstr("'w0' (rank 0)"));
  EXPECT_THAT(text, HasSubstr("no replacement rejoined"));
  EXPECT_TRUE(failover.recoveries().empty());
  agents[1]->shutdown(false);
}

}  // namespace
}  // namespace gradwire
