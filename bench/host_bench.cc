// What the host charges for a wake-up, the cost under every figure that waits for a message.
//   host.wake_latency_us  µs from one thread's FUTEX_WAKE to the sleeping thread running again,
//                         after the sleeper's core has had nothing to do for 1 ms (p50);
//                         params: the same after 0.02, 0.1, 1 and 5 ms of idling (p10/p50/p90),
//                         and as a baseline the woken thread polling instead of sleeping
// On bare metal and on most virtual machines the figure hardly depends on how long the core
// idled; where an idle virtual CPU is descheduled by its host (no guest idle polling) it grows
// with the idle time, and every message that finds its receiver asleep pays it.
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"

namespace gradwire::bench {
namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// The futex word is the round number; the sleeper waits while it is not yet its round.
struct Rendezvous {
  std::atomic<uint32_t> round{0};
  std::atomic<uint32_t> seen{0};  // last round the sleeper ran for
  std::atomic<int64_t> stamp{0};  // when the waker woke it (ns)
  std::atomic<bool> poll{false};  // the sleeper polls instead of sleeping
};

void futex_wait(std::atomic<uint32_t>& word, uint32_t value) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, value, nullptr,
          nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr,
          0);
}

// Microseconds from wake to running, one per round: the waker busy-waits `idle` (its own core
// stays busy while the sleeper's has nothing to do), then stamps the time and wakes.
std::vector<double> wake_latencies(std::chrono::microseconds idle, int rounds, bool poll) {
  Rendezvous r;
  r.poll = poll;
  std::vector<double> us;
  us.reserve(static_cast<size_t>(rounds));
  std::thread sleeper([&] {
    for (uint32_t i = 1; i <= static_cast<uint32_t>(rounds); ++i) {
      for (uint32_t v = r.round.load(std::memory_order_acquire); v != i;
           v = r.round.load(std::memory_order_acquire)) {
        if (!r.poll) futex_wait(r.round, v);
      }
      us.push_back(static_cast<double>(now_ns() - r.stamp.load(std::memory_order_relaxed)) / 1e3);
      r.seen.store(i, std::memory_order_release);
    }
  });
  for (uint32_t i = 1; i <= static_cast<uint32_t>(rounds); ++i) {
    // Not part of what is timed: on one core, let the sleeper record the last round.
    while (r.seen.load(std::memory_order_acquire) != i - 1)
      std::this_thread::yield();
    const auto until = Clock::now() + idle;
    while (Clock::now() < until) {
    }
    r.stamp.store(now_ns(), std::memory_order_relaxed);
    r.round.store(i, std::memory_order_release);
    if (!poll) futex_wake(r.round);
  }
  sleeper.join();
  return us;
}

const Register host_bench({"host.wake_latency_us"}, [](const auto& emit) {
  struct Gap {
    int us;
    int rounds;
  };
  const Gap gaps[] = {{20, 2000}, {100, 1500}, {1000, 600}, {5000, 200}};
  Params params{{"statistic", "percentiles over the rounds (the first tenth untimed)"},
                {"how",
                 "two threads of one process; the waker busy-waits the idle time, stamps the "
                 "clock and FUTEX_WAKEs the sleeper, which records when it runs again"}};
  double value = 0;
  for (const Gap& g : gaps) {
    std::vector<double> us = wake_latencies(std::chrono::microseconds(g.us), g.rounds, false);
    us.erase(us.begin(), us.begin() + g.rounds / 10);
    const std::string key = "idle_" + std::to_string(g.us) + "us_";
    params.emplace_back(key + "p10", percentile(us, 0.10));
    params.emplace_back(key + "p50", percentile(us, 0.50));
    params.emplace_back(key + "p90", percentile(us, 0.90));
    if (g.us == 1000) value = percentile(us, 0.50);
  }
  const unsigned cores = std::thread::hardware_concurrency();
  params.emplace_back("cores", static_cast<double>(cores));
  // Polling needs a core of its own beside the waker's busy wait.
  if (cores >= 2) {
    std::vector<double> polled = wake_latencies(std::chrono::microseconds(100), 1000, true);
    polled.erase(polled.begin(), polled.begin() + 100);
    const double polled_p50 = percentile(polled, 0.50);
    params.emplace_back("polling_p50", polled_p50);
    params.emplace_back("polling",
                        "baseline: the same with the sleeper polling the word "
                        "(after 100 us idle), no system call on either side");
    params.emplace_back("ratio_to_polling", polled_p50 > 0 ? value / polled_p50 : 0.0);
  } else {
    params.emplace_back("polling", "unavailable: one core");
  }
  emit(Figure{"host.wake_latency_us", value, "us", std::move(params)});
});

}  // namespace
}  // namespace gradwire::bench
