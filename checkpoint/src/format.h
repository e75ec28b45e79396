// The on-disk format of a snapshot: file names, the MANIFEST's fields, its text form and
// its parser, names of shards and snapshots, and the checks a ShardState must pass before
// it is written or after it is read (docs/checkpoint.md describes every field).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "gradwire/checkpoint/checkpoint.h"
#include "gradwire/tensor/dtype.h"

namespace gradwire::checkpoint::detail {

inline constexpr std::string_view kManifestName = "MANIFEST";
inline constexpr std::string_view kParamsFile = "params.gw";
inline constexpr std::string_view kOptimizerFile = "optimizer.gw";
inline constexpr std::string_view kHyperFile = "hyper.gw";
inline constexpr std::string_view kRngFile = "rng.gw";
inline constexpr std::string_view kRngEntry = "rng";
inline constexpr int kFormatVersion = 1;
inline constexpr int64_t kMaxSeq = 999'999'999'999;  // 12 digits
inline constexpr size_t kMaxNameBytes = 65536;       // nn::serialize's limit
inline constexpr uint64_t kMaxManifestBytes = 64ull << 20;
inline constexpr size_t kMaxDims = 64;

// One data file as the manifest lists it.
struct FileEntry {
  std::string name;
  uint64_t size = 0;
  uint32_t crc = 0;
};

// One piece as the manifest describes it.
struct PieceEntry {
  std::string name;
  DType dtype = kFloat32;
  std::vector<int64_t> sizes;         // the piece's own sizes
  std::vector<int64_t> global_sizes;  // empty: whole
  int64_t row_offset = 0;
};

struct Manifest {
  std::string shard;
  int64_t seq = 0;
  bool replicated = false;
  std::vector<std::string> job_shards;
  std::string optimizer_kind;
  std::map<std::string, int64_t> counters;
  std::vector<FileEntry> files;
  std::vector<PieceEntry> params;
  std::vector<PieceEntry> optimizer;
};

// The text of a manifest, ending with its checksum line.
std::string format_manifest(const Manifest& manifest);
// Parses and checks a manifest's text; InvalidArgument naming `path`, the line and the
// problem (a missing or wrong checksum line, an unknown or repeated field, a bad number).
Manifest parse_manifest(std::string_view text, const std::string& path);

// The piece's description (dtype and sizes from its value).
PieceEntry describe_piece(const Piece& piece);

// zlib's crc32 of `bytes`.
uint32_t crc32_of(std::string_view bytes);
// The crc32 a manifest lists for a data file: of its bytes before the 4-byte crc32 that
// nn::serialize ends every state file with. (The crc32 of a whole state file is the same
// constant for every file -- a CRC's residue -- so it could not tell two files apart.)
uint32_t data_file_crc(std::string_view bytes);

// "000000000042".
std::string snapshot_name(int64_t seq);
// The seq a snapshot directory's name holds, or -1 when it is not 12 digits.
int64_t parse_snapshot_name(std::string_view name);
bool valid_shard_name(std::string_view name);
// InvalidArgument naming `op` unless the name is in [A-Za-z0-9_.:-]{1,128}.
void check_shard_name(std::string_view name, std::string_view op);
// InvalidArgument unless 0 <= seq <= kMaxSeq.
void check_seq(int64_t seq, std::string_view op);

// Every check write_shard makes of a state (the header lists them); the message starts
// with `op` and names the piece.
void validate_state(const ShardState& state, const std::string& shard, std::string_view op);

// "[5,4]"; "[]" for a 0-d tensor.
std::string sizes_text(const std::vector<int64_t>& sizes);
// "[0,5)".
std::string rows_text(int64_t begin, int64_t end);

}  // namespace gradwire::checkpoint::detail
