// RRefContext (context.h) as the agent's listener: a worker lost (its forks released, the
// references to its values dead, the peer told), a worker rejoined, a graceful shutdown
// (this worker's last Deletes) and the agent closed.
#include <utility>

#include "context.h"
#include "gradwire/core/logging.h"
#include "proto/rref.pb.h"

namespace gradwire::rref {

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

void RRefContext::on_worker_left(const WorkerInfo& worker) {
  lose(worker, "it left the group", /*tell=*/false);
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

}  // namespace gradwire::rref
