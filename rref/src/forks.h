// ForkTable: the fork protocol's state machine (docs/rref.md, "The fork protocol as a state
// machine"). A fork is one user's claim on a value. Every fork this worker tracks has a
// state, on the owner's side (forks of the values it owns) or on a user's side (forks it
// sent of references it holds, its pending children), and apply() is the one place where an
// event moves a fork from one state to the next. Everything else in rref/ only reads the
// table or turns what happens to a message into an event.
//
// A fork keeps alive what it protects: on the owner, the owned value (the table's
// reference to it); on a user, the parent reference it was forked from. Forks that leave
// the table hand that reference to `dropped`, so the caller lets it go after its lock (a
// core's destructor calls back into the context).
//
// Thread-safety: none; the context guards the table with its mutex.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "gradwire/core/recent.h"
#include "gradwire/rref/rref.h"

namespace gradwire::rref {

enum class ForkSide {
  kOwner,  // a fork of a value this worker owns
  kUser,   // a fork this user sent of a reference it holds (a pending child)
};

enum class ForkState {
  kMinted,   // made for a message being built, bound to no receiver yet
  kSent,     // user: bound to its receiver; the owner has not settled it yet
  kHeld,     // owner: counted, held by `peer` (sent by the owner, or its Create/AddFork came)
  kGivenUp,  // owner: `peer` deleted it before the Create/AddFork that counts it arrived
};

enum class ForkEventKind {
  kMint,          // a reference was converted into a message: a new fork
  kBind,          // the message carrying it leaves for `peer`
  kNotDelivered,  // the message carrying it to `peer` never left, timed out, was refused
                  // unread or not written
  kDiscarded,     // the message it was minted for never reached the interceptors
  kCount,         // owner: its Create or AddFork arrived from `peer`
  kDelete,        // owner: `peer`'s Delete arrived
  kSettle,        // user: the owner settled it (ChildAccepted)
  kLost,          // `peer` was lost: forks it held or was receiving, and user forks of
                  // values it owned
};

struct ForkEvent {
  ForkEventKind kind{ForkEventKind::kMint};
  int peer{-1};
  uint64_t rref_id{0};                        // kMint, kCount, kDelete
  ForkSide side{ForkSide::kOwner};            // kMint
  int owner{-1};                              // kMint: the worker owning the value
  std::shared_ptr<detail::RRefCore> keeps{};  // kMint, kCount: what the fork keeps alive
  bool may_remember{false};  // kDelete: a Create/AddFork counting it may still come
  // kMint while serving a request: minted for the reply to request `request` of `peer`
  // (a result being converted). Such forks left unbound when that reply is written were
  // made for a reply that failed before it was built, and are discarded.
  uint64_t request{0};
};

enum class ForkVerdict {
  kApplied,     // the fork moved (or left the table)
  kIgnored,     // the event does not apply to the fork's state (already settled)
  kForgotten,   // kCount of a fork given up: counts nothing, and is forgotten
  kRemembered,  // kDelete before the fork was counted: remembered as given up
  kDuplicate,   // kCount or kMint of a fork already known
  kNotHolder,   // kDelete from a worker that does not hold the fork
  kUnknown,     // kDelete of a fork the owner never counted and no message will count
  kFull,        // kDelete to remember past the bound
};

class ForkTable {
 public:
  using Dropped = std::vector<std::shared_ptr<detail::RRefCore>>;

  // At most this many forks given up before they were counted are remembered.
  static constexpr size_t kMaxGivenUp = size_t{1} << 16;

  ForkVerdict apply(uint64_t fork, const ForkEvent& event, Dropped& dropped);
  // kLost to every fork it applies to.
  void lose(int worker, Dropped& dropped);
  // Every fork leaves (the agent closed).
  void clear(Dropped& dropped);

  // The forks minted for the reply to `request` of `peer` (ForkEvent::request), forgotten
  // here; some may be bound already.
  std::vector<uint64_t> take_minted_for_reply(int peer, uint64_t request);

  // The state of `fork`, or null when the table does not track it.
  const ForkState* state(uint64_t fork) const;
  int peer(uint64_t fork) const;
  // Whether `holder` gave up `fork` before it was counted.
  bool given_up(uint64_t fork, int holder) const;

  int64_t owner_forks() const { return owner_forks_; }  // kMinted and kHeld
  int64_t shared_values() const { return static_cast<int64_t>(per_value_.size()); }
  // Whether a live fork (minted or held) counts value `rref_id`.
  bool counts_value(uint64_t rref_id) const { return per_value_.count(rref_id) != 0; }
  int64_t pending_children() const { return user_forks_; }
  size_t given_up_count() const { return given_up_; }

 private:
  struct Fork {
    ForkSide side;
    ForkState state;
    uint64_t rref_id;
    int peer;
    int owner;
    std::shared_ptr<detail::RRefCore> keeps;
  };
  void add(uint64_t fork, Fork entry);
  void remove(std::map<uint64_t, Fork>::iterator it, Dropped& dropped);
  // Counts kept per state change.
  void counted(const Fork& f, int delta);

  std::map<uint64_t, Fork> forks_;
  std::map<uint64_t, int64_t> per_value_;  // owner: rref id -> its live forks
  // (peer, request) -> forks minted for the reply to it.
  std::map<std::pair<int, uint64_t>, std::vector<uint64_t>> for_reply_;
  // Owner: forks whose holder's Delete was applied (the last kMaxGivenUp). A Delete sent
  // again (its first reply was lost, and the holder retried) finds its fork here and is
  // ignored instead of being remembered as a give-up that no Create or AddFork will claim.
  RecentSet<uint64_t> deleted_{kMaxGivenUp};
  int64_t owner_forks_{0};
  int64_t user_forks_{0};
  size_t given_up_{0};
};

}  // namespace gradwire::rref
