// RRefContext (context.h): references received (validated, then accepted as the owner's
// value or as a new user reference, whose fork the owner is asked to count), and the
// placeholders made for a value whose creation has not arrived yet.
#include <utility>

#include "context.h"
#include "gradwire/core/error_kind_of.h"
#include "messages.h"
#include "proto/rref.pb.h"

namespace gradwire::rref {

namespace {

// Owned references made by a fork that arrived before the value's creation: bounded, so
// forks naming made-up ids cannot grow the table without end.
constexpr int64_t kMaxPlaceholders = 1 << 16;

}  // namespace

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
  if (d.owner == self_.id) return accept_owned(d, from);
  {
    MutexLock lock(mutex_);
    auto it = users_.find(d.fork_id);
    if (it != users_.end()) {
      if (auto existing = it->second.lock()) return existing;
    }
  }
  return accept_user(d);
}

std::shared_ptr<OwnerRRef> RRefContext::accept_owned(const RRefDescriptor& d,
                                                     const WorkerInfo& from) {
  const int minter = minter_of(d.fork_id);
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
    settle_child(agent()->get_worker_info(minter), d.rref_id, d.fork_id);
  }
  return owner;
}

std::shared_ptr<UserRRef> RRefContext::accept_user(const RRefDescriptor& d) {
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
  if (minter_of(d.fork_id) == d.owner) {
    // The owner made this fork and counted it when it sent it.
    user->apply(UserRRef::Event::kCounted);
    confirmed.try_set_value();
    return user;
  }
  send_add_fork(user, d, owner);
  return user;
}

void RRefContext::send_add_fork(const std::shared_ptr<UserRRef>& user, const RRefDescriptor& d,
                                const WorkerInfo& owner) {
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
    // A lost connection to the owner with the AddFork on it: the owner never counted the
    // fork, or released it with this worker's loss, and will not settle it with the user
    // that sent it, which learns it from here. Any other failure is settled elsewhere:
    // refused by the owner (it settled the sender itself) or timed out (this worker's
    // Delete settles it when the reference goes).
    if (error_kind_of(done.error()) != ErrorKind::kNetwork) return;
    if (auto self = weak.lock()) self->settle_refused(d);
  });
}

void RRefContext::accept_all(const Value& value, const WorkerInfo& from,
                             std::vector<std::shared_ptr<detail::RRefCore>>& out) {
  for_each_descriptor(value, [&](const RRefDescriptor& d) { out.push_back(accept(d, from)); });
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

std::shared_ptr<OwnerRRef> RRefContext::placeholder(uint64_t rref_id,
                                                    const std::string& type_name) {
  std::shared_ptr<OwnerRRef> made;
  MutexLock lock(mutex_);
  if (closed_) throw Error("rref: worker " + self_.describe() + " has shut down");
  auto it = owners_.find(rref_id);
  if (it != owners_.end()) {
    if (auto owner = it->second.lock()) return owner;
  }
  made = new_placeholder_locked(rref_id, type_name, "");
  return made;
}

std::shared_ptr<OwnerRRef> RRefContext::new_placeholder_locked(uint64_t rref_id,
                                                               const std::string& type_name,
                                                               const std::string& refusing) {
  // A fetch, call or fork that arrives after its value was freed (it raced the creation
  // that failed, or came late) must not bring back a placeholder nobody will fill.
  if (freed_locked(rref_id)) {
    throw CallRejected("rref: RRef " + id_text(rref_id) + " on worker " + self_.describe() +
                       " was freed" + refusing);
  }
  if (placeholders_ >= kMaxPlaceholders) {
    throw CallRejected(
        "rref: worker " + self_.describe() + " holds " + std::to_string(placeholders_) +
        " references whose creation has not arrived; refusing RRef " + id_text(rref_id));
  }
  auto made = std::make_shared<OwnerRRef>(shared_from_this(), rref_id, type_name);
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
    made = new_placeholder_locked(rref_id, type_name, "; refusing fork " + id_text(fork));
    owner = made;
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

}  // namespace gradwire::rref
