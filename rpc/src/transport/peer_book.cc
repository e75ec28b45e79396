#include "transport/peer_book.h"

#include "gradwire/core/printable.h"

namespace gradwire::rpc::transport {

namespace {

std::string describe(const PeerIdentity& who) {
  if (who.name.empty()) return "nobody (no name claimed)";
  return "worker '" + printable(who.name) + "' (rank " + std::to_string(who.rank) +
         ", incarnation " + std::to_string(who.incarnation) + ")";
}

std::string worker_key(const std::string& name, int rank) {
  return "w:" + std::to_string(rank) + ":" + name;
}

// Drops from `entries` what `order` says expired by `now`, and the oldest beyond `cap`; an
// entry made again since (a later expiry) stays.
template <typename Map, typename Slot, typename TimePoint>
void expire_in(Map& entries, std::deque<std::pair<Slot, TimePoint>>& order, TimePoint now,
               size_t cap) {
  while (!order.empty() && (order.front().second <= now || order.size() > cap)) {
    auto it = entries.find(order.front().first);
    if (it != entries.end() && it->second.expires == order.front().second) entries.erase(it);
    order.pop_front();
  }
}

}  // namespace

bool same_claim(const PeerIdentity& a, const PeerIdentity& b) {
  return a.name == b.name && a.rank == b.rank && a.incarnation == b.incarnation;
}

void PeerBook::expire(Clock::time_point now) {
  expire_in(offers_, offer_order_, now, kMaxPending);
  expire_in(expected_, expected_order_, now, kMaxPending);
}

void PeerBook::offer(const std::string& listener, const std::vector<uint64_t>& ids,
                     const PeerIdentity& who) {
  const Clock::time_point now = Clock::now();
  MutexLock lock(mutex_);
  expire(now);
  for (uint64_t id : ids) {
    offers_[Slot{listener, id}] = Offer{who, now + ttl_};
    offer_order_.emplace_back(Slot{listener, id}, now + ttl_);
  }
  expire(now);
}

std::string PeerBook::take(const std::string& listener, uint64_t id, const PeerIdentity& who) {
  MutexLock lock(mutex_);
  expire(Clock::now());
  auto it = offers_.find(Slot{listener, id});
  if (it == offers_.end()) {
    return "it asks for connection request #" + std::to_string(id) +
           ", which this worker has not offered to anyone (or no longer does)";
  }
  if (!same_claim(it->second.who, who)) {
    return "it asks for connection request #" + std::to_string(id) + " as " + describe(who) +
           ", but that request was offered to " + describe(it->second.who);
  }
  offers_.erase(it);
  return "";
}

void PeerBook::admitted(uint64_t owner, const PeerIdentity& who, PeerProcess process) {
  if (who.name.empty()) return;
  MutexLock lock(mutex_);
  seen_[owner] = Seen{worker_key(who.name, who.rank), process};
}

void PeerBook::expect(const std::string& dialed, const std::string& address,
                      const std::vector<uint64_t>& ids) {
  const Clock::time_point now = Clock::now();
  MutexLock lock(mutex_);
  expire(now);
  for (uint64_t id : ids) {
    expected_[Slot{address, id}] = Expectation{dialed, now + ttl_};
    expected_order_.emplace_back(Slot{address, id}, now + ttl_);
  }
  expire(now);
}

void PeerBook::reached(uint64_t owner, const std::string& address, uint64_t id,
                       PeerProcess process) {
  MutexLock lock(mutex_);
  expire(Clock::now());
  auto it = expected_.find(Slot{address, id});
  if (it == expected_.end()) return;
  seen_[owner] = Seen{"d:" + it->second.dialed, process};
  expected_.erase(it);
}

std::optional<PeerProcess> PeerBook::find(const std::string& key) const {
  for (auto it = seen_.rbegin(); it != seen_.rend(); ++it) {
    if (it->second.key == key) return it->second.process;
  }
  return std::nullopt;
}

std::optional<PeerProcess> PeerBook::process_of_worker(const std::string& name, int rank) const {
  MutexLock lock(mutex_);
  return find(worker_key(name, rank));
}

std::optional<PeerProcess> PeerBook::process_of_dialed(const std::string& dialed) const {
  MutexLock lock(mutex_);
  return find("d:" + dialed);
}

void PeerBook::forget(uint64_t owner) {
  MutexLock lock(mutex_);
  seen_.erase(owner);
}

size_t PeerBook::size() const {
  MutexLock lock(mutex_);
  return offers_.size() + expected_.size() + seen_.size();
}

}  // namespace gradwire::rpc::transport
