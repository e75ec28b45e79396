// HashStore: a Store held in this process's memory, for ranks that are threads of one
// process (tests, single-process simulations of a job).
//
// Waits block on a condition variable, so a get wakes as soon as another thread sets the
// key. Nothing is shared between processes: give every rank-thread the same HashStore.
//
// Thread-safety: every Store method may be called concurrently from any thread.
// Errors: TimeoutError naming the missing keys; StoreError from add on a non-integer value.
//
// Example:
//   auto store = std::make_shared<HashStore>();
//   run_ranks_as_threads(4, [&](int rank) { barrier(*store, "start", 4, 10s); }, 20s);
#pragma once

#include <condition_variable>
#include <map>
#include <string>
#include <vector>

#include "gradwire/c10d/store.h"
#include "gradwire/core/mutex.h"

namespace gradwire::c10d {

class HashStore : public Store {
 public:
  explicit HashStore(std::chrono::milliseconds timeout = kDefaultStoreTimeout);

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
  // Waits until every key exists; throws TimeoutError (naming `op`) otherwise.
  void wait_locked(MutexLock& lock, std::string_view op, const std::vector<std::string>& keys,
                   std::chrono::milliseconds timeout) GRADWIRE_REQUIRES(mutex_);

  Mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes, std::less<>> data_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace gradwire::c10d
