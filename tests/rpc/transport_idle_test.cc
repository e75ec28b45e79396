// Transports at rest (TransportIdle): connected agents and a caller waiting on a long call
// use no CPU, the spin options are checked, and polling threads that cannot get their core
// sleep instead.
#include <gtest/gtest.h>
#include <sched.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "support/agents.h"
#include "transport/reactor.h"
#include "transport_fixture.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using namespace transport_fixture;

// Per thread (name and id): user+system CPU ticks, from /proc.
std::map<std::string, long> thread_ticks() {
  std::map<std::string, long> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
    std::ifstream comm(entry.path() / "comm");
    std::string name;
    std::getline(comm, name);
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream fields(text.substr(close + 2));
    std::string field;
    long utime = 0;
    long stime = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14) utime = std::stol(field);
      if (i == 15) stime = std::stol(field);
    }
    out[name + "/" + entry.path().filename().string()] = utime + stime;
  }
  return out;
}

// The CPU ticks that threads not in `before` (those that appeared since) use over the next
// second, and which of them used any ("name/tid:ticks ..."); threads whose name starts with
// `skip` (when not empty) are not counted.
struct CpuUse {
  long ticks = 0;
  std::string busy;
};
CpuUse cpu_over_a_second(const std::map<std::string, long>& before, const std::string& skip = "") {
  const auto ticks0 = thread_ticks();
  std::this_thread::sleep_for(1s);  // the measured stretch itself, not a wait for an event
  CpuUse use;
  for (const auto& [thread, ticks] : thread_ticks()) {
    if (before.count(thread) != 0) continue;
    if (!skip.empty() && thread.rfind(skip, 0) == 0) continue;
    auto it = ticks0.find(thread);
    const long delta = ticks - (it == ticks0.end() ? 0 : it->second);
    use.ticks += delta;
    if (delta > 0) use.busy += " " + thread + ":" + std::to_string(delta);
  }
  return use;
}

TEST(TransportIdle, ConnectedAgentsUseNoCpuWhileIdle) {
  Registry reg;
  register_basics(reg);
  // The agents' threads are those that appear with them (BLAS and the harness have theirs).
  const auto before = thread_ticks();
  Group g = start_group(2, options_for(reg));
  expect_serving(g);
  EXPECT_EQ(g.agents[1]->rpc_sync<std::string>("w0", "concat", std::string("x"), std::string("y")),
            "xy");
  // The measurement itself is an idle stretch: two agents, connected both ways, doing
  // nothing for a second. Busy-polling transports burn about a core per agent here.
  const CpuUse use = cpu_over_a_second(before);
  // Clock ticks are 10 ms: 2 ticks in a second is 1% of a core per agent.
  EXPECT_LE(use.ticks, 2) << "ticks used by the agents' threads over an idle second:" << use.busy;
  test::shutdown_agents(g.agents);
}

// A caller whose call is being served for a long time polls its transports for
// transport_spin_awaiting after the last traffic, then sleeps: waiting costs no CPU either.
TEST(TransportIdle, ACallerWaitingOnALongCallPollsBrieflyThenSleeps) {
  Registry reg;
  register_basics(reg);
  auto release = std::make_shared<Future<void>>();
  reg.def("held", [release] {
    release->wait(10s);
    return 1;
  });
  const auto before = thread_ticks();
  rpc::AgentOptions options = options_for(reg);
  options.transport_spin_awaiting = 3ms;
  Group g = start_group(2, options);
  expect_serving(g);
  Future<int> pending = g.agents[1]->rpc_async<int>("w0", "held");
  const CpuUse use = cpu_over_a_second(before);
  EXPECT_FALSE(pending.completed());
  // Polling for the whole second would be about 100 ticks.
  EXPECT_LE(use.ticks, 3) << "ticks used by the agents' threads while a call waited:" << use.busy;
  release->try_set_value();
  EXPECT_EQ(std::move(pending).get(10s), 1);
  test::shutdown_agents(g.agents);
}

TEST(TransportIdle, SpinOptionsOutOfRangeAreRefused) {
  Registry reg;
  for (const std::string field : {"transport_spin_awaiting", "transport_spin_backoff"}) {
    for (auto spin : {std::chrono::microseconds(-1), std::chrono::microseconds(1'000'001)}) {
      rpc::AgentOptions options = options_for(reg);
      (field == "transport_spin_awaiting" ? options.transport_spin_awaiting
                                          : options.transport_spin_backoff) = spin;
      try {
        Group g = start_group(1, options);
        ADD_FAILURE() << field << " " << spin.count() << " us was taken";
        test::shutdown_agents(g.agents);
      } catch (const std::exception& e) {  // start_group names the rank that failed
        EXPECT_NE(
            std::string(e.what()).find("AgentOptions::" + field + " must be in [0, 1 s], got " +
                                       std::to_string(spin.count()) + " us"),
            std::string::npos)
            << e.what();
      }
    }
  }
}

// The rule: a yield that took the backoff or longer ends polling; the next activity
// resumes it; a backoff of 0 never ends it.
TEST(TransportIdle, SpinBackoffEndsPollingAfterALongYieldUntilTheNextActivity) {
  transport::SpinBackoff backoff(100us);
  EXPECT_TRUE(backoff.allows_polling());
  backoff.yielded(5us);
  EXPECT_TRUE(backoff.allows_polling());
  backoff.yielded(99us);
  EXPECT_TRUE(backoff.allows_polling());
  backoff.yielded(100us);
  EXPECT_FALSE(backoff.allows_polling());
  backoff.yielded(1us);
  EXPECT_FALSE(backoff.allows_polling()) << "a short yield after a long one resumed polling";
  backoff.worked();
  EXPECT_TRUE(backoff.allows_polling());
  transport::SpinBackoff never(0us);
  never.yielded(10s);
  EXPECT_TRUE(never.allows_polling());
}

// On a core shared with a thread that computes without pause, polling transport threads
// (told to poll for a whole second after traffic) find their yields taking long, stop
// polling and sleep (transport_polls_backed_off counts it), and the next call still goes
// through (traffic wakes them). With transport_spin_backoff 0 they poll on, yielding to that
// thread between looks, and the counter stays 0.
TEST(TransportIdle, PollingThreadsThatCannotGetTheirCoreSleepInstead) {
  Registry reg;
  register_basics(reg);
  // Everything below, agents' threads included, runs on the core this thread is on now.
  cpu_set_t saved;
  ASSERT_EQ(::sched_getaffinity(0, sizeof(saved), &saved), 0);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(::sched_getcpu(), &one);
  ASSERT_EQ(::sched_setaffinity(0, sizeof(one), &one), 0);
  struct Restore {
    cpu_set_t set;
    ~Restore() { ::sched_setaffinity(0, sizeof(set), &set); }
  } restore{saved};
  auto backed_off = [&](std::chrono::microseconds backoff) {
    rpc::AgentOptions options = options_for(reg);
    options.transport_spin = 1s;
    options.transport_spin_awaiting = 1s;
    options.transport_spin_backoff = backoff;
    Group g = start_group(2, options);
    expect_serving(g);
    std::atomic<bool> stop{false};
    std::thread busy([&stop] {
      volatile uint64_t n = 0;
      while (!stop.load(std::memory_order_relaxed))
        n = n + 1;
    });
    uint64_t count = 0;
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(
          g.agents[1]->rpc_sync<std::string>("w0", "concat", std::string("a"), std::to_string(i)),
          "a" + std::to_string(i));
    }
    for (const auto& agent : g.agents)
      count += agent->metrics().transport_polls_backed_off;
    stop = true;
    busy.join();
    test::shutdown_agents(g.agents);
    return count;
  };
  EXPECT_GT(backed_off(100us), 0u) << "no transport thread stopped polling";
  EXPECT_EQ(backed_off(0us), 0u);
}

}  // namespace
}  // namespace gradwire::rpc
