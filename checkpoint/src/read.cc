// Reading a shard's snapshots back: the manifest first, then every data file checked
// against it (size, crc32, and the pieces it describes) before anything is returned.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <system_error>

#include "files.h"
#include "format.h"
#include "gradwire/checkpoint/checkpoint.h"
#include "gradwire/core/check.h"
#include "gradwire/nn/serialize.h"

namespace gradwire::checkpoint {
namespace {

namespace fs = std::filesystem;

// The data file `name` as the manifest lists it, read and checked.
StateDict read_part(const fs::path& snap, const detail::Manifest& m, std::string_view name) {
  const std::string path = (snap / name).string();
  const auto entry = std::find_if(m.files.begin(), m.files.end(),
                                  [&](const detail::FileEntry& f) { return f.name == name; });
  GRADWIRE_CHECK_ARG(entry != m.files.end())
      << "checkpoint: " << (snap / detail::kManifestName).string() << ": lists no file '" << name
      << "'";
  const std::string bytes = detail::read_file(path, entry->size, "the manifest lists");
  GRADWIRE_CHECK_ARG(bytes.size() == entry->size)
      << "checkpoint: " << path << ": " << bytes.size() << " bytes, the manifest lists "
      << entry->size << " (the file is truncated)";
  const uint32_t crc = detail::data_file_crc(bytes);
  if (crc != entry->crc) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "crc32 %08x, the manifest lists %08x", crc, entry->crc);
    GRADWIRE_THROW(InvalidArgument)
        << "checkpoint: " << path << ": " << buf << " (the file is corrupt, or another snapshot's)";
  }
  return nn::deserialize(bytes, path);
}

// The pieces a data file holds, matched one for one to the manifest's descriptions.
std::vector<Piece> match_pieces(StateDict dict, const std::vector<detail::PieceEntry>& described,
                                const std::string& path) {
  GRADWIRE_CHECK_ARG(dict.size() == described.size())
      << "checkpoint: " << path << ": holds " << dict.size() << " tensors, the manifest describes "
      << described.size();
  std::vector<Piece> out;
  out.reserve(dict.size());
  for (size_t i = 0; i < dict.size(); ++i) {
    const detail::PieceEntry& d = described[i];
    auto& [name, value] = dict[i];
    GRADWIRE_CHECK_ARG(name == d.name && value.dtype() == d.dtype && value.sizes() == d.sizes)
        << "checkpoint: " << path << ": tensor " << i << " is '" << name << "' " << value.dtype()
        << " " << detail::sizes_text(value.sizes()) << ", the manifest describes '" << d.name
        << "' " << d.dtype << " " << detail::sizes_text(d.sizes);
    out.push_back(Piece{std::move(name), std::move(value), d.global_sizes, d.row_offset});
  }
  return out;
}

std::string rng_of(const StateDict& dict, const std::string& path) {
  GRADWIRE_CHECK_ARG(dict.size() == 1 && dict[0].first == detail::kRngEntry &&
                     dict[0].second.dtype() == kUInt8 && dict[0].second.dim() == 1)
      << "checkpoint: " << path << ": expected one 1-d uint8 tensor named '" << detail::kRngEntry
      << "'";
  const Tensor& t = dict[0].second;
  return std::string(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()));
}

void check_file_list(const detail::Manifest& m, const std::string& manifest_path) {
  const std::set<std::string> expected = {
      std::string(detail::kParamsFile), std::string(detail::kOptimizerFile),
      std::string(detail::kHyperFile), std::string(detail::kRngFile)};
  std::set<std::string> listed;
  for (const detail::FileEntry& f : m.files) {
    GRADWIRE_CHECK_ARG(expected.count(f.name) == 1 && listed.insert(f.name).second)
        << "checkpoint: " << manifest_path << ": lists file '" << f.name
        << "' twice or not of this format (params.gw, optimizer.gw, hyper.gw, rng.gw)";
  }
}

// A complete snapshot's state, every file checked; InvalidArgument naming the file at fault.
Snapshot load(const fs::path& snap, const std::string& shard, int64_t seq) {
  const std::string manifest_path = (snap / detail::kManifestName).string();
  const std::string text =
      detail::read_file(manifest_path, detail::kMaxManifestBytes, "over the limit of");
  const detail::Manifest m = detail::parse_manifest(text, manifest_path);
  GRADWIRE_CHECK_ARG(m.shard == shard && m.seq == seq)
      << "checkpoint: " << manifest_path << ": is the manifest of shard '" << m.shard << "' seq "
      << m.seq << ", found as shard '" << shard << "' seq " << seq;
  check_file_list(m, manifest_path);
  Snapshot out{seq, snap.string(), {}};
  ShardState& s = out.state;
  s.params = match_pieces(read_part(snap, m, detail::kParamsFile), m.params,
                          (snap / detail::kParamsFile).string());
  s.optimizer = match_pieces(read_part(snap, m, detail::kOptimizerFile), m.optimizer,
                             (snap / detail::kOptimizerFile).string());
  s.optimizer_hyper = read_part(snap, m, detail::kHyperFile);
  s.rng = rng_of(read_part(snap, m, detail::kRngFile), (snap / detail::kRngFile).string());
  s.job_shards = m.job_shards;
  s.optimizer_kind = m.optimizer_kind;
  s.counters = m.counters;
  s.replicated = m.replicated;
  detail::validate_state(s, shard, "checkpoint: " + manifest_path);
  return out;
}

}  // namespace

std::optional<Snapshot> read_snapshot(const std::string& dir, const std::string& shard,
                                      int64_t seq) {
  detail::check_shard_name(shard, "checkpoint::read_snapshot");
  detail::check_seq(seq, "checkpoint::read_snapshot");
  const fs::path snap = fs::path(dir) / shard / detail::snapshot_name(seq);
  std::error_code ec;
  if (!fs::exists(snap / detail::kManifestName, ec)) return std::nullopt;
  return load(snap, shard, seq);
}

std::optional<Snapshot> read_latest(const std::string& dir, const std::string& shard) {
  detail::check_shard_name(shard, "checkpoint::read_latest");
  const std::string shard_dir = (fs::path(dir) / shard).string();
  // A writer prunes a snapshot only once a newer one is complete: one that vanishes while
  // it is read has been replaced, and a second look finds the newer one.
  constexpr int kAttempts = 4;
  for (int attempt = 1;; ++attempt) {
    const std::vector<detail::SnapshotDir> snaps = detail::list_snapshots(shard_dir);
    const auto newest = std::find_if(snaps.rbegin(), snaps.rend(),
                                     [](const detail::SnapshotDir& s) { return s.complete; });
    if (newest == snaps.rend()) return std::nullopt;
    try {
      return load(newest->path, shard, newest->seq);
    } catch (const InvalidArgument&) {
      std::error_code ec;
      const bool pruned = !fs::exists(fs::path(newest->path) / detail::kManifestName, ec);
      if (!pruned || attempt == kAttempts) throw;
    }
  }
}

}  // namespace gradwire::checkpoint
