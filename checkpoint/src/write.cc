// write_shard: a shard's snapshot written file by file, the manifest last, then the old
// snapshots pruned.
#include <cstring>
#include <filesystem>
#include <system_error>

#include "files.h"
#include "format.h"
#include "gradwire/checkpoint/checkpoint.h"
#include "gradwire/core/check.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::checkpoint {
namespace {

namespace fs = std::filesystem;
constexpr std::string_view kOp = "checkpoint::write_shard";

StateDict dict_of(const std::vector<Piece>& pieces) {
  StateDict out;
  out.reserve(pieces.size());
  for (const Piece& p : pieces)
    out.emplace_back(p.name, p.value);
  return out;
}

StateDict rng_dict(const std::string& rng) {
  Tensor bytes = empty({static_cast<int64_t>(rng.size())}, TensorOptions(kUInt8));
  if (!rng.empty()) std::memcpy(bytes.data_ptr(), rng.data(), rng.size());
  return {{std::string(detail::kRngEntry), bytes}};
}

void make_directories(const fs::path& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) {
    GRADWIRE_THROW(Error) << kOp << ": cannot create directory '" << path.string()
                          << "': " << ec.message();
  }
}

// The data files, then the manifest (each durable), into the existing directory `snap`.
void write_parts(const fs::path& snap, const std::string& shard, int64_t seq,
                 const ShardState& state) {
  detail::Manifest m;
  m.shard = shard;
  m.seq = seq;
  m.replicated = state.replicated;
  m.job_shards = state.job_shards;
  m.optimizer_kind = state.optimizer_kind;
  m.counters = state.counters;
  const std::pair<std::string_view, StateDict> parts[] = {
      {detail::kParamsFile, dict_of(state.params)},
      {detail::kOptimizerFile, dict_of(state.optimizer)},
      {detail::kHyperFile, state.optimizer_hyper},
      {detail::kRngFile, rng_dict(state.rng)}};
  for (const auto& [name, dict] : parts) {
    const std::string bytes = nn::serialize(dict);
    detail::write_file_durably((snap / name).string(), bytes);
    m.files.push_back({std::string(name), bytes.size(), detail::data_file_crc(bytes)});
  }
  for (const Piece& p : state.params)
    m.params.push_back(detail::describe_piece(p));
  for (const Piece& p : state.optimizer)
    m.optimizer.push_back(detail::describe_piece(p));
  detail::fsync_dir(snap.string());
  detail::write_file_durably((snap / detail::kManifestName).string(), detail::format_manifest(m));
  detail::fsync_dir(snap.string());
}

// Removes complete snapshots older than the newest `keep_last`, and interrupted ones older
// than `seq` (the snapshot just written).
void prune(const fs::path& shard_dir, int64_t seq, int keep_last) {
  std::vector<detail::SnapshotDir> snaps = detail::list_snapshots(shard_dir.string());
  int complete_seen = 0;
  for (auto it = snaps.rbegin(); it != snaps.rend(); ++it) {
    if (it->complete) {
      if (++complete_seen > keep_last) detail::remove_snapshot(it->path);
    } else if (it->seq < seq) {
      detail::remove_snapshot(it->path);
    }
  }
}

// The newest complete snapshot's seq, or -1.
int64_t newest_complete(const fs::path& shard_dir) {
  int64_t newest = -1;
  for (const detail::SnapshotDir& s : detail::list_snapshots(shard_dir.string()))
    if (s.complete) newest = s.seq;
  return newest;
}

}  // namespace

std::string write_shard(const std::string& dir, const std::string& shard, int64_t seq,
                        const ShardState& state, const WriteOptions& options) {
  detail::check_seq(seq, kOp);
  GRADWIRE_CHECK_ARG(options.keep_last >= 1)
      << kOp << ": keep_last is " << options.keep_last << "; at least 1 snapshot is kept";
  GRADWIRE_CHECK_ARG(!dir.empty()) << kOp << ": the checkpoint directory is empty";
  detail::validate_state(state, shard, kOp);
  const fs::path shard_dir = fs::path(dir) / shard;
  make_directories(shard_dir);
  const int64_t newest = newest_complete(shard_dir);
  GRADWIRE_CHECK_ARG(seq > newest)
      << kOp << ": shard '" << shard << "' already has a complete snapshot "
      << (seq == newest ? "at seq " : "newer than seq ") << seq << " (seq " << newest << ") under '"
      << shard_dir.string() << "': sequence numbers only grow";
  const fs::path snap = shard_dir / detail::snapshot_name(seq);
  detail::remove_snapshot(snap.string());  // an interrupted write of the same seq
  std::error_code ec;
  fs::create_directory(snap, ec);
  if (ec) {
    GRADWIRE_THROW(Error) << kOp << ": cannot create directory '" << snap.string()
                          << "': " << ec.message();
  }
  try {
    write_parts(snap, shard, seq, state);
    detail::fsync_dir(shard_dir.string());
    detail::fsync_dir(dir);
  } catch (...) {
    detail::remove_snapshot(snap.string());
    throw;
  }
  prune(shard_dir, seq, options.keep_last);
  return snap.string();
}

}  // namespace gradwire::checkpoint
