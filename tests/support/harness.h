// Test harnesses that run one function as several ranks: as threads in this process, or
// as forked child processes. Both wait with a deadline and report, per rank, whether it
// passed and why not, instead of hanging or failing somewhere unrelated.
//
//   RankResults results = run_ranks_as_threads(4, [&](int rank) {
//     EXPECT_EQ(do_collective(rank), 10);
//   }, std::chrono::seconds(10));
//   EXPECT_ALL_RANKS_OK(results);
//
// A rank fails when its function throws (the report names the exception type and
// what()), when it records GoogleTest failures (EXPECT_*/ASSERT_* inside the rank are
// captured per rank and do not reach the enclosing test directly), or when it does not
// finish by the deadline. Results are returned, not asserted, so the caller decides what
// a failure means (and tests of the harness itself can inspect them);
// EXPECT_ALL_RANKS_OK / ASSERT_ALL_RANKS_OK fail the test with every rank's report.
//
// Ranks as threads: rank functions must honour timeouts themselves (wait with a
// deadline; never block forever), because a thread cannot be killed. At the deadline the
// unfinished ranks are reported as failed and the harness keeps joining them; if one is
// still running at twice the deadline the process aborts with a message naming it, since
// returning would leave a thread using the test's stack frame.
//
// Ranks as processes: each rank runs in a child made by fork(), which copies only the
// calling thread, so call it before the test process starts any thread (it checks, and
// fails every rank with an explanation otherwise). The parent waits on pipes and pidfds
// with poll(), kills stragglers with SIGKILL at the deadline, and reports each child's
// exit code, signal, failure message or overrun. Children leave with _exit(), so they
// never run the parent's atexit handlers or flush its buffers twice.
//
// Thread-safety: call each harness from one thread at a time; the rank function is
// called concurrently, once per rank.
// Errors: world_size < 1 or a non-positive deadline throw gradwire::InvalidArgument.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace gradwire::test {

struct RankResult {
  int rank = 0;
  bool ok = false;
  // Did not finish before the deadline (threads: reported, still joined; processes:
  // killed).
  bool timed_out = false;
  // Why the rank failed: exception, GoogleTest failures, exit status, signal or
  // overrun. Empty when ok.
  std::string failure;
  // Processes only: the child's exit code, or the signal that ended it.
  std::optional<int> exit_code;
  std::optional<int> term_signal;
};

struct RankResults {
  std::vector<RankResult> ranks;

  bool all_ok() const;
  std::vector<int> failed_ranks() const;
  // One paragraph per failed rank: "rank 2: threw std::runtime_error: boom".
  std::string summary() const;
};

[[nodiscard]] RankResults run_ranks_as_threads(int world_size,
                                               const std::function<void(int rank)>& fn,
                                               std::chrono::milliseconds deadline);

[[nodiscard]] RankResults run_ranks_as_processes(int world_size,
                                                 const std::function<void(int rank)>& fn,
                                                 std::chrono::milliseconds deadline);

// For EXPECT_PRED_FORMAT1: evaluates the results once and prints every failed rank.
::testing::AssertionResult AllRanksOk(const char* expression, const RankResults& results);

}  // namespace gradwire::test

#define EXPECT_ALL_RANKS_OK(results) EXPECT_PRED_FORMAT1(::gradwire::test::AllRanksOk, results)
#define ASSERT_ALL_RANKS_OK(results) ASSERT_PRED_FORMAT1(::gradwire::test::AllRanksOk, results)
