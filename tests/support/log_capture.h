// LogCapture: routes gradwire log lines into a test for the duration of a scope.
//
// It installs a log sink on construction and restores the previous one on destruction,
// and counts error lines down on a latch so a test can wait for an error that another
// thread logs (a pool worker, a callback) instead of sleeping.
//
// Thread-safety: lines may arrive from any thread; all methods may be called concurrently.
// Errors: none.
//
// Example:
//   LogCapture log(/*errors_expected=*/1);
//   pool.execute([] { throw std::runtime_error("boom"); });
//   ASSERT_TRUE(log.wait_for_errors(std::chrono::seconds(5)));
//   EXPECT_THAT(log.lines()[0], HasSubstr("boom"));
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "support/sync.h"

namespace gradwire::test {

class LogCapture {
 public:
  explicit LogCapture(int64_t errors_expected = 0) : error_lines_(errors_expected) {
    previous_ = set_log_sink([this](LogLevel level, std::string_view line) {
      {
        MutexLock lock(mutex_);
        lines_.emplace_back(line);
      }
      if (level == LogLevel::kError) error_lines_.count_down();
    });
  }
  ~LogCapture() { set_log_sink(previous_); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  std::vector<std::string> lines() GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return lines_;
  }

  // True once `errors_expected` error lines have arrived; false if `timeout` passed.
  bool wait_for_errors(std::chrono::milliseconds timeout) { return error_lines_.wait(timeout); }

 private:
  LogSink previous_;
  Mutex mutex_;
  std::vector<std::string> lines_ GRADWIRE_GUARDED_BY(mutex_);
  CountdownLatch error_lines_;
};

}  // namespace gradwire::test
