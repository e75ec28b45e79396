// PrefixStore: a namespace over another store. Every key k becomes "<prefix>/k" in the
// underlying store, so groups of workers (process subgroups, independent jobs sharing
// one server) can use the same key names without meeting.
//
// list_keys and num_keys see only this namespace (PyTorch's PrefixStore forwards
// num_keys to the whole underlying store; here it counts the keys under the prefix).
// Prefix stores nest: PrefixStore("b", make_shared<PrefixStore>("a", s)) uses "a/b/k".
//
// Thread-safety: as the underlying store; the prefix is immutable.
// Errors: those of the underlying store; an empty prefix or a null store throws
// InvalidArgument at construction. Timeouts name the keys as the caller wrote them.
//
// Example:
//   auto group = std::make_shared<PrefixStore>("pg1", store);
//   group->set("ready", "1");                  // stored as "pg1/ready"
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/store.h"

namespace gradwire::c10d {

class PrefixStore : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> store);

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& underlying_store() const { return store_; }

 protected:
  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t do_add(const std::string& key, int64_t delta) override;
  Bytes do_compare_set(const std::string& key, const Bytes& expected,
                       const Bytes& desired) override;
  void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool do_check(const std::vector<std::string>& keys) override;
  bool do_delete_key(const std::string& key) override;
  int64_t do_num_keys() override;
  std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout) override;
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<Bytes>& values) override;
  void do_append(const std::string& key, const Bytes& value) override;
  std::vector<std::string> do_list_keys() override;

 private:
  std::string join(const std::string& key) const { return prefix_ + key; }
  std::vector<std::string> join(const std::vector<std::string>& keys) const;
  // Rethrows a TimeoutError of the underlying store with the prefix taken off its keys.
  [[noreturn]] void rethrow_unprefixed(const std::exception& e) const;

  std::string prefix_;  // includes the trailing '/'
  std::shared_ptr<Store> store_;
};

}  // namespace gradwire::c10d
