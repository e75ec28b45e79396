#include "call_table.h"

#include "gradwire/core/logging.h"
#include "gradwire/core/trace.h"
#include "text.h"

namespace gradwire::rpc::detail {

std::string PendingCall::what() const {
  return describe_call(handler, function);
}

CallTable::CallTable(std::string owner) : owner_(std::move(owner)) {}

CallTable::~CallTable() {
  // The owner closes the table first; this only guards against a call left behind.
  close([this](const PendingCall& call) {
    return std::make_exception_ptr(Error("rpc agent " + owner_ + " was shut down before " +
                                         call.what() + " to worker " + call.to.describe() +
                                         " completed"));
  });
}

void CallTable::start() {
  timer_ = std::thread([this] { timer_loop(); });
}

bool CallTable::add(PendingCall& call) {
  const Clock::time_point deadline = deadline_after(call.timeout);
  bool wake_timer = false;
  {
    MutexLock lock(mutex_);
    if (closed_) return false;
    const uint64_t id = call.id;
    Entry entry{std::move(call), std::nullopt};
    if (deadline != Clock::time_point::max()) {
      entry.deadline = deadlines_.emplace(deadline, id);
      // The timer is woken only for a deadline earlier than the one it already waits for:
      // calls that follow one another (each deadline later than the last) do not wake it,
      // and it finds theirs when it wakes for the earlier one.
      if (deadline < timer_wakes_at_) {
        timer_wakes_at_ = deadline;
        wake_timer = true;
      }
    }
    pending_.emplace(id, std::move(entry));
    count_->store(pending_.size(), std::memory_order_relaxed);
  }
  // Outside the lock: the woken timer would otherwise wait for it at once.
  if (wake_timer) timer_cv_.notify_one();
  return true;
}

std::optional<PendingCall> CallTable::take_locked(uint64_t id, uint64_t connection) {
  auto it = pending_.find(id);
  if (it == pending_.end() || (connection != 0 && it->second.call.connection != connection)) {
    return std::nullopt;
  }
  if (it->second.deadline) deadlines_.erase(*it->second.deadline);
  PendingCall call = std::move(it->second.call);
  pending_.erase(it);
  count_->store(pending_.size(), std::memory_order_relaxed);
  // Whoever removes the last pending call wakes a graceful shutdown waiting for it.
  if (pending_.empty()) idle_cv_.notify_all();
  return call;
}

std::optional<PendingCall> CallTable::take(uint64_t id, uint64_t connection) {
  MutexLock lock(mutex_);
  return take_locked(id, connection);
}

std::vector<PendingCall> CallTable::take_connection(uint64_t connection) {
  std::vector<PendingCall> taken;
  MutexLock lock(mutex_);
  std::vector<uint64_t> ids;
  for (const auto& [id, entry] : pending_) {
    if (entry.call.connection == connection) ids.push_back(id);
  }
  for (uint64_t id : ids)
    taken.push_back(std::move(*take_locked(id, 0)));
  // No reply can come on a connection that is gone.
  late_.erase_if(
      [connection](uint64_t, const LateCall& late) { return late.connection == connection; });
  return taken;
}

void CallTable::keep_late_locked(const PendingCall& call) {
  bool kept = false;
  for (const auto& state : call.states)
    kept = kept || state != nullptr;
  if (!kept || call.interceptors == nullptr) return;
  late_.put(call.id, LateCall{call.to, call.connection, call.interceptors, call.states});
}

std::optional<LateCall> CallTable::take_late(uint64_t id, uint64_t connection) {
  MutexLock lock(mutex_);
  const LateCall* late = late_.find(id);
  if (late == nullptr || late->connection != connection) return std::nullopt;
  return late_.take(id);
}

void CallTable::fail(uint64_t id, std::exception_ptr error, CallOutcome outcome,
                     uint64_t connection) {
  std::optional<PendingCall> call = take(id, connection);
  if (call) finish(*call, Value(), std::move(error), outcome);
}

void CallTable::finish(PendingCall& call, Value value, std::exception_ptr error,
                       CallOutcome outcome) const {
  if (call.stats != nullptr || trace::enabled()) {
    const int64_t end_ns = trace::now_ns();
    const bool failed = error != nullptr || outcome != CallOutcome::kReplied;
    if (call.stats != nullptr) {
      call.stats->record(end_ns - call.started_ns, failed, call.bytes_out, call.bytes_in);
    }
    if (trace::enabled() && call.started_ns != 0) {
      const trace::Text function{"function", call.function};
      trace::complete(
          "rpc.call", "rpc", call.started_ns, end_ns,
          {trace::Arg("peer", call.to.id), trace::Arg("request_id", call.id),
           trace::Arg("bytes_out", call.bytes_out), trace::Arg("bytes_in", call.bytes_in),
           trace::Arg("outcome", call_outcome_name(outcome))},
          &function);
    }
  }
  if (call.interceptors != nullptr) {
    const FinishedCall finished{call.to, call.id, call.handler, call.function, outcome, error};
    for (size_t i = 0; i < call.states.size() && i < call.interceptors->size(); ++i) {
      try {
        (*call.interceptors)[i]->on_call_finished(finished, call.states[i]);
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kError) << "rpc worker " << owner_
                             << ": an interceptor's on_call_finished threw: " << e.what();
      }
    }
  }
  if (!call.done) return;
  try {
    call.done(std::move(value), std::move(error));
  } catch (const std::exception& e) {
    // The callback is the caller's; a throw from it must not unwind into an I/O thread.
    GRADWIRE_LOG(kError) << "rpc worker " << owner_ << ": the reply callback of " << call.what()
                         << " to worker " << call.to.describe() << " threw: " << e.what();
  } catch (...) {
    GRADWIRE_LOG(kError) << "rpc worker " << owner_ << ": the reply callback of " << call.what()
                         << " threw a non-std::exception";
  }
}

size_t CallTable::size() const {
  MutexLock lock(mutex_);
  return pending_.size();
}

bool CallTable::wait_until_idle(Clock::time_point deadline) {
  MutexLock lock(mutex_);
  while (!pending_.empty()) {
    if (lock.wait_until(idle_cv_, deadline) == std::cv_status::timeout && !pending_.empty()) {
      return false;
    }
  }
  return true;
}

void CallTable::timer_loop() {
  for (;;) {
    std::vector<PendingCall> expired;
    {
      MutexLock lock(mutex_);
      while (!closed_ && (deadlines_.empty() || Clock::now() < deadlines_.begin()->first)) {
        if (deadlines_.empty()) {
          timer_wakes_at_ = Clock::time_point::max();
          lock.wait(timer_cv_);
        } else {
          // A deadline removed meanwhile (its call was answered) still wakes the timer
          // once, which then waits for the next one.
          timer_wakes_at_ = deadlines_.begin()->first;
          lock.wait_until(timer_cv_, timer_wakes_at_);
        }
      }
      if (closed_) return;
      const Clock::time_point now = Clock::now();
      while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
        std::optional<PendingCall> call = take_locked(deadlines_.begin()->second, 0);
        if (call) {
          keep_late_locked(*call);
          expired.push_back(std::move(*call));
        } else {
          deadlines_.erase(deadlines_.begin());
        }
      }
    }
    for (PendingCall& call : expired) {
      finish(call, Value(),
             std::make_exception_ptr(TimeoutError("rpc: " + call.what() + " to worker " +
                                                  call.to.describe() + " timed out after " +
                                                  ms_text(call.timeout))),
             CallOutcome::kTimedOut);
    }
  }
}

void CallTable::close(const std::function<std::exception_ptr(const PendingCall&)>& error_of) {
  std::vector<PendingCall> abandoned;
  {
    MutexLock lock(mutex_);
    if (!closed_) {
      closed_ = true;
      for (auto& [id, entry] : pending_)
        abandoned.push_back(std::move(entry.call));
      pending_.clear();
      count_->store(0, std::memory_order_relaxed);
      deadlines_.clear();
      late_.clear();
      timer_cv_.notify_all();
      idle_cv_.notify_all();
    }
  }
  for (PendingCall& call : abandoned)
    finish(call, Value(), error_of(call), CallOutcome::kShutDown);
  if (timer_.joinable()) timer_.join();
}

}  // namespace gradwire::rpc::detail
