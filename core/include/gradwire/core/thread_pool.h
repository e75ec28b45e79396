// ThreadPool: a fixed set of named worker threads running tasks in FIFO order.
//
// It is the Executor behind future callbacks, RPC handlers, backward passes and optimizer
// steps. submit(fn) returns a Future of fn's result (an exception in fn becomes the
// future's error); execute(task) runs a fire-and-forget task, whose exception is logged
// at error level and never terminates the process.
//
// shutdown() stops accepting work, lets the workers drain everything already queued, then
// joins them. It is idempotent and called by the destructor. Afterwards execute() throws
// gradwire::Error("thread pool '<name>' is shut down") and submit() returns a future that
// has failed with that error. Worker threads are named "<name>-<index>" (cut to the
// 15-character limit of pthread names, shortening the name and keeping the index) so they
// can be told apart in top -H and gdb.
//
// A pool may be shut down, or its last reference dropped, from one of its own tasks: that
// worker cannot join itself, so shutdown() then only stops intake and returns; the
// workers finish the queue and exit on their own, keeping the pool's internal state (not
// the ThreadPool object) alive until they are done.
//
// shutdown_now(join_timeout) instead discards the queue and bounds the wait for running
// tasks (see below).
//
// Wake-ups: an idle worker sleeps on a futex word of its own. A queued task wakes the worker
// that went idle last, unless a worker woken earlier has not reached the queue yet; a worker
// that takes a task and finds more queued wakes the next one. So a burst of tasks costs one
// wake-up at a time, and each task still gets a worker of its own when enough are idle.
//
// Thread-safety: every method may be called from any thread, concurrently.
// Errors: the constructor throws InvalidArgument for bad options; execute() throws Error
// after shutdown.
//
// Example:
//   auto pool = std::make_shared<gradwire::ThreadPool>(
//       gradwire::ThreadPoolOptions{.num_threads = 8, .name = "rpc"});
//   gradwire::Future<int> f = pool->submit([] { return 6 * 7; });
//   int answer = f.get(std::chrono::seconds(10));
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "gradwire/core/executor.h"
#include "gradwire/core/future.h"

namespace gradwire {

struct ThreadPoolOptions {
  // In [1, 1024].
  int num_threads{4};
  // Non-empty; used in thread names, log lines and errors.
  std::string name{"gradwire"};
};

class ThreadPool final : public Executor {
 public:
  explicit ThreadPool(ThreadPoolOptions options = {});
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void execute(std::function<void()> task) override;

  // Runs fn() on a worker; the future holds its result or the exception it threw.
  template <typename F>
  auto submit(F fn) -> Future<std::invoke_result_t<F&>>;

  void shutdown();
  // Shutdown without draining: stops intake, discards the queued tasks without running them
  // (returns how many), and waits up to `join_timeout` for the running ones; workers still
  // busy then are left to finish on their own (logged). For closing an agent whose queued
  // work has lost its purpose and whose handlers may never return. From a worker of this
  // pool it does not wait.
  size_t shutdown_now(std::chrono::milliseconds join_timeout);
  // True on one of this pool's worker threads (lock-free).
  bool is_worker_thread() const;
  bool on_own_thread() const override { return is_worker_thread(); }

  const std::string& name() const;
  int num_threads() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

template <typename F>
auto ThreadPool::submit(F fn) -> Future<std::invoke_result_t<F&>> {
  using R = std::invoke_result_t<F&>;
  Future<R> result;
  // Shared so that move-only callables fit in std::function.
  auto shared_fn = std::make_shared<F>(std::move(fn));
  try {
    execute([shared_fn, result]() mutable {
      try {
        if constexpr (std::is_void_v<R>) {
          (*shared_fn)();
          result.try_set_value();
        } else {
          result.try_set_value((*shared_fn)());
        }
      } catch (...) {
        result.try_set_error(std::current_exception());
      }
    });
  } catch (...) {
    result.try_set_error(std::current_exception());
  }
  return result;
}

}  // namespace gradwire
