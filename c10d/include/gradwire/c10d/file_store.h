// FileStore: a Store kept in one file, for rendezvous on a shared file system (no server
// to start, no port to agree on) and for several processes on one machine.
//
// The file is an append-only log of records (set, delete); each process replays what
// others appended since its last look. Every operation holds an open-file-description
// lock (fcntl F_OFD_SETLKW) on the whole file while it reads and appends, so processes,
// threads and several FileStore objects in one process are all serialised correctly.
// Waits re-read the file with a short back-off (1 ms growing to 20 ms): shared file
// systems offer no change notification that works everywhere.
//
// Clean-up: each FileStore counts itself in a users record when it opens the file and
// out when it is destroyed. With num_workers set, the file is removed when that many
// users have finished; with num_workers = 0 (the default), when the count of open users
// returns to zero. A process that opens the file just after it was removed starts a
// fresh one (opening checks that the path still names the inode it locked).
//
// Thread-safety: every Store method may be called concurrently from any thread.
// Errors: StoreError naming the path for I/O failures and for a corrupt file; TimeoutError
// naming the missing keys; InvalidArgument for an empty path or a bad option.
//
// Example:
//   FileStore store(FileStoreOptions{.path = "/shared/job42.store", .num_workers = 8});
//   barrier(store, "start", 8, std::chrono::seconds(60));
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gradwire/c10d/store.h"
#include "gradwire/core/mutex.h"

namespace gradwire::c10d {

struct FileStoreOptions {
  std::string path{};
  // Users after whose departure the file is removed; 0: when no user has it open.
  int num_workers{0};
  std::chrono::milliseconds timeout{kDefaultStoreTimeout};
  uint32_t max_key_bytes{64 * 1024};
  uint32_t max_value_bytes{64u << 20};

  // Throws InvalidArgument naming the first bad field.
  void validate() const;
};

class FileStore : public Store {
 public:
  explicit FileStore(FileStoreOptions options);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  const std::string& path() const { return options_.path; }

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
  void check_key(const std::string& key) const;
  void check_value(const std::string& key, size_t size) const;
  // With this object's mutex held, takes the file lock (released by an OfdUnlock guard),
  // opening the file again if it was removed, and replays what other users appended.
  void lock_file(bool exclusive) GRADWIRE_REQUIRES(mutex_);
  void open_file() GRADWIRE_REQUIRES(mutex_);
  void replay() GRADWIRE_REQUIRES(mutex_);
  // Appends one record (the file lock held exclusively) and applies it to the cache.
  void append_record(uint8_t type, std::string_view key, std::string_view value)
      GRADWIRE_REQUIRES(mutex_);
  void append_set(const std::string& key, const Bytes& value) GRADWIRE_REQUIRES(mutex_);
  // Polls until every key exists; returns their values when want_values.
  std::vector<Bytes> wait_for(std::string_view op, const std::vector<std::string>& keys,
                              std::chrono::milliseconds timeout, bool want_values)
      GRADWIRE_EXCLUDES(mutex_);

  FileStoreOptions options_;
  Mutex mutex_;  // serialises this object's threads; the file lock serialises processes
  int fd_ GRADWIRE_GUARDED_BY(mutex_) = -1;
  uint64_t ino_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  uint64_t offset_ GRADWIRE_GUARDED_BY(mutex_) = 0;  // bytes of the log replayed so far
  std::map<std::string, Bytes, std::less<>> cache_ GRADWIRE_GUARDED_BY(mutex_);
  int64_t users_ GRADWIRE_GUARDED_BY(mutex_) = 0;     // replayed from users records
  int64_t finished_ GRADWIRE_GUARDED_BY(mutex_) = 0;  // users that have left
};

}  // namespace gradwire::c10d
