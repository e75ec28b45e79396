// Waiting helpers for tests that never sleep to wait for an event.
//
// CountdownLatch is std::latch with a timed wait: a test counts down from its threads or
// callbacks and waits with a deadline, so a missing event fails the test instead of
// hanging it, and a present one ends the wait at once.
//
// Thread-safety: all methods may be called concurrently from any thread.
// Errors: none; count_down past zero leaves the count at zero.
//
// Example:
//   CountdownLatch done(3);
//   for (auto& f : futures) f.add_callback(pool, [&](auto) { done.count_down(); });
//   ASSERT_TRUE(done.wait(std::chrono::seconds(5)));
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>

#include "gradwire/core/mutex.h"

namespace gradwire::test {

class CountdownLatch {
 public:
  explicit CountdownLatch(int64_t count) : count_(count) {}

  void count_down(int64_t n = 1) GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (count_ == 0) return;
    count_ = n >= count_ ? 0 : count_ - n;
    // Notified under the lock: a waiter that wakes may destroy the latch at once (it
    // often lives on the waiting test's stack), so the notify must be over by then.
    if (count_ == 0) cv_.notify_all();
  }

  // True once the count reached zero; false if `timeout` passed first.
  bool wait(std::chrono::milliseconds timeout) GRADWIRE_EXCLUDES(mutex_) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mutex_);
    while (count_ > 0) {
      if (lock.wait_until(cv_, deadline) == std::cv_status::timeout) return count_ == 0;
    }
    return true;
  }

  int64_t count() GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return count_;
  }

 private:
  Mutex mutex_;
  std::condition_variable cv_;
  int64_t count_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace gradwire::test
