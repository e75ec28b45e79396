// RRefContext (context.h): its construction and installation on an agent, the registries
// of references alive here, the one entry to the fork table, and the metrics and waits.
// The rest of the context is in files by concept: context_send.cc (protocol messages and
// settlements sent), context_receive.cc (references received, validated, and the
// placeholders awaiting a creation), context_intercept.cc (the interceptor: forks bound to
// and released with the messages carrying them), context_loss.cc (a worker lost or
// rejoined, a graceful shutdown, the agent closed) and context_handler.cc (one handler per
// protocol message).
#include "context.h"

#include <utility>

#include "messages.h"
#include "proto/rref.pb.h"

namespace gradwire::rref {

namespace {

// Freed values remembered, so that a late fork of one is refused rather than awaited.
constexpr size_t kRememberedFrees = 1 << 16;

}  // namespace

// ---- the context

RRefContext::RRefContext(const std::shared_ptr<rpc::RpcAgent>& agent)
    : agent_(agent), self_(agent->worker_info()), ids_(agent), freed_(kRememberedFrees) {}

int RRefContext::world_size() const {
  int n = world_size_.load(std::memory_order_acquire);
  if (n > 0) return n;
  std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
  // Ids are bounded by the group's size, or an elastic group's capacity.
  n = agent == nullptr ? 0 : agent->id_limit();
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
  if (minter_of(rref_id) != self_.id) freed_.insert(rref_id);
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
  return freed_.contains(rref_id);
}

bool RRefContext::lost_locked(int worker) const {
  auto it = incarnations_.find(worker);
  return lost_.count({worker, it == incarnations_.end() ? 0 : it->second}) != 0;
}

bool RRefContext::take_given_up(uint64_t fork, int holder) {
  {
    MutexLock lock(mutex_);
    if (!forks_.given_up(fork, holder)) return false;
  }
  return apply(fork, ForkEvent{.kind = ForkEventKind::kCount, .peer = holder}) ==
         ForkVerdict::kForgotten;
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
