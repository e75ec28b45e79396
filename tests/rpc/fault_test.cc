// The fault injector (rpc/fault_injection.h): rules match what they say and nothing else,
// and each action does to a running pair of agents what the field would do — a dropped
// request or reply times out, a delayed one arrives late, a cut connection fails what was
// pending on it at both ends and the next call reconnects.
#include "gradwire/rpc/fault_injection.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/registry.h"
#include "support/agents.h"
#include "support/event_log.h"
#include "support/sync.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const WorkerInfo kW0{"w0", 0};
const WorkerInfo kW1{"w1", 1};
const std::string kAdd = "add";
const std::string kFetch = "fetch";

FaultDecision::Verdict verdict(FaultInjector& f, const WorkerInfo& from, const WorkerInfo& to,
                               bool reply, uint32_t handler, const std::string& function) {
  return f.decide(OutgoingMessage{from, to, reply, handler, function}).verdict;
}

TEST(FaultRules, TheNthMatchingMessageAndTheCountAfterItAreActedOn) {
  FaultInjector f;
  Future<void> done = f.add({.action = FaultAction::kDrop, .to = "w1", .nth = 2, .count = 2});
  using V = FaultDecision::Verdict;
  EXPECT_EQ(verdict(f, kW0, kW1, false, kCallHandler, kAdd), V::kSend);  // 1st
  EXPECT_EQ(verdict(f, kW1, kW0, false, kCallHandler, kAdd), V::kSend);  // to w0: not counted
  EXPECT_FALSE(done.completed());
  EXPECT_EQ(verdict(f, kW0, kW1, false, kCallHandler, kAdd), V::kDrop);  // 2nd
  EXPECT_FALSE(done.completed());
  EXPECT_EQ(verdict(f, kW0, kW1, true, 2, kFetch), V::kDrop);  // 3rd
  EXPECT_TRUE(done.completed());
  EXPECT_EQ(verdict(f, kW0, kW1, false, kCallHandler, kAdd), V::kSend);  // spent
  EXPECT_EQ(f.fired(), 2u);
}

TEST(FaultRules, KindHandlerFunctionAndSenderNarrowARule) {
  FaultInjector f;
  f.add({.action = FaultAction::kCut,
         .from = "w0",
         .kind = MessageKind::kReply,
         .handler = 2,
         .function = "fetch",
         .count = -1});
  using V = FaultDecision::Verdict;
  EXPECT_EQ(verdict(f, kW0, kW1, false, 2, kFetch), V::kSend);  // a request
  EXPECT_EQ(verdict(f, kW0, kW1, true, 3, kFetch), V::kSend);   // another handler
  EXPECT_EQ(verdict(f, kW0, kW1, true, 2, kAdd), V::kSend);     // another function
  EXPECT_EQ(verdict(f, kW1, kW0, true, 2, kFetch), V::kSend);   // another sender
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(verdict(f, kW0, kW1, true, 2, kFetch), V::kCut);  // every one: count -1
  f.clear();
  EXPECT_EQ(verdict(f, kW0, kW1, true, 2, kFetch), V::kSend);
}

TEST(FaultRules, TheFirstMatchingRuleOwnsAMessage) {
  FaultInjector f;
  f.add({.action = FaultAction::kDelay, .function = "add", .nth = 2, .delay = 5ms});
  f.add({.action = FaultAction::kDrop});
  using V = FaultDecision::Verdict;
  // The first rule counts "add" (and is not yet due); the second sees only the rest.
  EXPECT_EQ(verdict(f, kW0, kW1, false, kCallHandler, kAdd), V::kSend);
  EXPECT_EQ(verdict(f, kW0, kW1, false, kCallHandler, kFetch), V::kDrop);
  const FaultDecision d = f.decide(OutgoingMessage{kW0, kW1, false, kCallHandler, kAdd});
  EXPECT_EQ(d.verdict, V::kDelay);
  EXPECT_EQ(d.delay, 5ms);
}

TEST(FaultRules, RulesThatCannotFireAreRefused) {
  FaultInjector f;
  EXPECT_THROW(f.add({.nth = 0}), InvalidArgument);
  EXPECT_THROW(f.add({.count = 0}), InvalidArgument);
  EXPECT_THROW(f.add({.count = -2}), InvalidArgument);
  EXPECT_THROW(f.add({.action = FaultAction::kDelay, .delay = -1ms}), InvalidArgument);
  try {
    f.add({.action = FaultAction::kDrop, .delay = 10ms});
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("delay action only"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.fired(), 0u);
}

TEST(FaultRules, DelayedWorkRunsInOrderAndAtDestructionAtTheLatest) {
  std::vector<int> order;
  test::CountdownLatch first_two(2);
  {
    FaultInjector f;
    f.run_later(30ms, [&] {
      order.push_back(2);
      first_two.count_down();
    });
    f.run_later(0ms, [&] {
      order.push_back(1);
      first_two.count_down();
    });
    ASSERT_TRUE(first_two.wait(5s));
    f.run_later(1h, [&] { order.push_back(3); });
  }
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

// ---- on running agents

class FaultsOnAgents : public ::testing::Test {
 protected:
  void SetUp() override {
    reg_.def("add", [](int64_t a, int64_t b) { return a + b; });
    reg_.def("count", [this]() -> int64_t { return ++served_; });
    reg_.def("block", [this]() -> int64_t {
      entered_.count_down();
      return release_.wait(20s) ? 1 : 0;
    });
    AgentOptions options = test::agent_options(reg_);
    options.faults = faults_;
    agents_ = test::start_agents(2, options);
  }
  void TearDown() override {
    release_.count_down();
    test::shutdown_agents(agents_);
  }
  RpcAgent& w0() { return *agents_[0]; }
  RpcAgent& w1() { return *agents_[1]; }

  Registry reg_;
  std::shared_ptr<FaultInjector> faults_ = std::make_shared<FaultInjector>();
  test::Agents agents_;
  std::atomic<int64_t> served_{0};
  test::CountdownLatch entered_{1};
  test::CountdownLatch release_{1};
};

TEST_F(FaultsOnAgents, ADroppedRequestTimesOutAndIsNeverServed) {
  Future<void> fired = faults_->add(
      {.action = FaultAction::kDrop, .from = "w0", .to = "w1", .function = "count", .nth = 2});
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "count"), 1);
  const auto start = Clock::now();
  EXPECT_THROW(w0().rpc_sync<int64_t>("w1", "count", CallOptions{.timeout = 200ms}), TimeoutError);
  EXPECT_GE(Clock::now() - start, 200ms);
  EXPECT_TRUE(fired.completed());
  // The third goes through, and the second never ran.
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "count"), 2);
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "add", int64_t{2}, int64_t{3}), 5);
}

TEST_F(FaultsOnAgents, ADroppedReplyTimesOutAfterTheFunctionRanOnce) {
  faults_->add({.action = FaultAction::kDrop,
                .from = "w1",
                .kind = MessageKind::kReply,
                .function = "count"});
  EXPECT_THROW(w0().rpc_sync<int64_t>("w1", "count", CallOptions{.timeout = 200ms}), TimeoutError);
  EXPECT_EQ(served_.load(), 1);
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "count"), 2);
  EXPECT_EQ(w0().metrics().pending_calls, 0);
}

TEST_F(FaultsOnAgents, ADelayedRequestArrivesLateAndOneDelayedPastItsDeadlineTimesOut) {
  faults_->add({.action = FaultAction::kDelay, .from = "w0", .function = "add", .delay = 150ms});
  auto start = Clock::now();
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "add", int64_t{20}, int64_t{22}), 42);
  EXPECT_GE(Clock::now() - start, 150ms);

  // A reply delayed past the call's deadline: the call times out, the late reply is dropped,
  // and the pair goes on.
  Future<void> fired = faults_->add({.action = FaultAction::kDelay,
                                     .from = "w1",
                                     .kind = MessageKind::kReply,
                                     .function = "count",
                                     .delay = 400ms});
  EXPECT_THROW(w0().rpc_sync<int64_t>("w1", "count", CallOptions{.timeout = 100ms}), TimeoutError);
  EXPECT_TRUE(fired.completed());
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "count"), 2);
}

// Told when a worker's connection is lost.
class LostWorkers : public AgentListener {
 public:
  void on_worker_lost(const WorkerInfo& worker, const std::string& why) override {
    MutexLock lock(mutex_);
    if (lost_.empty()) lost_ = worker.name + ": " + why;
    latch_.count_down();
  }
  bool wait(std::chrono::milliseconds timeout) { return latch_.wait(timeout); }
  std::string first() {
    MutexLock lock(mutex_);
    return lost_;
  }

 private:
  Mutex mutex_;
  std::string lost_ GRADWIRE_GUARDED_BY(mutex_);
  test::CountdownLatch latch_{1};
};

TEST_F(FaultsOnAgents, ACutFailsWhatWasPendingOnTheConnectionAtBothEndsAndTheNextCallReconnects) {
  auto w1_lost = std::make_shared<LostWorkers>();
  w1().add_listener(w1_lost);
  // A call that is running on w1 when the connection goes.
  Future<int64_t> pending = w0().rpc_async<int64_t>("w1", "block");
  ASSERT_TRUE(entered_.wait(10s));
  Future<void> fired =
      faults_->add({.action = FaultAction::kCut, .from = "w0", .to = "w1", .function = "add"});
  const auto start = Clock::now();
  Future<int64_t> cut = w0().rpc_async<int64_t>("w1", "add", int64_t{1}, int64_t{1});
  for (Future<int64_t>* f : {&pending, &cut}) {
    ASSERT_TRUE(f->wait(10s));
    try {
      f->value();
      ADD_FAILURE() << "expected NetworkError";
    } catch (const NetworkError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("worker 'w1'"), std::string::npos) << what;
      EXPECT_NE(what.find("cut by a fault rule"), std::string::npos) << what;
    }
  }
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_TRUE(fired.completed());
  // The other end saw the connection lost too.
  ASSERT_TRUE(w1_lost->wait(10s));
  EXPECT_EQ(w1_lost->first().rfind("w0: ", 0), 0u) << w1_lost->first();
  // The next call opens a new connection.
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "add", int64_t{2}, int64_t{2}), 4);
  release_.count_down();
}

TEST_F(FaultsOnAgents, ACutReplyFailsTheCallerWithANetworkErrorNamingTheCallee) {
  faults_->add({.action = FaultAction::kCut,
                .from = "w1",
                .kind = MessageKind::kReply,
                .function = "count"});
  const auto start = Clock::now();
  try {
    w0().rpc_sync<int64_t>("w1", "count");
    ADD_FAILURE() << "expected NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("worker 'w1'"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_EQ(served_.load(), 1);
  EXPECT_EQ(w0().rpc_sync<int64_t>("w1", "count"), 2);
}

// ---- a lost worker replaced by a new one under its name (AgentOptions::rejoin)

// Told of lost and rejoined workers, in order.
class Membership : public AgentListener {
 public:
  void on_worker_lost(const WorkerInfo& worker, const std::string&) override {
    log_.add("lost " + worker.name);
  }
  void on_worker_rejoined(const WorkerInfo& worker, int incarnation) override {
    log_.add("rejoined " + worker.name + " #" + std::to_string(incarnation));
  }
  std::vector<std::string> wait_for(size_t n, std::chrono::milliseconds timeout) {
    return log_.wait_for(n, timeout);
  }

 private:
  test::EventLog log_;
};

TEST(Rejoin, ALostWorkerIsReplacedUnderItsNameAndTheOthersServeAndCallIt) {
  Registry reg;
  reg.def("add", [](int64_t a, int64_t b) { return a + b; });
  reg.def("incarnation",
          [](const CallContext& ctx) -> int64_t { return ctx.agent()->incarnation(); });
  AgentOptions options = test::agent_options(reg);
  auto store = std::make_shared<c10d::HashStore>(20s);
  std::vector<std::shared_ptr<Membership>> seen;
  test::Agents agents(3);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      seen.push_back(std::make_shared<Membership>());
      agents[static_cast<size_t>(r)] =
          create_tensorpipe_agent(test::worker_name(r), r, 3, store, options);
      agents[static_cast<size_t>(r)]->add_listener(seen.back());
    }
    for (int r = 0; r < 3; ++r)
      threads.emplace_back([&, r] { agents[static_cast<size_t>(r)]->start(); });
    for (auto& t : threads)
      t.join();
  }
  // w0 and w2 both know w1; then w1 goes without a word.
  for (int r : {0, 2})
    EXPECT_EQ(agents[static_cast<size_t>(r)]->rpc_sync<int64_t>("w1", "incarnation"), 0);
  agents[1]->shutdown(false);
  for (int r : {0, 2}) {
    EXPECT_EQ(seen[static_cast<size_t>(r)]->wait_for(1, 10s), std::vector<std::string>{"lost w1"});
    EXPECT_THROW(agents[static_cast<size_t>(r)]->rpc_sync<int64_t>("w1", "incarnation"),
                 NetworkError);
  }
  // A replacement needs a running group.
  AgentOptions rejoining = options;
  rejoining.rejoin = true;
  EXPECT_THROW(make_tensorpipe_agent("w1", 1, 3, std::make_shared<c10d::HashStore>(1s), rejoining),
               InvalidArgument);

  // The replacement joins without anyone waiting for it and is a new incarnation.
  auto w1 = make_tensorpipe_agent("w1", 1, 3, store, rejoining);
  EXPECT_EQ(w1->incarnation(), 1);
  // It calls w0 (which is told it rejoined before serving it), and w0 and w2 call it at its
  // new address.
  EXPECT_EQ(w1->rpc_sync<int64_t>("w0", "add", int64_t{40}, int64_t{2}), 42);
  EXPECT_EQ(seen[0]->wait_for(2, 10s), (std::vector<std::string>{"lost w1", "rejoined w1 #1"}));
  for (int r : {0, 2})
    EXPECT_EQ(agents[static_cast<size_t>(r)]->rpc_sync<int64_t>("w1", "incarnation"), 1);
  EXPECT_EQ(seen[2]->wait_for(2, 10s), (std::vector<std::string>{"lost w1", "rejoined w1 #1"}));
  // The group shuts down gracefully with the replacement in the old one's place.
  agents[1] = w1;
  test::shutdown_agents(agents);
}

}  // namespace
}  // namespace gradwire::rpc
