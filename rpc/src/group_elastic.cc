// GroupDirectory's elastic membership (group.h, docs/elastic.md): joining a running group,
// the roster, workers met, left and lost, each id's presence, and barriers over the members
// of the moment.
#include "group.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "gradwire/c10d/store.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "text.h"

namespace gradwire::rpc::detail {

int GroupDirectory::formed_size() const {
  const std::string me = "rpc agent " + self_.describe();
  // Rank 0 marks the generation right after entering it.
  std::string formed;
  try {
    formed = c10d::to_string(store_->get(key("elastic"), std::chrono::milliseconds(2'000)));
  } catch (const TimeoutError&) {
    throw InvalidArgument(me +
                          " was asked to join the running group, but that group is not "
                          "elastic: start its workers with AgentOptions::elastic "
                          "(GRADWIRE_RPC_ELASTIC=1)");
  }
  int size = 0;
  try {
    size = std::stoi(formed);
  } catch (const std::exception&) {
  }
  if (size < 1 || size > capacity_) {
    throw InvalidArgument(me + ": the store's mark of the running group's size is '" +
                          printable(formed) + "', not a size in [1, " + std::to_string(capacity_) +
                          "]; is another program using the same store?");
  }
  return size;
}

void GroupDirectory::enter_running_generation() {
  const std::string me = "rpc agent " + self_.describe();
  const int64_t started = store_->add("rpc/starts/0", 0);
  if (started < 1) {
    throw InvalidArgument(me +
                          " was asked to join a running group (join_running), but no group "
                          "has started on this store");
  }
  prefix_ = "rpc/" + std::to_string(started) + "/";
  world_size_ = formed_size();
  const std::string rank_text = std::to_string(self_.id);
  if (self_.id < world_size_) {
    throw InvalidArgument(me + " cannot join the running group under rank " + rank_text +
                          ": the group formed with ranks 0.." + std::to_string(world_size_ - 1) +
                          ", and a lost one is replaced with AgentOptions::rejoin");
  }
  // Ranks are never reused: a rank that a worker joined under stays its own.
  const std::string held = c10d::to_string(
      store_->compare_set(key("joined/" + rank_text), {}, c10d::to_bytes(self_.name)));
  if (held != self_.name) {
    throw InvalidArgument(me + " cannot join the running group under rank " + rank_text +
                          ": worker '" + printable(held) + "' joined under it already");
  }
  // A later replacement of this rank (AgentOptions::rejoin) finds the generation here.
  store_->set("rpc/starts/" + rank_text, std::to_string(started));
}

// ---- elastic membership

std::vector<int> GroupDirectory::roster() const {
  std::vector<int> ranks;
  if (!store_->check({key("roster")})) return ranks;
  std::istringstream in(c10d::to_string(store_->get(key("roster"), join_timeout_)));
  for (std::string word; in >> word;) {
    int rank = -1;
    try {
      rank = std::stoi(word);
    } catch (const std::exception&) {
    }
    // Only a joiner's rank: anything else is not this group's writing.
    if (rank >= world_size_ && rank < slots_ &&
        std::find(ranks.begin(), ranks.end(), rank) == ranks.end())
      ranks.push_back(rank);
  }
  return ranks;
}

std::vector<int> GroupDirectory::members_in_store() const {
  std::vector<int> ranks;
  for (int r = 0; r < world_size_; ++r)
    ranks.push_back(r);
  if (!elastic()) return ranks;
  for (int r : roster())
    ranks.push_back(r);
  std::erase_if(ranks, [&](int r) { return r != self_.id && gone_in_store(r); });
  return ranks;
}

bool GroupDirectory::gone_in_store(int rank) const {
  const std::string rank_text = std::to_string(rank);
  if (store_->check({key("left/" + rank_text)})) return true;
  if (!store_->check({key("lost/" + rank_text)})) return false;
  // Lost in the incarnation that holds the rank now: a replacement counts again.
  const std::string lost = c10d::to_string(store_->get(key("lost/" + rank_text), join_timeout_));
  const int64_t current = store_->add(key("incarnation/" + rank_text), 0);
  try {
    return std::stoll(lost) >= current;
  } catch (const std::exception&) {
    return false;
  }
}

void GroupDirectory::mark_lost(int rank) const {
  if (!elastic() || rank < 0 || rank >= slots_) return;
  int incarnation = 0;
  {
    MutexLock lock(mutable_mutex_);
    incarnation = incarnations_[static_cast<size_t>(rank)];
  }
  const std::string lost_key = key("lost/" + std::to_string(rank));
  // The newest incarnation anyone saw lost stays: a slower worker's older news never
  // overwrites it.
  for (int attempt = 0; attempt < 8; ++attempt) {
    const c10d::Bytes before =
        store_->check({lost_key}) ? store_->get(lost_key, join_timeout_) : c10d::Bytes{};
    if (!before.empty()) {
      try {
        if (std::stoll(c10d::to_string(before)) >= incarnation) return;
      } catch (const std::exception&) {
      }
    }
    const c10d::Bytes held =
        store_->compare_set(lost_key, before, c10d::to_bytes(std::to_string(incarnation)));
    if (c10d::to_string(held) == std::to_string(incarnation)) return;
  }
}

void GroupDirectory::adopt_roster() {
  // Workers that formed the group and have left it since, or were lost and not replaced.
  for (int r = 0; r < world_size_; ++r) {
    if (r != self_.id && gone_in_store(r)) {
      if (store_->check({key("left/" + std::to_string(r))})) {
        mark_left(r);
      } else {
        apply(r, PresenceEvent::kLose);
      }
    }
  }
  for (int r : roster()) {
    const std::string rec_key = key("worker/" + std::to_string(r));
    if (!store_->check({rec_key})) continue;  // it is publishing: met later
    const WorkerRecord rec = parse_record(c10d::to_string(store_->get(rec_key, join_timeout_)), r);
    {
      MutexLock lock(mutable_mutex_);
      adopt(r, rec);
    }
    // One that has left already is known by name, as gone; one lost, as lost.
    if (store_->check({key("left/" + std::to_string(r))})) {
      mark_left(r);
    } else if (gone_in_store(r)) {
      apply(r, PresenceEvent::kLose);
    }
  }
}

std::optional<WorkerInfo> GroupDirectory::discover(int rank, std::chrono::milliseconds timeout) {
  if (!elastic() || rank < world_size_ || rank >= slots_) return std::nullopt;
  const std::string rank_text = std::to_string(rank);
  try {
    const WorkerRecord rec =
        parse_record(c10d::to_string(store_->get(key("worker/" + rank_text), timeout)), rank);
    bool adopted = false;
    {
      MutexLock lock(mutable_mutex_);
      adopted = adopt(rank, rec);
    }
    // A joiner that has left already is known by name, as gone, and is not met.
    if (store_->check({key("left/" + rank_text)})) {
      mark_left(rank);
      return std::nullopt;
    }
    if (!adopted) return std::nullopt;
    const WorkerInfo met = workers_[static_cast<size_t>(rank)];
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": " << met.describe()
                        << " joined the group";
    if (on_met_) on_met_(met);
    return met;
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": no joiner of rank " << rank
                        << " could be read from the store: " << e.what();
    return std::nullopt;
  }
}

std::optional<WorkerInfo> GroupDirectory::discover(const std::string& name,
                                                   std::chrono::milliseconds timeout) {
  if (!elastic() || !valid_worker_name(name)) return std::nullopt;
  const std::string name_key = key("name/" + name);
  try {
    if (!store_->check({name_key})) return std::nullopt;
    const int rank = std::stoi(c10d::to_string(store_->get(name_key, timeout)));
    return discover(rank, timeout);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": worker '" << name
                        << "' could not be looked up in the store: " << e.what();
    return std::nullopt;
  }
}

bool GroupDirectory::mark_left(int id) {
  if (id < 0 || id >= slots_) return false;
  MutexLock lock(mutable_mutex_);
  Presence& p = presence_[static_cast<size_t>(id)];
  const bool was_in = p == Presence::kMember || p == Presence::kLost;
  p = next(p, PresenceEvent::kLeave);
  return was_in;
}

void GroupDirectory::mark_leaving() const {
  store_->set(key("left/" + std::to_string(self_.id)), "1");
}

Presence GroupDirectory::apply(int id, PresenceEvent event) {
  if (id < 0 || id >= slots_) return Presence::kAbsent;
  MutexLock lock(mutable_mutex_);
  Presence& p = presence_[static_cast<size_t>(id)];
  p = next(p, event);
  return p;
}

Presence GroupDirectory::presence(int id) const {
  if (id < 0 || id >= slots_) return Presence::kAbsent;
  MutexLock lock(mutable_mutex_);
  return presence_[static_cast<size_t>(id)];
}

std::vector<WorkerInfo> GroupDirectory::workers() const {
  std::vector<WorkerInfo> out;
  MutexLock lock(mutable_mutex_);
  for (int id = 0; id < slots_; ++id) {
    const Presence p = presence_[static_cast<size_t>(id)];
    if (p == Presence::kMember || p == Presence::kLost)
      out.push_back(workers_[static_cast<size_t>(id)]);
  }
  return out;
}

Presence next(Presence presence, PresenceEvent event) {
  switch (event) {
    case PresenceEvent::kAdopt:
      return presence == Presence::kAbsent ? Presence::kMember : presence;
    case PresenceEvent::kLose:
      return presence == Presence::kMember ? Presence::kLost : presence;
    case PresenceEvent::kRejoin:
      return presence == Presence::kLost ? Presence::kMember : presence;
    case PresenceEvent::kLeave:
      return Presence::kLeft;
  }
  return presence;
}

const char* presence_name(Presence presence) {
  switch (presence) {
    case Presence::kAbsent:
      return "absent";
    case Presence::kMember:
      return "member";
    case Presence::kLost:
      return "lost";
    case Presence::kLeft:
      return "left";
  }
  return "?";
}

void GroupDirectory::wait_for_members(const std::string& prefix, Clock::time_point deadline,
                                      const std::string& what) const {
  constexpr std::chrono::milliseconds kLook{200};
  for (;;) {
    // Who the members are changes while this waits: a joiner counts from when it joined, a
    // worker that left stops counting.
    const std::vector<int> members = members_in_store();
    std::vector<std::string> keys;
    for (int r : members)
      keys.push_back(key(prefix + std::to_string(r)));
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      store_->wait(keys, std::clamp(left, std::chrono::milliseconds(1), kLook));
      if (members_in_store() == members) return;
    } catch (const TimeoutError&) {
      if (left > kLook) continue;
      std::string missing;
      for (size_t i = 0; i < keys.size(); ++i) {
        if (!store_->check({keys[i]}))
          missing += (missing.empty() ? "" : ", ") + describe_rank(members[i]);
      }
      throw TimeoutError("rpc agent " + self_.describe() + " waited " + ms_text(join_timeout_) +
                         " " + what + "; members that did not: [" + missing + "]");
    }
  }
}

}  // namespace gradwire::rpc::detail
