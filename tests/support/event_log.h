// EventLog: what other threads report (a listener's calls, say), in the order it came, and a
// wait for the first n reports. Header-only.
//
// Thread-safety: every method may be called from any thread.
//
// Example:
//   test::EventLog log;
//   ... a listener calls log.add("lost " + worker.name) ...
//   EXPECT_EQ(log.wait_for(1, 10s), std::vector<std::string>{"lost w1"});
#pragma once

#include <chrono>
#include <condition_variable>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/core/mutex.h"

namespace gradwire::test {

class EventLog {
 public:
  void add(std::string event) {
    MutexLock lock(mutex_);
    events_.push_back(std::move(event));
    cv_.notify_all();
  }
  // Waits until `n` events have come or `timeout` passes; returns those that came.
  std::vector<std::string> wait_for(size_t n, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mutex_);
    while (events_.size() < n) {
      if (lock.wait_until(cv_, deadline) == std::cv_status::timeout) break;
    }
    return events_;
  }

 private:
  Mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::string> events_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace gradwire::test
