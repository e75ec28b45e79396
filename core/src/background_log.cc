#include "gradwire/core/background_log.h"

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <thread>

#include "gradwire/core/mutex.h"

namespace gradwire {

struct BackgroundLog::State {
  Mutex mutex;
  std::condition_variable cv;
  struct Line {
    LogLevel level = LogLevel::kInfo;
    std::string text;
    const char* file = "";
    int line = 0;
  };
  std::deque<Line> queue GRADWIRE_GUARDED_BY(mutex);
  size_t capacity = 0;
  uint64_t dropped GRADWIRE_GUARDED_BY(mutex) = 0;
  uint64_t unreported GRADWIRE_GUARDED_BY(mutex) = 0;  // dropped since the last line written
  bool stop GRADWIRE_GUARDED_BY(mutex) = false;
  bool done GRADWIRE_GUARDED_BY(mutex) = false;

  void run() {
    for (;;) {
      Line item;
      uint64_t lost = 0;
      {
        MutexLock lock(mutex);
        while (queue.empty() && !stop)
          lock.wait(cv);
        if (queue.empty()) {
          done = true;
          cv.notify_all();
          return;
        }
        item = std::move(queue.front());
        queue.pop_front();
        lost = unreported;
        unreported = 0;
      }
      if (lost > 0) {
        item.text += " (" + std::to_string(lost) + " earlier log line" + (lost == 1 ? "" : "s") +
                     " dropped: the log was not draining)";
      }
      // May block on a full pipe: only this thread waits.
      detail::emit_log_line(item.level, item.file, item.line, item.text);
    }
  }
};

BackgroundLog::BackgroundLog(size_t capacity) : state_(std::make_shared<State>()) {
  state_->capacity = capacity == 0 ? 1 : capacity;
  std::shared_ptr<State> state = state_;
  // Detached: a writer stuck on a sink that never drains must not hold up its owner.
  std::thread([state] {
    ::pthread_setname_np(::pthread_self(), "gw-log");
    state->run();
  }).detach();
}

BackgroundLog::~BackgroundLog() {
  MutexLock lock(state_->mutex);
  state_->stop = true;
  state_->cv.notify_all();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (!state_->done) {
    if (lock.wait_until(state_->cv, deadline) == std::cv_status::timeout) break;
  }
}

void BackgroundLog::log(LogLevel level, std::string message, const char* file, int line) {
  if (!log_enabled(level)) return;
  MutexLock lock(state_->mutex);
  if (state_->queue.size() >= state_->capacity) {
    ++state_->dropped;
    ++state_->unreported;
    return;
  }
  state_->queue.push_back(State::Line{level, std::move(message), file, line});
  state_->cv.notify_one();
}

BackgroundLog& BackgroundLog::shared() {
  // Leaked on purpose: lines logged while the process exits must still find it.
  static BackgroundLog* const log = new BackgroundLog();
  return *log;
}

uint64_t BackgroundLog::dropped() const {
  MutexLock lock(state_->mutex);
  return state_->dropped;
}

bool EventSummary::note(std::string what, Clock::time_point now) {
  ++total_;
  if (!logged_once_ || now - last_logged_ >= period_) {
    // A new period: what was counted in the old one is reported by summarise() first.
    if (suppressed_ == 0) {
      logged_once_ = true;
      last_logged_ = now;
      return true;
    }
  }
  ++suppressed_;
  last_ = std::move(what);
  return false;
}

std::optional<std::string> EventSummary::summarise(const std::string& noun, Clock::time_point now) {
  if (suppressed_ == 0) return std::nullopt;
  std::string line = std::to_string(suppressed_) + " more " + noun + " in the last " +
                     std::to_string(period_.count()) + " s (the last: " + last_ + ")";
  suppressed_ = 0;
  last_.clear();
  last_logged_ = now;
  return line;
}

}  // namespace gradwire
