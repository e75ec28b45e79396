// TCPStoreServer's requests after the handshake: handle_request dispatches each opcode to
// its one handler, which decodes the payload, applies it to the keys and replies.
#include "tcp_store_server_impl.h"

#include <charconv>
#include <chrono>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gradwire/core/printable.h"

namespace gradwire::c10d {

namespace {

// A key quoted for a log line or an error message.
std::string quoted(std::string_view key) {
  return "'" + printable(key) + "'";
}

// Parses a counter value: optional sign and decimal digits, nothing else.
bool parse_counter(std::string_view text, int64_t& out) {
  if (text.empty()) return false;
  const char* first = text.data();
  if (*first == '+') ++first;
  auto [ptr, ec] = std::from_chars(first, text.data() + text.size(), out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

}  // namespace

bool TCPStoreServer::Impl::handle_request(Connection* c, uint8_t op, uint32_t id, FrameReader& r) {
  switch (static_cast<Op>(op)) {
    case Op::kSet:
      return handle_set(c, id, r);
    case Op::kGet:
      return handle_get(c, id, r);
    case Op::kAdd:
      return handle_add(c, id, r);
    case Op::kCompareSet:
      return handle_compare_set(c, id, r);
    case Op::kWait:
    case Op::kMultiGet:
      return handle_wait(c, static_cast<Op>(op), id, r);
    case Op::kCheck:
      return handle_check(c, id, r);
    case Op::kDelete:
      return handle_delete(c, id, r);
    case Op::kNumKeys:
      return handle_num_keys(c, id, r);
    case Op::kMultiSet:
      return handle_multi_set(c, id, r);
    case Op::kAppend:
      return handle_append(c, id, r);
    case Op::kListKeys:
      return handle_list_keys(c, id, r);
    case Op::kTime:
      return handle_time(c, id, r);
    case Op::kHello:
      disconnect(c, "second handshake on one connection");
      return false;
    case Op::kAuth:
      disconnect(c, "authentication outside the handshake");
      return false;
  }
  disconnect(c, "unknown opcode " + std::to_string(op) + " in request " + std::to_string(id));
  return false;
}

bool TCPStoreServer::Impl::malformed(Connection* c, uint32_t id, const char* what,
                                     const FrameReader& r) {
  disconnect(c, std::string("malformed ") + what + " request " + std::to_string(id) + ": " +
                    (r.ok() ? std::string("trailing bytes") : r.error()));
  return false;
}

TCPStoreServer::Impl::KeyList TCPStoreServer::Impl::read_keys(FrameReader& r) const {
  // Views into the frame until they are copied into the list.
  KeyList list;
  const uint32_t n = r.count(options_.max_keys_per_request, 4, "keys");
  list.order.reserve(n);
  std::unordered_map<std::string_view, uint32_t> index;
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    const std::string_view key = r.bytes(options_.max_key_bytes, "key");
    auto [it, added] = index.emplace(key, static_cast<uint32_t>(list.keys.size()));
    if (added) list.keys.emplace_back(key);
    list.order.push_back(it->second);
  }
  return list;
}

bool TCPStoreServer::Impl::all_exist(const KeyList& keys) const {
  for (const std::string& k : keys.keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

bool TCPStoreServer::Impl::handle_set(Connection* c, uint32_t id, FrameReader& r) {
  const std::string_view key = r.bytes(options_.max_key_bytes, "key");
  const std::string_view value = r.bytes(options_.max_value_bytes, "value");
  if (!r.done()) return malformed(c, id, "set", r);
  const bool exists = data_.find(key) != data_.end();
  if (refuse_write(c, id, "set", exists ? 0 : 1, set_growth(key, value))) return true;
  set_key(key, value);
  return true;
}

bool TCPStoreServer::Impl::handle_get(Connection* c, uint32_t id, FrameReader& r) {
  const std::string_view key = r.bytes(options_.max_key_bytes, "key");
  const uint64_t timeout_ms = r.u64();
  if (!r.done()) return malformed(c, id, "get", r);
  auto it = data_.find(key);
  if (it != data_.end()) {
    if (!room_for(c, id, 4 + uint64_t{it->second.size()})) return !c->closing;
    FrameWriter w = reply(c, Reply::kValue, id);
    w.str(it->second);
    end_reply(c, w);
    return true;
  }
  KeyList list;
  list.keys.emplace_back(key);
  list.order.push_back(0);
  park(c, id, Op::kGet, std::move(list), timeout_ms);
  return !c->closing;
}

bool TCPStoreServer::Impl::handle_add(Connection* c, uint32_t id, FrameReader& r) {
  const std::string_view key = r.bytes(options_.max_key_bytes, "key");
  const int64_t delta = r.i64();
  if (!r.done()) return malformed(c, id, "add", r);
  int64_t current = 0;
  auto it = data_.find(key);
  if (it != data_.end() && !parse_counter(it->second, current)) {
    reply_error(c, id, ErrorKind::kStore,
                "add: the value of key " + quoted(key) + " is not an integer");
    return true;
  }
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result)) {
    reply_error(c, id, ErrorKind::kStore, "add: counter " + quoted(key) + " would overflow int64");
    return true;
  }
  char text[24];
  auto [end, ec] = std::to_chars(text, text + sizeof(text), result);
  const std::string_view value(text, static_cast<size_t>(end - text));
  if (refuse_write(c, id, "add", it == data_.end() ? 1 : 0, set_growth(key, value))) {
    return true;
  }
  set_key(key, value);
  FrameWriter w = reply(c, Reply::kInt, id);
  w.i64(result);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_compare_set(Connection* c, uint32_t id, FrameReader& r) {
  const std::string_view key = r.bytes(options_.max_key_bytes, "key");
  const std::string_view expected = r.bytes(options_.max_value_bytes, "expected value");
  const std::string_view desired = r.bytes(options_.max_value_bytes, "desired value");
  if (!r.done()) return malformed(c, id, "compare_set", r);
  auto it = data_.find(key);
  bool exists = it != data_.end();
  if ((!exists && expected.empty()) || (exists && it->second == expected)) {
    if (refuse_write(c, id, "compare_set", exists ? 0 : 1, set_growth(key, desired))) {
      return true;
    }
    set_key(key, desired);
    exists = true;
    it = data_.find(key);
  }
  const std::string_view current = exists ? std::string_view(it->second) : std::string_view();
  if (!room_for(c, id, 4 + uint64_t{current.size()})) return !c->closing;
  FrameWriter w = reply(c, Reply::kValue, id);
  w.str(current);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_wait(Connection* c, Op op, uint32_t id, FrameReader& r) {
  KeyList keys = read_keys(r);
  const uint64_t timeout_ms = r.u64();
  if (!r.done()) return malformed(c, id, op == Op::kWait ? "wait" : "multi_get", r);
  if (all_exist(keys)) {
    reply_values(c, id, op, keys);
    return !c->closing;
  }
  park(c, id, op, std::move(keys), timeout_ms);
  return !c->closing;
}

bool TCPStoreServer::Impl::handle_check(Connection* c, uint32_t id, FrameReader& r) {
  const KeyList keys = read_keys(r);
  if (!r.done()) return malformed(c, id, "check", r);
  FrameWriter w = reply(c, Reply::kBool, id);
  w.u8(all_exist(keys) ? 1 : 0);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_delete(Connection* c, uint32_t id, FrameReader& r) {
  const std::string_view key = r.bytes(options_.max_key_bytes, "key");
  if (!r.done()) return malformed(c, id, "delete_key", r);
  const bool existed = data_.find(key) != data_.end();
  // A delete frees memory, so it is refused only while the journal cannot record it.
  if (existed && refuse_write(c, id, "delete_key", 0, 0)) return true;
  if (existed) erase_key(key);
  FrameWriter w = reply(c, Reply::kBool, id);
  w.u8(existed ? 1 : 0);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_num_keys(Connection* c, uint32_t id, FrameReader& r) {
  if (!r.done()) return malformed(c, id, "num_keys", r);
  FrameWriter w = reply(c, Reply::kInt, id);
  w.i64(static_cast<int64_t>(data_.size()));
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_multi_set(Connection* c, uint32_t id, FrameReader& r) {
  const uint32_t n = r.count(options_.max_keys_per_request, 8, "multi_set entries");
  std::vector<std::pair<std::string_view, std::string_view>> entries;
  entries.reserve(n);
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    const std::string_view key = r.bytes(options_.max_key_bytes, "key");
    const std::string_view value = r.bytes(options_.max_value_bytes, "value");
    entries.emplace_back(key, value);
  }
  // Validated completely before anything is applied, so a bad request changes nothing.
  if (!r.done()) return malformed(c, id, "multi_set", r);
  // The request's effect on the limits: the last value of each key wins.
  std::unordered_map<std::string_view, std::string_view> last;
  for (const auto& [key, value] : entries)
    last[key] = value;
  uint64_t new_keys = 0;
  int64_t growth = 0;
  for (const auto& [key, value] : last) {
    if (data_.find(key) == data_.end()) ++new_keys;
    growth += set_growth(key, value);
  }
  if (refuse_write(c, id, "multi_set", new_keys, growth)) return true;
  for (const auto& [key, value] : entries)
    set_key(key, value);
  return true;
}

bool TCPStoreServer::Impl::handle_append(Connection* c, uint32_t id, FrameReader& r) {
  const uint32_t max_value = options_.max_value_bytes;
  const std::string_view key = r.bytes(options_.max_key_bytes, "key");
  const std::string_view value = r.bytes(max_value, "value");
  if (!r.done()) return malformed(c, id, "append", r);
  auto it = data_.find(key);
  const size_t current = it == data_.end() ? 0 : it->second.size();
  if (current + value.size() > max_value) {
    reply_error(c, id, ErrorKind::kInvalidArgument,
                "append: the value of key " + quoted(key) + " would grow to " +
                    std::to_string(current + value.size()) + " bytes, over the limit of " +
                    std::to_string(max_value));
    return true;
  }
  const bool exists = it != data_.end();
  const int64_t growth =
      static_cast<int64_t>(value.size()) + (exists ? 0 : static_cast<int64_t>(key.size()));
  if (refuse_write(c, id, "append", exists ? 0 : 1, growth)) return true;
  if (!exists) {
    set_key(key, value);
  } else {
    append_key(key, value);
  }
  FrameWriter w = reply(c, Reply::kOk, id);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_list_keys(Connection* c, uint32_t id, FrameReader& r) {
  if (!r.done()) return malformed(c, id, "list_keys", r);
  // Sized from the running totals: a listing past the frame limit is refused at the cost of
  // its refusal, not of a walk over every key.
  const uint64_t payload = 4 + 4 * uint64_t{data_.size()} + key_bytes_;
  if (!room_for(c, id, payload)) return !c->closing;
  FrameWriter w = reply(c, Reply::kKeys, id);
  w.u32(static_cast<uint32_t>(data_.size()));
  for (const auto& entry : data_)
    w.str(entry.first);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_time(Connection* c, uint32_t id, FrameReader& r) {
  // No payload, a fixed-size answer: the clock read as the request is handled, for clients
  // measuring their offset to it (TCPStore::probe_clock).
  if (!r.done()) return malformed(c, id, "time", r);
  FrameWriter w = reply(c, Reply::kInt, id);
  w.i64(std::chrono::duration_cast<std::chrono::nanoseconds>(
            std::chrono::system_clock::now().time_since_epoch())
            .count());
  end_reply(c, w);
  return true;
}

}  // namespace gradwire::c10d
