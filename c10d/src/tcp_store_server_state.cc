// TCPStoreServer's state: the keys and their limits, the journal that records them, and
// the waits parked on missing keys until they exist or their deadline passes.
#include "tcp_store_server_impl.h"

#include <algorithm>
#include <string>
#include <vector>

#include "gradwire/core/logging.h"

namespace gradwire::c10d {

StoreJournal::ForEach TCPStoreServer::Impl::live_keys() {
  return [this](const StoreJournal::Visit& visit) {
    for (const auto& [key, value] : data_)
      visit(key, value);
  };
}

void TCPStoreServer::Impl::open_journal() {
  journal_ = std::make_unique<StoreJournal>(
      options_.journal,
      [this](StoreJournal::Kind kind, std::string_view key, std::string_view value) {
        auto it = data_.find(key);
        switch (kind) {
          case StoreJournal::Kind::kSet:
            stored_bytes_ += static_cast<uint64_t>(set_growth(key, value));
            if (it == data_.end()) {
              key_bytes_ += key.size();
              data_.emplace(std::string(key), std::string(value));
            } else {
              it->second.assign(value.data(), value.size());
            }
            break;
          case StoreJournal::Kind::kAppend:
            stored_bytes_ += value.size() + (it == data_.end() ? key.size() : 0);
            if (it == data_.end()) {
              key_bytes_ += key.size();
              data_.emplace(std::string(key), std::string(value));
            } else {
              it->second.append(value);
            }
            break;
          case StoreJournal::Kind::kDelete:
            if (it != data_.end()) {
              stored_bytes_ -= it->first.size() + it->second.size();
              key_bytes_ -= it->first.size();
              data_.erase(it);
            }
            break;
        }
      },
      live_keys(), options_.journal_fsync);
  if (!journal_->torn_tail().empty()) {
    GRADWIRE_LOG(kWarning) << "TCPStoreServer: journal '" << options_.journal
                           << "': dropped an incomplete last record (" << journal_->torn_tail()
                           << "), the end of a write the previous server did not finish";
  }
  GRADWIRE_LOG(kInfo) << "TCPStoreServer: journal '" << options_.journal
                      << "': " << journal_->records_replayed() << " records replayed, "
                      << data_.size() << " keys";
  if (data_.size() > options_.max_keys || stored_bytes_ > options_.max_total_bytes) {
    GRADWIRE_LOG(kWarning) << "TCPStoreServer: journal '" << options_.journal
                           << "' holds more than this server's limits (" << data_.size()
                           << " keys, " << stored_bytes_
                           << " bytes; max_keys = " << options_.max_keys
                           << ", max_total_bytes = " << options_.max_total_bytes
                           << "): every key is kept, and writes that add to them are refused";
  }
}

int64_t TCPStoreServer::Impl::set_growth(std::string_view key, std::string_view value) const {
  auto it = data_.find(key);
  if (it == data_.end()) return static_cast<int64_t>(key.size() + value.size());
  return static_cast<int64_t>(value.size()) - static_cast<int64_t>(it->second.size());
}

bool TCPStoreServer::Impl::refuse_write(Connection* c, uint32_t id, const char* what,
                                        uint64_t new_keys, int64_t added_bytes) {
  if (journal_ && (journal_failing_ || journal_->buffered() > options_.journal_buffer_bytes)) {
    reply_limit(c, id, Limit::kJournal, options_.journal_buffer_bytes,
                std::string(what) + " refused: the store's journal '" + options_.journal + "' " +
                    (journal_failing_ ? std::string("cannot be written")
                                      : "holds " + std::to_string(journal_->buffered()) +
                                            " bytes not yet written, over its limit "
                                            "journal_buffer_bytes = " +
                                            std::to_string(options_.journal_buffer_bytes)) +
                    "; writes are refused until it is written again");
    return true;
  }
  if (new_keys > 0 && data_.size() + new_keys > options_.max_keys) {
    reply_limit(c, id, Limit::kKeys, options_.max_keys,
                std::string(what) + " refused: the store holds " + std::to_string(data_.size()) +
                    " keys, its limit max_keys = " + std::to_string(options_.max_keys));
    return true;
  }
  if (added_bytes > 0 &&
      stored_bytes_ + static_cast<uint64_t>(added_bytes) > options_.max_total_bytes) {
    reply_limit(
        c, id, Limit::kTotalBytes, options_.max_total_bytes,
        std::string(what) + " refused: the store holds " + std::to_string(stored_bytes_) +
            " bytes of keys and values and this would add " + std::to_string(added_bytes) +
            ", over its limit max_total_bytes = " + std::to_string(options_.max_total_bytes));
    return true;
  }
  return false;
}

void TCPStoreServer::Impl::set_key(std::string_view key, std::string_view value) {
  if (journal_) journal_->record(StoreJournal::Kind::kSet, key, value);
  stored_bytes_ += static_cast<uint64_t>(set_growth(key, value));
  auto it = data_.find(key);
  if (it == data_.end()) {
    key_bytes_ += key.size();
    data_.emplace(std::string(key), std::string(value));
    notify(key);
  } else {
    it->second.assign(value.data(), value.size());
  }
}

void TCPStoreServer::Impl::append_key(std::string_view key, std::string_view value) {
  auto it = data_.find(key);
  if (journal_) journal_->record(StoreJournal::Kind::kAppend, key, value);
  stored_bytes_ += value.size();
  it->second.append(value);
  notify(key);
}

void TCPStoreServer::Impl::erase_key(std::string_view key) {
  auto it = data_.find(key);
  if (journal_) journal_->record(StoreJournal::Kind::kDelete, key);
  stored_bytes_ -= it->first.size() + it->second.size();
  key_bytes_ -= it->first.size();
  data_.erase(it);
}

void TCPStoreServer::Impl::notify(std::string_view key) {
  // Waiters are listed only under keys that were missing when they parked, so a key that
  // already existed has none and this lookup is the whole cost of a plain set.
  if (waiters_by_key_.empty()) return;
  auto it = waiters_by_key_.find(key);
  if (it == waiters_by_key_.end()) return;
  std::vector<Waiter*> ready;
  for (Waiter* w : it->second) {
    if (--w->missing == 0) ready.push_back(w);
  }
  waiters_by_key_.erase(it);
  // Completing a waiter may drop its connection (too many unsent replies), and with it
  // other waiters of this list: remove_waiter takes those out of `alive`.
  std::unordered_set<Waiter*> alive(ready.begin(), ready.end());
  std::unordered_set<Waiter*>* outer = completing_;
  completing_ = &alive;
  for (Waiter* w : ready) {
    if (alive.count(w) != 0) complete(w);
  }
  completing_ = outer;
  rearm_timer();
}

bool TCPStoreServer::Impl::park(Connection* c, uint32_t id, Op op, KeyList keys,
                                uint64_t timeout_ms) {
  if (c->waiters.size() >= options_.max_pending_waits_per_client) {
    reply_limit(c, id, Limit::kClientWaits, options_.max_pending_waits_per_client,
                std::string(op == Op::kGet    ? "get"
                            : op == Op::kWait ? "wait"
                                              : "multi_get") +
                    " refused: this client has " + std::to_string(c->waiters.size()) +
                    " waits parked, the limit max_pending_waits_per_client = " +
                    std::to_string(options_.max_pending_waits_per_client));
    return false;
  }
  const uint64_t bytes = keys.bytes();
  if (parked_ >= options_.max_parked_waits || parked_bytes_ + bytes > options_.max_parked_bytes) {
    const bool count = parked_ >= options_.max_parked_waits;
    reply_limit(c, id, Limit::kParkedWaits,
                count ? options_.max_parked_waits : options_.max_parked_bytes,
                std::string(op == Op::kGet    ? "get"
                            : op == Op::kWait ? "wait"
                                              : "multi_get") +
                    " refused: " +
                    (count ? std::to_string(parked_) +
                                 " waits are parked on the store, its limit max_parked_waits = " +
                                 std::to_string(options_.max_parked_waits)
                           : "the waits parked on the store name " + std::to_string(parked_bytes_) +
                                 " bytes of keys and this one " + std::to_string(bytes) +
                                 ", over its limit max_parked_bytes = " +
                                 std::to_string(options_.max_parked_bytes)));
    return false;
  }
  auto* w = new Waiter();
  w->conn = c;
  w->id = id;
  w->op = op;
  w->keys = std::move(keys);
  w->bytes = bytes;
  for (const std::string& k : w->keys.keys) {
    if (data_.find(k) == data_.end() && waiters_by_key_[k].insert(w).second) ++w->missing;
  }
  // Loop time is cached per iteration and truncated to whole milliseconds: refresh it and
  // add one, so a wait never ends before its timeout. Clamped against overflow (~35 years).
  uv_update_time(&loop_);
  const uint64_t deadline = uv_now(&loop_) + std::min<uint64_t>(timeout_ms, uint64_t{1} << 40) + 1;
  w->deadline_it = deadlines_.emplace(deadline, w);
  c->waiters.insert(w);
  ++parked_;
  parked_bytes_ += bytes;
  rearm_timer();
  return true;
}

void TCPStoreServer::Impl::complete(Waiter* w) {
  // A key can be deleted between its arrival and the arrival of the waiter's last key:
  // then the waiter goes back to waiting for it (a wait, though, has seen every key).
  if (w->op != Op::kWait) {
    for (const std::string& k : w->keys.keys) {
      if (data_.find(k) == data_.end() && waiters_by_key_[k].insert(w).second) ++w->missing;
    }
    if (w->missing > 0) return;
  }
  Connection* c = w->conn;
  const uint32_t id = w->id;
  const Op op = w->op;
  KeyList keys = std::move(w->keys);
  remove_waiter(w);
  reply_values(c, id, op, keys);
}

void TCPStoreServer::Impl::reply_values(Connection* c, uint32_t id, Op op, const KeyList& keys) {
  if (c->closing) return;
  if (op == Op::kWait) {
    FrameWriter w = reply(c, Reply::kOk, id);
    end_reply(c, w);
    return;
  }
  // The reply's size first: one value per key named, in order, duplicates included. Past
  // the frame limit it is refused before a byte of it is built.
  std::vector<const std::string*> values;
  values.reserve(keys.keys.size());
  for (const std::string& k : keys.keys)
    values.push_back(&data_.find(k)->second);
  uint64_t payload = op == Op::kMultiGet ? 4 : 0;
  for (const uint32_t i : keys.order)
    payload += 4 + uint64_t{values[i]->size()};
  if (!room_for(c, id, payload)) return;
  FrameWriter w = reply(c, op == Op::kGet ? Reply::kValue : Reply::kValues, id);
  if (op == Op::kMultiGet) w.u32(static_cast<uint32_t>(keys.order.size()));
  for (const uint32_t i : keys.order)
    w.str(*values[i]);
  end_reply(c, w);
}

void TCPStoreServer::Impl::remove_waiter(Waiter* w) {
  // O(distinct keys of this waiter): each is listed at most once per key.
  if (w->missing > 0) {
    for (const std::string& k : w->keys.keys) {
      auto it = waiters_by_key_.find(k);
      if (it == waiters_by_key_.end()) continue;
      it->second.erase(w);
      if (it->second.empty()) waiters_by_key_.erase(it);
    }
  }
  deadlines_.erase(w->deadline_it);
  w->conn->waiters.erase(w);
  if (completing_ != nullptr) completing_->erase(w);
  --parked_;
  parked_bytes_ -= w->bytes;
  delete w;
}

void TCPStoreServer::Impl::rearm_timer() {
  if (stopping_) return;
  if (deadlines_.empty()) {
    uv_timer_stop(&timer_);
    return;
  }
  const uint64_t now = uv_now(&loop_);
  const uint64_t first = deadlines_.begin()->first;
  uv_timer_start(&timer_, &Impl::on_timer, first > now ? first - now : 0, 0);
}

void TCPStoreServer::Impl::on_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  const uint64_t now = uv_now(&self->loop_);
  while (!self->deadlines_.empty() && self->deadlines_.begin()->first <= now) {
    Waiter* w = self->deadlines_.begin()->second;
    Connection* c = w->conn;
    try {
      std::vector<std::string_view> missing;
      uint64_t payload = 4;
      for (const std::string& k : w->keys.keys) {
        if (self->data_.find(k) == self->data_.end()) {
          missing.push_back(k);
          payload += 4 + k.size();
        }
      }
      // The missing keys are a subset of the request's, so this fits a frame; the unsent
      // replies, though, may be too many.
      if (self->room_for(c, w->id, payload)) {
        FrameWriter fw = self->reply(c, Reply::kTimeout, w->id);
        fw.u32(static_cast<uint32_t>(missing.size()));
        for (std::string_view k : missing)
          fw.str(k);
        self->end_reply(c, fw);
      }
      if (!c->closing) self->remove_waiter(w);
    } catch (const std::exception& e) {
      self->disconnect(c, std::string("internal error while timing out request ") +
                              std::to_string(w->id) + ": " + e.what());
    }
  }
  self->rearm_timer();
  self->flush_dirty();
}

}  // namespace gradwire::c10d
