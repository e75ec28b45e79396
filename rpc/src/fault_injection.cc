#include "gradwire/rpc/fault_injection.h"

#include <utility>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"

namespace gradwire::rpc {

const char* fault_action_name(FaultAction action) {
  switch (action) {
    case FaultAction::kDrop:
      return "drop";
    case FaultAction::kDelay:
      return "delay";
    case FaultAction::kCut:
      return "cut";
  }
  return "unknown";
}

FaultInjector::~FaultInjector() {
  {
    MutexLock lock(mutex_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
}

Future<void> FaultInjector::add(FaultRule rule) {
  const std::string what = std::string("fault rule (") + fault_action_name(rule.action) + ")";
  if (rule.nth < 1) {
    throw InvalidArgument(what + ": nth must be at least 1, got " + std::to_string(rule.nth));
  }
  if (rule.count == 0 || rule.count < -1) {
    throw InvalidArgument(what + ": count must be at least 1, or -1 for every message; got " +
                          std::to_string(rule.count));
  }
  if (rule.delay.count() < 0 || (rule.action != FaultAction::kDelay && rule.delay.count() != 0)) {
    throw InvalidArgument(what +
                          ": a delay must be >= 0 and belongs to the delay action only; got " +
                          std::to_string(rule.delay.count()) + " ms");
  }
  Armed armed{std::move(rule), 0, 0, Future<void>()};
  Future<void> done = armed.done;
  MutexLock lock(mutex_);
  rules_.push_back(std::move(armed));
  return done;
}

void FaultInjector::clear() {
  MutexLock lock(mutex_);
  rules_.clear();
}

uint64_t FaultInjector::fired() const {
  MutexLock lock(mutex_);
  return fired_;
}

namespace {

bool matches(const FaultRule& rule, const OutgoingMessage& m) {
  if (!rule.from.empty() && rule.from != m.from.name) return false;
  if (!rule.to.empty() && rule.to != m.to.name) return false;
  if (rule.kind == MessageKind::kRequest && m.is_reply) return false;
  if (rule.kind == MessageKind::kReply && !m.is_reply) return false;
  if (rule.handler && *rule.handler != m.handler) return false;
  return rule.function.empty() || rule.function == m.function;
}

}  // namespace

FaultDecision FaultInjector::decide(const OutgoingMessage& message) {
  Future<void> finished;
  FaultDecision decision;
  {
    MutexLock lock(mutex_);
    for (Armed& armed : rules_) {
      const FaultRule& rule = armed.rule;
      if (!matches(rule, message)) continue;
      // The first matching rule owns the message, whether or not it acts on it yet.
      const int64_t position = ++armed.seen;
      if (position < rule.nth || (rule.count != -1 && armed.acted >= rule.count)) break;
      ++armed.acted;
      ++fired_;
      switch (rule.action) {
        case FaultAction::kDrop:
          decision.verdict = FaultDecision::Verdict::kDrop;
          break;
        case FaultAction::kDelay:
          decision.verdict = FaultDecision::Verdict::kDelay;
          decision.delay = rule.delay;
          break;
        case FaultAction::kCut:
          decision.verdict = FaultDecision::Verdict::kCut;
          break;
      }
      if (armed.acted == rule.count) finished = armed.done;
      GRADWIRE_LOG(kInfo) << "fault injected: " << fault_action_name(rule.action) << " the "
                          << (message.is_reply ? "reply" : "request") << " #" << position << " '"
                          << message.function << "' (handler " << message.handler << ") from "
                          << message.from.describe() << " to " << message.to.describe();
      break;
    }
  }
  // Completed outside the lock: a waiter's continuation may add rules.
  if (finished.valid()) finished.set_value();
  return decision;
}

void FaultInjector::run_later(std::chrono::milliseconds delay, std::function<void()> fn) {
  {
    MutexLock lock(mutex_);
    timers_.emplace(Clock::now() + delay, std::move(fn));
    if (!timer_.joinable()) timer_ = std::thread([this] { timer_loop(); });
  }
  timer_cv_.notify_all();
}

void FaultInjector::timer_loop() {
  for (;;) {
    std::function<void()> fn;
    {
      MutexLock lock(mutex_);
      for (;;) {
        if (timers_.empty()) {
          if (stopping_) return;
          lock.wait(timer_cv_);
          continue;
        }
        auto first = timers_.begin();
        // At destruction, what is still delayed goes at once rather than never.
        if (!stopping_ && first->first > Clock::now()) {
          lock.wait_until(timer_cv_, first->first);
          continue;
        }
        fn = std::move(first->second);
        timers_.erase(first);
        break;
      }
    }
    try {
      fn();
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kWarning) << "fault injector: a delayed message failed: " << e.what();
    }
  }
}

}  // namespace gradwire::rpc
