// The examples' --trace DIR, run as a user runs it: every process writes
// DIR/<worker>.trace.json; each trainer's batches are spans "step" (category train,
// numbered 1, 2, ...) holding train.forward, train.backward and train.optimizer, and the
// modules' spans of that batch (the backward's context, the optimizer's step on the
// server, DDP's buckets in hybrid_train) fall inside the phase that caused them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "support/command.h"
#include "support/temp_dir.h"
#include "support/trace_file.h"

namespace {

namespace fs = std::filesystem;

// Microseconds of slack for the rounding of ts + dur.
constexpr double kSlackUs = 0.01;

#if defined(GRADWIRE_PS_TRAIN_PATH) && defined(GRADWIRE_HYBRID_TRAIN_PATH)
// Runs `program args` under the launcher with three processes; returns the output, and the
// exit status in `status`.
std::string run(const char* program, const std::string& args, int& status) {
  const std::string command =
      std::string(GRADWIRE_RUN_PATH) + " --nproc-per-node 3 " + program + " " + args;
  return gradwire::test::run_command(command, status);
}

class TraceFlag : public ::testing::Test {
 protected:
  nlohmann::json file(const std::string& worker) {
    return gradwire::test::read_trace((dir_ / (worker + ".trace.json")).string());
  }

  gradwire::test::TempDir tmp_{"gradwire-trace-flag"};
  fs::path dir_ = tmp_.path();
};

bool inside(const nlohmann::json& inner, const nlohmann::json& outer) {
  return gradwire::test::trace_begin(inner) >= gradwire::test::trace_begin(outer) &&
         gradwire::test::trace_end(inner) <= gradwire::test::trace_end(outer) + kSlackUs;
}

// The one span named `name` of `events` inside `outer`; fails unless there is exactly one.
nlohmann::json only_inside(const std::vector<nlohmann::json>& events, const nlohmann::json& outer,
                           const std::string& what) {
  std::vector<nlohmann::json> found;
  for (const auto& e : events) {
    if (inside(e, outer)) found.push_back(e);
  }
  EXPECT_EQ(found.size(), 1u) << what << " in " << outer.dump();
  return found.empty() ? nlohmann::json::object() : found[0];
}

// Checks a trainer's step spans: numbered 1..n, each holding one forward, backward and
// optimizer phase in that order; returns them.
std::vector<nlohmann::json> check_steps(const nlohmann::json& f) {
  using gradwire::test::trace_events;
  std::vector<nlohmann::json> steps = trace_events(f, "step");
  EXPECT_GE(steps.size(), 2u);
  const auto forward = trace_events(f, "train.forward");
  const auto backward = trace_events(f, "train.backward");
  const auto optimizer = trace_events(f, "train.optimizer");
  EXPECT_EQ(forward.size(), steps.size());
  EXPECT_EQ(backward.size(), steps.size());
  EXPECT_EQ(optimizer.size(), steps.size());
  std::set<int64_t> numbers;
  for (const auto& s : steps) {
    EXPECT_EQ(s.at("cat"), "train");
    numbers.insert(s.at("args").at("step").get<int64_t>());
    const auto fw = only_inside(forward, s, "train.forward");
    const auto bw = only_inside(backward, s, "train.backward");
    const auto op = only_inside(optimizer, s, "train.optimizer");
    if (fw.empty() || bw.empty() || op.empty()) continue;
    EXPECT_LE(gradwire::test::trace_end(fw), gradwire::test::trace_begin(bw) + kSlackUs);
    EXPECT_LE(gradwire::test::trace_end(bw), gradwire::test::trace_begin(op) + kSlackUs);
  }
  EXPECT_EQ(numbers.size(), steps.size());
  EXPECT_EQ(*numbers.begin(), 1);
  EXPECT_EQ(*numbers.rbegin(), static_cast<int64_t>(steps.size()));
  return steps;
}

TEST_F(TraceFlag, PsTrainWritesEveryWorkersStepsAndTheirModulesSpans) {
  int status = 0;
  const std::string out =
      run(GRADWIRE_PS_TRAIN_PATH, "--epochs 1 --min-accuracy 0 --trace " + dir_.string(), status);
  ASSERT_EQ(status, 0) << out;
  for (const char* worker : {"ps0", "trainer1", "trainer2"})
    ASSERT_TRUE(fs::exists(dir_ / (std::string(worker) + ".trace.json"))) << worker;
  // The server's steps, by context.
  std::set<int64_t> served;
  for (const auto& e : gradwire::test::trace_events(file("ps0"), "dist_optim.owner_step"))
    served.insert(e.at("args").at("context_id").get<int64_t>());
  EXPECT_TRUE(gradwire::test::trace_events(file("ps0"), "step").empty());
  for (const char* worker : {"trainer1", "trainer2"}) {
    SCOPED_TRACE(worker);
    const nlohmann::json f = file(worker);
    const auto steps = check_steps(f);
    const auto passes = gradwire::test::trace_events(f, "dist_autograd.backward");
    const auto optimizer_steps = gradwire::test::trace_events(f, "dist_optim.step");
    for (const auto& s : steps) {
      // This batch's pass and its optimizer step: one context, stepped on the server too.
      const auto pass = only_inside(passes, s, "dist_autograd.backward");
      const auto step = only_inside(optimizer_steps, s, "dist_optim.step");
      if (pass.empty() || step.empty()) continue;
      const int64_t context = pass.at("args").at("context_id");
      EXPECT_EQ(step.at("args").at("context_id"), context);
      EXPECT_EQ(served.count(context), 1u) << context;
    }
  }
}

TEST_F(TraceFlag, HybridTrainsStepsHoldDdpBucketsAndTheirAllReduces) {
  int status = 0;
  const std::string out = run(GRADWIRE_HYBRID_TRAIN_PATH,
                              "--epochs 1 --min-accuracy 0 --trace " + dir_.string(), status);
  ASSERT_EQ(status, 0) << out;
  for (const char* worker : {"trainer1", "trainer2"}) {
    SCOPED_TRACE(worker);
    const nlohmann::json f = file(worker);
    const auto steps = check_steps(f);
    const auto backward = gradwire::test::trace_events(f, "train.backward");
    const auto ddp = gradwire::test::trace_events(f, "ddp.backward");
    EXPECT_EQ(ddp.size(), steps.size());
    // DDP's work of each pass lies in the batch's backward.
    for (const auto& b : backward)
      only_inside(ddp, b, "ddp.backward");
    bool group_reduced = false;
    for (const auto& e : gradwire::test::trace_events(f, "c10d.all_reduce"))
      group_reduced = group_reduced || e.at("args").at("group") == "hybrid-ddp";
    EXPECT_TRUE(group_reduced);
  }
}

TEST_F(TraceFlag, TraceWithoutADirectoryIsRefused) {
  int status = 0;
  const std::string out = run(GRADWIRE_PS_TRAIN_PATH, "--epochs 1 --trace", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(out.find("missing value after --trace"), std::string::npos) << out;
}
#else
TEST(TraceFlag, Skipped) {
  GTEST_SKIP() << "the examples are not built";
}
#endif

}  // namespace
