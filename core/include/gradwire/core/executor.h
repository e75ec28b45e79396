// Executor: something that runs tasks later, on some thread other than the caller's.
//
// Futures post their callbacks to an Executor (Future::then, Future::add_callback), and
// RPC handlers, backward passes and optimizer steps are handed to one, so the thread that
// completes a future or reads a message never runs user code inline. (The exception is
// short library work through detail::map_here_or_on, which runs on the completing thread
// when on_own_thread() says it is one of the agent's pool workers: rpc/ converting a
// handler's asynchronous result and writing its reply, dist_optim's early step.) ThreadPool
// (<gradwire/core/thread_pool.h>) is the implementation the library uses.
//
// Contract for implementations:
//   - execute() never runs the task on the calling thread before returning (another
//     thread may start it at once), so a caller may hold its own locks across the call.
//   - execute() either accepts the task, and then runs it exactly once, or throws
//     (typically gradwire::Error once shut down) and never runs it.
//   - A task that throws must not take the process down; what happens to the exception
//     is the implementation's to document (ThreadPool logs it).
//
// std::function, not std::move_only_function: the latter is C++23, and g++ 12 offers it
// only under -std=c++23. Callers with move-only state wrap it in a shared_ptr (as
// ThreadPool::submit does).
//
// Thread-safety: implementations must accept execute() from any thread concurrently.
// Errors: execute() throws when it rejects a task.
//
// Example:
//   std::shared_ptr<Executor> pool = std::make_shared<ThreadPool>(ThreadPoolOptions{});
//   pool->execute([] { GRADWIRE_LOG(kInfo) << "running on a pool thread"; });
#pragma once

#include <functional>

namespace gradwire {

class Executor {
 public:
  virtual ~Executor() = default;
  virtual void execute(std::function<void()> task) = 0;
  // True when the calling thread is one of this executor's own (a ThreadPool's worker): code
  // that would hand short work to the executor only to have it run on some such thread may
  // then run it at once instead, saving a wake-up. Must be cheap, never block. Default: false.
  virtual bool on_own_thread() const { return false; }
};

}  // namespace gradwire
