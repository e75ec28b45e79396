// Mutex and MutexLock: std::mutex and std::unique_lock with thread-safety annotations.
//
// libstdc++'s std::mutex carries no capability attributes, so clang's -Wthread-safety
// cannot see it being locked; these thin wrappers add them at no run-time cost. Waiting on
// a std::condition_variable goes through MutexLock so the analysis knows the mutex is held
// again when the wait returns.
//
// Thread-safety: Mutex is a mutex; a MutexLock belongs to the thread that made it.
// Errors: as std::mutex (std::system_error on a broken system lock).
//
// Example:
//   MutexLock lock(mutex_);
//   while (!ready_) {
//     if (lock.wait_until(cv_, deadline) == std::cv_status::timeout) break;
//   }
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "gradwire/core/thread_annotations.h"

namespace gradwire {

class GRADWIRE_CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() GRADWIRE_ACQUIRE() { mutex_.lock(); }
  void unlock() GRADWIRE_RELEASE() { mutex_.unlock(); }
  bool try_lock() GRADWIRE_TRY_ACQUIRE(true) { return mutex_.try_lock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

// Scoped lock on a Mutex; can be released early (unlock) to run work outside the lock.
class GRADWIRE_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) GRADWIRE_ACQUIRE(mutex) : lock_(mutex.mutex_) {}
  ~MutexLock() GRADWIRE_RELEASE() = default;
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  // Releases the mutex before the end of the scope; the destructor then does nothing.
  void unlock() GRADWIRE_RELEASE() { lock_.unlock(); }

  // Waits on cv, releasing the mutex meanwhile; it is held again on return. Callers loop
  // on their own condition: wake-ups may be spurious.
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  template <typename Clock, typename Duration>
  std::cv_status wait_until(std::condition_variable& cv,
                            const std::chrono::time_point<Clock, Duration>& deadline) {
    return cv.wait_until(lock_, deadline);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace gradwire
