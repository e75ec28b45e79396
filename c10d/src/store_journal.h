// StoreJournal: the TCPStore server's append-only record of its changes, so that a server
// restarted with the same file (TCPStoreServerOptions::journal, gradwire-store --journal)
// has every key back.
//
// The file: "GWSJ", u32 version (1), then records: u32 length of what follows the length,
// u8 kind (1 set, 2 append, 3 delete), key (u32 length + bytes), value (u32 length + bytes;
// empty for delete), u64 FNV-1a of kind..value. Integers are little-endian. The server
// records each change as it applies it and writes the records of one loop turn with one
// write() before it sends that turn's replies, so an acknowledged change has reached the
// kernel: it survives the server process being killed; with `fsync` each write is followed
// by fdatasync(), so it survives the machine losing power too.
//
// Files: the journal is never opened through a symbolic link (O_NOFOLLOW), and the
// compaction's temporary file (path + ".tmp") is created with O_EXCL|O_NOFOLLOW: one left by
// a server that died while compacting is removed first if it is a regular file, and
// anything else found there (a symbolic link someone planted) is refused.
//
// Opening replays the file, then compacts it (one set per live key, written to a temporary
// file and renamed over it); it is compacted again when what was written since exceeds
// 64 MiB and four times the live data. A record cut short at the end (a write interrupted
// by the process dying) is dropped with a warning; a record that is complete but does not
// check out is corruption, and opening fails naming the file and the offset.
//
// Thread-safety: none; the server's loop thread owns it.
// Errors: the constructor throws StoreError naming the path (cannot open, a symbolic link,
// not a journal, corrupt); flush() returns false with the reason (the records stay
// buffered and are retried by the next flush; the server refuses writes meanwhile).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "gradwire/core/fd.h"

namespace gradwire::c10d {

class StoreJournal {
 public:
  enum class Kind : uint8_t { kSet = 1, kAppend = 2, kDelete = 3 };
  using Apply = std::function<void(Kind kind, std::string_view key, std::string_view value)>;
  using Visit = std::function<void(std::string_view key, std::string_view value)>;
  // Calls the visitor once per live key.
  using ForEach = std::function<void(const Visit& visit)>;

  // Replays `path` (created if missing) through `apply`, then rewrites it from `live`.
  StoreJournal(std::string path, const Apply& apply, const ForEach& live, bool fsync = false);
  ~StoreJournal();
  StoreJournal(const StoreJournal&) = delete;
  StoreJournal& operator=(const StoreJournal&) = delete;

  void record(Kind kind, std::string_view key, std::string_view value = {});
  // Writes what was recorded since the last flush; compacts from `live` when due.
  bool flush(const ForEach& live, std::string* error);
  bool pending() const { return !buffer_.empty() || unsynced_; }
  // Bytes recorded that have not reached the file.
  uint64_t buffered() const { return buffer_.size(); }

  uint64_t records_replayed() const { return replayed_; }
  // What the last open dropped at the end of the file ("" if nothing).
  const std::string& torn_tail() const { return torn_tail_; }
  const std::string& path() const { return path_; }

 private:
  void rewrite(const ForEach& live);

  std::string path_;
  bool fsync_ = false;
  bool unsynced_ = false;  // written, but the last fdatasync failed
  UniqueFd fd_;            // the journal, open for appending
  std::string buffer_;
  uint64_t written_since_compaction_ = 0;
  uint64_t live_bytes_ = 0;  // as of the last compaction
  uint64_t replayed_ = 0;
  std::string torn_tail_;
};

}  // namespace gradwire::c10d
