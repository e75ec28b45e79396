// A parameter server SIGKILLed while two trainers train, as processes: a replacement
// process rejoins under the server's name and rank (AgentOptions::rejoin), restores the
// newest snapshot its predecessor's ShardCheckpointer wrote, and the trainers come back
// through ServerFailover and finish; their held-out accuracy is the uninterrupted run's,
// within 0.02. The worker processes meet through a FileStore in the test's directory, so
// the store outlives the server's death.
//
// The task: three Gaussian blobs in the plane, a 2-16-3 MLP on the server ("ps", rank 2),
// trained by "trainer0" and "trainer1" in a synchronous trainer group (one Adam).
#include <gtest/gtest.h>

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "gradwire/c10d/file_store.h"
#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/dist_optim/failover.h"
#include "gradwire/dist_optim/shard_checkpoint.h"
#include "gradwire/nn/loss.h"
#include "gradwire/optim/adam.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/temp_dir.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using rref::RRef;

constexpr int kWorld = 3;  // trainer0, trainer1, ps
constexpr int kServerRank = 2;
constexpr int kEpochs = 10;
constexpr int64_t kBatch = 16;

struct Data {
  Tensor x, y;
};

// n samples per class around three centres, the same in every process.
Data blobs(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> xs;
  std::vector<int64_t> ys;
  const Tensor noise = randn({3 * n, 2}, &gen, kFloat64);
  const std::vector<double> z = noise.to_vector<double>();
  for (int64_t i = 0; i < 3 * n; ++i) {
    const int64_t c = i % 3;
    const double angle = 2 * std::numbers::pi * static_cast<double>(c) / 3;
    xs.push_back(2 * std::cos(angle) + 0.7 * z[static_cast<size_t>(2 * i)]);
    xs.push_back(2 * std::sin(angle) + 0.7 * z[static_cast<size_t>(2 * i + 1)]);
    ys.push_back(c);
  }
  return {tensor(xs, {3 * n, 2}), tensor(ys)};
}

double accuracy(const Tensor& logits, const Tensor& y) {
  return sum(eq(argmax(logits, 1), y), kFloat64).item<double>() / static_cast<double>(y.size(0));
}

// The server's model: its parameters, made the same way by the first server and its
// replacement (which then restores them).
struct Model {
  Tensor w1, b1, w2, b2;
  Model() {
    Generator gen(1);
    w1 = mul(randn({2, 16}, &gen, kFloat64), 0.5);
    b1 = zeros({16}, kFloat64);
    w2 = mul(randn({16, 3}, &gen, kFloat64), 0.5);
    b2 = zeros({3}, kFloat64);
    for (Tensor* p : {&w1, &b1, &w2, &b2})
      p->set_requires_grad(true);
  }
  StateDict named() const { return {{"w1", w1}, {"b1", b1}, {"w2", w2}, {"b2", b2}}; }
  // On copies of the parameters taken now (their gradients reach the parameters), so that an
  // update between a forward and its backward leaves the backward's values alone.
  Tensor forward(const Tensor& x) const {
    const Tensor h = relu(add(matmul(x, w1.clone()), b1.clone()));
    return add(matmul(h, w2.clone()), b2.clone());
  }
};

struct Job {
  std::filesystem::path dir;
  int64_t kill_after = 0;  // the server dies in this forward (0: never)
  std::string store() const { return (dir / "store").string(); }
};

std::shared_ptr<c10d::FileStore> open_store(const Job& run) {
  return std::make_shared<c10d::FileStore>(
      c10d::FileStoreOptions{.path = run.store(), .timeout = 60s});
}

rpc::AgentOptions options(rpc::Registry& reg) {
  rpc::AgentOptions o = test::agent_options(reg);
  o.join_timeout = 60s;
  return o;
}

// Waits until process `pid` has ended (it is not this process's child).
void wait_for_exit(pid_t pid) {
  const int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return;  // gone already
  pollfd p{fd, POLLIN, 0};
  const int ready = ::poll(&p, 1, 60'000);
  ::close(fd);
  if (ready != 1) throw TimeoutError("the first server did not end within 60 s");
}

// The server (or, `replacement`, the process that takes its place once it is dead).
void serve(const Job& run, bool replacement) {
  auto store = open_store(run);
  if (replacement) {
    wait_for_exit(static_cast<pid_t>(std::stol(c10d::to_string(store->get("test/ps_pid")))));
  } else {
    store->set("test/ps_pid", std::to_string(::getpid()));
  }
  rpc::Registry reg;
  Model model;
  std::shared_ptr<dist_optim::ShardCheckpointer> ckpt;
  std::atomic<int64_t> forwards{0};
  reg.def("forward", [&](const Tensor& x) {
    if (!replacement && run.kill_after > 0 && ++forwards >= run.kill_after &&
        ckpt->stats().written > 0) {
      ::kill(::getpid(), SIGKILL);  // as a crash would, in the middle of serving
    }
    return model.forward(x);
  });
  reg.def("params", [&](const rpc::CallContext& ctx) {
    std::vector<RRef<Tensor>> refs;
    for (const auto& [name, p] : model.named())
      refs.push_back(rref::make_local(*ctx.agent(), p));
    return refs;
  });
  rpc::AgentOptions o = options(reg);
  o.rejoin = replacement;
  auto agent = rpc::create_tensorpipe_agent("ps", kServerRank, kWorld, store, o);
  ckpt = std::make_shared<dist_optim::ShardCheckpointer>(
      *agent, model.named(),
      dist_optim::ShardCheckpointOptions{.dir = (run.dir / "ckpt").string(),
                                         .every = std::chrono::duration<double>(0.05),
                                         .group = "job"});
  // Restored before the agent serves anything.
  const auto restored = ckpt->restore();
  if (replacement) {
    if (!restored.has_value()) throw Error("the replacement found no snapshot");
    std::ofstream(run.dir / "restored") << restored->updates << "\n";
  }
  ckpt->start();
  agent->start();
  agent->shutdown();  // graceful: serves until both trainers are done
  ckpt->stop();
}

void train(const Job& run, int rank) {
  auto store = open_store(run);
  rpc::Registry reg;
  auto agent = rpc::make_tensorpipe_agent("trainer" + std::to_string(rank), rank, kWorld, store,
                                          options(reg));
  const Data all = blobs(100, 7), test = blobs(50, 8);
  std::vector<int64_t> mine;
  for (int64_t i = rank; i < all.x.size(0); i += 2)
    mine.push_back(i);
  const Tensor index = tensor(mine);
  const Tensor x = index_select(all.x, 0, index), y = index_select(all.y, 0, index);
  dist_optim::ServerFailover failover(
      *agent, [&] { return agent->rpc_sync<std::vector<RRef<Tensor>>>("ps", "params"); },
      [&](std::vector<RRef<Tensor>> params) {
        return std::make_unique<dist_optim::DistributedOptimizer>(
            *agent, optim::AdamOptions{.lr = 0.05}, std::move(params),
            dist_optim::TrainerGroup{
                .name = "job", .trainers = 2, .max_staleness = 0, .aggregate = 2});
      },
      dist_optim::FailoverOptions{.rejoin_timeout = 60s});
  Generator order_gen(static_cast<uint64_t>(100 + rank));
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    const Tensor order = randperm(x.size(0), &order_gen);
    for (int64_t b = 0; b < x.size(0); b += kBatch) {
      const Tensor rows = order.slice(0, b, std::min(b + kBatch, x.size(0)));
      const Tensor xb = index_select(x, 0, rows), yb = index_select(y, 0, rows);
      failover.run([&] {
        dist_autograd::Context ctx(*agent);
        const Tensor loss = nn::cross_entropy(agent->rpc_sync<Tensor>("ps", "forward", xb), yb);
        failover.optimizer().backward_and_step(ctx.id(), {loss});
      });
    }
  }
  failover.run([&] { failover.optimizer().leave(); });
  double acc = 0;
  failover.run([&] { acc = accuracy(agent->rpc_sync<Tensor>("ps", "forward", test.x), test.y); });
  double took = 0;
  for (const auto& r : failover.recoveries())
    took += r.took.count();
  std::ofstream(run.dir / ("trainer" + std::to_string(rank)))
      << acc << " " << failover.recoveries().size() << " " << took << "\n";
  agent->shutdown();
}

struct Outcome {
  double accuracy = 0;
  size_t recoveries = 0;
  double recovery_s = 0;
};

Outcome outcome(const Job& run, int rank) {
  std::ifstream in(run.dir / ("trainer" + std::to_string(rank)));
  Outcome o;
  in >> o.accuracy >> o.recoveries >> o.recovery_s;
  return o;
}

class ServerFailoverProcesses : public ::testing::Test {
 protected:
  test::TempDir tmp_{"gradwire-server-failover"};
};

TEST_F(ServerFailoverProcesses, AServerKilledMidTrainingIsRestoredAndTheJobEndsAtTheSameAccuracy) {
  const Job clean{tmp_.path() / "clean"};
  const Job killed{tmp_.path() / "killed", 120};
  for (const Job* run : {&clean, &killed})
    std::filesystem::create_directories(run->dir);
  // Ranks 0 and 1 train, rank 2 serves; in the killed run rank 3 is the replacement.
  auto body = [](const Job& run) {
    return [&run](int rank) {
      if (rank < kServerRank) {
        train(run, rank);
      } else {
        serve(run, rank > kServerRank);
      }
    };
  };
  const test::RankResults uninterrupted = test::run_ranks_as_processes(3, body(clean), 90s);
  ASSERT_ALL_RANKS_OK(uninterrupted);
  const test::RankResults results = test::run_ranks_as_processes(4, body(killed), 90s);
  EXPECT_EQ(results.ranks[kServerRank].term_signal, SIGKILL) << results.summary();
  for (int rank : {0, 1, 3})
    EXPECT_TRUE(results.ranks[static_cast<size_t>(rank)].ok) << results.summary();

  int64_t restored_updates = 0;
  std::ifstream(killed.dir / "restored") >> restored_updates;
  EXPECT_GT(restored_updates, 0);  // a snapshot taken mid-training, not a fresh start
  for (int rank = 0; rank < 2; ++rank) {
    const Outcome before = outcome(clean, rank), after = outcome(killed, rank);
    EXPECT_GE(before.accuracy, 0.85) << "trainer" << rank;
    EXPECT_NEAR(after.accuracy, before.accuracy, 0.02) << "trainer" << rank;
    EXPECT_EQ(before.recoveries, 0u);
    EXPECT_EQ(after.recoveries, 1u) << "trainer" << rank;
    std::printf(
        "trainer%d: held-out accuracy %.3f uninterrupted, %.3f with the server killed and "
        "restored (snapshot after %lld updates); recovery took %.3f s\n",
        rank, before.accuracy, after.accuracy, static_cast<long long>(restored_updates),
        after.recovery_s);
  }
}

}  // namespace
}  // namespace gradwire
