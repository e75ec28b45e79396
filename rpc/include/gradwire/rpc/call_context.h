// CallContext: what a registered function, a message handler or a value converter may learn
// about the call it serves — which agent runs it, who called, the request's id and deadline.
//
// Why: the modules above rpc/ keep per-agent state (rref/'s RRef context, dist_autograd/'s
// context container) and must find it from inside a call, with no process-wide singleton —
// several agents live in one process in tests. The agent hands every call a CallContext;
// state hangs on the agent as typed attachments (RpcAgent::attachment<T>(), agent.h), so
// `ctx.agent()->attachment<RRefContext>()` is how an RRef argument finds its owner's
// bookkeeping.
//
// Registered functions may take it as an optional first parameter (registry.h):
//   registry.def("whoami", [](const rpc::CallContext& ctx) { return ctx.caller().name; });
// and value converters may take it as a third argument (value_convert.h).
//
// A default-constructed context is "outside any agent" (a registry invoked directly, as in
// tests): agent() is null and caller() is an empty WorkerInfo with id -1.
//
// Thread-safety: a plain value; the agent it points to is thread-safe (agent.h) and
// outlives every call it serves.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <utility>

#include "gradwire/rpc/worker_info.h"

namespace gradwire::rpc {

class RpcAgent;

class CallContext {
 public:
  using Clock = std::chrono::steady_clock;

  CallContext() = default;
  CallContext(RpcAgent* agent, WorkerInfo caller, uint64_t request_id, Clock::time_point deadline)
      : agent_(agent), caller_(std::move(caller)), request_id_(request_id), deadline_(deadline) {}

  // The agent serving the call; null outside any agent.
  RpcAgent* agent() const { return agent_; }
  // The worker that sent the request.
  const WorkerInfo& caller() const { return caller_; }
  // The request's id, unique per caller and agent (0 outside any agent).
  uint64_t request_id() const { return request_id_; }
  // When the caller stops waiting for the reply (Clock::time_point::max() when unknown).
  Clock::time_point deadline() const { return deadline_; }

 private:
  RpcAgent* agent_ = nullptr;
  WorkerInfo caller_;
  uint64_t request_id_ = 0;
  Clock::time_point deadline_ = Clock::time_point::max();
};

// For a handler or registered function: runs `fn` on this thread once the request it is
// serving here has been answered (right after its reply is handed to the transport; for a
// result that is not ready when the handler returns, right after it returns). Work that
// should follow the answer but need not delay it (dist_autograd runs the nodes that the
// gradients it just took made ready) then needs no hand-off to another thread. Several run
// in the order given; one that throws is logged and the rest still run. Returns false, and
// does not run `fn`, when this thread is not serving a request, or serves it inline on an
// I/O thread (Execution::kInline, or a handler's chooser said so): nothing may hold up the
// transport there, so the caller hands the work to the pool instead.
// Example:
//   registry.def("take", [](const Tensor& t) {
//     rpc::run_after_reply([t] { consume(t); });  // the caller is not kept waiting
//     return 0;
//   });
bool run_after_reply(std::function<void()> fn);

}  // namespace gradwire::rpc
