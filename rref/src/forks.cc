// The fork protocol's transitions: docs/rref.md has them as a table, in the same order.
#include "forks.h"

namespace gradwire::rref {

void ForkTable::counted(const Fork& f, int delta) {
  if (f.side == ForkSide::kUser) {
    user_forks_ += delta;
    return;
  }
  if (f.state == ForkState::kGivenUp) {
    given_up_ = static_cast<size_t>(static_cast<int64_t>(given_up_) + delta);
    return;
  }
  owner_forks_ += delta;
  int64_t& n = per_value_[f.rref_id];
  n += delta;
  if (n == 0) per_value_.erase(f.rref_id);
}

void ForkTable::add(uint64_t fork, Fork entry) {
  counted(entry, +1);
  forks_.emplace(fork, std::move(entry));
}

void ForkTable::remove(std::map<uint64_t, Fork>::iterator it, Dropped& dropped) {
  counted(it->second, -1);
  if (it->second.keeps != nullptr) dropped.push_back(std::move(it->second.keeps));
  forks_.erase(it);
}

ForkVerdict ForkTable::apply(uint64_t fork, const ForkEvent& e, Dropped& dropped) {
  auto it = forks_.find(fork);
  // Forks the table does not track yet.
  if (it == forks_.end()) {
    switch (e.kind) {
      case ForkEventKind::kMint:
        add(fork, Fork{e.side, ForkState::kMinted, e.rref_id, -1, e.owner, e.keeps});
        if (e.request != 0) for_reply_[{e.peer, e.request}].push_back(fork);
        return ForkVerdict::kApplied;
      case ForkEventKind::kCount:
        add(fork, Fork{ForkSide::kOwner, ForkState::kHeld, e.rref_id, e.peer, -1, e.keeps});
        return ForkVerdict::kApplied;
      case ForkEventKind::kDelete:
        if (deleted_.contains(fork)) return ForkVerdict::kIgnored;  // sent again
        if (!e.may_remember) return ForkVerdict::kUnknown;
        if (given_up_ >= kMaxGivenUp) return ForkVerdict::kFull;
        add(fork, Fork{ForkSide::kOwner, ForkState::kGivenUp, e.rref_id, e.peer, -1, nullptr});
        return ForkVerdict::kRemembered;
      default:
        return ForkVerdict::kIgnored;
    }
  }
  Fork& f = it->second;
  switch (e.kind) {
    case ForkEventKind::kMint:
      return ForkVerdict::kDuplicate;
    case ForkEventKind::kBind:
      if (f.state != ForkState::kMinted) return ForkVerdict::kIgnored;
      counted(f, -1);
      // The owner counts a fork it sends; a user waits for the owner to settle it.
      f.state = f.side == ForkSide::kOwner ? ForkState::kHeld : ForkState::kSent;
      f.peer = e.peer;
      counted(f, +1);
      return ForkVerdict::kApplied;
    case ForkEventKind::kNotDelivered:
      if (f.state == ForkState::kGivenUp || f.state == ForkState::kMinted || f.peer != e.peer)
        return ForkVerdict::kIgnored;
      remove(it, dropped);
      return ForkVerdict::kApplied;
    case ForkEventKind::kDiscarded:
      if (f.state != ForkState::kMinted) return ForkVerdict::kIgnored;
      remove(it, dropped);
      return ForkVerdict::kApplied;
    case ForkEventKind::kCount:
      if (f.side != ForkSide::kOwner) return ForkVerdict::kIgnored;
      if (f.state == ForkState::kGivenUp && f.peer == e.peer) {
        remove(it, dropped);
        deleted_.insert(fork);
        return ForkVerdict::kForgotten;
      }
      return ForkVerdict::kDuplicate;
    case ForkEventKind::kDelete:
      if (f.side != ForkSide::kOwner || f.state == ForkState::kMinted) return ForkVerdict::kUnknown;
      if (f.peer != e.peer) return ForkVerdict::kNotHolder;
      if (f.state == ForkState::kGivenUp) return ForkVerdict::kIgnored;  // a second Delete
      remove(it, dropped);
      deleted_.insert(fork);
      return ForkVerdict::kApplied;
    case ForkEventKind::kSettle:
      if (f.side != ForkSide::kUser || f.state != ForkState::kSent) return ForkVerdict::kIgnored;
      remove(it, dropped);
      return ForkVerdict::kApplied;
    case ForkEventKind::kLost:
      if (f.state == ForkState::kMinted && !(f.side == ForkSide::kUser && f.owner == e.peer))
        return ForkVerdict::kIgnored;
      if (f.peer != e.peer && !(f.side == ForkSide::kUser && f.owner == e.peer))
        return ForkVerdict::kIgnored;
      remove(it, dropped);
      return ForkVerdict::kApplied;
  }
  return ForkVerdict::kIgnored;
}

std::vector<uint64_t> ForkTable::take_minted_for_reply(int peer, uint64_t request) {
  auto it = for_reply_.find({peer, request});
  if (it == for_reply_.end()) return {};
  std::vector<uint64_t> forks = std::move(it->second);
  for_reply_.erase(it);
  return forks;
}

void ForkTable::lose(int worker, Dropped& dropped) {
  // No reply goes to it any more.
  for (auto it = for_reply_.begin(); it != for_reply_.end();)
    it = it->first.first == worker ? for_reply_.erase(it) : std::next(it);
  std::vector<uint64_t> forks;
  for (const auto& [fork, f] : forks_) {
    if (f.peer == worker || (f.side == ForkSide::kUser && f.owner == worker)) forks.push_back(fork);
  }
  for (uint64_t fork : forks)
    apply(fork, ForkEvent{.kind = ForkEventKind::kLost, .peer = worker}, dropped);
}

void ForkTable::clear(Dropped& dropped) {
  for (auto& [fork, f] : forks_) {
    if (f.keeps != nullptr) dropped.push_back(std::move(f.keeps));
  }
  forks_.clear();
  per_value_.clear();
  deleted_.clear();
  for_reply_.clear();
  owner_forks_ = 0;
  user_forks_ = 0;
  given_up_ = 0;
}

const ForkState* ForkTable::state(uint64_t fork) const {
  auto it = forks_.find(fork);
  return it == forks_.end() ? nullptr : &it->second.state;
}

int ForkTable::peer(uint64_t fork) const {
  auto it = forks_.find(fork);
  return it == forks_.end() ? -1 : it->second.peer;
}

bool ForkTable::given_up(uint64_t fork, int holder) const {
  auto it = forks_.find(fork);
  return it != forks_.end() && it->second.state == ForkState::kGivenUp && it->second.peer == holder;
}

}  // namespace gradwire::rref
