// PeerAdmission (group.h): which incoming connections speak for which worker of the group.
#include "group.h"

#include <algorithm>
#include <sstream>

#include "gradwire/c10d/store.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "text.h"

namespace gradwire::rpc::detail {

// ---- admission of incoming connections

MemberState next(MemberState state, MemberEvent event) {
  switch (event) {
    case MemberEvent::kJoin:
      return state == MemberState::kUnjoined ? MemberState::kKnown : state;
    case MemberEvent::kClaimNewer:
      return state == MemberState::kKnown ? MemberState::kRereading : state;
    case MemberEvent::kReread:
      return state == MemberState::kRereading ? MemberState::kKnown : state;
    case MemberEvent::kClose:
      return MemberState::kClosed;
  }
  return state;
}

MemberState& PeerAdmission::member(int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= members_.size()) return outsiders_;
  return members_[static_cast<size_t>(rank)];
}

void PeerAdmission::apply_to_all(MemberEvent event) {
  for (MemberState& state : members_)
    state = next(state, event);
  outsiders_ = next(outsiders_, event);
}

PeerAdmission::Finding PeerAdmission::check(const Claim& claim) const {
  using Verdict = Finding::Verdict;
  const std::string who = "worker '" + printable(claim.name) + "' of rank " +
                          std::to_string(claim.rank) + ", incarnation " +
                          std::to_string(claim.incarnation);
  const int id = group_.id_of(claim.name);
  if (id < 0) {
    // Not a worker of this group: served as an outsider (rank -1), which speaks for nobody.
    if (claim.rank == -1) return {Verdict::kAdmit, ""};
    // An elastic group's joiner that this worker has not met: its record is read first.
    if (group_.elastic() && claim.rank >= group_.world_size() && claim.rank < group_.slots() &&
        group_.presence(claim.rank) == Presence::kAbsent)
      return {Verdict::kNewer, ""};
    if (group_.presence(claim.rank) == Presence::kLeft &&
        group_.worker(claim.rank).name == claim.name)
      return {Verdict::kRefuse, "it claims to be " + who + ", which has left the group"};
    return {Verdict::kRefuse,
            "it claims to be " + who + ", but no worker of this group has that name"};
  }
  if (claim.rank != id) {
    return {Verdict::kRefuse, "it claims to be " + who + ", but worker '" + claim.name +
                                  "' has rank " + std::to_string(id)};
  }
  const int current = group_.incarnation(id);
  if (claim.incarnation == current) return {Verdict::kAdmit, ""};
  if (claim.incarnation > current) return {Verdict::kNewer, ""};
  return {Verdict::kRefuse, "it claims to be " + who + ", which incarnation " +
                                std::to_string(current) + " has replaced"};
}

void PeerAdmission::verify(Claim claim, Done done) {
  Runner runner;
  std::string refused;
  {
    MutexLock lock(mutex_);
    switch (member(claim.rank)) {
      case MemberState::kUnjoined:
        waiting_.emplace_back(std::move(claim), std::move(done));
        return;
      case MemberState::kClosed:
        refused = closed_why_;
        break;
      case MemberState::kKnown:
      case MemberState::kRereading:
        runner = runner_;
        break;
    }
  }
  if (!refused.empty()) {
    done(refused);
    return;
  }
  decide(std::move(claim), std::move(done), runner);
}

void PeerAdmission::decide(Claim claim, Done done, const Runner& runner) {
  const Finding finding = check(claim);
  if (finding.verdict != Finding::Verdict::kNewer) {
    done(finding.why);
    return;
  }
  // A rank taken over since this worker last read its record (AgentOptions::rejoin): the
  // store says which incarnation holds it now. Read off the transport's thread, once per
  // rank at a time: claims that arrive meanwhile wait for the same read, so a flood of
  // claims costs one store read per rank, not one per connection.
  const int rank = claim.rank;
  {
    MutexLock lock(mutex_);
    MemberState& state = member(rank);
    state = next(state, MemberEvent::kClaimNewer);
    auto [it, first] = refreshing_.try_emplace(rank);
    it->second.emplace_back(std::move(claim), std::move(done));
    if (!first) return;
  }
  try {
    if (!runner) throw Error("nothing runs it");
    runner([this, rank] { reread(rank); });
  } catch (const std::exception& e) {
    std::vector<std::pair<Claim, Done>> refused;
    {
      MutexLock lock(mutex_);
      refused.swap(refreshing_[rank]);
      refreshing_.erase(rank);
      MemberState& state = member(rank);
      state = next(state, MemberEvent::kReread);
    }
    for (auto& [c, d] : refused)
      d("its claim of a newer incarnation cannot be checked now: " + std::string(e.what()));
  }
}

void PeerAdmission::reread(int rank) {
  if (group_.presence(rank) == Presence::kAbsent) {
    group_.discover(rank, refresh_timeout_);
  } else {
    group_.refresh(rank, refresh_timeout_);
  }
  std::vector<std::pair<Claim, Done>> decided;
  {
    MutexLock lock(mutex_);
    decided.swap(refreshing_[rank]);
    refreshing_.erase(rank);
    MemberState& state = member(rank);
    state = next(state, MemberEvent::kReread);
  }
  for (auto& [c, d] : decided) {
    const Finding after = check(c);
    const bool unmet = group_.presence(c.rank) == Presence::kAbsent;
    d(after.verdict != Finding::Verdict::kNewer ? after.why
      : unmet ? "it claims to be worker '" + printable(c.name) + "' of rank " +
                    std::to_string(c.rank) + ", which has not joined this group"
              : "it claims to be worker '" + printable(c.name) + "' of rank " +
                    std::to_string(c.rank) + " in incarnation " + std::to_string(c.incarnation) +
                    ", but the store's record of that rank holds incarnation " +
                    std::to_string(group_.incarnation(c.rank)));
  }
}

void PeerAdmission::open(Runner runner) {
  std::vector<std::pair<Claim, Done>> waiting;
  {
    MutexLock lock(mutex_);
    if (outsiders_ != MemberState::kUnjoined) return;
    apply_to_all(MemberEvent::kJoin);
    runner_ = runner;
    waiting.swap(waiting_);
  }
  for (auto& [claim, done] : waiting)
    decide(std::move(claim), std::move(done), runner);
}

void PeerAdmission::close(const std::string& why) {
  std::vector<std::pair<Claim, Done>> waiting;
  {
    MutexLock lock(mutex_);
    apply_to_all(MemberEvent::kClose);
    closed_why_ = why;
    runner_ = nullptr;
    waiting.swap(waiting_);
  }
  for (auto& [claim, done] : waiting)
    done(why);
}

}  // namespace gradwire::rpc::detail
