// Executors for tests that need to control when, or whether, callbacks run.
//
// ManualExecutor queues tasks and runs them only when the test calls run_all(), so a
// test can prove that nothing ran inline and then run the callbacks deterministically.
// RejectingExecutor refuses every task, as a shut-down pool would.
//
// Thread-safety: execute() may be called from any thread; run_all() from one at a time.
// Errors: RejectingExecutor::execute throws gradwire::Error(message).
//
// Example:
//   auto manual = std::make_shared<ManualExecutor>();
//   future.add_callback(manual, [](auto) { ... });
//   future.set_value(1);                    // nothing has run yet
//   EXPECT_EQ(manual->run_all(), 1u);
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <utility>

#include "gradwire/core/error.h"
#include "gradwire/core/executor.h"
#include "gradwire/core/mutex.h"

namespace gradwire::test {

class ManualExecutor final : public Executor {
 public:
  void execute(std::function<void()> task) override GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    tasks_.push_back(std::move(task));
  }

  size_t pending() GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return tasks_.size();
  }

  // Runs queued tasks, including ones queued while running, until none is left; returns
  // how many ran.
  size_t run_all() GRADWIRE_EXCLUDES(mutex_) {
    size_t ran = 0;
    while (true) {
      std::function<void()> task;
      {
        MutexLock lock(mutex_);
        if (tasks_.empty()) return ran;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
      ++ran;
    }
  }

 private:
  Mutex mutex_;
  std::deque<std::function<void()>> tasks_ GRADWIRE_GUARDED_BY(mutex_);
};

class RejectingExecutor final : public Executor {
 public:
  explicit RejectingExecutor(std::string message = "rejected by RejectingExecutor")
      : message_(std::move(message)) {}
  void execute(std::function<void()>) override { throw Error(message_); }

 private:
  std::string message_;
};

}  // namespace gradwire::test
