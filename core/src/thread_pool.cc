#include "gradwire/core/thread_pool.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "gradwire/core/check.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"

namespace gradwire {
namespace {

constexpr int kMaxThreads = 1024;
// Linux limits thread names to 16 bytes including the terminating NUL.
constexpr size_t kMaxThreadNameLength = 15;

std::string worker_name(const std::string& pool_name, int index) {
  const std::string suffix = "-" + std::to_string(index);
  const size_t room = kMaxThreadNameLength - std::min(suffix.size(), kMaxThreadNameLength);
  return pool_name.substr(0, room) + suffix;
}

// Where an idle worker sleeps: a futex word of its own, so that waking it costs the waker
// one FUTEX_WAKE and the worker nothing more (a condition variable's waiter re-takes the
// queue's mutex as contended, and its unlock then makes a second system call).
class Parking {
 public:
  // The worker: returns once unpark() was called (at once if it already was).
  void park() {
    uint32_t expected = kAwake;
    if (state_.compare_exchange_strong(expected, kAsleep, std::memory_order_acq_rel)) {
      while (state_.load(std::memory_order_acquire) == kAsleep) {
        ::syscall(SYS_futex, word(), FUTEX_WAIT_PRIVATE, kAsleep, nullptr, nullptr, 0);
      }
    }
    state_.store(kAwake, std::memory_order_relaxed);
  }
  // Whoever took the worker off the idle list (one waker per park()).
  void unpark() {
    if (state_.exchange(kWoken, std::memory_order_acq_rel) == kAsleep) {
      ::syscall(SYS_futex, word(), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }

 private:
  static constexpr uint32_t kAwake = 0;
  static constexpr uint32_t kWoken = 1;
  static constexpr uint32_t kAsleep = 2;
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t));
  uint32_t* word() { return reinterpret_cast<uint32_t*>(&state_); }

  std::atomic<uint32_t> state_{kAwake};
};

}  // namespace

// The pool whose worker this thread is (null: none).
static thread_local const void* t_pool = nullptr;

// Shared by the ThreadPool object and every worker, so that a worker that outlives the
// ThreadPool (detached because it dropped the last reference) still has a valid queue.
struct ThreadPool::Impl {
  Impl(std::string name, int num_threads)
      : name(std::move(name)),
        num_threads(num_threads),
        parking(num_threads),
        called(static_cast<size_t>(num_threads), 0) {}

  ~Impl() {
    // Only reached once no ThreadPool and no worker refers to this state. Threads that
    // nobody joined (the pool was dropped on one of its own workers) are already on their
    // way out; detach them so std::thread's destructor does not terminate the process.
    MutexLock lock(join_mutex);
    for (std::thread& thread : threads) {
      if (thread.joinable()) thread.detach();
    }
  }

  // Lock-free: each worker marks its thread with the pool it belongs to.
  bool is_worker_thread() const { return t_pool == this; }

  // Stops intake; `dropped`, when not null, receives the queue instead of the workers.
  void stop(std::deque<std::function<void()>>* dropped = nullptr) GRADWIRE_EXCLUDES(mutex) {
    std::vector<int> woken;
    {
      MutexLock lock(mutex);
      stopping = true;
      if (dropped != nullptr) dropped->swap(queue);
      woken.swap(idle);
    }
    // Each wakes, finds the queue empty (or drains it with the others) and leaves.
    for (int index : woken)
      parking[static_cast<size_t>(index)].unpark();
  }

  void join_all() GRADWIRE_EXCLUDES(join_mutex) {
    MutexLock lock(join_mutex);
    for (std::thread& thread : threads) {
      if (thread.joinable()) thread.join();
    }
  }

  static void run(const std::shared_ptr<Impl>& impl, int index);

  // For a task just queued: takes the most recent idle worker off the list to wake it, unless
  // one woken for work has not reached the queue yet (that one takes the task, and wakes the
  // next worker if it finds more). -1: wake none. One wake-up per burst of tasks instead of
  // one per task: a worker that posts several continuations and then runs them itself no
  // longer wakes a worker for each, each of which would find the queue empty and park
  // again (a futex wake for the poster and two context switches each, on a busy core).
  int take_idle_for_work() GRADWIRE_REQUIRES(mutex) {
    if (waking > 0 || idle.empty()) return -1;
    const int index = idle.back();
    idle.pop_back();
    called[static_cast<size_t>(index)] = 1;
    ++waking;
    return index;
  }

  const std::string name;
  const int num_threads;

  Mutex mutex;
  std::deque<std::function<void()>> queue GRADWIRE_GUARDED_BY(mutex);
  // One per worker, made before the workers start and never resized.
  std::vector<Parking> parking;
  // The workers parked with nothing to do, the most recent last: a task wakes the one that
  // ran last (its stack and data are the likeliest still in cache).
  std::vector<int> idle GRADWIRE_GUARDED_BY(mutex);
  // Workers woken for work that have not looked at the queue yet, and which ones they are.
  int waking GRADWIRE_GUARDED_BY(mutex) = 0;
  std::vector<char> called GRADWIRE_GUARDED_BY(mutex);
  bool stopping GRADWIRE_GUARDED_BY(mutex) = false;
  int live_workers GRADWIRE_GUARDED_BY(mutex) = 0;
  std::condition_variable exited_cv;  // a worker left run()

  // Separate from `mutex` so that joining never blocks workers taking tasks.
  Mutex join_mutex;
  std::vector<std::thread> threads GRADWIRE_GUARDED_BY(join_mutex);
};

void ThreadPool::Impl::run(const std::shared_ptr<Impl>& impl, int index) {
  const std::string thread_name = worker_name(impl->name, index);
  pthread_setname_np(pthread_self(), thread_name.c_str());
  Parking& parking = impl->parking[static_cast<size_t>(index)];
  t_pool = impl.get();
  while (true) {
    std::function<void()> task;
    int next = -1;
    {
      MutexLock lock(impl->mutex);
      if (impl->called[static_cast<size_t>(index)] != 0) {
        impl->called[static_cast<size_t>(index)] = 0;
        --impl->waking;
      }
      if (impl->queue.empty()) {
        // Stopping only ends the loop once the queue is drained.
        if (impl->stopping) {
          --impl->live_workers;
          impl->exited_cv.notify_all();
          return;
        }
        // Listed under the mutex that execute() and stop() take: whoever takes it off the
        // list wakes it, and it looks at the queue again.
        impl->idle.push_back(index);
      } else {
        task = std::move(impl->queue.front());
        impl->queue.pop_front();
        // More waiting: hand them to another worker rather than leave them for this one.
        if (!impl->queue.empty()) next = impl->take_idle_for_work();
      }
    }
    if (next >= 0) impl->parking[static_cast<size_t>(next)].unpark();
    if (task == nullptr) {
      parking.park();
      continue;
    }
    try {
      task();
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "thread pool '" << impl->name << "': a task threw: " << e.what();
    } catch (...) {
      GRADWIRE_LOG(kError) << "thread pool '" << impl->name
                           << "': a task threw a non-std::exception";
    }
    // Release the task's captures before waiting for the next one, so that what they own
    // (possibly the last reference to this pool) is freed now, not when the next task
    // arrives.
    task = nullptr;
  }
}

ThreadPool::ThreadPool(ThreadPoolOptions options) {
  GRADWIRE_CHECK_ARG(options.num_threads >= 1 && options.num_threads <= kMaxThreads)
      << "ThreadPoolOptions.num_threads must be in [1, " << kMaxThreads << "], got "
      << options.num_threads;
  GRADWIRE_CHECK_ARG(!options.name.empty()) << "ThreadPoolOptions.name must not be empty";
  impl_ = std::make_shared<Impl>(std::move(options.name), options.num_threads);
  try {
    MutexLock join_lock(impl_->join_mutex);
    for (int i = 0; i < impl_->num_threads; ++i) {
      // The thread's copy of impl_ keeps the state alive for as long as it runs.
      {
        MutexLock lock(impl_->mutex);
        ++impl_->live_workers;
      }
      impl_->threads.emplace_back([impl = impl_, i] { Impl::run(impl, i); });
    }
  } catch (...) {
    impl_->stop();
    impl_->join_all();
    throw;
  }
}

ThreadPool::~ThreadPool() {
  try {
    shutdown();
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kError) << "thread pool '" << impl_->name << "': shutdown failed: " << e.what();
  }
}

void ThreadPool::execute(std::function<void()> task) {
  GRADWIRE_CHECK_ARG(task != nullptr) << "thread pool '" << impl_->name << "': empty task";
  int woken = -1;
  {
    MutexLock lock(impl_->mutex);
    if (impl_->stopping) {
      GRADWIRE_THROW(Error) << "thread pool '" << impl_->name << "' is shut down";
    }
    impl_->queue.push_back(std::move(task));
    woken = impl_->take_idle_for_work();
  }
  // A worker already busy takes the task if it finishes first; the one woken then finds the
  // queue empty and parks again.
  if (woken >= 0) impl_->parking[static_cast<size_t>(woken)].unpark();
}

void ThreadPool::shutdown() {
  impl_->stop();
  // A worker cannot wait for itself, nor for the queue it is part of draining; it
  // leaves the joining to a shutdown from outside, or to Impl's destructor.
  if (impl_->is_worker_thread()) return;
  impl_->join_all();
}

size_t ThreadPool::shutdown_now(std::chrono::milliseconds join_timeout) {
  std::deque<std::function<void()>> dropped;
  impl_->stop(&dropped);
  const size_t discarded = dropped.size();
  dropped.clear();  // outside the lock: a task's captures may own anything
  if (impl_->is_worker_thread()) return discarded;
  const auto deadline = deadline_after(join_timeout);
  bool all_exited = false;
  {
    MutexLock lock(impl_->mutex);
    while (impl_->live_workers > 0) {
      if (deadline == std::chrono::steady_clock::time_point::max()) {
        lock.wait(impl_->exited_cv);
      } else if (lock.wait_until(impl_->exited_cv, deadline) == std::cv_status::timeout) {
        break;
      }
    }
    all_exited = impl_->live_workers == 0;
  }
  MutexLock join_lock(impl_->join_mutex);
  for (std::thread& thread : impl_->threads) {
    if (!thread.joinable()) continue;
    // A worker still in its task finishes on its own; its copy of the state keeps the
    // queue it then finds empty alive.
    if (all_exited) {
      thread.join();
    } else {
      thread.detach();
    }
  }
  if (!all_exited) {
    GRADWIRE_LOG(kWarning) << "thread pool '" << impl_->name << "': tasks still running "
                           << join_timeout.count() << " ms after shutdown_now; left to finish";
  }
  return discarded;
}

bool ThreadPool::is_worker_thread() const {
  return impl_->is_worker_thread();
}

const std::string& ThreadPool::name() const {
  return impl_->name;
}

int ThreadPool::num_threads() const {
  return impl_->num_threads;
}

}  // namespace gradwire
