#include "context.h"

#include <cxxabi.h>

#include <cstdlib>
#include <string_view>
#include <utility>

#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/value_walk.h"
#include "proto/rref.pb.h"
#include "rref_scan.h"

namespace gradwire::rref {

using rpc::CallContext;
using rpc::CallRejected;
using rpc::RRefDescriptor;
using rpc::Value;
using rpc::WorkerInfo;

namespace {

constexpr size_t kMaxTypeNameBytes = 1024;
// How much of a type name refused for its bytes the refusal quotes (escaped).
constexpr size_t kQuotedTypeNameBytes = 128;
// Owned references made by a fork that arrived before the value's creation: bounded, so
// forks naming made-up ids cannot grow the table without end.
constexpr int64_t kMaxPlaceholders = 1 << 16;
// Freed values remembered, so that a late fork of one is refused rather than awaited.
constexpr size_t kRememberedFrees = 1 << 16;

// Visits every RRef descriptor inside a Value tree.
template <typename F>
void for_each_descriptor(const Value& value, F&& fn) {
  rpc::for_each_leaf(value, [&](const Value& leaf) {
    if (leaf.type() == rpc::ValueType::kRRef) fn(leaf.as_rref());
  });
}

bool has_descriptor(const Value& value) {
  bool found = false;
  for_each_descriptor(value, [&](const RRefDescriptor&) { found = true; });
  return found;
}

// The references a message carried, alive until it has been served or converted.
struct Held : rpc::ServeScope {
  std::vector<std::shared_ptr<detail::RRefCore>> cores;
};

struct CallState {
  std::vector<uint64_t> bound;  // forks minted here that this request carries
  std::vector<std::shared_ptr<detail::RRefCore>> received;  // in its reply
};

bool is_busy(const std::exception_ptr& error) {
  if (error == nullptr) return false;
  try {
    std::rethrow_exception(error);
  } catch (const BusyError&) {
    return true;
  } catch (...) {
    return false;
  }
}

std::string parse_error(std::string_view what) {
  return "malformed rref message: " + std::string(what);
}

// Why `name` is not a type name a peer may send; empty when it is one. Every worker names a
// type alike (a registered class's name, a value type's name): printable ASCII, never empty,
// at most kMaxTypeNameBytes. Anything else is refused where it arrives, so that no reference
// keeps it and no error or log line quotes it unescaped.
std::string bad_type_name(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > kMaxTypeNameBytes) {
    return "of " + std::to_string(name.size()) + " bytes exceeds the limit of " +
           std::to_string(kMaxTypeNameBytes);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c > 0x7e) {
      static constexpr char kHex[] = "0123456789abcdef";
      return "'" + printable(name, kQuotedTypeNameBytes) + "' holds byte 0x" + kHex[c >> 4] +
             kHex[c & 0xf] + " at offset " + std::to_string(i) +
             " (a type name is printable ASCII)";
    }
  }
  return {};
}

// Refuses a peer's message whose `field` holds no type name (bad_type_name).
void check_type_name(std::string_view name, std::string_view field) {
  const std::string why = bad_type_name(name);
  if (!why.empty()) throw CallRejected(parse_error(std::string(field) + ": the type name " + why));
}

// A protocol message as trace spans name it: its operation and the reference it is about
// (0 when it names none: a loss notice, an accept of forks).
struct TracedOp {
  const char* op;
  uint64_t rref_id;
};

TracedOp traced_op(const wire::RRefMessage& message) {
  switch (message.op_case()) {
    case wire::RRefMessage::kCreate:
      return {"create", message.create().rref_id()};
    case wire::RRefMessage::kFetch:
      return {"fetch", message.fetch().rref_id()};
    case wire::RRefMessage::kCallMethod:
      return {"call_method", message.call_method().rref_id()};
    case wire::RRefMessage::kAddFork:
      return {"add_fork", message.add_fork().rref_id()};
    case wire::RRefMessage::kLost:
      return {"lost", 0};
    case wire::RRefMessage::kChildAccepted:
      return {"child_accepted", 0};
    case wire::RRefMessage::kDeleteFork:
      return {"delete", message.delete_fork().rref_id()};
    case wire::RRefMessage::OP_NOT_SET:
      break;
  }
  return {"none", 0};
}

uint64_t local_part(uint64_t id) {
  return id & ((uint64_t{1} << rpc::kIdMinterShift) - 1);
}

// Records a span of a protocol message (rref.send on its sender, rref.handle on its
// receiver), whose `op` is known.
void record_message(const char* name, int64_t start_ns, const TracedOp& op, int peer,
                    const char* outcome) {
  trace::complete(name, "rref", start_ns, trace::now_ns(),
                  {trace::Arg("op", op.op), trace::Arg("rref_worker", minter_of(op.rref_id)),
                   trace::Arg("rref_local", local_part(op.rref_id)), trace::Arg("peer", peer),
                   trace::Arg("outcome", outcome)});
}

// What a handled message's reply says: done (ok or error), or still running (a creation or
// a call whose user code runs on).
const char* handled_outcome(const Future<Value>& reply) {
  if (!reply.completed()) return "running";
  return reply.has_error() ? "error" : "ok";
}

}  // namespace

bool contains_references(const Value& value) {
  return has_descriptor(value);
}

namespace detail {

std::string demangle(const char* name) {
  int status = 0;
  char* text = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || text == nullptr) return name;
  std::string out(text);
  std::free(text);
  return out;
}

void throw_empty() {
  throw Error("rref: this RRef is empty (default-constructed or moved from)");
}

void throw_unnamed_type(const std::string& cpp_name) {
  throw InvalidArgument("rref: RRef<" + cpp_name +
                        ">: the type is neither a class registered with def_class on this "
                        "worker's registry nor a value type with a ValueConverter");
}

CallContext sending_context(rpc::RpcAgent& agent) {
  return CallContext(&agent, agent.worker_info(), 0, CallContext::Clock::time_point::max());
}

std::chrono::milliseconds wait_bound(rpc::RpcAgent& agent, const rpc::CallOptions& options) {
  return agent.effective_timeout(options);
}

void throw_timeout(const std::string& what, std::chrono::milliseconds waited) {
  throw TimeoutError("rref: " + what + " timed out after " + std::to_string(waited.count()) +
                     " ms");
}

std::shared_ptr<RRefCore> create(rpc::RpcAgent& agent, const rpc::Destination& to, std::string name,
                                 std::string type_name, std::vector<Value> args,
                                 rpc::CallOptions options) {
  std::shared_ptr<RRefContext> context = RRefContext::of(agent);
  const WorkerInfo owner = agent.get_worker_info(to);
  if (owner.id == context->self().id) {
    return context->create_local(std::move(name), std::move(type_name), std::move(args));
  }
  return context->create_remote(owner, std::move(name), std::move(type_name), std::move(args),
                                options);
}

std::shared_ptr<RRefCore> own_value(rpc::RpcAgent& agent, std::string type_name, Value value) {
  return RRefContext::of(agent)->own(std::move(type_name), std::move(value), nullptr);
}

std::shared_ptr<RRefCore> own_object(rpc::RpcAgent& agent, std::string class_name,
                                     std::shared_ptr<void> object) {
  return RRefContext::of(agent)->own(std::move(class_name), Value(), std::move(object));
}

std::shared_ptr<RRefCore> receive(const Value& value, const rpc::Where& where,
                                  const CallContext& ctx, const std::string& expected_type) {
  if (value.type() != rpc::ValueType::kRRef) {
    throw InvalidArgument(where.str() + ": expected RRef<" + expected_type + ">, received " +
                          value.describe());
  }
  const RRefDescriptor& d = value.as_rref();
  if (ctx.agent() == nullptr) {
    throw InvalidArgument(where.str() +
                          ": an RRef converts only inside a call made or served by an agent "
                          "(it must find that agent's references)");
  }
  std::shared_ptr<RRefContext> context = RRefContext::of(*ctx.agent());
  if (d.type_name != expected_type) {
    // A descriptor that arrived was checked (validate); one made here is quoted escaped too.
    throw InvalidArgument(where.str() + ": expected RRef<" + expected_type + ">, received RRef<" +
                          printable(d.type_name, kMaxTypeNameBytes) + "> (RRef " +
                          id_text(d.rref_id) + " owned by worker " + std::to_string(d.owner) + ")");
  }
  std::shared_ptr<RRefCore> core = context->find_received(d);
  if (core == nullptr) {
    throw InvalidArgument(where.str() + ": RRef " + id_text(d.rref_id) + " (fork " +
                          id_text(d.fork_id) + ") was not received by worker " +
                          context->self().describe() +
                          " (a Value holding an RRef converts only where it arrived)");
  }
  return core;
}

}  // namespace detail

// ---- the context

RRefContext::RRefContext(const std::shared_ptr<rpc::RpcAgent>& agent)
    : agent_(agent), self_(agent->worker_info()), ids_(agent) {}

int RRefContext::world_size() const {
  int n = world_size_.load(std::memory_order_acquire);
  if (n > 0) return n;
  std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
  n = agent == nullptr ? 0 : static_cast<int>(agent->get_worker_infos().size());
  world_size_.store(n, std::memory_order_release);
  return n;
}

RRefContext::~RRefContext() = default;

void RRefContext::install(const std::shared_ptr<rpc::RpcAgent>& agent) {
  auto context = std::make_shared<RRefContext>(agent);
  std::weak_ptr<RRefContext> weak = context;
  // Requests that run user code (a creation, a method, a fetch's copy) are served on the
  // pool; the bookkeeping ones (forks, deletes) never block and are answered on the I/O
  // thread that received them.
  auto handler = [weak](const CallContext& ctx, const rpc::Request& request) {
    std::shared_ptr<RRefContext> self = weak.lock();
    if (self == nullptr) return make_failed_future<Value>(Error("rref: the context is gone"));
    return self->handle(ctx, request);
  };
  agent->register_handler(kRRefHandler, "rref", handler, rpc::Execution::kPool);
  agent->register_handler(kRRefControlHandler, "rref control", handler, rpc::Execution::kInline);
  agent->add_interceptor(context);
  agent->add_listener(context);
  agent->set_attachment(context);
}

std::shared_ptr<RRefContext> RRefContext::of(const rpc::RpcAgent& agent) {
  std::shared_ptr<RRefContext> context = agent.attachment<RRefContext>();
  if (context == nullptr) {
    throw Error("rref: worker " + agent.worker_info().describe() +
                " has no RRef context (agents made by create_tensorpipe_agent or init_rpc "
                "have one when the program links gradwire::rref)");
  }
  return context;
}

std::shared_ptr<rpc::RpcAgent> RRefContext::agent() const {
  std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
  if (agent == nullptr || agent->is_shut_down()) {
    throw Error("rref: the agent of worker " + self_.describe() +
                " has shut down; its RRefs can no longer be used");
  }
  return agent;
}

std::shared_ptr<rpc::RpcAgent> RRefContext::agent_or_null() const {
  return agent_.lock();
}

std::exception_ptr RRefContext::lost_error(int worker, int incarnation) const {
  MutexLock lock(mutex_);
  auto it = lost_.find({worker, incarnation});
  if (it == lost_.end()) return nullptr;
  std::string name = "worker " + std::to_string(worker);
  if (std::shared_ptr<rpc::RpcAgent> agent = agent_.lock()) {
    try {
      name = agent->get_worker_info(worker).describe();
    } catch (const std::exception&) {
      // Named by its rank alone.
    }
  }
  return std::make_exception_ptr(NetworkError("rref: the owner, " + name + " incarnation " +
                                              std::to_string(incarnation) + ", was lost (" +
                                              it->second + "); its references stay dead"));
}

int RRefContext::incarnation_of(int worker) const {
  MutexLock lock(mutex_);
  auto it = incarnations_.find(worker);
  return it == incarnations_.end() ? 0 : it->second;
}

Future<Value> RRefContext::send(
    const WorkerInfo& to, const std::string& payload, std::string what, std::vector<Value> args,
    rpc::CallOptions options, uint32_t handler,
    std::shared_ptr<std::vector<std::shared_ptr<detail::RRefCore>>> keep) {
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  rpc::Request request;
  request.handler = handler;
  request.function = std::move(what);
  request.payload.assign(payload.begin(), payload.end());
  request.args = std::move(args);
  {
    MutexLock lock(mutex_);
    ++in_flight_;
  }
  Future<Value> result;
  result.set_default_timeout(rpc::RpcAgent::wait_bound(agent->effective_timeout(options)));
  std::weak_ptr<RRefContext> weak = weak_from_this();
  // Tracing: the message from its send to its reply (rref.send).
  TracedOp traced{nullptr, 0};
  int64_t start_ns = 0;
  if (trace::enabled()) {
    wire::RRefMessage message;
    if (message.ParseFromString(payload)) {
      traced = traced_op(message);
      start_ns = trace::now_ns();
    }
  }
  auto done = [weak, traced, start_ns, peer = to.id](RRefContext& self, bool failed) {
    if (start_ns != 0) record_message("rref.send", start_ns, traced, peer, failed ? "error" : "ok");
    MutexLock lock(self.mutex_);
    --self.in_flight_;
    self.cv_.notify_all();
  };
  try {
    agent->send_request(to, std::move(request), options,
                        [weak, done, result, keep](Value value, std::exception_ptr error) mutable {
                          if (error) {
                            result.try_set_error(std::move(error));
                          } else {
                            auto self = weak.lock();
                            if (keep != nullptr && self != nullptr && has_descriptor(value)) {
                              for_each_descriptor(value, [&](const RRefDescriptor& d) {
                                if (auto core = self->find_received(d)) keep->push_back(core);
                              });
                            }
                            result.try_set_value(std::move(value));
                          }
                          const bool failed = error != nullptr;
                          if (auto self = weak.lock()) done(*self, failed);
                        });
  } catch (...) {
    done(*this, true);
    throw;
  }
  return result;
}

std::shared_ptr<UserRRef> RRefContext::create_remote(const WorkerInfo& owner, std::string name,
                                                     std::string type_name, std::vector<Value> args,
                                                     rpc::CallOptions options) {
  const int incarnation = incarnation_of(owner.id);
  if (std::exception_ptr lost = lost_error(owner.id, incarnation)) std::rethrow_exception(lost);
  const uint64_t rref_id = mint();
  const uint64_t fork = mint();
  wire::RRefMessage message;
  wire::Create* create = message.mutable_create();
  create->set_rref_id(rref_id);
  create->set_fork_id(fork);
  create->set_type_name(type_name);
  create->set_name(name);
  Future<void> confirmed;
  auto user = std::make_shared<UserRRef>(shared_from_this(), owner, incarnation, rref_id, fork,
                                         type_name, confirmed,
                                         /*creator=*/true);
  {
    MutexLock lock(mutex_);
    users_[fork] = user;
  }
  Future<Value> reply;
  try {
    reply = send(owner, message.SerializeAsString(),
                 "remote " + name + " -> RRef " + id_text(rref_id) + " (" + type_name + ")", args,
                 options, kRRefHandler);
  } catch (...) {
    discard(args);
    throw;
  }
  // The reference stays alive until the owner has replied: a delete is sent only for a fork
  // the owner has counted.
  gradwire::detail::on_complete_inline(
      reply, [user](const Future<Value>& done) { user->owner_answered(done, /*creation=*/true); });
  return user;
}

std::shared_ptr<OwnerRRef> RRefContext::own(std::string type_name, Value value,
                                            std::shared_ptr<void> object) {
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  if (object == nullptr && has_descriptor(value)) {
    discard({value});
    throw InvalidArgument("rref: make_local of a " + type_name +
                          " that contains references: a value an RRef holds cannot hold RRefs "
                          "(they would not be counted); hold them in an object of a registered "
                          "class instead");
  }
  auto owner = std::make_shared<OwnerRRef>(shared_from_this(), mint(), type_name);
  register_owner(owner);
  owner->begin_creation(type_name);
  if (object != nullptr) {
    owner->hold_object(agent->registry().class_info(type_name), std::move(object));
  } else {
    owner->adopt(make_ready_future(std::move(value)));
  }
  return owner;
}

std::shared_ptr<OwnerRRef> RRefContext::create_local(std::string name, std::string type_name,
                                                     std::vector<Value> args) {
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  auto owner = std::make_shared<OwnerRRef>(shared_from_this(), mint(), type_name);
  register_owner(owner);
  owner->begin_creation(type_name);
  // References among the arguments were made for sending: this worker receives them.
  std::vector<const Value*> values;
  for (const Value& v : args)
    values.push_back(&v);
  std::shared_ptr<void> keep = loop_back(values);
  const CallContext ctx = detail::sending_context(*agent);
  try {
    agent->executor()->execute([owner, keep, ctx, name = std::move(name), args = std::move(args)] {
      owner->create(ctx, name, args);
    });
  } catch (...) {
    owner->fail(std::current_exception());
  }
  return owner;
}

void RRefContext::adopt_user(const std::shared_ptr<UserRRef>& user) {
  MutexLock lock(mutex_);
  users_[user->fork_id()] = user;
}

void RRefContext::register_owner(const std::shared_ptr<OwnerRRef>& owner) {
  MutexLock lock(mutex_);
  owners_[owner->rref_id()] = owner;
}

ForkVerdict RRefContext::apply(uint64_t fork, const ForkEvent& event) {
  ForkTable::Dropped dropped;  // let go after the lock
  MutexLock lock(mutex_);
  const ForkVerdict verdict = forks_.apply(fork, event, dropped);
  cv_.notify_all();
  lock.unlock();
  return verdict;
}

void RRefContext::add_owner_fork(const std::shared_ptr<OwnerRRef>& owner, uint64_t fork,
                                 const CallContext& ctx) {
  {
    MutexLock lock(mutex_);
    if (closed_) throw Error("rref: the agent of worker " + self_.describe() + " has shut down");
  }
  apply(fork, ForkEvent{.kind = ForkEventKind::kMint,
                        .peer = ctx.caller().id,
                        .rref_id = owner->rref_id(),
                        .side = ForkSide::kOwner,
                        .owner = self_.id,
                        .keeps = owner,
                        .request = ctx.request_id()});
}

void RRefContext::add_child(const std::shared_ptr<UserRRef>& parent, uint64_t fork,
                            const CallContext& ctx) {
  {
    MutexLock lock(mutex_);
    if (closed_) throw Error("rref: the agent of worker " + self_.describe() + " has shut down");
    // Minted under the same lock as the check: a loss applied after it finds this fork.
    if (lost_.count({parent->owner().id, parent->owner_incarnation()}) == 0) {
      ForkTable::Dropped none;  // a mint drops nothing
      forks_.apply(fork,
                   ForkEvent{.kind = ForkEventKind::kMint,
                             .peer = ctx.caller().id,
                             .rref_id = parent->rref_id(),
                             .side = ForkSide::kUser,
                             .owner = parent->owner().id,
                             .keeps = parent,
                             .request = ctx.request_id()},
                   none);
      cv_.notify_all();
      return;
    }
  }
  // A reference to a lost incarnation is not sent on: nobody could count the fork.
  std::rethrow_exception(lost_error(parent->owner().id, parent->owner_incarnation()));
}

void RRefContext::release_user(const WorkerInfo& owner, int incarnation, uint64_t rref_id,
                               uint64_t fork, bool counted) {
  {
    MutexLock lock(mutex_);
    auto it = users_.find(fork);
    if (it != users_.end() && it->second.expired()) users_.erase(it);
    cv_.notify_all();
    if (!counted || closed_ || lost_.count({owner.id, incarnation}) != 0) return;
  }
  wire::RRefMessage message;
  message.mutable_delete_fork()->set_rref_id(rref_id);
  message.mutable_delete_fork()->set_fork_id(fork);
  send_settlement(owner, message.SerializeAsString(),
                  "delete of fork " + id_text(fork) + " of RRef " + id_text(rref_id));
}

void RRefContext::send_settlement(const WorkerInfo& to, const std::string& payload,
                                  std::string what, bool through_losses) {
  {
    MutexLock lock(mutex_);
    ++in_flight_;  // across every attempt: wait_idle and a graceful shutdown wait for the last
  }
  settlement_attempt(to, payload, what, 1, through_losses);
}

void RRefContext::settlement_attempt(const WorkerInfo& to, const std::string& payload,
                                     const std::string& what, int attempt, bool through_losses) {
  std::weak_ptr<RRefContext> weak = weak_from_this();
  auto end = [weak] {
    if (auto self = weak.lock()) {
      MutexLock lock(self->mutex_);
      --self->in_flight_;
      self->cv_.notify_all();
    }
  };
  Future<Value> reply;
  std::shared_ptr<rpc::RpcAgent> agent;
  try {
    agent = this->agent();
    reply = send(to, payload, what);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kDebug) << "rref worker " << self_.describe() << ": the " << what
                         << " was not sent to " << to.describe() << ": " << e.what();
    end();
    return;
  }
  reply.add_callback(agent->executor(), [weak, to, payload, what, attempt, through_losses,
                                         end](const Future<Value>& done) {
    if (done.has_error()) {
      bool timed_out = false;
      try {
        std::rethrow_exception(done.error());
      } catch (const TimeoutError&) {
        timed_out = true;
      } catch (const NetworkError&) {
        timed_out = through_losses;
      } catch (...) {
        // Refused (nothing left to settle there) or the peer is gone: not sent again.
      }
      std::shared_ptr<RRefContext> self = weak.lock();
      bool again = timed_out && self != nullptr && attempt < kSettleAttempts;
      if (again) {
        MutexLock lock(self->mutex_);
        again = !self->closed_;
      }
      if (again) {
        // Lost on the way or its answer was: the receiver takes a second copy as a no-op.
        self->settlement_attempt(to, payload, what, attempt + 1, through_losses);
        return;
      }
      if (self != nullptr) {
        try {
          std::rethrow_exception(done.error());
        } catch (const std::exception& e) {
          GRADWIRE_LOG(kDebug) << "rref worker " << self->self_.describe() << ": the " << what
                               << " to " << to.describe() << " failed after " << attempt
                               << " attempt(s): " << e.what();
        }
      }
    }
    end();
  });
}

void RRefContext::settle_refused(const RRefDescriptor& d) {
  const int minter = minter_of(d.fork_id);
  if (minter == self_.id) return;
  wire::RRefMessage message;
  std::string what;
  if (minter == d.owner) {
    message.mutable_delete_fork()->set_rref_id(d.rref_id);
    message.mutable_delete_fork()->set_fork_id(d.fork_id);
    what = "delete of refused fork ";
  } else {
    message.mutable_child_accepted()->add_fork_ids(d.fork_id);
    what = "settlement of refused fork ";
  }
  std::shared_ptr<rpc::RpcAgent> agent = agent_or_null();
  if (agent == nullptr) return;
  WorkerInfo to;
  try {
    to = agent->get_worker_info(minter);
  } catch (const std::exception&) {
    return;  // validate() checked the id; a group that changed size has nothing to settle
  }
  send_settlement(to, message.SerializeAsString(),
                  what + id_text(d.fork_id) + " of RRef " + id_text(d.rref_id));
}

void RRefContext::owner_destroyed(uint64_t rref_id, bool placeholder) {
  MutexLock lock(mutex_);
  if (placeholder) {
    --placeholders_;
  } else {
    remember_freed_locked(rref_id);
  }
  auto it = owners_.find(rref_id);
  if (it != owners_.end() && it->second.expired()) owners_.erase(it);
  cv_.notify_all();
}

void RRefContext::remember_freed_locked(uint64_t rref_id) {
  if (minter_of(rref_id) == self_.id || !freed_.insert(rref_id).second) return;
  freed_order_.push_back(rref_id);
  if (freed_order_.size() > kRememberedFrees) {
    freed_.erase(freed_order_.front());
    freed_order_.pop_front();
  }
}

std::shared_ptr<OwnerRRef> RRefContext::find_owner(uint64_t rref_id) const {
  MutexLock lock(mutex_);
  auto it = owners_.find(rref_id);
  return it == owners_.end() ? nullptr : it->second.lock();
}

bool RRefContext::holds_locked(uint64_t rref_id) const {
  auto it = owners_.find(rref_id);
  return it != owners_.end() && !it->second.expired();
}

bool RRefContext::freed_locked(uint64_t rref_id) const {
  if (minter_of(rref_id) == self_.id) return true;
  return freed_.count(rref_id) != 0;
}

bool RRefContext::lost_locked(int worker) const {
  auto it = incarnations_.find(worker);
  return lost_.count({worker, it == incarnations_.end() ? 0 : it->second}) != 0;
}

void RRefContext::abandon_placeholders(int creator, uint64_t rref_id,
                                       const std::exception_ptr& error) {
  std::vector<std::shared_ptr<OwnerRRef>> found;  // let go after the lock
  {
    MutexLock lock(mutex_);
    for (auto& [id, weak] : owners_) {
      if ((rref_id != 0 && id != rref_id) || minter_of(id) != creator) continue;
      if (auto owner = weak.lock()) found.push_back(std::move(owner));
    }
  }
  std::vector<std::shared_ptr<OwnerRRef>> awaited;
  for (const std::shared_ptr<OwnerRRef>& owner : found) {
    // False once its creation began: a created value is released by its forks.
    if (!owner->abandon(error)) continue;
    MutexLock lock(mutex_);
    --placeholders_;  // it is one no more; its destruction frees it
    if (auto it = awaited_.find(owner->rref_id()); it != awaited_.end()) {
      awaited.push_back(std::move(it->second));
      awaited_.erase(it);
    }
    cv_.notify_all();
  }
}

bool RRefContext::take_given_up(uint64_t fork, int holder) {
  {
    MutexLock lock(mutex_);
    if (!forks_.given_up(fork, holder)) return false;
  }
  return apply(fork, ForkEvent{.kind = ForkEventKind::kCount, .peer = holder}) ==
         ForkVerdict::kForgotten;
}

std::shared_ptr<OwnerRRef> RRefContext::placeholder(uint64_t rref_id,
                                                    const std::string& type_name) {
  std::shared_ptr<OwnerRRef> made;
  MutexLock lock(mutex_);
  if (closed_) throw Error("rref: worker " + self_.describe() + " has shut down");
  auto it = owners_.find(rref_id);
  if (it != owners_.end()) {
    if (auto owner = it->second.lock()) return owner;
  }
  // A fetch or call that arrives after its value was freed (it raced the creation that
  // failed, or came late) must not bring back a placeholder nobody will fill.
  if (freed_locked(rref_id)) {
    throw CallRejected("rref: RRef " + id_text(rref_id) + " on worker " + self_.describe() +
                       " was freed");
  }
  if (placeholders_ >= kMaxPlaceholders) {
    throw CallRejected(
        "rref: worker " + self_.describe() + " holds " + std::to_string(placeholders_) +
        " references whose creation has not arrived; refusing RRef " + id_text(rref_id));
  }
  made = std::make_shared<OwnerRRef>(shared_from_this(), rref_id, type_name);
  owners_[rref_id] = made;
  ++placeholders_;
  return made;
}

std::shared_ptr<OwnerRRef> RRefContext::owned_or_awaited(uint64_t rref_id,
                                                         const std::string& type_name,
                                                         const WorkerInfo& caller) {
  if (std::shared_ptr<OwnerRRef> owner = find_owner(rref_id)) return owner;
  // The reference remote() returned is used at once by its creator, whose creation may
  // still be on its way (another pool thread): it is awaited, held here until it arrives.
  if (minter_of(rref_id) != caller.id || type_name.empty() ||
      type_name.size() > kMaxTypeNameBytes) {
    throw CallRejected("rref: worker " + self_.describe() + " owns no RRef " + id_text(rref_id));
  }
  {
    MutexLock lock(mutex_);
    if (lost_locked(caller.id)) {
      // Its loss abandoned what it was creating here; nothing it sends now creates anything.
      throw CallRejected("rref: worker " + self_.describe() + " lost the connection to " +
                         caller.describe() + " and owns no RRef " + id_text(rref_id));
    }
  }
  std::shared_ptr<OwnerRRef> owner = placeholder(rref_id, type_name);
  MutexLock lock(mutex_);
  // Held only while its creation has not begun: handle_create lets it go after beginning,
  // under the same lock.
  if (!closed_ && !owner->creation_started()) awaited_.emplace(rref_id, owner);
  return owner;
}

std::shared_ptr<OwnerRRef> RRefContext::owner_with_fork(uint64_t rref_id,
                                                        const std::string& type_name, uint64_t fork,
                                                        int holder) {
  std::shared_ptr<OwnerRRef> made;  // let go after the lock when unused
  MutexLock lock(mutex_);
  if (closed_) throw Error("rref: worker " + self_.describe() + " has shut down");
  if (fork != 0 && holder != self_.id && lost_locked(holder)) {
    // Its loss released what it held here, once: a fork counted now would never be.
    throw CallRejected("rref: worker " + self_.describe() + " lost the connection to worker " +
                       std::to_string(holder) + " and released what it held; refusing fork " +
                       id_text(fork) + " of RRef " + id_text(rref_id));
  }
  std::shared_ptr<OwnerRRef> owner;
  auto it = owners_.find(rref_id);
  if (it != owners_.end()) owner = it->second.lock();
  if (owner == nullptr) {
    if (freed_locked(rref_id)) {
      throw CallRejected("rref: RRef " + id_text(rref_id) + " on worker " + self_.describe() +
                         " was freed; refusing fork " + id_text(fork));
    }
    if (placeholders_ >= kMaxPlaceholders) {
      throw CallRejected(
          "rref: worker " + self_.describe() + " holds " + std::to_string(placeholders_) +
          " references whose creation has not arrived; refusing RRef " + id_text(rref_id));
    }
    made = std::make_shared<OwnerRRef>(shared_from_this(), rref_id, type_name);
    owner = made;
    owners_[rref_id] = owner;
    ++placeholders_;
  }
  if (fork == 0) return owner;
  ForkTable::Dropped none;  // a count drops nothing
  const ForkVerdict verdict = forks_.apply(
      fork,
      ForkEvent{.kind = ForkEventKind::kCount, .peer = holder, .rref_id = rref_id, .keeps = owner},
      none);
  if (verdict != ForkVerdict::kApplied) {
    throw CallRejected("rref: fork " + id_text(fork) + " of RRef " + id_text(rref_id) +
                       " is already counted on worker " + self_.describe());
  }
  return owner;
}

void RRefContext::remove_fork(uint64_t rref_id, uint64_t fork, int holder) {
  apply(fork, ForkEvent{.kind = ForkEventKind::kDelete, .peer = holder, .rref_id = rref_id});
}

void RRefContext::accept_children(const std::vector<uint64_t>& forks) {
  for (uint64_t fork : forks)
    apply(fork, ForkEvent{.kind = ForkEventKind::kSettle});
}

std::shared_ptr<detail::RRefCore> RRefContext::find_received(const RRefDescriptor& d) const {
  MutexLock lock(mutex_);
  if (d.owner == self_.id) {
    auto it = owners_.find(d.rref_id);
    return it == owners_.end() ? nullptr : it->second.lock();
  }
  auto it = users_.find(d.fork_id);
  return it == users_.end() ? nullptr : it->second.lock();
}

void RRefContext::validate(const RRefDescriptor& d) const {
  const int world = world_size();
  auto in_group = [&](int id) { return id >= 0 && id < world; };
  const std::string bad_type = bad_type_name(d.type_name);
  if (!in_group(d.owner) || d.rref_id == 0 || d.fork_id == 0 || !in_group(minter_of(d.rref_id)) ||
      !in_group(minter_of(d.fork_id)) || !bad_type.empty()) {
    throw CallRejected("rref: worker " + self_.describe() + " received a malformed RRef (owner " +
                       std::to_string(d.owner) + ", RRef " + id_text(d.rref_id) + ", fork " +
                       id_text(d.fork_id) + ")" +
                       (bad_type.empty() ? "" : ": its type name " + bad_type));
  }
}

std::shared_ptr<detail::RRefCore> RRefContext::accept(const RRefDescriptor& d,
                                                      const WorkerInfo& from) {
  validate(d);
  const int minter = minter_of(d.fork_id);
  if (d.owner == self_.id) {
    std::shared_ptr<OwnerRRef> owner = find_owner(d.rref_id);
    if (owner == nullptr) {
      if (minter == self_.id || minter_of(d.rref_id) == self_.id) {
        throw CallRejected("rref: worker " + self_.describe() + " received RRef " +
                           id_text(d.rref_id) + " from " + from.describe() +
                           ", which it does not own (it was released or never existed)");
      }
      // A user passed a reference to its owner before its creation arrived (the two travel
      // on different threads): the owner waits for it, as for a fork.
      owner = placeholder(d.rref_id, d.type_name);
    }
    if (minter == self_.id) {
      // A fork this owner made came back: the local handle takes over.
      remove_fork(d.rref_id, d.fork_id, from.id);
    } else {
      // Another user's fork arrived at the owner: that user may let go of its reference.
      wire::RRefMessage message;
      message.mutable_child_accepted()->add_fork_ids(d.fork_id);
      send_settlement(agent()->get_worker_info(minter), message.SerializeAsString(),
                      "accept of fork " + id_text(d.fork_id) + " of RRef " + id_text(d.rref_id));
    }
    return owner;
  }
  {
    MutexLock lock(mutex_);
    auto it = users_.find(d.fork_id);
    if (it != users_.end()) {
      if (auto existing = it->second.lock()) return existing;
    }
  }
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  const WorkerInfo owner = agent->get_worker_info(d.owner);
  Future<void> confirmed;
  const int incarnation = incarnation_of(owner.id);
  auto user = std::make_shared<UserRRef>(shared_from_this(), owner, incarnation, d.rref_id,
                                         d.fork_id, d.type_name, confirmed);
  {
    MutexLock lock(mutex_);
    users_[d.fork_id] = user;
  }
  if (std::exception_ptr lost = lost_error(owner.id, incarnation)) {
    user->apply(UserRRef::Event::kNotCounted);
    confirmed.try_set_error(lost);
    // Refused here for good: its sender must still learn it, or the owner keeps the fork it
    // counted when it sent it (the connection that failed here may have failed alone, the
    // owner living on), or a user keeps the parent it forked it from.
    settle_refused(d);
    return user;
  }
  if (minter == d.owner) {
    // The owner made this fork and counted it when it sent it.
    user->apply(UserRRef::Event::kCounted);
    confirmed.try_set_value();
    return user;
  }
  wire::RRefMessage message;
  wire::AddFork* add = message.mutable_add_fork();
  add->set_rref_id(d.rref_id);
  add->set_fork_id(d.fork_id);
  add->set_type_name(d.type_name);
  Future<Value> reply;
  try {
    reply = send(owner, message.SerializeAsString(),
                 "fork " + id_text(d.fork_id) + " of RRef " + id_text(d.rref_id));
  } catch (const std::exception& e) {
    // Never sent: the owner never counts it (the reference fails its calls with why).
    reply = make_failed_future<Value>(std::make_exception_ptr(
        NetworkError("rref: the fork " + id_text(d.fork_id) + " of RRef " + id_text(d.rref_id) +
                     " was not sent to its owner " + owner.describe() + ": " + e.what())));
  }
  std::weak_ptr<RRefContext> weak = weak_from_this();
  gradwire::detail::on_complete_inline(reply, [user, d, weak](const Future<Value>& done) {
    user->owner_answered(done, /*creation=*/false);
    if (!done.has_error()) return;
    try {
      std::rethrow_exception(done.error());
    } catch (const NetworkError&) {
      // The connection to the owner failed with the AddFork on it: the owner never counted
      // the fork, or released it with this worker's loss, and will not settle it with the
      // user that sent it, which learns it from here.
      if (auto self = weak.lock()) self->settle_refused(d);
    } catch (...) {
      // Refused by the owner (it settled the sender itself) or timed out (this worker's
      // Delete settles it when the reference goes).
    }
  });
  return user;
}

void RRefContext::accept_all(const Value& value, const WorkerInfo& from,
                             std::vector<std::shared_ptr<detail::RRefCore>>& out) {
  for_each_descriptor(value, [&](const RRefDescriptor& d) { out.push_back(accept(d, from)); });
}

void RRefContext::bind_all(const Value& value, int to, std::vector<uint64_t>& bound) {
  std::vector<uint64_t> uncounted;  // owner forks for a worker lost here
  for_each_descriptor(value, [&](const RRefDescriptor& d) {
    if (minter_of(d.fork_id) != self_.id) return;
    if (apply(d.fork_id, ForkEvent{.kind = ForkEventKind::kBind, .peer = to}) !=
        ForkVerdict::kApplied)
      return;
    bound.push_back(d.fork_id);
    if (to != self_.id) {
      MutexLock lock(mutex_);
      if (lost_locked(to)) uncounted.push_back(d.fork_id);
    }
  });
  // A fork kept for a lost worker would never be released (its loss was applied once, its
  // Deletes are ignored, and its death later would not be told again): the message goes,
  // but the owner does not count the fork, and a user does not keep it pending.
  unbind(uncounted, to);
}

void RRefContext::unbind(const std::vector<uint64_t>& forks, int to) {
  for (uint64_t fork : forks)
    apply(fork, ForkEvent{.kind = ForkEventKind::kNotDelivered, .peer = to});
}

void RRefContext::discard(const std::vector<Value>& values) {
  // Only forks bound to no receiver: one bound may be accepted there, and the message that
  // carries it settles it.
  for (const Value& v : values) {
    for_each_descriptor(v, [&](const RRefDescriptor& d) {
      if (minter_of(d.fork_id) == self_.id)
        apply(d.fork_id, ForkEvent{.kind = ForkEventKind::kDiscarded});
    });
  }
}

std::shared_ptr<void> RRefContext::loop_back(const std::vector<const Value*>& values) {
  auto held = std::make_shared<Held>();
  std::vector<uint64_t> bound;
  for (const Value* v : values) {
    if (!has_descriptor(*v)) continue;
    bind_all(*v, self_.id, bound);
    accept_all(*v, self_, held->cores);
  }
  return held;
}

// ---- interceptor

std::shared_ptr<void> RRefContext::on_outgoing_request(const WorkerInfo& to,
                                                       rpc::Request& request) {
  auto state = std::make_shared<CallState>();
  for (const Value& v : request.args) {
    if (v.type() == rpc::ValueType::kRRef || v.type() == rpc::ValueType::kList ||
        v.type() == rpc::ValueType::kMap)
      bind_all(v, to.id, state->bound);
  }
  return state;
}

void RRefContext::on_incoming_response(const WorkerInfo& from, rpc::Response& response,
                                       const std::shared_ptr<void>& state) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr || state == nullptr || !has_descriptor(*value)) return;
  accept_all(*value, from, static_cast<CallState*>(state.get())->received);
}

void RRefContext::on_call_finished(const rpc::FinishedCall& call,
                                   const std::shared_ptr<void>& state) {
  if (state == nullptr) return;
  // Served: its receiver accepted what it carried. Anything else (never sent, refused
  // unread as busy, timed out, its connection or the agent gone) releases the forks it
  // carried; a receiver that got it anyway finds them refused or freed.
  if (call.outcome == rpc::CallOutcome::kReplied && !is_busy(call.error)) return;
  unbind(static_cast<CallState*>(state.get())->bound, call.to.id);
}

void RRefContext::on_request_not_sent(const rpc::Request& request) {
  discard(request.args);
}

void RRefContext::on_late_response(const WorkerInfo& from, const rpc::Response& response,
                                   const std::shared_ptr<void>&) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr || !has_descriptor(*value)) return;
  // Accepted as if the call had waited for it, then let go at once: each fork is counted
  // and deleted (or refused) as usual.
  std::vector<std::shared_ptr<detail::RRefCore>> dropped;
  try {
    accept_all(*value, from, dropped);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kDebug) << "rref worker " << self_.describe() << ": a late reply from "
                         << from.describe() << " carried a reference refused here: " << e.what();
  }
}

void RRefContext::on_response_not_sent(const WorkerInfo& to, const rpc::Request&,
                                       const rpc::Response& response) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr || !has_descriptor(*value)) return;
  std::vector<uint64_t> forks;
  for_each_descriptor(*value, [&](const RRefDescriptor& d) {
    if (minter_of(d.fork_id) == self_.id) forks.push_back(d.fork_id);
  });
  unbind(forks, to.id);
}

std::shared_ptr<rpc::ServeScope> RRefContext::on_incoming_request(const WorkerInfo& from,
                                                                  rpc::Request& request) {
  std::shared_ptr<Held> held;
  for (const Value& v : request.args) {
    if (!has_descriptor(v)) continue;
    if (held == nullptr) held = std::make_shared<Held>();
    accept_all(v, from, held->cores);
  }
  return held;
}

void RRefContext::on_outgoing_response(const WorkerInfo& to, const rpc::Request& request,
                                       rpc::Response& response) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value != nullptr && has_descriptor(*value)) {
    std::vector<uint64_t> bound;
    bind_all(*value, to.id, bound);
  }
  // Forks converted for this reply that it does not carry: its result failed to convert
  // part-way (a later element threw), or the function made them and failed.
  std::vector<uint64_t> unused;
  {
    MutexLock lock(mutex_);
    unused = forks_.take_minted_for_reply(to.id, request.id);
  }
  for (uint64_t fork : unused)
    apply(fork, ForkEvent{.kind = ForkEventKind::kDiscarded});
}

// ---- listener

void RRefContext::on_worker_lost(const WorkerInfo& worker, const std::string& why) {
  lose(worker, why, /*tell=*/true);
}

void RRefContext::lose(const WorkerInfo& worker, const std::string& why, bool tell) {
  std::vector<std::shared_ptr<detail::RRefCore>> dropped;
  std::vector<std::shared_ptr<UserRRef>> orphans;
  int incarnation = 0;
  {
    MutexLock lock(mutex_);
    incarnation = incarnations_[worker.id];
    if (closed_ || lost_.count({worker.id, incarnation}) != 0) return;
    lost_[{worker.id, incarnation}] =
        "the connection to " + worker.describe() + " was lost: " + why;
    // Forks it held or was receiving no longer keep values alive; forks sent of its values
    // will never be settled.
    forks_.lose(worker.id, dropped);
    // Filtered after the lock: a handle let go meanwhile must not be the last one here.
    for (auto& [fork, weak] : users_) {
      if (auto user = weak.lock()) orphans.push_back(std::move(user));
    }
    cv_.notify_all();
  }
  std::erase_if(orphans, [&](const std::shared_ptr<UserRRef>& user) {
    return user->owner().id != worker.id || user->owner_incarnation() != incarnation;
  });
  for (auto& user : orphans)
    user->apply(UserRRef::Event::kNotCounted);
  // Values it was creating here whose Create has not come: it never will.
  abandon_placeholders(
      worker.id, 0,
      std::make_exception_ptr(
          NetworkError("rref: the creator of the reference, " + worker.describe() + ", was lost (" +
                       why + ") before its creation arrived on " + self_.describe())));
  GRADWIRE_LOG(kInfo) << "rref worker " << self_.describe() << ": released what "
                      << worker.describe() << " held; " << orphans.size()
                      << " references to its values are now dead";
  if (!tell) return;
  // The connection may have failed on this side alone (the peer lives on and did not see
  // it): the peer releases the same, or it would keep this worker's forks for good.
  wire::RRefMessage message;
  message.mutable_lost()->set_incarnation(incarnation);
  message.mutable_lost()->set_why(why);
  send_settlement(worker, message.SerializeAsString(), "loss notice", /*through_losses=*/true);
}

void RRefContext::on_worker_rejoined(const WorkerInfo& worker, int incarnation) {
  MutexLock lock(mutex_);
  // The lost incarnation stays lost: references made for it keep failing at once, and
  // only references made from now on reach the replacement.
  incarnations_[worker.id] = incarnation;
  GRADWIRE_LOG(kInfo) << "rref worker " << self_.describe() << ": " << worker.describe()
                      << " is back as incarnation " << incarnation;
}

void RRefContext::on_graceful_shutdown(Clock::time_point deadline) {
  {
    MutexLock lock(mutex_);
    shutting_down_ = true;
  }
  // Forks this worker sent must be accepted first: each keeps a value alive for its
  // receiver.
  wait_idle(deadline, "a graceful shutdown");
  // Then every reference still held here is given up.
  std::vector<std::shared_ptr<UserRRef>> users;
  {
    MutexLock lock(mutex_);
    for (auto& [fork, weak] : users_) {
      if (auto user = weak.lock()) users.push_back(std::move(user));
    }
  }
  for (auto& user : users) {
    if (user->apply(UserRRef::Event::kGiveUp))
      release_user(user->owner(), user->owner_incarnation(), user->rref_id(), user->fork_id(),
                   true);
  }
  users.clear();
  wait_idle(deadline, "a graceful shutdown");
}

void RRefContext::on_closed() {
  ForkTable::Dropped dropped;
  std::map<uint64_t, std::shared_ptr<OwnerRRef>> awaited;
  std::vector<std::shared_ptr<UserRRef>> users;
  {
    MutexLock lock(mutex_);
    at_close_ = metrics_locked();
    closed_ = true;
    forks_.clear(dropped);
    awaited.swap(awaited_);
    for (auto& [fork, weak] : users_) {
      if (auto user = weak.lock()) users.push_back(std::move(user));
    }
    cv_.notify_all();
  }
  for (auto& user : users)
    user->apply(UserRRef::Event::kNotCounted);
}

RRefMetrics RRefContext::metrics() const {
  MutexLock lock(mutex_);
  return metrics_locked();
}

RRefMetrics RRefContext::metrics_at_close() const {
  MutexLock lock(mutex_);
  return at_close_;
}

RRefMetrics RRefContext::metrics_locked() const {
  RRefMetrics m;
  for (const auto& [id, weak] : owners_) {
    if (!weak.expired()) ++m.owned_values;
  }
  m.shared_values = forks_.shared_values();
  m.owned_forks = forks_.owner_forks();
  for (const auto& [fork, weak] : users_) {
    if (!weak.expired()) ++m.user_references;
  }
  m.pending_children = forks_.pending_children();
  m.messages_in_flight = in_flight_;
  return m;
}

void RRefContext::wait_idle(Clock::time_point deadline, const char* what) const {
  MutexLock lock(mutex_);
  auto busy = [&]() GRADWIRE_REQUIRES(mutex_) {
    return !closed_ && (in_flight_ > 0 || forks_.pending_children() > 0);
  };
  while (busy()) {
    if (lock.wait_until(cv_, deadline) == std::cv_status::timeout && busy()) {
      throw TimeoutError("rref worker " + self_.describe() + ": " + what + " waited for " +
                         std::to_string(in_flight_) + " protocol messages and " +
                         std::to_string(forks_.pending_children()) +
                         " forks not yet accepted by their owners");
    }
  }
}

bool RRefContext::wait_owned_values(int64_t count, Clock::time_point deadline) const {
  MutexLock lock(mutex_);
  auto over = [&]() GRADWIRE_REQUIRES(mutex_) {
    int64_t n = 0;
    for (const auto& [id, weak] : owners_) {
      if (!weak.expired()) ++n;
    }
    return n > count;
  };
  while (over()) {
    if (lock.wait_until(cv_, deadline) == std::cv_status::timeout) return !over();
  }
  return true;
}

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
  if (!trace::enabled()) return dispatch(ctx, request, message);
  // Tracing: the message's handling here (rref.handle), until its reply is ready or its
  // user code goes on running.
  const TracedOp traced = traced_op(message);
  const int64_t start_ns = trace::now_ns();
  try {
    Future<Value> reply = dispatch(ctx, request, message);
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

Future<Value> RRefContext::dispatch(const CallContext& ctx, const rpc::Request& request,
                                    const wire::RRefMessage& message) {
  const WorkerInfo& caller = ctx.caller();
  const int world = world_size();
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  switch (message.op_case()) {
    case wire::RRefMessage::kCreate:
      return handle_create(ctx, request, message.create());
    case wire::RRefMessage::kFetch: {
      const wire::Fetch& fetch = message.fetch();
      check_type_name(fetch.type_name(), "Fetch.type_name");
      std::shared_ptr<OwnerRRef> owner =
          owned_or_awaited(fetch.rref_id(), fetch.type_name(), caller);
      return owner->serialise(ctx, fetch.type_name());
    }
    case wire::RRefMessage::kCallMethod: {
      const wire::CallMethod& call = message.call_method();
      check_type_name(call.type_name(), "CallMethod.type_name");
      std::shared_ptr<OwnerRRef> owner = owned_or_awaited(call.rref_id(), call.type_name(), caller);
      return owner->invoke(ctx, call.method(), request.args);
    }
    case wire::RRefMessage::kAddFork: {
      const wire::AddFork& add = message.add_fork();
      const int parent = minter_of(add.fork_id());
      if (add.rref_id() == 0 || minter_of(add.rref_id()) >= world || parent >= world ||
          parent == self_.id) {
        throw CallRejected(parse_error("a fork with bad ids"));
      }
      check_type_name(add.type_name(), "AddFork.type_name");
      // Whatever the answer, the sender's pending child is settled: counted, given up by its
      // holder already, or refused.
      auto settle = [&] {
        wire::RRefMessage accepted;
        accepted.mutable_child_accepted()->add_fork_ids(add.fork_id());
        send_settlement(
            agent->get_worker_info(parent), accepted.SerializeAsString(),
            "accept of fork " + id_text(add.fork_id()) + " of RRef " + id_text(add.rref_id()));
      };
      if (take_given_up(add.fork_id(), caller.id)) {
        settle();
        return make_ready_future(Value());
      }
      std::shared_ptr<OwnerRRef> owner;
      try {
        owner = owner_with_fork(add.rref_id(), add.type_name(), add.fork_id(), caller.id);
        if (owner->type_name() != add.type_name()) {
          remove_fork(add.rref_id(), add.fork_id(), caller.id);
          throw CallRejected("rref: RRef " + id_text(add.rref_id()) + " on worker " +
                             self_.describe() + " holds " + owner->type_name() + ", not " +
                             add.type_name());
        }
      } catch (const CallRejected&) {
        settle();
        throw;
      }
      settle();
      return make_ready_future(Value());
    }
    case wire::RRefMessage::kLost: {
      // Only for the incarnation running here: a notice meant for a predecessor is stale.
      if (message.lost().incarnation() == agent->incarnation()) {
        lose(caller,
             "it lost its connection to " + self_.describe() + ": " +
                 printable(message.lost().why(), 200),
             /*tell=*/false);
      }
      return make_ready_future(Value());
    }
    case wire::RRefMessage::kChildAccepted: {
      std::vector<uint64_t> forks(message.child_accepted().fork_ids().begin(),
                                  message.child_accepted().fork_ids().end());
      accept_children(forks);
      return make_ready_future(Value());
    }
    case wire::RRefMessage::kDeleteFork: {
      const wire::Delete& del = message.delete_fork();
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
        case ForkVerdict::kRemembered: {
          lock.unlock();
          // The AddFork of a fork another user made may never come (it timed out on its way
          // here): the user that sent the fork learns now that it is settled.
          const int parent = minter_of(fork);
          if (parent != caller.id) {
            wire::RRefMessage settled;
            settled.mutable_child_accepted()->add_fork_ids(fork);
            send_settlement(
                agent->get_worker_info(parent), settled.SerializeAsString(),
                "accept of fork " + id_text(fork) + " of RRef " + id_text(del.rref_id()));
          } else if (minter_of(del.rref_id()) == caller.id) {
            // The creator gave its own reference up before its Create arrived (the Create
            // timed out, or was lost on the way): its remote() failed, nothing will create
            // the value now, and calls waiting for it (the creator's own, or other
            // workers' through forks) end with why.
            {
              // Not held here yet (its Create and its calls still on their way): whatever
              // of it arrives now is refused instead of awaited.
              MutexLock relock(mutex_);
              if (!holds_locked(del.rref_id())) remember_freed_locked(del.rref_id());
            }
            abandon_placeholders(
                caller.id, del.rref_id(),
                std::make_exception_ptr(CallRejected(
                    "rref: RRef " + id_text(del.rref_id()) + " was given up by its creator, " +
                    caller.describe() + ", before its creation arrived on " + self_.describe())));
          }
          return make_ready_future(Value());
        }
        case ForkVerdict::kNotHolder:
          throw CallRejected("rref: fork " + id_text(fork) + " of RRef " + id_text(del.rref_id()) +
                             " is not held by " + caller.describe());
        case ForkVerdict::kFull:
          throw CallRejected("rref: worker " + self_.describe() + " holds " +
                             std::to_string(forks_.given_up_count()) +
                             " forks given up before they were counted; refusing fork " +
                             id_text(fork));
        default:
          if (foreign && gone) return make_ready_future(Value());
          throw CallRejected("rref: worker " + self_.describe() + " counts no fork " +
                             id_text(fork) + " of RRef " + id_text(del.rref_id()));
      }
    }
    case wire::RRefMessage::OP_NOT_SET:
      break;
  }
  throw CallRejected(parse_error("no operation"));
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

RRefMetrics metrics(rpc::RpcAgent& agent) {
  return RRefContext::of(agent)->metrics();
}

RRefMetrics metrics_at_close(rpc::RpcAgent& agent) {
  return RRefContext::of(agent)->metrics_at_close();
}

void wait_idle(rpc::RpcAgent& agent, std::chrono::milliseconds timeout) {
  RRefContext::of(agent)->wait_idle(deadline_after(timeout), "wait_idle");
}

bool wait_owned_values(rpc::RpcAgent& agent, int64_t count, std::chrono::milliseconds timeout) {
  return RRefContext::of(agent)->wait_owned_values(count, deadline_after(timeout));
}

namespace detail {
// Every agent built by a factory gets a context, the default one of init_rpc included.
bool ensure_registered() {
  static const bool registered = [] {
    rpc::register_agent_extension("rref", &RRefContext::install);
    return true;
  }();
  return registered;
}
namespace {
const bool kRegistered = ensure_registered();
}  // namespace
}  // namespace detail

}  // namespace gradwire::rref
