// Bounded memory of recent keys: a map (or set) that forgets its oldest entries once it
// holds more than its capacity.
//
// The protocols remember what they have seen lately so that a message sent again is
// recognised (a call answered late, an rref already freed, a context released): a peer
// can make them remember without end, so each memory keeps at most `capacity` entries and
// forgets the oldest first.
//
// Thread-safety: none. The owner's mutex guards it (GRADWIRE_GUARDED_BY on the member).
// Errors: none; constructing with capacity 0 keeps nothing.
//
// Example:
//   gradwire::RecentSet<uint64_t> freed(1 << 16);
//   if (!freed.insert(id)) return;       // seen before: a copy sent again
//   if (freed.contains(id)) ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <unordered_map>
#include <utility>

namespace gradwire {

// Hashes a std::pair for RecentMap/RecentSet keys such as (context id, worker id).
struct PairHash {
  template <class A, class B>
  size_t operator()(const std::pair<A, B>& p) const {
    const size_t a = std::hash<A>{}(p.first);
    const size_t b = std::hash<B>{}(p.second);
    return a ^ (b + 0x9e3779b97f4a7c15ULL + (a << 6) + (a >> 2));
  }
};

template <class Key, class Value, class Hash = std::hash<Key>>
class RecentMap {
 public:
  explicit RecentMap(size_t capacity) : capacity_(capacity) {}

  // Sets key's value and makes it the newest entry. Returns true if the key was new.
  // Past capacity, the oldest entries are forgotten.
  bool put(const Key& key, Value value) {
    auto [it, inserted] = entries_.insert_or_assign(key, Entry{std::move(value), ++clock_});
    order_.emplace_back(key, it->second.stamp);
    trim();
    return inserted;
  }

  Value* find(const Key& key) {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second.value;
  }
  const Value* find(const Key& key) const {
    auto it = entries_.find(key);
    return it == entries_.end() ? nullptr : &it->second.value;
  }
  bool contains(const Key& key) const { return entries_.count(key) != 0; }

  // Removes the key and returns its value, if it was there.
  std::optional<Value> take(const Key& key) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return std::nullopt;
    std::optional<Value> value(std::move(it->second.value));
    entries_.erase(it);
    compact();
    return value;
  }

  bool erase(const Key& key) {
    const bool erased = entries_.erase(key) != 0;
    if (erased) compact();
    return erased;
  }

  // Removes every entry for which pred(key, value) is true; returns how many.
  template <class Pred>
  size_t erase_if(Pred pred) {
    size_t erased = 0;
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (pred(it->first, static_cast<const Value&>(it->second.value))) {
        it = entries_.erase(it);
        ++erased;
      } else {
        ++it;
      }
    }
    if (erased != 0) compact();
    return erased;
  }

  void clear() {
    entries_.clear();
    order_.clear();
  }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  size_t capacity() const { return capacity_; }

 private:
  struct Entry {
    Value value;
    uint64_t stamp;  // which put made it: older records of the key in order_ are stale
  };

  bool live(const std::pair<Key, uint64_t>& record) const {
    auto it = entries_.find(record.first);
    return it != entries_.end() && it->second.stamp == record.second;
  }

  void trim() {
    while (entries_.size() > capacity_ && !order_.empty()) {
      if (live(order_.front())) entries_.erase(order_.front().first);
      order_.pop_front();
    }
    compact();
  }

  // Drops stale records from the front, and rebuilds the order when stale records make up
  // most of it, so that it stays within a constant factor of the entries.
  void compact() {
    while (!order_.empty() && !live(order_.front()))
      order_.pop_front();
    if (order_.size() > 2 * entries_.size() + 16) {
      std::deque<std::pair<Key, uint64_t>> kept;
      for (auto& record : order_)
        if (live(record)) kept.push_back(std::move(record));
      order_.swap(kept);
    }
  }

  size_t capacity_;
  uint64_t clock_ = 0;
  std::unordered_map<Key, Entry, Hash> entries_;
  std::deque<std::pair<Key, uint64_t>> order_;  // oldest first, with the put's stamp
};

template <class Key, class Hash = std::hash<Key>>
class RecentSet {
 public:
  explicit RecentSet(size_t capacity) : map_(capacity) {}

  // Remembers key as the newest entry unless it is already there. Returns true if it was
  // new. Past capacity, the oldest keys are forgotten.
  bool insert(const Key& key) {
    if (map_.contains(key)) return false;
    return map_.put(key, Empty{});
  }
  bool contains(const Key& key) const { return map_.contains(key); }
  bool erase(const Key& key) { return map_.erase(key); }
  void clear() { map_.clear(); }
  size_t size() const { return map_.size(); }
  bool empty() const { return map_.empty(); }
  size_t capacity() const { return map_.capacity(); }

 private:
  struct Empty {};
  RecentMap<Key, Empty, Hash> map_;
};

}  // namespace gradwire
