// FaultInjector: makes an agent drop, delay or cut the messages it sends, on command, so that
// tests can show what a job does when the network misbehaves — without sleeping and without
// touching the code under test.
//
// An injector is handed to an agent through AgentOptions::faults. The agent asks it about
// every request and every reply it is about to write, whichever module made it (a call, an
// RRef's fork protocol, a distributed backward pass), so a rule can aim at exactly one
// message: "the 3rd reply to a 'step' call sent to ps0". Rules are matched in the order they
// were added; the first rule that matches a message counts it, and acts on it when the count
// reaches `nth` (and on the next count-1 matches after it).
//
// What the actions do to the message and to the workers:
// - kDrop: the message is never written. A dropped request fails at its caller's deadline
//   with TimeoutError; a dropped reply too, after the function has run on the callee (which
//   is how a lost reply looks in the field).
// - kDelay: the message is written `delay` later, from the injector's timer thread (later
//   messages to the same peer may overtake it). The deadline of the call keeps running.
// - kCut: the connection the message would travel on is closed, and the message with it:
//   both workers see the connection lost, as when the peer dies (pending calls on it fail
//   with NetworkError naming the peer, and the modules above release what the peer held).
//   The next message to that peer opens a new connection.
//
// A message the sender does not expect an answer to is a request too (rref/'s deletions are
// requests with empty replies). Messages an agent writes on its own account (a refusal of a
// malformed message, the release of lent tensors) are never faulted.
//
// Thread-safety: every method may be called from any thread, also while agents use the
// injector. One injector may serve several agents (ranks as threads); `from` then tells
// their messages apart.
//
// Errors: add() throws InvalidArgument for a rule that cannot fire (nth < 1, count 0 or below
// -1, a negative delay, or a delay given for another action).
//
// Example: the second call to "step" on worker "ps0" is dropped.
//   auto faults = std::make_shared<rpc::FaultInjector>();
//   Future<void> fired = faults->add({.action = rpc::FaultAction::kDrop, .to = "ps0",
//                                     .function = "step", .nth = 2});
//   options.faults = faults;   // then create the agent with these options
//   ...
//   EXPECT_THROW(agent->rpc_sync<void>("ps0", "step"), TimeoutError);
//   EXPECT_TRUE(fired.wait(1s));
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/rpc/worker_info.h"

namespace gradwire::rpc {

enum class FaultAction { kDrop, kDelay, kCut };
// "drop", "delay", "cut".
const char* fault_action_name(FaultAction action);

// Which messages of a sender a rule counts.
enum class MessageKind { kAny, kRequest, kReply };

struct FaultRule {
  FaultAction action{FaultAction::kDrop};
  // The worker that sends the message (for injectors shared by several agents); empty: any.
  std::string from{};
  // The worker the message goes to; empty: any.
  std::string to{};
  MessageKind kind{MessageKind::kAny};
  // The request's handler (rpc::kCallHandler, rref::kRRefHandler, ...); a reply counts as
  // its request's. Unset: any.
  std::optional<uint32_t> handler{};
  // The request's function (for other handlers, what its module calls the message, e.g.
  // "fetch"); a reply counts as its request's. Empty: any.
  std::string function{};
  // The first matching message acted on (1: the first one).
  int64_t nth{1};
  // How many matching messages from the nth on; -1: every one.
  int64_t count{1};
  // kDelay only: how much later the message is written.
  std::chrono::milliseconds delay{0};
};

// One message an agent is about to write, as the injector sees it.
struct OutgoingMessage {
  const WorkerInfo& from;
  const WorkerInfo& to;
  bool is_reply;
  uint32_t handler;
  const std::string& function;
};

// What to do with one message.
struct FaultDecision {
  enum class Verdict { kSend, kDrop, kDelay, kCut };
  Verdict verdict{Verdict::kSend};
  std::chrono::milliseconds delay{0};
};

class FaultInjector {
 public:
  FaultInjector() = default;
  ~FaultInjector();
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  // Adds a rule. The future completes once the rule has acted on its last message (never,
  // for count -1), so a test waits for the fault itself rather than for time to pass.
  Future<void> add(FaultRule rule);
  // Removes every rule; messages flow untouched from then on (a delayed one still goes).
  void clear();
  // Messages acted on so far, by every rule.
  uint64_t fired() const;

  // For agents: counts `message` against the rules and says what to do with it.
  FaultDecision decide(const OutgoingMessage& message);
  // For agents: runs `fn` `delay` from now on the injector's timer thread (kDelay). `fn`
  // must not block; it runs at the latest when the injector is destroyed.
  void run_later(std::chrono::milliseconds delay, std::function<void()> fn);

 private:
  struct Armed {
    FaultRule rule;
    int64_t seen{0};
    int64_t acted{0};
    Future<void> done;
  };
  using Clock = std::chrono::steady_clock;
  void timer_loop();

  mutable Mutex mutex_;
  std::vector<Armed> rules_ GRADWIRE_GUARDED_BY(mutex_);
  uint64_t fired_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  std::multimap<Clock::time_point, std::function<void()>> timers_ GRADWIRE_GUARDED_BY(mutex_);
  bool stopping_ GRADWIRE_GUARDED_BY(mutex_) = false;
  std::condition_variable timer_cv_;
  std::thread timer_;  // started by the first run_later
};

}  // namespace gradwire::rpc
