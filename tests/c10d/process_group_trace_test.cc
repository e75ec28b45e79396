// c10d's trace spans: each collective and point-to-point operation of a process group is
// one span in category c10d, from the operation handed to the backend to its completion,
// with the bytes of the caller's tensors, the collective's sequence number, the group's
// rank and size, the backend and the group's name. Two ranks as forked processes over Gloo,
// each tracing into its own file; and tracing off records nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "c10d/c10d_test_util.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/core/trace.h"
#include "gradwire/tensor/factory.h"
#include "support/harness.h"
#include "support/trace_file.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 2;

// Runs `body` on kWorld ranks as processes, each with a ProcessGroupGloo on 127.0.0.1 named
// "traced".
void run_ranks(const std::string& dir,
               const std::function<void(ProcessGroup& group, int rank)>& body) {
  const std::string path = dir + "/store";
  const test::RankResults results = test::run_ranks_as_processes(
      kWorld,
      [&](int rank) {
        auto store = std::make_shared<FileStore>(
            FileStoreOptions{.path = path, .num_workers = kWorld, .timeout = 20s});
        ProcessGroupOptions options;
        options.timeout = 20s;
        options.name = "traced";
        options.debug_level = DebugLevel::kOff;
        auto group = ProcessGroupGloo::create(store, rank, kWorld, options,
                                              GlooOptions{.host = "127.0.0.1"});
        body(*group, rank);
      },
      60s);
  EXPECT_ALL_RANKS_OK(results);
}

TEST(ProcessGroupTrace, CollectivesAreSpansWithOpBytesSequenceRankSizeAndBackend) {
  test::TempDir dir;
  run_ranks(dir.path(), [&](ProcessGroup& group, int rank) {
    trace::clear();
    trace::start();
    Tensor grads = full({10}, Scalar(rank + 1.0), kFloat32);  // 40 bytes
    Tensor weights = zeros({3, 4}, kFloat64);                 // 96 bytes
    const int64_t before_us = trace::now_ns() / 1000;
    group.all_reduce(grads).wait();
    group.broadcast(weights, BroadcastOptions{.root = 0}).wait();
    trace::stop();
    EXPECT_FLOAT_EQ(grads.to_vector<float>()[0], 3.0f);
    const std::string file_path = dir.path() + "/rank" + std::to_string(rank) + ".json";
    // The span is recorded by the continuation that runs once the waiters have woken.
    const nlohmann::json file = test::wait_for_trace(file_path, [](const nlohmann::json& f) {
      return test::trace_events(f, "c10d.all_reduce").size() == 1 &&
             test::trace_events(f, "c10d.broadcast").size() == 1;
    });
    const auto reduces = test::trace_events(file, "c10d.all_reduce");
    const auto broadcasts = test::trace_events(file, "c10d.broadcast");
    ASSERT_EQ(reduces.size(), 1u) << file.dump();
    ASSERT_EQ(broadcasts.size(), 1u) << file.dump();
    const nlohmann::json& reduce = reduces[0];
    EXPECT_EQ(reduce.at("cat"), "c10d");
    EXPECT_EQ(reduce.at("ph"), "X");
    EXPECT_GE(test::trace_begin(reduce), static_cast<double>(before_us));
    const nlohmann::json& args = reduce.at("args");
    EXPECT_EQ(args.at("bytes"), 40);
    EXPECT_EQ(args.at("rank"), rank);
    EXPECT_EQ(args.at("size"), kWorld);
    EXPECT_EQ(args.at("backend"), "gloo");
    EXPECT_EQ(args.at("group"), "traced");
    EXPECT_GE(args.at("seq").get<int64_t>(), 1);
    const nlohmann::json& bargs = broadcasts[0].at("args");
    EXPECT_EQ(bargs.at("bytes"), 96);
    // Numbered in issue order, one after the other.
    EXPECT_EQ(bargs.at("seq").get<int64_t>(), args.at("seq").get<int64_t>() + 1);
    EXPECT_GE(test::trace_begin(broadcasts[0]), test::trace_begin(reduce));
  });
}

TEST(ProcessGroupTrace, PointToPointIsTracedWithSequenceZero) {
  test::TempDir dir;
  run_ranks(dir.path(), [&](ProcessGroup& group, int rank) {
    trace::clear();
    trace::start();
    Tensor t = full({5}, Scalar(7.0), kFloat32);
    if (rank == 0) {
      group.send(t, 1, 3).wait();
    } else {
      group.recv(t, 0, 3).wait();
    }
    trace::stop();
    const char* name = rank == 0 ? "c10d.send" : "c10d.recv";
    const nlohmann::json file = test::wait_for_trace(
        dir.path() + "/p2p" + std::to_string(rank) + ".json",
        [&](const nlohmann::json& f) { return !test::trace_events(f, name).empty(); });
    const auto spans = test::trace_events(file, name);
    ASSERT_EQ(spans.size(), 1u) << file.dump();
    EXPECT_EQ(spans[0].at("args").at("bytes"), 20);
    EXPECT_EQ(spans[0].at("args").at("seq"), 0);
  });
}

TEST(ProcessGroupTrace, TracingOffRecordsNothing) {
  test::TempDir dir;
  run_ranks(dir.path(), [&](ProcessGroup& group, int rank) {
    trace::stop();
    trace::clear();
    Tensor grads = ones({8}, kFloat32);
    group.all_reduce(grads).wait();
    group.barrier().wait();
    EXPECT_FLOAT_EQ(grads.to_vector<float>()[0], 2.0f);
    const std::string path = dir.path() + "/off" + std::to_string(rank) + ".json";
    trace::write(path);
    EXPECT_TRUE(test::trace_events(test::read_trace(path)).empty());
  });
}

}  // namespace
}  // namespace gradwire::c10d
