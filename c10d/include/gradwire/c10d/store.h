// Store: the key-value store every worker of a job meets through.
//
// Keys are strings, values are byte vectors. Four kinds implement it: TCPStore (a server
// on a libuv loop, clients over TCP), FileStore (a file on a shared file system),
// HashStore (in-process, for ranks as threads) and PrefixStore (a namespace over any
// store). They all behave the same way, and one test suite runs over all of them.
//
//   set(k, v)             store v under k, replacing any value
//   get(k[, timeout])     wait until k exists, then return its value
//   add(k, delta)         atomic counter: the value is the decimal text of an int64 ("0"
//                         when missing); returns the new value
//   compare_set(k, e, d)  if k holds e (or is missing and e is empty), store d; returns
//                         the value now stored, empty when k does not exist
//   wait(keys[, timeout]) wait until every key exists
//   check(keys)           do all keys exist now?
//   delete_key(k)         remove k; true if it existed
//   num_keys()            how many keys exist
//   multi_get / multi_set several keys in one round trip
//   append(k, v)          append v to k's value (creating k)
//   list_keys()           every key, in no particular order
//
// Every wait takes a timeout; the overloads without one use the store's timeout()
// (kDefaultStoreTimeout, 300 s, until set_timeout changes it).
//
// Thread-safety: every method may be called concurrently from any thread, except
// set_timeout, which must not race with calls that read the default timeout.
// Errors: a wait that runs out throws TimeoutError naming the keys still missing; a store
// that cannot reach its server or file throws NetworkError (TCPStore: naming host:port)
// or StoreError; bad arguments (a key or value over the configured size, mismatched
// multi_set lengths, a non-positive timeout) throw InvalidArgument; add on a value that is
// not an integer throws StoreError.
//
// Example:
//   store.set("addr/0", "10.0.0.1:29500");
//   std::string peer = store.get_string("addr/1");    // waits up to timeout()
//   int64_t arrived = store.add("joined", 1);
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire::c10d {

using Bytes = std::vector<uint8_t>;

inline constexpr std::chrono::milliseconds kDefaultStoreTimeout{300'000};

// Converts text to bytes and back (store values are bytes; much of what is stored is text).
Bytes to_bytes(std::string_view text);
std::string to_string(const Bytes& bytes);

class Store {
 public:
  virtual ~Store() = default;

  void set(const std::string& key, const Bytes& value) { do_set(key, value); }
  void set(const std::string& key, std::string_view value) { do_set(key, to_bytes(value)); }

  Bytes get(const std::string& key) { return get(key, timeout()); }
  Bytes get(const std::string& key, std::chrono::milliseconds timeout);
  std::string get_string(const std::string& key) { return to_string(get(key)); }
  std::string get_string(const std::string& key, std::chrono::milliseconds timeout) {
    return to_string(get(key, timeout));
  }

  int64_t add(const std::string& key, int64_t delta) { return do_add(key, delta); }

  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
    return do_compare_set(key, expected, desired);
  }

  void wait(const std::vector<std::string>& keys) { wait(keys, timeout()); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  bool check(const std::vector<std::string>& keys) { return do_check(keys); }
  bool delete_key(const std::string& key) { return do_delete_key(key); }
  int64_t num_keys() { return do_num_keys(); }

  std::vector<Bytes> multi_get(const std::vector<std::string>& keys) {
    return multi_get(keys, timeout());
  }
  std::vector<Bytes> multi_get(const std::vector<std::string>& keys,
                               std::chrono::milliseconds timeout);
  void multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values);

  void append(const std::string& key, const Bytes& value) { do_append(key, value); }
  void append(const std::string& key, std::string_view value) { do_append(key, to_bytes(value)); }

  std::vector<std::string> list_keys() { return do_list_keys(); }

  // The timeout used by the overloads that take none. Must be positive.
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds timeout);

 protected:
  Store() = default;
  explicit Store(std::chrono::milliseconds timeout) { set_timeout(timeout); }

  // The operations each kind implements. Arguments are validated by the public methods
  // (positive timeouts, matching multi_set lengths); size limits are the kind's concern.
  virtual void do_set(const std::string& key, const Bytes& value) = 0;
  virtual Bytes do_get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  virtual int64_t do_add(const std::string& key, int64_t delta) = 0;
  virtual Bytes do_compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) = 0;
  virtual void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  virtual bool do_check(const std::vector<std::string>& keys) = 0;
  virtual bool do_delete_key(const std::string& key) = 0;
  virtual int64_t do_num_keys() = 0;
  virtual std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout) = 0;
  virtual void do_multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) = 0;
  virtual void do_append(const std::string& key, const Bytes& value) = 0;
  virtual std::vector<std::string> do_list_keys() = 0;

 private:
  std::chrono::milliseconds timeout_{kDefaultStoreTimeout};
};

// Blocks until `world_size` callers have entered the barrier named `key`, or throws
// TimeoutError after `timeout`. The same key may be used for any number of successive
// barriers by the same group: arrivals are counted under `key` and round r completes
// when the counter reaches r * world_size. Uses the keys `key` and `key + "/done/<r>"`.
void barrier(Store& store, const std::string& key, int world_size,
             std::chrono::milliseconds timeout);

// The message a TimeoutError carries: "<op>: timed out after <ms> ms waiting for keys
// [a, b]". Shared by every kind so that the text is the same everywhere.
std::string timeout_message(std::string_view op, const std::vector<std::string>& missing,
                            std::chrono::milliseconds timeout);

}  // namespace gradwire::c10d
