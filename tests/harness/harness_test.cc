#include <gmock/gmock.h>
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "gradwire/core/error.h"
#include "support/harness.h"
#include "support/sync.h"

namespace gradwire::test {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr milliseconds kDeadline{10'000};
// Small on purpose: the deadline tests wait this long.
constexpr milliseconds kShortDeadline{300};

// ---- ranks as threads ----

TEST(ThreadRanksTest, EveryRankRunsOnceOnItsOwnThread) {
  constexpr int kWorld = 4;
  std::atomic<int> runs[kWorld] = {};
  const std::thread::id caller = std::this_thread::get_id();
  RankResults results = run_ranks_as_threads(
      kWorld,
      [&](int rank) {
        runs[rank].fetch_add(1);
        EXPECT_NE(std::this_thread::get_id(), caller);
      },
      kDeadline);
  EXPECT_ALL_RANKS_OK(results);
  ASSERT_EQ(results.ranks.size(), static_cast<size_t>(kWorld));
  for (int rank = 0; rank < kWorld; ++rank) {
    EXPECT_EQ(runs[rank].load(), 1);
    EXPECT_EQ(results.ranks[rank].rank, rank);
    EXPECT_TRUE(results.ranks[rank].ok);
    EXPECT_TRUE(results.ranks[rank].failure.empty());
  }
  EXPECT_TRUE(results.failed_ranks().empty());
  EXPECT_EQ(results.summary(), "");
}

TEST(ThreadRanksTest, RanksCanWaitForEachOther) {
  CountdownLatch all_arrived(3);
  RankResults results = run_ranks_as_threads(
      3,
      [&](int) {
        all_arrived.count_down();
        ASSERT_TRUE(all_arrived.wait(kDeadline));
      },
      kDeadline);
  EXPECT_ALL_RANKS_OK(results);
}

TEST(ThreadRanksTest, ExceptionIsReportedWithTypeAndMessage) {
  RankResults results = run_ranks_as_threads(
      3,
      [](int rank) {
        if (rank == 2) throw TimeoutError("store get timed out");
      },
      kDeadline);
  EXPECT_FALSE(results.all_ok());
  EXPECT_EQ(results.failed_ranks(), std::vector<int>{2});
  EXPECT_EQ(results.ranks[2].failure, "threw gradwire::TimeoutError: store get timed out");
  EXPECT_FALSE(results.ranks[2].timed_out);
  EXPECT_EQ(results.summary(), "rank 2: threw gradwire::TimeoutError: store get timed out\n");
}

TEST(ThreadRanksTest, NonStdExceptionIsReported) {
  RankResults results = run_ranks_as_threads(
      1, [](int) { throw 42; }, kDeadline);
  EXPECT_EQ(results.ranks[0].failure, "threw int");
}

TEST(ThreadRanksTest, GoogleTestFailuresAreCapturedPerRank) {
  RankResults results = run_ranks_as_threads(
      3,
      [](int rank) {
        if (rank == 1) {
          EXPECT_EQ(rank, 0) << "rank one disagrees";
          EXPECT_TRUE(false) << "second failure";
        }
        if (rank == 2) {
          ASSERT_EQ(rank, 5);
          throw std::logic_error("not reached: ASSERT returns");
        }
      },
      kDeadline);
  // The failures belong to the ranks, not to this test.
  EXPECT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(results.failed_ranks(), (std::vector<int>{1, 2}));
  EXPECT_THAT(results.ranks[1].failure, HasSubstr("harness_test.cc:"));
  EXPECT_THAT(results.ranks[1].failure, HasSubstr("rank one disagrees"));
  EXPECT_THAT(results.ranks[1].failure, HasSubstr("second failure"));
  EXPECT_THAT(results.ranks[2].failure, HasSubstr("Expected equality"));
  EXPECT_THAT(results.ranks[2].failure, ::testing::Not(HasSubstr("not reached")));
}

TEST(ThreadRanksTest, RankPastTheDeadlineIsReportedAndJoined) {
  const auto start = std::chrono::steady_clock::now();
  RankResults results = run_ranks_as_threads(
      2,
      [](int rank) {
        // The straggler is what is under test; it overruns but stays within 2x.
        if (rank == 1) std::this_thread::sleep_for(kShortDeadline + milliseconds(20));
      },
      kShortDeadline);
  EXPECT_GE(std::chrono::steady_clock::now() - start, kShortDeadline + milliseconds(20));
  EXPECT_EQ(results.failed_ranks(), std::vector<int>{1});
  EXPECT_TRUE(results.ranks[1].timed_out);
  EXPECT_THAT(results.ranks[1].failure,
              MatchesRegex("did not finish within 300 ms \\(finished after [0-9]+ ms\\)"));
  EXPECT_TRUE(results.ranks[0].ok);
}

TEST(ThreadRanksDeathTest, RankStuckPastTwiceTheDeadlineAbortsWithAMessage) {
  EXPECT_DEATH(
      {
        RankResults ignored = run_ranks_as_threads(
            2,
            [](int rank) {
              if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(30));
            },
            milliseconds(100));
        (void)ignored;
      },
      "rank\\(s\\) 1 still running at twice the 100 ms deadline");
}

TEST(ThreadRanksTest, InvalidArgumentsAreRejected) {
  EXPECT_THROW((void)run_ranks_as_threads(
                   0, [](int) {}, kDeadline),
               InvalidArgument);
  EXPECT_THROW((void)run_ranks_as_threads(
                   1, [](int) {}, milliseconds(0)),
               InvalidArgument);
}

// ---- reporting ----

RankResult make_rank(int rank, std::string failure) {
  RankResult result;
  result.rank = rank;
  result.ok = failure.empty();
  result.failure = std::move(failure);
  return result;
}

void assert_one_failed_rank() {
  RankResults failed;
  failed.ranks = {make_rank(0, "x")};
  ASSERT_ALL_RANKS_OK(failed);
}

TEST(RankResultsTest, ExpectAllRanksOkPrintsEveryFailedRank) {
  RankResults results;
  results.ranks = {make_rank(0, ""), make_rank(1, "boom\nsecond line"), make_rank(2, "late")};
  EXPECT_EQ(results.summary(), "rank 1: boom\n  second line\nrank 2: late\n");
  EXPECT_NONFATAL_FAILURE(EXPECT_ALL_RANKS_OK(results), "2 of 3 ranks failed");
  EXPECT_NONFATAL_FAILURE(EXPECT_ALL_RANKS_OK(results), "rank 1: boom\n  second line");
  EXPECT_FATAL_FAILURE(assert_one_failed_rank(), "rank 0: x");
}

// ---- ranks as processes ----

TEST(ProcessRanksTest, EveryRankRunsInItsOwnChild) {
  const pid_t parent = ::getpid();
  RankResults results = run_ranks_as_processes(
      3,
      [parent](int rank) {
        EXPECT_NE(::getpid(), parent);
        EXPECT_EQ(::getppid(), parent);
        EXPECT_GE(rank, 0);
      },
      kDeadline);
  EXPECT_ALL_RANKS_OK(results);
  for (const RankResult& rank : results.ranks) {
    EXPECT_EQ(rank.exit_code, 0);
    EXPECT_FALSE(rank.term_signal.has_value());
  }
}

TEST(ProcessRanksTest, GoogleTestFailureInAChildIsReported) {
  RankResults results = run_ranks_as_processes(
      2, [](int rank) { EXPECT_EQ(rank, 0) << "only rank 0 may pass"; }, kDeadline);
  EXPECT_FALSE(::testing::Test::HasFailure());
  EXPECT_EQ(results.failed_ranks(), std::vector<int>{1});
  EXPECT_EQ(results.ranks[1].exit_code, 1);
  EXPECT_THAT(results.ranks[1].failure, HasSubstr("harness_test.cc:"));
  EXPECT_THAT(results.ranks[1].failure, HasSubstr("only rank 0 may pass"));
  EXPECT_EQ(results.ranks[0].exit_code, 0);
}

TEST(ProcessRanksTest, ExceptionInAChildIsReported) {
  RankResults results = run_ranks_as_processes(
      2,
      [](int rank) {
        if (rank == 0) throw NetworkError("peer vanished");
      },
      kDeadline);
  EXPECT_EQ(results.failed_ranks(), std::vector<int>{0});
  EXPECT_EQ(results.ranks[0].failure, "threw gradwire::NetworkError: peer vanished");
  EXPECT_EQ(results.ranks[0].exit_code, 1);
}

TEST(ProcessRanksTest, ChildKilledBySignalIsReported) {
  RankResults results = run_ranks_as_processes(
      2,
      [](int rank) {
        if (rank == 1) ::raise(SIGTERM);
      },
      kDeadline);
  EXPECT_EQ(results.failed_ranks(), std::vector<int>{1});
  EXPECT_EQ(results.ranks[1].term_signal, SIGTERM);
  EXPECT_FALSE(results.ranks[1].exit_code.has_value());
  EXPECT_THAT(results.ranks[1].failure, HasSubstr("killed by signal 15 (Terminated)"));
  EXPECT_FALSE(results.ranks[1].timed_out);
}

TEST(ProcessRanksTest, ChildExitingBeforeItsFunctionReturnedIsReported) {
  RankResults results = run_ranks_as_processes(
      2, [](int rank) { ::_exit(rank == 0 ? 0 : 3); }, kDeadline);
  EXPECT_EQ(results.failed_ranks(), (std::vector<int>{0, 1}));
  EXPECT_EQ(results.ranks[0].exit_code, 0);
  EXPECT_THAT(results.ranks[0].failure,
              HasSubstr("exited with status 0 before its rank function returned"));
  EXPECT_EQ(results.ranks[1].exit_code, 3);
  EXPECT_THAT(results.ranks[1].failure, HasSubstr("exited with status 3"));
}

TEST(ProcessRanksTest, StragglerIsKilledAtTheDeadline) {
  const auto start = std::chrono::steady_clock::now();
  RankResults results = run_ranks_as_processes(
      2,
      [](int rank) {
        // The straggler is what is under test.
        if (rank == 1) std::this_thread::sleep_for(std::chrono::seconds(60));
      },
      kShortDeadline);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_GE(elapsed, kShortDeadline);
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  EXPECT_EQ(results.failed_ranks(), std::vector<int>{1});
  EXPECT_TRUE(results.ranks[1].timed_out);
  EXPECT_EQ(results.ranks[1].term_signal, SIGKILL);
  EXPECT_EQ(results.ranks[1].failure, "did not finish within 300 ms; killed with SIGKILL");
  EXPECT_TRUE(results.ranks[0].ok);
}

TEST(ProcessRanksTest, RefusesToForkAThreadedProcess) {
  CountdownLatch release(1);
  // Two, so that the process is over the limit even where a sanitizer runtime is allowed
  // a thread of its own.
  std::thread busy1([&release] { release.wait(kDeadline); });
  std::thread busy2([&release] { release.wait(kDeadline); });
  bool ran = false;
  RankResults results = run_ranks_as_processes(
      2, [&ran](int) { ran = true; }, kDeadline);
  release.count_down();
  busy1.join();
  busy2.join();
  EXPECT_FALSE(ran);
  EXPECT_EQ(results.failed_ranks(), (std::vector<int>{0, 1}));
  EXPECT_THAT(results.ranks[0].failure,
              HasSubstr("must be called before the test process starts any thread"));
  EXPECT_THAT(results.ranks[0].failure, MatchesRegex(".*this process has [0-9]+ threads"));
}

TEST(ProcessRanksTest, InvalidArgumentsAreRejected) {
  EXPECT_THROW((void)run_ranks_as_processes(
                   -1, [](int) {}, kDeadline),
               InvalidArgument);
  EXPECT_THROW((void)run_ranks_as_processes(
                   1, [](int) {}, milliseconds(-1)),
               InvalidArgument);
}

}  // namespace
}  // namespace gradwire::test
