// The intra-op pool behind parallel_for (parallel.h).
//
// One Pool per process, made on first use and never destroyed: its workers block on a
// condition variable between ops, and the process exits around them. A parallel_for that
// wins the pool's try-lock publishes one Job; up to (threads - 1) workers join it and,
// with the caller, claim chunks from an atomic counter until none are left, so a worker
// that is slow to wake costs nothing but its share. The Job is shared, so a worker that
// wakes after the caller has returned only finds that every chunk is claimed.
//
// fork(): the child has none of the parent's threads, and the pool's mutex may have been
// held by one of them, so the child drops the pointer (leaking the object) and makes a
// fresh pool on first use.
#include "gradwire/tensor/parallel.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <thread>

#include "gradwire/core/check.h"
#include "gradwire/core/env.h"
#include "gradwire/core/mutex.h"

namespace gradwire {
namespace {

thread_local bool t_in_parallel = false;

int count_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// 0 until first read, so the environment is read on first use rather than at load.
std::atomic<int> g_num_threads{0};

struct Job {
  const std::function<void(int64_t, int64_t)>* fn = nullptr;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t chunk = 1;
  int64_t chunks = 0;
  std::atomic<int64_t> next{0};
  // Set once a chunk threw, so later chunks are skipped rather than run for nothing.
  std::atomic<bool> failed{false};
  Mutex mutex;
  std::condition_variable all_done;
  int64_t done GRADWIRE_GUARDED_BY(mutex) = 0;
  std::exception_ptr error GRADWIRE_GUARDED_BY(mutex);
};

// Claims and runs chunks of `job` until none are left.
void run_chunks(Job& job) {
  for (;;) {
    const int64_t i = job.next.fetch_add(1, std::memory_order_relaxed);
    if (i >= job.chunks) return;
    std::exception_ptr error;
    if (!job.failed.load(std::memory_order_relaxed)) {
      const int64_t b = job.begin + i * job.chunk;
      try {
        (*job.fn)(b, std::min(job.end, b + job.chunk));
      } catch (...) {
        error = std::current_exception();
        job.failed.store(true, std::memory_order_relaxed);
      }
    }
    MutexLock lock(job.mutex);
    if (error && !job.error) job.error = error;
    if (++job.done == job.chunks) job.all_done.notify_all();
  }
}

class Pool {
 public:
  // The try-lock of the policy: true when the caller now owns the pool.
  bool try_acquire() { return !busy_.exchange(true, std::memory_order_acquire); }
  void release() { busy_.store(false, std::memory_order_release); }

  // Runs every chunk of `job` on the caller and up to `helpers` workers; the caller must
  // own the pool. Rethrows the first exception a chunk threw.
  void run(const std::shared_ptr<Job>& job, int helpers) {
    {
      MutexLock lock(mutex_);
      while (workers_ < helpers) {
        std::thread([this] { work(); }).detach();
        ++workers_;
      }
      job_ = job;
      slots_ = helpers;
    }
    for (int i = 0; i < helpers; ++i)
      wake_.notify_one();
    t_in_parallel = true;
    run_chunks(*job);
    t_in_parallel = false;
    std::exception_ptr error;
    {
      MutexLock lock(job->mutex);
      while (job->done < job->chunks)
        lock.wait(job->all_done);
      error = job->error;
    }
    {
      MutexLock lock(mutex_);
      job_.reset();
      slots_ = 0;
    }
    if (error) std::rethrow_exception(error);
  }

 private:
  void work() {
    t_in_parallel = true;
    for (;;) {
      std::shared_ptr<Job> job;
      {
        MutexLock lock(mutex_);
        while (job_ == nullptr || slots_ == 0)
          lock.wait(wake_);
        --slots_;
        job = job_;
      }
      run_chunks(*job);
    }
  }

  std::atomic<bool> busy_{false};
  Mutex mutex_;
  std::condition_variable wake_;
  int workers_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  std::shared_ptr<Job> job_ GRADWIRE_GUARDED_BY(mutex_);
  // How many more workers may join job_: a job never has more threads than it asked for,
  // even when an earlier set_num_threads left more workers idle.
  int slots_ GRADWIRE_GUARDED_BY(mutex_) = 0;
};

std::atomic<Pool*> g_pool{nullptr};

Pool& pool() {
  Pool* current = g_pool.load(std::memory_order_acquire);
  if (current != nullptr) return *current;
  // Two first users may race; the loser's pool has no threads yet and is deleted.
  auto fresh = std::make_unique<Pool>();
  if (g_pool.compare_exchange_strong(current, fresh.get(), std::memory_order_acq_rel)) {
    return *fresh.release();
  }
  return *current;
}

void forget_pool_in_child() {
  // Leaked on purpose: destroying it would touch a mutex and threads the child lacks.
  g_pool.store(nullptr, std::memory_order_release);
  t_in_parallel = false;
}

// Registered at load, while no thread exists yet; it starts no thread itself.
const int g_atfork_registered = ::pthread_atfork(nullptr, nullptr, &forget_pool_in_child);

}  // namespace

int get_num_threads() {
  int n = g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  n = static_cast<int>(env_int("GRADWIRE_NUM_THREADS", count_cores(), 1, 1024));
  int expected = 0;
  // A concurrent set_num_threads wins over the environment's default.
  if (!g_num_threads.compare_exchange_strong(expected, n, std::memory_order_relaxed)) {
    return expected;
  }
  return n;
}

void set_num_threads(int n) {
  GRADWIRE_CHECK_ARG(n >= 1) << "set_num_threads: the number of threads must be at least 1, got "
                             << n;
  g_num_threads.store(n, std::memory_order_relaxed);
}

bool in_parallel_region() {
  return t_in_parallel;
}

void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  (void)g_atfork_registered;
  grain = std::max<int64_t>(1, grain);
  const int64_t n = end - begin;
  const int64_t threads = get_num_threads();
  if (threads < 2 || n / grain < 2 || t_in_parallel) {
    fn(begin, end);
    return;
  }
  Pool& p = pool();
  if (!p.try_acquire()) {
    fn(begin, end);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->begin = begin;
  job->end = end;
  job->chunks = std::min(threads, n / grain);
  job->chunk = (n + job->chunks - 1) / job->chunks;
  job->chunks = (n + job->chunk - 1) / job->chunk;
  try {
    p.run(job, static_cast<int>(job->chunks - 1));
  } catch (...) {
    p.release();
    throw;
  }
  p.release();
}

}  // namespace gradwire
