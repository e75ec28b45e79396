// CallTable: an agent's outgoing calls that wait for their reply, with their deadlines.
//
// A call enters the table once it is ready to leave (add) and leaves it exactly once, through
// take() (its reply came, its connection went, writing it failed) or when its deadline
// passes or the table closes; whoever removes it then finishes it (finish): the
// interceptors that saw the request learn how it ended, then its callback runs. One timer
// thread fails the calls whose deadline passed. A graceful shutdown waits for the table to
// empty (wait_until_idle); close() fails every call still pending and refuses new ones.
//
// Nothing here knows the transport: a call records the serial of the connection it travels
// on only so that losing that connection, or a reply arriving on another, can be told apart.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gradwire/core/mutex.h"
#include "gradwire/core/recent.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/rpc/agent.h"
#include "stats_table.h"

namespace gradwire::rpc::detail {

// One outgoing call.
struct PendingCall {
  RpcAgent::ReplyCallback done;  // null: the caller learns the outcome by a throw
  WorkerInfo to;
  uint32_t handler{kCallHandler};
  std::string function;
  std::chrono::milliseconds timeout{0};
  uint64_t connection{0};
  // The interceptors that saw the request, and what each kept for this call.
  std::shared_ptr<const std::vector<std::shared_ptr<Interceptor>>> interceptors;
  std::vector<std::shared_ptr<void>> states;
  uint64_t id{0};
  // Statistics and tracing (rpc/stats.h, core/trace.h): the entry of a registered
  // function's calls to `to` (null for other handlers), when the call began (trace::now_ns)
  // and the bytes of the request and of the reply on the wire.
  StatsTable::Entry* stats{nullptr};
  int64_t started_ns{0};
  uint64_t bytes_out{0};
  uint64_t bytes_in{0};

  // "call 'add'" or "request to handler 3"; built only for messages.
  std::string what() const;
};

// A call that timed out, kept so that a reply arriving later is still shown to the
// interceptors that saw its request (Interceptor::on_late_response).
struct LateCall {
  WorkerInfo to;
  uint64_t connection{0};
  std::shared_ptr<const std::vector<std::shared_ptr<Interceptor>>> interceptors;
  std::vector<std::shared_ptr<void>> states;
};

// finish() also records the call in its statistics entry and, while tracing is on, as an
// "rpc.call" span (category "rpc") from its start to its end, with the function name
// (truncated to trace::kTextBytes - 1), the peer's id, the request id, the bytes each way
// and the outcome.
//
// Thread-safety: every method may be called from any thread. Callbacks and interceptors
// run on the thread that finishes a call, never with the table's mutex held.
class CallTable {
 public:
  using Clock = std::chrono::steady_clock;

  // `owner` names the agent in logs ("'w0' (rank 0)").
  explicit CallTable(std::string owner);
  ~CallTable();
  CallTable(const CallTable&) = delete;
  CallTable& operator=(const CallTable&) = delete;

  // A fresh request id; ids start at 1 and are never reused.
  uint64_t next_id() { return next_id_.fetch_add(1, std::memory_order_relaxed); }

  // Starts the timer thread. Once.
  void start();

  // Adds `call`, which times out after call.timeout (kNoTimeout: never). False, leaving
  // `call` as it was, once the table is closed.
  bool add(PendingCall& call);

  // Removes call `id`, only if it travels on `connection` (when that is not 0).
  std::optional<PendingCall> take(uint64_t id, uint64_t connection = 0);
  // Removes every call travelling on `connection` (and forgets its timed-out calls).
  std::vector<PendingCall> take_connection(uint64_t connection);
  // Removes timed-out call `id`, kept for its late reply, if it travelled on `connection`.
  // Calls whose interceptors kept no state are not kept; nor are more than kMaxLateCalls
  // (the oldest are forgotten first).
  std::optional<LateCall> take_late(uint64_t id, uint64_t connection);
  static constexpr size_t kMaxLateCalls = size_t{1} << 16;
  // take(), then finish() with `error`.
  void fail(uint64_t id, std::exception_ptr error, CallOutcome outcome, uint64_t connection = 0);

  // Ends a call that was removed (or never added): tells its interceptors how, then its
  // callback; a throw from either is logged, never passed on.
  void finish(PendingCall& call, Value value, std::exception_ptr error, CallOutcome outcome) const;

  size_t size() const;
  // Whether any call awaits its reply (no lock: for a polling loop's "keep polling").
  bool any_pending() const { return count_->load(std::memory_order_relaxed) != 0; }
  // The same count, shared: a loop that may outlive this table reads it safely.
  std::shared_ptr<const std::atomic<size_t>> pending_count() const { return count_; }
  // Waits until no call is pending; false when `deadline` passed first.
  bool wait_until_idle(Clock::time_point deadline);

  // Refuses later calls, fails those pending with `error_of(call)` (kShutDown) and stops the
  // timer. Idempotent.
  void close(const std::function<std::exception_ptr(const PendingCall&)>& error_of);

 private:
  using Deadlines = std::multimap<Clock::time_point, uint64_t>;
  struct Entry {
    PendingCall call;
    std::optional<Deadlines::iterator> deadline;  // none: no timeout
  };

  std::optional<PendingCall> take_locked(uint64_t id, uint64_t connection)
      GRADWIRE_REQUIRES(mutex_);
  void keep_late_locked(const PendingCall& call) GRADWIRE_REQUIRES(mutex_);
  void timer_loop();

  const std::string owner_;
  std::atomic<uint64_t> next_id_{1};
  std::thread timer_;

  mutable Mutex mutex_;
  std::condition_variable timer_cv_;
  std::condition_variable idle_cv_;
  bool closed_ GRADWIRE_GUARDED_BY(mutex_) = false;
  std::unordered_map<uint64_t, Entry> pending_ GRADWIRE_GUARDED_BY(mutex_);
  // pending_.size(), written under mutex_.
  const std::shared_ptr<std::atomic<size_t>> count_ = std::make_shared<std::atomic<size_t>>(0);
  Deadlines deadlines_ GRADWIRE_GUARDED_BY(mutex_);
  // When the timer thread wakes next (max: it waits until notified). add() notifies it only
  // for an earlier deadline.
  Clock::time_point timer_wakes_at_ GRADWIRE_GUARDED_BY(mutex_) = Clock::time_point::min();
  // Timed-out calls kept for their late replies, the oldest forgotten first.
  RecentMap<uint64_t, LateCall> late_ GRADWIRE_GUARDED_BY(mutex_){kMaxLateCalls};
};

}  // namespace gradwire::rpc::detail
