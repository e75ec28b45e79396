// A graceful shutdown is a departure, not a loss: the workers' connections close as each
// leaves, and no listener is told that a worker was lost.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "c10d/c10d_test_util.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/harness.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;

class LossRecorder : public AgentListener {
 public:
  void on_worker_lost(const WorkerInfo& worker, const std::string& why) override {
    std::lock_guard lock(mutex_);
    lost_.push_back(worker.name + ": " + why);
  }
  std::vector<std::string> lost() const {
    std::lock_guard lock(mutex_);
    return lost_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> lost_;
};

TEST(GracefulDeparture, NoWorkerIsReportedLost) {
  const uint16_t port = test::free_port();
  constexpr int kWorld = 4;
  constexpr int kRounds = 8;
  // Rank 0 hosts the store, so its graceful shutdown waits for every other worker's
  // departure mark while the others, already gone, close their connections to it: the
  // moment a departure could be taken for a loss (a race, hence several rounds, each a new
  // group on its own part of the store).
  test::RankResults results = test::run_ranks_as_processes(
      kWorld,
      [&](int rank) {
        auto store = std::make_shared<c10d::TCPStore>(c10d::TCPStoreOptions{
            .host = "127.0.0.1", .port = port, .is_master = rank == 0, .timeout = 30s});
        Registry reg;
        reg.def("echo", [](const std::string& s) { return s; });
        AgentOptions options;
        options.registry = &reg;
        options.rpc_timeout = 20s;
        options.join_timeout = 20s;
        options.num_worker_threads = 2;
        options.mpt_lanes = 1;
        for (int round = 0; round < kRounds; ++round) {
          auto agent = create_tensorpipe_agent(
              "w" + std::to_string(rank), rank, kWorld,
              std::make_shared<c10d::PrefixStore>("round" + std::to_string(round), store), options);
          auto recorder = std::make_shared<LossRecorder>();
          agent->add_listener(recorder);
          agent->start();
          // Connections in both directions between every pair.
          for (int peer = 0; peer < kWorld; ++peer) {
            if (peer == rank) continue;
            EXPECT_EQ(
                agent->rpc_sync<std::string>("w" + std::to_string(peer), "echo", std::string("hi")),
                "hi");
          }
          agent->shutdown();
          EXPECT_THAT(recorder->lost(), ::testing::IsEmpty()) << "round " << round;
        }
        // The store's host leaves last.
        c10d::barrier(*store, "done", kWorld, 20s);
        if (rank != 0) {
          store->set("bye/" + std::to_string(rank), std::string_view("1"));
        } else {
          store->wait({"bye/1", "bye/2", "bye/3"}, 20s);
        }
      },
      90s);
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace
}  // namespace gradwire::rpc
