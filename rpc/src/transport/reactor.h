// An epoll loop on one thread, for gradwire's transports: file descriptors with handlers,
// work deferred from any thread, and timers. It sleeps in epoll_wait whenever there is
// nothing to do, so an idle worker spends no CPU on it.
//
// Thread-safety: defer(), in_loop() and close() may be called from any thread; everything
// else only from the loop thread (inside a handler, a timer or deferred work).
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gradwire/core/mutex.h"

namespace gradwire::rpc::transport {

// When a polling loop should give up polling early: after a yield of its core that took
// `backoff` or longer, other runnable threads are waiting for the cores (more of them than
// cores). Polling on would keep one of them off its core (the computation whose result the
// loop waits for, or the loop of the peer that will send it), and the loop itself only gets
// back to look after each such wait. Sleeping instead frees the core, and the wake-up puts
// the loop ahead of the threads that ran meanwhile. Polling resumes after the next
// activity. Used by Reactor; separate so that the rule can be tested without a scheduler.
class SpinBackoff {
 public:
  using Duration = std::chrono::steady_clock::duration;
  explicit SpinBackoff(Duration backoff) : backoff_(backoff) {}
  // A yield between two polls took `took`.
  void yielded(Duration took) {
    if (backoff_.count() > 0 && took >= backoff_) starved_ = true;
  }
  // There was traffic or work: polling after it is worth it again.
  void worked() { starved_ = false; }
  bool allows_polling() const { return !starved_; }

 private:
  const Duration backoff_;
  bool starved_ = false;
};

class Reactor {
 public:
  using Clock = std::chrono::steady_clock;
  // Called with the epoll events that fired for the descriptor.
  using Handler = std::function<void(uint32_t events)>;

  // `spin`: after any activity the loop keeps polling (without sleeping) this long before
  // it blocks, so that a reply that follows a request closely is picked up without a
  // wake-up; an idle loop sleeps. 0: never spin. While `awaiting` (asked from the loop, so it
  // must be cheap and never block) says that an answer is awaited, the loop keeps polling up
  // to `spin_awaiting` after the last activity instead (when that is longer than `spin`).
  // Between polls the loop yields its core; when a yield returns only after `spin_backoff`
  // or more (other threads wanted the core: more runnable threads than cores) it stops
  // polling until the next activity and sleeps instead (SpinBackoff), and calls `on_backoff`
  // (a counter; loop thread, must be cheap). 0: never stops early.
  explicit Reactor(std::string name, std::chrono::microseconds spin = std::chrono::microseconds(0),
                   std::chrono::microseconds spin_awaiting = std::chrono::microseconds(0),
                   std::function<bool()> awaiting = {},
                   std::chrono::microseconds spin_backoff = std::chrono::microseconds(0),
                   std::function<void()> on_backoff = {});
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  // Runs fn on the loop thread, after whatever it is doing now (never inline). Work deferred
  // before the loop stopped always runs (the last of it on the way out); after, defer
  // returns false and drops fn.
  bool defer(std::function<void()> fn);
  bool in_loop() const {
    return std::this_thread::get_id() == thread_id_.load(std::memory_order_relaxed);
  }

  // Loop thread only. The handler stays registered until remove(); events for a removed
  // descriptor that were already collected are not delivered.
  void add(int fd, uint32_t events, Handler handler);
  void modify(int fd, uint32_t events);
  void remove(int fd);

  // Loop thread only: fn runs at `when` unless cancelled first; ids are never 0.
  uint64_t add_timer(Clock::time_point when, std::function<void()> fn);
  void cancel_timer(uint64_t id);

  // Loop thread only: a poller is called on every turn of the loop with arm=false (it
  // returns whether it did any work, which keeps the loop spinning), and with arm=true just
  // before the loop sleeps (it prepares its wake-up and returns whether work is already
  // waiting, in which case the loop does not sleep). For what no descriptor announces while
  // the loop spins: the shared-memory rings of the local transport. Ids are never 0.
  using Poller = std::function<bool(bool arm)>;
  uint64_t add_poller(Poller poller);
  void remove_poller(uint64_t id);

  // Stops the loop once the work deferred before it has run; join() waits for the thread
  // (not from the loop thread itself).
  void close();
  void join();

 private:
  void run();
  void wake();
  bool run_deferred();  // whether it ran anything
  int next_timeout_ms();
  bool run_pollers(bool arm);  // whether any found work
  void run_due_timers();
  // run()'s steps: a polling loop's yield of the core (which may end the polling), the
  // handlers of the ready descriptors, and the work deferred before the stop.
  void yield_core(SpinBackoff& backoff);
  void handle_events(const epoll_event* events, int n);
  void drain_after_stop();

  const std::string name_;
  const std::chrono::microseconds spin_;
  const std::chrono::microseconds spin_awaiting_;
  const std::function<bool()> awaiting_;
  const std::chrono::microseconds spin_backoff_;
  const std::function<void()> on_backoff_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
  std::atomic<bool> stopping_{false};

  Mutex mutex_;
  std::vector<std::function<void()>> deferred_ GRADWIRE_GUARDED_BY(mutex_);
  bool closed_ GRADWIRE_GUARDED_BY(mutex_) = false;
  // The loop is polling: work deferred now is seen without a wake-up.
  bool spinning_ GRADWIRE_GUARDED_BY(mutex_) = false;

  // Loop thread only.
  struct Entry {
    uint64_t token;
    std::shared_ptr<Handler> handler;
  };
  std::unordered_map<int, Entry> fds_;
  std::unordered_map<uint64_t, std::shared_ptr<Handler>> by_token_;
  uint64_t next_token_ = 1;
  std::multimap<Clock::time_point, std::pair<uint64_t, std::function<void()>>> timers_;
  std::unordered_map<uint64_t, decltype(timers_)::iterator> timer_ids_;
  uint64_t next_timer_ = 1;
  struct PollerEntry {
    uint64_t id;
    Poller fn;
    bool removed = false;
  };
  std::vector<std::unique_ptr<PollerEntry>> pollers_;
  bool pollers_removed_ = false;  // some entries are marked removed
  uint64_t next_poller_ = 1;
};

}  // namespace gradwire::rpc::transport
