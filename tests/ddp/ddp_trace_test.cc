// ddp/'s trace spans: each bucket's readiness (first gradient to last), its all-reduce
// (launch to completion, with the bucket's index and bytes), the end-of-pass wait
// (ddp.finalize) and the pass's whole reducer work (ddp.backward), every one inside the
// pass. Two ranks as forked processes over Gloo, each tracing into its own file; and
// tracing off records nothing.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "c10d/c10d_test_util.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/core/trace.h"
#include "gradwire/ddp/ddp.h"
#include "gradwire/nn/nn.h"
#include "gradwire/tensor/factory.h"
#include "support/harness.h"
#include "support/trace_file.h"

namespace gradwire::ddp {
namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 2;
// Timestamps are microseconds with nanosecond fractions: ends are compared with this slack
// for the rounding of ts + dur.
constexpr double kSlackUs = 0.01;

// One backward pass of a 5-7-3 float64 MLP under DDP on each of kWorld ranks (processes),
// with buckets small enough that the model takes several; `check` gets the rank's model
// after the pass.
void run_pass(bool traced, const std::function<void(DistributedDataParallel&, int)>& check) {
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  const test::RankResults results = test::run_ranks_as_processes(
      kWorld,
      [&](int rank) {
        auto store = std::make_shared<c10d::FileStore>(
            c10d::FileStoreOptions{.path = path, .num_workers = kWorld, .timeout = 20s});
        c10d::ProcessGroupOptions options;
        options.timeout = 20s;
        options.debug_level = c10d::DebugLevel::kOff;
        auto group = c10d::ProcessGroupGloo::create(store, rank, kWorld, options,
                                                    c10d::GlooOptions{.host = "127.0.0.1"});
        Generator gen(3);
        auto net = std::make_shared<nn::MLP>(
            nn::MLPOptions{.sizes = {5, 7, 3}, .dtype = kFloat64, .generator = &gen});
        // 100 and 200 bytes: the 528 bytes of parameters make several buckets.
        DistributedDataParallel model(net, group,
                                      {.bucket_cap_mb = 200e-6, .first_bucket_mb = 100e-6});
        trace::stop();
        trace::clear();
        if (traced) trace::start();
        Generator data(10 + static_cast<uint64_t>(rank));
        const Tensor x = randn({4, 5}, &data, kFloat64);
        const Tensor y = randn({4, 3}, &data, kFloat64);
        nn::mse_loss(model.forward(x), y).backward();
        trace::stop();
        check(model, rank);
        trace::clear();
      },
      60s);
  EXPECT_ALL_RANKS_OK(results);
}

TEST(DdpTrace, BucketsReadyAndAllReducedInsideThePassWithTheirBytes) {
  test::TempDir dir;
  run_pass(true, [&](DistributedDataParallel& model, int rank) {
    const std::string file_path = dir.path() + "/rank" + std::to_string(rank) + ".json";
    trace::write(file_path);
    const nlohmann::json file = test::read_trace(file_path);
    const auto passes = test::trace_events(file, "ddp.backward");
    const auto finals = test::trace_events(file, "ddp.finalize");
    ASSERT_EQ(passes.size(), 1u) << file.dump();
    ASSERT_EQ(finals.size(), 1u) << file.dump();
    const nlohmann::json& pass = passes[0];
    EXPECT_EQ(pass.at("cat"), "ddp");
    EXPECT_EQ(pass.at("args").at("rank"), rank);
    const double begin = test::trace_begin(pass), end = test::trace_end(pass);
    EXPECT_GE(test::trace_begin(finals[0]), begin);
    EXPECT_LE(test::trace_end(finals[0]), end + kSlackUs);

    const std::vector<std::vector<size_t>> buckets = model.reducer().bucket_indices();
    ASSERT_GE(buckets.size(), 2u);
    EXPECT_EQ(pass.at("args").at("buckets"), buckets.size());
    const auto ready = test::trace_events(file, "ddp.bucket_ready");
    const auto reduced = test::trace_events(file, "ddp.allreduce");
    ASSERT_EQ(ready.size(), buckets.size()) << file.dump();
    ASSERT_EQ(reduced.size(), buckets.size()) << file.dump();
    for (size_t b = 0; b < buckets.size(); ++b) {
      uint64_t bytes = 0;
      for (size_t idx : buckets[b])
        bytes += model.reducer().parameters()[idx].nbytes();
      // Buckets become ready, and are reduced, in index order.
      const nlohmann::json& r = ready[b];
      const nlohmann::json& a = reduced[b];
      EXPECT_EQ(r.at("args").at("bucket"), b);
      EXPECT_EQ(r.at("args").at("bytes"), bytes);
      EXPECT_EQ(r.at("args").at("params"), buckets[b].size());
      EXPECT_EQ(a.at("args").at("bucket"), b);
      EXPECT_EQ(a.at("args").at("bytes"), bytes);
      EXPECT_EQ(a.at("args").at("rank"), rank);
      // Ready inside the pass; launched once ready; completed before the pass ended.
      EXPECT_GE(test::trace_begin(r), begin);
      EXPECT_GE(test::trace_begin(a) + kSlackUs, test::trace_end(r));
      EXPECT_LE(test::trace_end(a), end + kSlackUs);
    }
    // Each bucket's all-reduce went through the group: a c10d.all_reduce of its bytes.
    bool found = false;
    for (const auto& e : test::trace_events(file, "c10d.all_reduce"))
      found = found || e.at("args").at("bytes") == reduced[0].at("args").at("bytes");
    // The c10d span is recorded when the collective's Work completes, which may be after the
    // pass observed it: look again until it is there.
    if (!found) {
      const nlohmann::json later = test::wait_for_trace(file_path, [&](const nlohmann::json& f) {
        for (const auto& e : test::trace_events(f, "c10d.all_reduce"))
          if (e.at("args").at("bytes") == reduced[0].at("args").at("bytes")) return true;
        return false;
      });
      for (const auto& e : test::trace_events(later, "c10d.all_reduce"))
        found = found || e.at("args").at("bytes") == reduced[0].at("args").at("bytes");
    }
    EXPECT_TRUE(found);
  });
}

TEST(DdpTrace, TracingOffRecordsNothing) {
  test::TempDir dir;
  run_pass(false, [&](DistributedDataParallel& model, int rank) {
    EXPECT_TRUE(model.reducer().parameters()[0].grad().defined());
    const std::string file_path = dir.path() + "/off" + std::to_string(rank) + ".json";
    trace::write(file_path);
    EXPECT_TRUE(test::trace_events(test::read_trace(file_path)).empty());
  });
}

}  // namespace
}  // namespace gradwire::ddp
