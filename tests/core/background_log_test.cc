// BackgroundLog (a log that never blocks its caller) and EventSummary (one line for many
// events), with a sink that stands for a pipe nobody drains.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "gradwire/core/background_log.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "support/sync.h"

namespace gradwire {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

// Collects lines; while `blocked`, the first line stalls the writer until released.
struct StuckSink {
  Mutex mutex;
  std::vector<std::string> lines GRADWIRE_GUARDED_BY(mutex);
  test::CountdownLatch release{1};
  test::CountdownLatch first{1};

  LogSink sink() {
    return [this](LogLevel, std::string_view line) {
      {
        MutexLock lock(mutex);
        lines.emplace_back(line);
      }
      first.count_down();
      release.wait(30s);
    };
  }
  std::vector<std::string> snapshot() {
    MutexLock lock(mutex);
    return lines;
  }
};

TEST(BackgroundLog, ACallerNeverWaitsForASinkThatDoesNotDrain) {
  StuckSink stuck;
  const LogSink previous = set_log_sink(stuck.sink());
  {
    BackgroundLog log(/*capacity=*/4);
    log.log(LogLevel::kWarning, "line 0");
    ASSERT_TRUE(stuck.first.wait(10s));  // the writer is now stuck inside the sink
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 1; i <= 100; ++i)
      log.log(LogLevel::kWarning, "line " + std::to_string(i));
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 1s);
    EXPECT_EQ(log.dropped(), 96u);  // 4 queued behind the stuck one
    stuck.release.count_down();
  }
  set_log_sink(previous);
  const std::vector<std::string> lines = stuck.snapshot();
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_THAT(lines[0], HasSubstr("line 0"));
  EXPECT_THAT(lines[1], HasSubstr("line 1 (96 earlier log lines dropped"));
  EXPECT_THAT(lines[4], HasSubstr("line 4"));
  // The line names where it was logged, not the logger's thread.
  EXPECT_THAT(lines[0], HasSubstr("background_log_test.cc:"));
}

TEST(BackgroundLog, LinesBelowTheThresholdAreNotQueued) {
  StuckSink stuck;
  stuck.release.count_down();
  const LogSink previous = set_log_sink(stuck.sink());
  const LogLevel level = log_level();
  set_log_level(LogLevel::kWarning);
  {
    BackgroundLog log;
    log.log(LogLevel::kInfo, "quiet");
    log.log(LogLevel::kError, "loud");
  }
  set_log_level(level);
  set_log_sink(previous);
  const std::vector<std::string> lines = stuck.snapshot();
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_THAT(lines[0], HasSubstr("loud"));
}

TEST(EventSummary, TheFirstOfAPeriodIsLoggedTheRestCountedOnce) {
  using Clock = EventSummary::Clock;
  EventSummary summary(10s);
  const Clock::time_point t0 = Clock::now();
  EXPECT_TRUE(summary.note("a", t0));
  EXPECT_FALSE(summary.pending());
  EXPECT_FALSE(summary.note("b", t0 + 1s));
  EXPECT_FALSE(summary.note("c", t0 + 2s));
  EXPECT_TRUE(summary.pending());
  EXPECT_EQ(summary.due(), t0 + 10s);
  EXPECT_EQ(summary.summarise("connections", t0 + 10s),
            "2 more connections in the last 10 s (the last: c)");
  EXPECT_FALSE(summary.pending());
  EXPECT_EQ(summary.summarise("connections", t0 + 11s), std::nullopt);
  // Within the period after a summary: counted again; after a quiet period: logged again.
  EXPECT_FALSE(summary.note("d", t0 + 12s));
  EXPECT_EQ(summary.summarise("connections", t0 + 20s),
            "1 more connections in the last 10 s (the last: d)");
  EXPECT_TRUE(summary.note("e", t0 + 40s));
  EXPECT_EQ(summary.total(), 5u);
}

}  // namespace
}  // namespace gradwire
