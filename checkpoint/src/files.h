// Durable file writes and bounded reads for snapshots.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire::checkpoint::detail {

// Writes `bytes` to `path` so that a crash leaves either no file at `path` or all of it:
// to `path`.tmp, fsync, then rename over `path`. Error naming the path on a failure (the
// temporary file removed).
void write_file_durably(const std::string& path, std::string_view bytes);
// fsync of a directory, so that the names made or renamed in it persist. Error naming it.
void fsync_dir(const std::string& dir);
// The whole file; InvalidArgument naming it when it is missing or larger than `max_bytes`
// ("<path>: N bytes, <limit_text> <max_bytes>"), Error when it cannot be read.
std::string read_file(const std::string& path, uint64_t max_bytes, std::string_view limit_text);

// A snapshot directory of a shard: its seq, and whether it has a manifest.
struct SnapshotDir {
  int64_t seq = 0;
  bool complete = false;
  std::string path;
};
// The snapshot directories under `shard_dir` (12-digit names), oldest first; empty when the
// directory does not exist. Error naming it when it cannot be listed.
std::vector<SnapshotDir> list_snapshots(const std::string& shard_dir);
// Removes a snapshot directory: its manifest first, so that a removal cut short leaves an
// interrupted snapshot (skipped by readers) rather than a corrupt one. Errors are ignored:
// what is left is removed by a later write.
void remove_snapshot(const std::string& path);

}  // namespace gradwire::checkpoint::detail
