// The table of contexts on this worker, the handler's dispatch, and the check that a message
// comes from a worker it concerns.
#include "container.h"

#include <string_view>
#include <utility>

#include "dist_autograd_scan.h"
#include "gradwire/core/printable.h"

namespace gradwire::dist_autograd::internal {

void Container::install(const std::shared_ptr<rpc::RpcAgent>& agent) {
  auto container = std::make_shared<Container>(agent);
  std::weak_ptr<Container> weak = container;
  agent->register_handler(
      kDistAutogradHandler, "dist_autograd",
      [weak](const CallContext& ctx, const rpc::Request& request) {
        std::shared_ptr<Container> self = weak.lock();
        if (self == nullptr) return make_failed_future<Value>(Error("dist_autograd: gone"));
        return self->handle(ctx, request);
      },
      &Container::execution_of);
  agent->add_interceptor(container);
  agent->add_listener(container);
  agent->set_attachment(container);
}

std::shared_ptr<Container> Container::of(const rpc::RpcAgent& agent) {
  auto c = agent.attachment<Container>();
  if (c == nullptr) {
    throw Error("dist_autograd: worker " + agent.worker_info().describe() +
                " has no dist_autograd container (the program must link gradwire::dist_autograd)");
  }
  return c;
}

std::shared_ptr<rpc::RpcAgent> Container::agent() const {
  auto a = agent_.lock();
  if (a == nullptr || a->is_shut_down()) {
    throw Error("dist_autograd: the agent of worker " + self_.describe() + " has shut down");
  }
  return a;
}

std::shared_ptr<ContextState> Container::create_context() {
  const uint64_t id = mint();
  auto state = std::make_shared<ContextState>(id);
  MutexLock lock(mutex_);
  contexts_[id] = state;
  return state;
}

std::shared_ptr<ContextState> Container::find(uint64_t id) const {
  MutexLock lock(mutex_);
  auto it = contexts_.find(id);
  return it == contexts_.end() ? nullptr : it->second;
}

std::shared_ptr<ContextState> Container::get(uint64_t id) const {
  auto c = find(id);
  if (c == nullptr) {
    throw InvalidArgument("dist_autograd: worker " + self_.describe() + " has no context " +
                          ctx_text(id) + " (unknown, or already released)");
  }
  return c;
}

std::shared_ptr<ContextState> Container::get_or_make(uint64_t id, int from) {
  MutexLock lock(mutex_);
  auto it = contexts_.find(id);
  if (it != contexts_.end()) return it->second;
  // Not held here: released here (or by `from`) before, or never seen.
  const ContextPhase known = released_.contains(id) || released_by_.contains({id, from})
                                 ? ContextPhase::kReleased
                                 : ContextPhase::kNone;
  if (!next(known, ContextEvent::kMake)) {
    throw CallRejected("dist_autograd: worker " + self_.describe() + " already released context " +
                       ctx_text(id));
  }
  auto state = std::make_shared<ContextState>(id);
  contexts_.emplace(id, state);
  return state;
}

void Container::remember_released_unseen(uint64_t id) {
  MutexLock lock(mutex_);
  if (contexts_.count(id) == 0) remember_released(id);
}

void Container::remember_released_by(uint64_t id, int by) {
  MutexLock lock(mutex_);
  if (contexts_.count(id) == 0) released_by_.insert({id, by});
}

void Container::remember_released(uint64_t id) {
  released_.insert(id);
}

size_t Container::size() const {
  MutexLock lock(mutex_);
  return contexts_.size();
}

std::chrono::milliseconds Container::agent_wait() const {
  auto a = agent_.lock();
  return a == nullptr ? std::chrono::milliseconds(0) : a->options().rpc_timeout;
}

Future<Value> Container::send(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                              std::string what, std::vector<Value> args, rpc::CallOptions options) {
  rpc::Request request;
  request.handler = kDistAutogradHandler;
  request.function = std::move(what);
  const std::string payload = message.SerializeAsString();
  request.payload.assign(payload.begin(), payload.end());
  request.args = std::move(args);
  return agent()->send(to, std::move(request), options);
}

Future<Value> Container::try_send(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                                  std::string what, std::vector<Value> args,
                                  rpc::CallOptions options) {
  try {
    return send(to, message, std::move(what), std::move(args), options);
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
}

bool Container::participant(const std::shared_ptr<ContextState>& state, int w) {
  if (w == worker_of(state->id)) return true;
  MutexLock lock(state->mutex);
  return state->touched.count(w) != 0;
}

std::shared_ptr<ContextState> Container::get_for(uint64_t id, const WorkerInfo& caller,
                                                 const char* what) const {
  std::shared_ptr<ContextState> state;
  std::string lost;
  {
    // One look at the table: a context released for a lost worker between two looks would
    // be neither found nor explained.
    MutexLock lock(mutex_);
    auto it = contexts_.find(id);
    if (it != contexts_.end()) {
      state = it->second;
    } else if (const LostWhy* why = lost_why_.find(id);
               why != nullptr && why->members.count(caller.id) != 0) {
      lost = why->why;
    }
  }
  // Released here because a worker was lost: what a member asking after it must hear.
  if (!lost.empty()) throw NetworkError(lost);
  if (state == nullptr) state = get(id);  // throws: unknown, or already released
  if (!participant(state, caller.id)) {
    throw CallRejected("dist_autograd: worker " + self_.describe() + " refused a " + what +
                       " for context " + ctx_text(id) + " from worker " + caller.describe() +
                       ", which takes no part in it");
  }
  return state;
}

std::shared_ptr<SendBackward> Container::send_from(ContextState& state, uint64_t m,
                                                   const WorkerInfo& caller,
                                                   const char* what) const {
  std::shared_ptr<SendBackward> send;
  {
    MutexLock lock(state.mutex);
    auto it = state.sends.find(m);
    if (it != state.sends.end()) send = it->second;
  }
  if (send == nullptr) {
    throw CallRejected("dist_autograd: worker " + self_.describe() + " recorded no send " +
                       ctx_text(m) + " in context " + ctx_text(state.id) +
                       " (released, or its graph was freed by an earlier pass)");
  }
  if (send->peer() != caller.id) {
    throw CallRejected("dist_autograd: worker " + self_.describe() + " refused a " + what +
                       " for send " + ctx_text(m) + " in context " + ctx_text(state.id) +
                       " from worker " + caller.describe() + ", which the send did not go to");
  }
  return send;
}

rpc::Execution Container::execution_of(const rpc::Request& request) {
  // A Wait (ends the hold, registers the answer; no walk, no send) runs as it arrives on
  // the I/O thread: no pool worker is woken for it, and one busy computing this worker's
  // part does not delay it, so the thread that ends the part writes the answer. What ending
  // the hold makes ready runs on the pool (run_soon). The rest goes to the pool: a Discover
  // walks the graph and may send Discovers on (no work for a transport thread), and a
  // payload that does not parse is refused there. Only a small payload is parsed here (too
  // small to name more than dist_autograd_scan.h allows); a Wait is a few bytes.
  constexpr size_t kLargestInline = 256;
  wire::DistAutogradMessage message;
  if (request.payload.empty() || request.payload.size() > kLargestInline ||
      !message.ParseFromArray(request.payload.data(), static_cast<int>(request.payload.size()))) {
    return rpc::Execution::kPool;
  }
  return message.op_case() == wire::DistAutogradMessage::kWait ? rpc::Execution::kInline
                                                               : rpc::Execution::kPool;
}

Future<Value> Container::handle(const CallContext& ctx, const rpc::Request& request) {
  // Only members of the group speak for a context; each message is then checked against
  // the workers that take part in the context (or pass) it names.
  const WorkerInfo& caller = ctx.caller();
  if (caller.id < 0) {
    throw CallRejected("dist_autograd: worker " + self_.describe() + " refused a message from '" +
                       printable(caller.name) + "', which is not a member of the group");
  }
  if (request.payload.empty()) {
    throw CallRejected("malformed dist_autograd message: the payload does not parse");
  }
  // Counted before Protobuf builds anything of it (dist_autograd_scan.h).
  check_message_counts(std::string_view(reinterpret_cast<const char*>(request.payload.data()),
                                        request.payload.size()));
  wire::DistAutogradMessage message;
  if (!message.ParseFromArray(request.payload.data(), static_cast<int>(request.payload.size()))) {
    throw CallRejected("malformed dist_autograd message: the payload does not parse");
  }
  switch (message.op_case()) {
    case wire::DistAutogradMessage::kDiscover:
      return on_discover(caller, message.discover());
    case wire::DistAutogradMessage::kPropagate:
      return on_propagate(caller, message.propagate(), request.args);
    case wire::DistAutogradMessage::kWait:
      return on_wait(caller, message.wait());
    case wire::DistAutogradMessage::kAbort:
      return on_abort(caller, message.abort());
    case wire::DistAutogradMessage::kRelease:
      return on_release(caller, message.release());
    case wire::DistAutogradMessage::OP_NOT_SET:
      break;
  }
  throw CallRejected("malformed dist_autograd message: no operation");
}

}  // namespace gradwire::dist_autograd::internal
