#include "transport/reactor.h"

#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"

namespace gradwire::rpc::transport {

namespace {
constexpr uint64_t kWakeToken = 0;
}

Reactor::Reactor(std::string name, std::chrono::microseconds spin,
                 std::chrono::microseconds spin_awaiting, std::function<bool()> awaiting,
                 std::chrono::microseconds spin_backoff, std::function<void()> on_backoff)
    : name_(std::move(name)),
      spin_(spin),
      spin_awaiting_(awaiting ? spin_awaiting : std::chrono::microseconds(0)),
      awaiting_(std::move(awaiting)),
      spin_backoff_(spin_backoff),
      on_backoff_(std::move(on_backoff)) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  if (epoll_fd_ < 0) {
    throw NetworkError("transport " + name_ + ": epoll_create1 failed: " + std::strerror(errno));
  }
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd_ < 0) {
    const int err = errno;
    ::close(epoll_fd_);
    throw NetworkError("transport " + name_ + ": eventfd failed: " + std::strerror(err));
  }
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kWakeToken;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  thread_ = std::thread([this] { run(); });
}

Reactor::~Reactor() {
  close();
  if (thread_.joinable()) {
    if (in_loop()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  ::close(wake_fd_);
  ::close(epoll_fd_);
}

bool Reactor::defer(std::function<void()> fn) {
  bool need_wake = false;
  {
    MutexLock lock(mutex_);
    if (closed_) return false;
    // The loop drains the queue before it sleeps, and looks at it while it spins: only the
    // first item from another thread, while the loop may be asleep, needs to wake it.
    need_wake = deferred_.empty() && !spinning_;
    deferred_.push_back(std::move(fn));
  }
  if (need_wake && !in_loop()) wake();
  return true;
}

void Reactor::wake() {
  const uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN: the counter is already non-zero, the loop will wake anyway
}

void Reactor::add(int fd, uint32_t events, Handler handler) {
  const uint64_t token = next_token_++;
  auto h = std::make_shared<Handler>(std::move(handler));
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = token;
  if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
    throw NetworkError("transport " + name_ + ": epoll_ctl(ADD) failed: " + std::strerror(errno));
  }
  fds_[fd] = Entry{token, h};
  by_token_[token] = std::move(h);
}

void Reactor::modify(int fd, uint32_t events) {
  auto it = fds_.find(fd);
  if (it == fds_.end()) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = it->second.token;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd, &ev);
}

void Reactor::remove(int fd) {
  auto it = fds_.find(fd);
  if (it == fds_.end()) return;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  by_token_.erase(it->second.token);
  fds_.erase(it);
}

uint64_t Reactor::add_timer(Clock::time_point when, std::function<void()> fn) {
  const uint64_t id = next_timer_++;
  auto it = timers_.emplace(when, std::make_pair(id, std::move(fn)));
  timer_ids_[id] = it;
  return id;
}

void Reactor::cancel_timer(uint64_t id) {
  auto it = timer_ids_.find(id);
  if (it == timer_ids_.end()) return;
  timers_.erase(it->second);
  timer_ids_.erase(it);
}

uint64_t Reactor::add_poller(Poller poller) {
  auto entry = std::make_unique<PollerEntry>();
  entry->id = next_poller_++;
  entry->fn = std::move(poller);
  pollers_.push_back(std::move(entry));
  return pollers_.back()->id;
}

void Reactor::remove_poller(uint64_t id) {
  // Marked here and erased at the start of the next turn: a turn may be iterating now.
  for (const auto& entry : pollers_) {
    if (entry->id == id && !entry->removed) {
      entry->removed = true;
      pollers_removed_ = true;
      return;
    }
  }
}

bool Reactor::run_pollers(bool arm) {
  if (pollers_removed_) {
    std::erase_if(pollers_, [](const auto& entry) { return entry->removed; });
    pollers_removed_ = false;
  }
  bool found = false;
  // By index and raw pointer (no copy of the list on every turn of a spinning loop):
  // entries stay allocated while the turn runs, and those added by a poller run next turn.
  const size_t count = pollers_.size();
  for (size_t i = 0; i < count; ++i) {
    PollerEntry* entry = pollers_[i].get();
    if (entry->removed) continue;
    try {
      if (entry->fn(arm)) found = true;
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "transport " << name_ << ": a poller threw: " << e.what();
    }
  }
  return found;
}

void Reactor::close() {
  {
    MutexLock lock(mutex_);
    if (closed_) return;
    // The stop is itself deferred work: what was deferred before it still runs.
    deferred_.push_back([this] { stopping_.store(true, std::memory_order_relaxed); });
  }
  wake();
}

void Reactor::join() {
  if (thread_.joinable() && !in_loop()) thread_.join();
}

int Reactor::next_timeout_ms() {
  if (timers_.empty()) return -1;
  const auto wait = timers_.begin()->first - Clock::now();
  if (wait <= Clock::duration::zero()) return 0;
  // Rounded up so that a timer never fires early.
  return static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(wait).count());
}

void Reactor::run_due_timers() {
  const auto now = Clock::now();
  while (!timers_.empty() && timers_.begin()->first <= now) {
    auto node = timers_.extract(timers_.begin());
    timer_ids_.erase(node.mapped().first);
    node.mapped().second();
  }
}

bool Reactor::run_deferred() {
  bool ran = false;
  for (;;) {
    std::vector<std::function<void()>> batch;
    {
      MutexLock lock(mutex_);
      if (deferred_.empty()) return ran;
      batch.swap(deferred_);
    }
    ran = true;
    for (auto& fn : batch) {
      try {
        fn();
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kError) << "transport " << name_ << ": deferred work threw: " << e.what();
      }
    }
  }
}

void Reactor::run() {
  thread_id_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  // "gw-tcp w0": what ps and /proc show (15 characters at most).
  ::pthread_setname_np(::pthread_self(), ("gw-" + name_).substr(0, 15).c_str());
  std::vector<epoll_event> events(128);
  Clock::time_point last_work = Clock::now();
  // Polling goes on this long after the last activity (longer while an answer is awaited).
  SpinBackoff backoff(spin_backoff_);
  auto polling = [&] {
    if (!backoff.allows_polling()) return false;
    const Clock::time_point now = Clock::now();
    if (spin_.count() > 0 && now < last_work + spin_) return true;
    return spin_awaiting_ > spin_ && now < last_work + spin_awaiting_ && awaiting_();
  };
  while (!stopping_.load(std::memory_order_relaxed)) {
    bool worked = run_deferred();
    if (stopping_.load(std::memory_order_relaxed)) break;
    if (run_pollers(false)) worked = true;
    if (worked) {
      last_work = Clock::now();
      backoff.worked();
    }
    int timeout = next_timeout_ms();
    bool sleeping = false;
    {
      MutexLock lock(mutex_);
      if (!deferred_.empty()) {
        timeout = 0;
      } else if (polling()) {
        timeout = 0;
        spinning_ = true;
      } else {
        // From here on a defer from another thread wakes the loop.
        spinning_ = false;
        sleeping = timeout != 0;
      }
    }
    // Pollers arm their wake-ups last, so that what arrives after they looked wakes us.
    if (sleeping && run_pollers(true)) timeout = 0;
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), timeout);
    if (n > 0) {
      last_work = Clock::now();
      backoff.worked();
    } else if (n == 0 && timeout == 0) {
      yield_core(backoff);
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      GRADWIRE_LOG(kError) << "transport " << name_
                           << ": epoll_wait failed: " << std::strerror(errno);
      break;
    }
    handle_events(events.data(), n);
    run_due_timers();
  }
  drain_after_stop();
}

void Reactor::yield_core(SpinBackoff& backoff) {
  // Polling with nothing to do: let another runnable thread have this core (with more
  // busy threads than cores, a spinning loop would otherwise delay the very peer whose
  // message it waits for). A yield that kept us off the core long says there are such
  // threads: stop polling and sleep until the next activity (SpinBackoff).
  const Clock::time_point before = Clock::now();
  ::sched_yield();
  const bool was_polling = backoff.allows_polling();
  backoff.yielded(Clock::now() - before);
  if (was_polling && !backoff.allows_polling() && on_backoff_) on_backoff_();
}

void Reactor::handle_events(const epoll_event* events, int n) {
  for (int i = 0; i < n; ++i) {
    const uint64_t token = events[i].data.u64;
    if (token == kWakeToken) {
      uint64_t count = 0;
      ssize_t r = ::read(wake_fd_, &count, sizeof(count));
      (void)r;
      continue;
    }
    auto it = by_token_.find(token);
    if (it == by_token_.end()) continue;  // removed by an earlier handler of this batch
    std::shared_ptr<Handler> handler = it->second;
    try {
      (*handler)(events[i].events);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "transport " << name_ << ": a handler threw: " << e.what();
    }
  }
}

void Reactor::drain_after_stop() {
  // What was deferred before the stop still runs (it may owe callbacks); later defers fail.
  for (;;) {
    std::vector<std::function<void()>> batch;
    {
      MutexLock lock(mutex_);
      if (deferred_.empty()) {
        closed_ = true;
        break;
      }
      batch.swap(deferred_);
    }
    for (auto& fn : batch) {
      try {
        fn();
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kError) << "transport " << name_ << ": deferred work threw: " << e.what();
      }
    }
  }
  timers_.clear();
  timer_ids_.clear();
  pollers_.clear();
}

}  // namespace gradwire::rpc::transport
