// Logging for threads that must never block on it (event loops), and a summary of noisy
// events.
//
// BackgroundLog hands each line to a thread of its own through a bounded queue: the caller
// only formats the line and takes a lock. When stderr (or the sink) stops draining — a pipe
// nobody reads — the background thread blocks, the queue fills, and further lines are
// dropped and counted; the next line that gets through says how many were lost. The caller
// never waits.
//
// EventSummary rate-limits one kind of event (a refused connection): the first in a period
// is logged in full, the rest are counted, and summarise() writes one line for them
// ("dropped 250 malformed connections in the last 10 s (the last: ...)"). The owner calls
// summarise() from a timer when pending() says there is something to summarise.
//
// Thread-safety: BackgroundLog::log may be called from any thread. EventSummary is not
// thread-safe: use it from one thread (the loop that sees the events).
// Errors: none; logging never throws.
//
// Example:
//   BackgroundLog log;
//   EventSummary refusals(std::chrono::seconds(10));
//   if (refusals.note("client 7: bad frame")) log.log(LogLevel::kWarning, "dropped client 7");
//   ...  // later, from a timer: if (auto line = refusals.summarise("connections")) log.log(...);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "gradwire/core/logging.h"

namespace gradwire {

class BackgroundLog {
 public:
  // `capacity`: lines queued at most; > 0.
  explicit BackgroundLog(size_t capacity = 256);
  // Writes what is queued if the sink lets it within a second, then returns regardless.
  ~BackgroundLog();
  BackgroundLog(const BackgroundLog&) = delete;
  BackgroundLog& operator=(const BackgroundLog&) = delete;

  // Queues one line at `level` (nothing if the level is below the threshold); the line
  // names the caller's file and line.
  // (__builtin_FILE/__builtin_LINE: std::source_location is missing from clang 14.)
  void log(LogLevel level, std::string message, const char* file = __builtin_FILE(),
           int line = __builtin_LINE());
  // Lines dropped so far because the queue was full.
  uint64_t dropped() const;
  // A process-wide instance for code that logs rarely from many objects (one thread in all,
  // started on first use, never destroyed).
  static BackgroundLog& shared();

  struct State;

 private:
  std::shared_ptr<State> state_;
};

class EventSummary {
 public:
  using Clock = std::chrono::steady_clock;
  explicit EventSummary(std::chrono::seconds period) : period_(period) {}

  // Records one event; true when it should be logged in full (the first of a period).
  bool note(std::string what, Clock::time_point now = Clock::now());
  // Whether events were counted but not yet summarised, and when to summarise them.
  bool pending() const { return suppressed_ > 0; }
  Clock::time_point due() const { return last_logged_ + period_; }
  // "<count> more <noun> in the last <period> s (the last: <what>)", or nothing.
  std::optional<std::string> summarise(const std::string& noun,
                                       Clock::time_point now = Clock::now());
  uint64_t total() const { return total_; }

 private:
  std::chrono::seconds period_;
  bool logged_once_ = false;
  Clock::time_point last_logged_{};
  uint64_t suppressed_ = 0;
  uint64_t total_ = 0;
  std::string last_;
};

}  // namespace gradwire
