// Dispatcher: how an agent serves the requests it receives, whatever carries them.
//
// It owns the handler table (rpc/'s own call handler and those the modules above register)
// and the interceptors. Serving a request: the interceptors see it (and may return the
// ServeScopes that wrap every piece of work for it), the handler or registered function is
// looked up once and run — inline or on the executor, as it was registered — with the
// call's CallContext, and its result, or error, becomes the Response that the transport
// writes back. A refusal before any user code ran (an unknown handler or function, bad
// arguments) travels as a rejected ErrorReply, so the caller tells a mistake in the call
// from a failure of the function.
//
// The transport stays outside: it hands each request over with the connection it came on
// (a Link) and gets the reply back through ReplyWriter. So an agent that wraps another to
// drop, delay or cut messages can serve with the same dispatcher.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "gradwire/core/executor.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/agent.h"
#include "stats_table.h"

namespace gradwire::rpc::detail {

// The connection a request arrived on, as the dispatcher sees it: the transport's own
// connection type derives from it and receives it back to write the reply.
struct Link {
  virtual ~Link() = default;
  WorkerInfo peer;  // id -1: a peer that is not in the group
};

// What serving a request needs from the transport.
class ReplyWriter {
 public:
  virtual ~ReplyWriter() = default;
  // Encodes `response` to `request` and writes it to the sender over `link`; `plain` (an
  // error reply) maps no device and lends nothing. Throws what encoding throws, having
  // written nothing. False when a fault rule dropped it (it is never written). `bytes`, when
  // not null, is set to what the encoded reply takes on the wire.
  virtual bool write_reply(const std::shared_ptr<Link>& link, const Request& request,
                           const Response& response, bool plain, size_t* bytes) = 0;
  // The request handed to Dispatcher::serve with `tensor_bytes` is finished with: its reply
  // is written, or it was dropped because the executor is shut down.
  virtual void request_done(const Link& link, size_t tensor_bytes) = 0;
};

// Marks the calling thread as handing work to TensorPipe (a write, a read, a connect, a
// close) for the mark's life. TensorPipe runs its loop on whichever thread enters it first, so such
// a thread — a caller in rpc_async, a pool worker writing a reply — may deliver what arrived
// meanwhile; serve() then hands an inline request to the dispatcher's inline thread, so that
// no function runs inside another's send (where the sender may hold a lock the function
// takes), and none waits for a pool whose threads may all be busy (a Wait that only an inline
// run can answer while the pool computes). Nests.
class SendingMark {
 public:
  SendingMark();
  ~SendingMark();
  SendingMark(const SendingMark&) = delete;
  SendingMark& operator=(const SendingMark&) = delete;
};
// Whether a SendingMark is alive on this thread.
bool sending_on_this_thread();

// Thread-safety: every method may be called from any thread. register_handler and
// add_interceptor copy the table they change, so serving reads a snapshot without a lock
// and sees each table whole. start() runs once, before the first serve().
class Dispatcher {
 public:
  using Interceptors = std::vector<std::shared_ptr<Interceptor>>;

  // `self` names this worker in error replies; `writer` outlives the dispatcher.
  Dispatcher(WorkerInfo self, ReplyWriter& writer);
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Throws InvalidArgument for an empty handler or a taken id (kCallHandler always is).
  // With `choose`, it picks per request (and `execution` is unused).
  void register_handler(uint32_t id, std::string name, MessageHandler handler, Execution execution,
                        ExecutionChooser choose);
  // Throws InvalidArgument for null.
  void add_interceptor(std::shared_ptr<Interceptor> interceptor);
  // The interceptors now, in the order they were added.
  std::shared_ptr<const Interceptors> interceptors() const {
    return interceptors_.load(std::memory_order_acquire);
  }

  // Where handlers, registered functions and replies to asynchronous results run.
  void start(std::shared_ptr<Executor> executor);

  // Serves `request`, received from `from`, for `agent` (held until the reply is written;
  // its registry holds the functions). `tensor_bytes` goes back to
  // ReplyWriter::request_done. A call of a registered function is counted in
  // served_stats() (tensor_bytes as its bytes in) and, while tracing is on, recorded as an
  // "rpc.queue" span (arrival to start) and an "rpc.serve" span (start to the reply handed
  // to the transport), both with the request id, the caller's id and the function.
  // `on_executor`: this thread is one of the executor's (the request's tensors were first
  // copied here, off the I/O thread), so a request that would be handed to the executor
  // runs right here instead of waiting for a second thread.
  void serve(std::shared_ptr<RpcAgent> agent, std::shared_ptr<Link> from, Request request,
             size_t tensor_bytes, bool on_executor = false);
  // Whether this thread is running a request this dispatcher serves (a graceful shutdown
  // from there would wait for itself).
  bool serving_on_this_thread() const;
  // The calls of registered functions served, per (function, caller).
  const StatsTable& served_stats() const { return served_stats_; }

  // The ErrorReply for an error raised while serving: rejected for a CallRejected, and
  // keeping the origin of a RemoteError raised further down a chain of calls.
  ErrorReply error_reply(std::exception_ptr error) const;
  // The error a caller's call to `to` fails with when `reply` comes back: the error kind
  // itself for a rejected call, else a RemoteError.
  static std::exception_ptr reply_error(const ErrorReply& reply, const WorkerInfo& to,
                                        uint32_t handler, const std::string& function);

 private:
  struct HandlerEntry {
    std::string name;
    MessageHandler handler;
    Execution execution{Execution::kPool};
    ExecutionChooser choose;  // null: `execution` for every request
  };
  using Handlers = std::map<uint32_t, HandlerEntry>;
  using ServeScopes = std::vector<std::shared_ptr<ServeScope>>;

  // When a request arrived and began to run (trace::now_ns), and its statistics entry
  // (null: not a registered function).
  struct Timing {
    int64_t arrived_ns{0};
    int64_t started_ns{0};
    StatsTable::Entry* stats{nullptr};
  };

  void run(const std::shared_ptr<RpcAgent>& agent, const std::shared_ptr<Link>& from,
           Request& request, const std::shared_ptr<const Handlers>& handlers,
           const HandlerEntry* entry, const std::shared_ptr<const RegisteredFunction>& function,
           size_t tensor_bytes, Timing timing, bool after_reply_here);
  // run()'s steps: the handler or registered function called (what it throws becomes a
  // failed result), and a result that completes later answered once it does.
  Future<Value> invoke(const std::shared_ptr<RpcAgent>& agent, const Link& from,
                       const Request& request, const HandlerEntry* entry,
                       const std::shared_ptr<const RegisteredFunction>& function);
  void reply_when_done(const Future<Value>& result,
                       std::shared_ptr<std::function<void(const Future<Value>&)>> reply);
  // Where a request for `entry` runs: its chooser's pick (the pool when that throws), or the
  // execution the handler was registered with.
  static Execution execution_of(const HandlerEntry& entry, const Request& request);
  void respond(const std::shared_ptr<Link>& from, const Request& request,
               const Future<Value>& result, size_t tensor_bytes, const Interceptors& interceptors,
               const Timing& timing);
  // Counts and traces one served request, whose reply was handed over at end_ns.
  void served(const std::shared_ptr<Link>& from, const Request& request, size_t bytes_in,
              size_t bytes_out, bool error, const Timing& timing, int64_t end_ns);

  const WorkerInfo self_;
  ReplyWriter& writer_;
  std::shared_ptr<Executor> executor_;  // set by start(), then constant
  StatsTable served_stats_;

  // Writers take changes_mutex_ and publish a new table; readers only load.
  Mutex changes_mutex_;
  std::atomic<std::shared_ptr<const Handlers>> handlers_;
  std::atomic<std::shared_ptr<const Interceptors>> interceptors_;

  // One thread ("gw-inline-0") for the inline requests a sending thread took (SendingMark):
  // made on first need; last, so that it drains its queue while the rest is still alive.
  ThreadPool& inline_thread();
  std::once_flag inline_once_;
  std::unique_ptr<ThreadPool> inline_thread_;
};

}  // namespace gradwire::rpc::detail
