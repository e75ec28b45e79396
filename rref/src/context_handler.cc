// RRefContext (context.h) as the rref handler: a protocol message is checked, then
// dispatched to the one handler of its kind.
#include <utility>

#include "context.h"
#include "gradwire/core/printable.h"
#include "gradwire/core/trace.h"
#include "messages.h"
#include "proto/rref.pb.h"
#include "rref_scan.h"

namespace gradwire::rref {

// ---- the handler

Future<Value> RRefContext::handle(const CallContext& ctx, const rpc::Request& request) {
  if (request.payload.empty()) throw CallRejected(parse_error("the payload does not parse"));
  // Counted before Protobuf builds anything of it (rref_scan.h).
  check_message_counts(std::string_view(reinterpret_cast<const char*>(request.payload.data()),
                                        request.payload.size()));
  wire::RRefMessage message;
  if (!message.ParseFromArray(request.payload.data(), static_cast<int>(request.payload.size()))) {
    throw CallRejected(parse_error("the payload does not parse"));
  }
  const WorkerInfo& caller = ctx.caller();
  const int world = world_size();
  if (caller.id < 0 || caller.id >= world) {
    throw CallRejected("rref: requests from outside the group are refused");
  }
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  // A fetch runs user code too: copying an object (copy_object) or converting a held T back
  // (its ValueConverter).
  const bool runs_user_code = message.op_case() == wire::RRefMessage::kCreate ||
                              message.op_case() == wire::RRefMessage::kCallMethod ||
                              message.op_case() == wire::RRefMessage::kFetch;
  if (runs_user_code != (request.handler == kRRefHandler)) {
    throw CallRejected(
        parse_error(runs_user_code ? "a creation, fetch or method call sent to the control handler"
                                   : "a control message sent to the call handler"));
  }
  if (!trace::enabled()) return dispatch(ctx, request, message, *agent);
  // Tracing: the message's handling here (rref.handle), until its reply is ready or its
  // user code goes on running.
  const TracedOp traced = traced_op(message);
  const int64_t start_ns = trace::now_ns();
  try {
    Future<Value> reply = dispatch(ctx, request, message, *agent);
    record_message("rref.handle", start_ns, traced, caller.id, handled_outcome(reply));
    return reply;
  } catch (const CallRejected&) {
    record_message("rref.handle", start_ns, traced, caller.id, "refused");
    throw;
  } catch (...) {
    record_message("rref.handle", start_ns, traced, caller.id, "error");
    throw;
  }
}

// One handler per message kind; nothing else is decided here.
Future<Value> RRefContext::dispatch(const CallContext& ctx, const rpc::Request& request,
                                    const wire::RRefMessage& message, rpc::RpcAgent& agent) {
  switch (message.op_case()) {
    case wire::RRefMessage::kCreate:
      return handle_create(ctx, request, message.create());
    case wire::RRefMessage::kFetch:
      return handle_fetch(ctx, message.fetch());
    case wire::RRefMessage::kCallMethod:
      return handle_call_method(ctx, request, message.call_method());
    case wire::RRefMessage::kAddFork:
      return handle_add_fork(ctx, agent, message.add_fork());
    case wire::RRefMessage::kLost:
      return handle_lost(ctx, agent, message.lost());
    case wire::RRefMessage::kChildAccepted:
      return handle_child_accepted(message.child_accepted());
    case wire::RRefMessage::kDeleteFork:
      return handle_delete(ctx, agent, message.delete_fork());
    case wire::RRefMessage::OP_NOT_SET:
      break;
  }
  throw CallRejected(parse_error("no operation"));
}

Future<Value> RRefContext::handle_fetch(const CallContext& ctx, const wire::Fetch& fetch) {
  check_type_name(fetch.type_name(), "Fetch.type_name");
  std::shared_ptr<OwnerRRef> owner =
      owned_or_awaited(fetch.rref_id(), fetch.type_name(), ctx.caller());
  return owner->serialise(ctx, fetch.type_name());
}

Future<Value> RRefContext::handle_call_method(const CallContext& ctx, const rpc::Request& request,
                                              const wire::CallMethod& call) {
  check_type_name(call.type_name(), "CallMethod.type_name");
  std::shared_ptr<OwnerRRef> owner =
      owned_or_awaited(call.rref_id(), call.type_name(), ctx.caller());
  return owner->invoke(ctx, call.method(), request.args);
}

Future<Value> RRefContext::handle_add_fork(const CallContext& ctx, rpc::RpcAgent& agent,
                                           const wire::AddFork& add) {
  const WorkerInfo& caller = ctx.caller();
  const int world = world_size();
  const int parent = minter_of(add.fork_id());
  if (add.rref_id() == 0 || minter_of(add.rref_id()) >= world || parent >= world ||
      parent == self_.id) {
    throw CallRejected(parse_error("a fork with bad ids"));
  }
  check_type_name(add.type_name(), "AddFork.type_name");
  // Whatever the answer, the sender's pending child is settled: counted, given up by its
  // holder already, or refused.
  auto settle = [&] { settle_child(agent.get_worker_info(parent), add.rref_id(), add.fork_id()); };
  if (take_given_up(add.fork_id(), caller.id)) {
    settle();
    return make_ready_future(Value());
  }
  std::shared_ptr<OwnerRRef> owner;
  try {
    owner = owner_with_fork(add.rref_id(), add.type_name(), add.fork_id(), caller.id);
    if (owner->type_name() != add.type_name()) {
      remove_fork(add.rref_id(), add.fork_id(), caller.id);
      throw CallRejected("rref: RRef " + id_text(add.rref_id()) + " on worker " + self_.describe() +
                         " holds " + owner->type_name() + ", not " + add.type_name());
    }
  } catch (const CallRejected&) {
    settle();
    throw;
  }
  settle();
  return make_ready_future(Value());
}

Future<Value> RRefContext::handle_lost(const CallContext& ctx, rpc::RpcAgent& agent,
                                       const wire::Lost& lost) {
  // Only for the incarnation running here: a notice meant for a predecessor is stale.
  if (lost.incarnation() == agent.incarnation()) {
    lose(ctx.caller(),
         "it lost its connection to " + self_.describe() + ": " + printable(lost.why(), 200),
         /*tell=*/false);
  }
  return make_ready_future(Value());
}

Future<Value> RRefContext::handle_child_accepted(const wire::ChildAccepted& accepted) {
  const std::vector<uint64_t> forks(accepted.fork_ids().begin(), accepted.fork_ids().end());
  accept_children(forks);
  return make_ready_future(Value());
}

Future<Value> RRefContext::handle_delete(const CallContext& ctx, rpc::RpcAgent& agent,
                                         const wire::Delete& del) {
  const WorkerInfo& caller = ctx.caller();
  const int world = world_size();
  const uint64_t fork = del.fork_id();
  ForkTable::Dropped dropped;  // let go after the lock
  MutexLock lock(mutex_);
  // Its loss released every fork it held here, and none was counted for it since.
  if (lost_locked(caller.id)) return make_ready_future(Value());
  // A fork the owner did not make may be given up before the Create or AddFork that
  // counts it arrives (its Create still queued for a pool thread, its AddFork delayed):
  // it is remembered, and that message then counts nothing. Of a value already freed,
  // nothing is left to give up.
  const bool gone = !holds_locked(del.rref_id()) && freed_locked(del.rref_id());
  const bool foreign = fork != 0 && minter_of(fork) != self_.id && minter_of(fork) < world;
  const ForkVerdict verdict = forks_.apply(fork,
                                           ForkEvent{.kind = ForkEventKind::kDelete,
                                                     .peer = caller.id,
                                                     .rref_id = del.rref_id(),
                                                     .may_remember = foreign && !gone},
                                           dropped);
  cv_.notify_all();
  switch (verdict) {
    case ForkVerdict::kApplied:
    case ForkVerdict::kIgnored:
      return make_ready_future(Value());
    case ForkVerdict::kRemembered:
      lock.unlock();
      deleted_before_counted(caller, agent, del);
      return make_ready_future(Value());
    case ForkVerdict::kNotHolder:
      throw CallRejected("rref: fork " + id_text(fork) + " of RRef " + id_text(del.rref_id()) +
                         " is not held by " + caller.describe());
    case ForkVerdict::kFull:
      throw CallRejected(
          "rref: worker " + self_.describe() + " holds " + std::to_string(forks_.given_up_count()) +
          " forks given up before they were counted; refusing fork " + id_text(fork));
    default:
      if (foreign && gone) return make_ready_future(Value());
      throw CallRejected("rref: worker " + self_.describe() + " counts no fork " + id_text(fork) +
                         " of RRef " + id_text(del.rref_id()));
  }
}

void RRefContext::deleted_before_counted(const WorkerInfo& caller, rpc::RpcAgent& agent,
                                         const wire::Delete& del) {
  const uint64_t fork = del.fork_id();
  // The AddFork of a fork another user made may never come (it timed out on its way
  // here): the user that sent the fork learns now that it is settled.
  const int parent = minter_of(fork);
  if (parent != caller.id) {
    settle_child(agent.get_worker_info(parent), del.rref_id(), fork);
    return;
  }
  if (minter_of(del.rref_id()) != caller.id) return;
  // The creator gave its own reference up before its Create arrived (the Create
  // timed out, or was lost on the way): its remote() failed, nothing will create
  // the value now, and calls waiting for it (the creator's own, or other
  // workers' through forks) end with why.
  {
    // Not held here yet (its Create and its calls still on their way): whatever
    // of it arrives now is refused instead of awaited.
    MutexLock lock(mutex_);
    if (!holds_locked(del.rref_id())) remember_freed_locked(del.rref_id());
  }
  abandon_placeholders(
      caller.id, del.rref_id(),
      std::make_exception_ptr(CallRejected(
          "rref: RRef " + id_text(del.rref_id()) + " was given up by its creator, " +
          caller.describe() + ", before its creation arrived on " + self_.describe())));
}

Future<Value> RRefContext::handle_create(const CallContext& ctx, const rpc::Request& request,
                                         const wire::Create& create) {
  const int caller = ctx.caller().id;
  if (minter_of(create.rref_id()) != caller || minter_of(create.fork_id()) != caller ||
      create.name().empty()) {
    throw CallRejected(parse_error("a creation with bad ids or no name"));
  }
  check_type_name(create.type_name(), "Create.type_name");
  if (create.target_rref_id() != 0)
    check_type_name(create.target_type_name(), "Create.target_type_name");
  // The creator may have given its reference up while this Create waited for a pool
  // thread (its call timed out): the fork is not counted, and nothing is made unless another
  // worker's fork or call is already waiting for the value.
  const bool given_up = take_given_up(create.fork_id(), caller);
  if (given_up && find_owner(create.rref_id()) == nullptr) {
    throw CallRejected("rref: RRef " + id_text(create.rref_id()) +
                       " was given up by its creator before its creation arrived");
  }
  std::shared_ptr<OwnerRRef> owner = owner_with_fork(create.rref_id(), create.type_name(),
                                                     given_up ? 0 : create.fork_id(), caller);
  if (!owner->begin_creation(create.type_name())) {
    throw CallRejected("rref: RRef " + id_text(create.rref_id()) + " was already created");
  }
  std::shared_ptr<OwnerRRef> awaited;  // let go after the lock
  {
    MutexLock lock(mutex_);
    --placeholders_;  // it is one no more; its destruction will not count it
    if (auto it = awaited_.find(create.rref_id()); it != awaited_.end()) {
      awaited = std::move(it->second);
      awaited_.erase(it);
    }
  }
  if (create.target_rref_id() != 0) {
    std::shared_ptr<OwnerRRef> target;
    try {
      target = owned_or_awaited(create.target_rref_id(), create.target_type_name(), ctx.caller());
    } catch (...) {
      owner->fail(std::current_exception());
    }
    if (target != nullptr) {
      owner->adopt(target->invoke(ctx, create.name(), request.args, create.type_name()));
    }
  } else {
    owner->create(ctx, create.name(), request.args);
  }
  // Replied once the value exists: the caller's calls on it wait for this.
  Future<void> created = owner->creation();
  if (created.completed()) {
    if (created.has_error()) return make_failed_future<Value>(created.error());
    return make_ready_future(Value());
  }
  return created.then(agent()->executor(), [](Future<void> done) {
    done.value();
    return Value();
  });
}

}  // namespace gradwire::rref
