// Distributed checkpoints: each worker ("shard") of a job writes its own state -- parameters
// by name, optimizer state, step counters, the generator's state -- as snapshots that are
// written atomically and checked on load; a job's shards are then read together, checked
// against each other, and split again for a different number of workers (P servers saved,
// Q loaded; a data-parallel replica saved once and loaded into every rank).
//
// Layout and format (docs/checkpoint.md has every field):
//   DIR/<shard>/<seq, 12 digits>/params.gw      the parameter pieces     (nn::serialize)
//                                optimizer.gw   the optimizer state       (nn::serialize)
//                                hyper.gw       the optimizer's hyperparameters
//                                rng.gw         the generator's state     (one uint8 tensor)
//                                MANIFEST       a text file, written last: every data file's
//                                               size and crc32, every piece's name, dtype,
//                                               sizes, global sizes and rows, the counters,
//                                               and a checksum line of its own
// Each file is written to a temporary name, fsync'd and renamed; the directory is fsync'd
// before the MANIFEST is written the same way, so a snapshot either has a MANIFEST whose
// files all check out, or is an interrupted write that readers skip.
//
// A tensor is either whole (Piece::global_sizes empty) or split by rows: a piece holds rows
// [row_offset, row_offset + value.size(0)) of a tensor of sizes global_sizes. A job's
// shards together must hold every row of a split tensor exactly once.
//
// Errors: InvalidArgument for a bad state or name, and for a checkpoint that is corrupt,
// truncated or inconsistent (the message names the file or the shard, the tensor and what
// is wrong); Error naming the path when a file cannot be written or read. Nothing is ever
// half-loaded: a Snapshot or a Checkpoint exists only once all of it has been checked.
//
// Thread-safety: the free functions are reentrant; one writer per shard at a time (two
// processes writing the same shard of one directory is not supported). Readers may run
// while a shard's writer writes (they skip the snapshot in progress). A Checkpoint is
// immutable once open: its const methods may be called from any number of threads.
//
// Example (two parameter servers, each holding half of a table's rows, and a bias):
//   checkpoint::ShardState s;
//   s.job_shards = {"ps0", "ps1"};
//   auto [first, last] = checkpoint::row_range(10, rank, 2);
//   s.params.push_back({"emb", table.clone(), {10, 4}, first});
//   s.params.push_back({"bias", bias.clone()});
//   checkpoint::add_optimizer(s, opt, {"emb", "bias"}, {{10, 4}, {}}, {first, 0});
//   s.counters["step"] = step;
//   checkpoint::write_shard("/ckpt", "ps" + std::to_string(rank), step, s);
//   ...
//   // Three servers later: server i of 3 takes its rows.
//   checkpoint::ShardState mine = checkpoint::Checkpoint::open("/ckpt").reshard(i, 3);
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/optim/optimizer.h"
#include "gradwire/tensor/state_dict.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::checkpoint {

namespace detail {
struct CheckpointData;  // the snapshots and each tensor's layout (src/checkpoint.cc)
}  // namespace detail

// One tensor of a worker's state, or rows [row_offset, row_offset + value.size(0)) of a
// larger tensor whose full sizes are global_sizes (empty global_sizes: value is the whole
// tensor).
struct Piece {
  Piece() = default;
  // Piece{"bias", b} (whole) or Piece{"emb", rows, {10, 4}, first} (rows of a table).
  Piece(std::string name, Tensor value, std::vector<int64_t> global_sizes = {},
        int64_t row_offset = 0)
      : name(std::move(name)),
        value(std::move(value)),
        global_sizes(std::move(global_sizes)),
        row_offset(row_offset) {}

  std::string name;
  Tensor value;                       // saved from its CPU contiguous form
  std::vector<int64_t> global_sizes;  // empty: the whole tensor
  int64_t row_offset{0};
};

// What one worker (a "shard" of the job) saves.
struct ShardState {
  // Every shard name of the job, for a missing shard's error; empty: this one alone.
  std::vector<std::string> job_shards;
  std::vector<Piece> params;  // parameters by name
  // Optimizer state by parameter: "<param name>/<state key>", row-split like its parameter.
  std::vector<Piece> optimizer;
  std::string optimizer_kind;               // "SGD", "Adagrad", "Adam", ... ("" none)
  StateDict optimizer_hyper;                // hyperparameters/scalars (e.g. "hyper.lr"), as-is
  std::map<std::string, int64_t> counters;  // step counters ("step", "epoch", ...)
  std::string rng;                          // the generator's state, opaque bytes ("" none)
  bool replicated{false};  // a data-parallel replica: saved once, loads into any number of ranks
};

struct WriteOptions {
  int keep_last{3};  // older complete snapshots of this shard are removed, >= 1
};

// Writes snapshot `seq` (0 <= seq < 10^12) of `shard` under dir:
// dir/<shard>/<seq as 12-digit zero-padded>/ with one file per part and a MANIFEST written
// last (every data file: temp file, write, fsync, rename; then fsync the directory). Then
// removes this shard's complete snapshots older than the newest keep_last, and interrupted
// ones older than `seq`. Returns the snapshot directory.
// Throws InvalidArgument for a bad state: a shard name not in [A-Za-z0-9_.:-]{1,128}, a
// job_shards list without this shard or with a repeated or bad name, an empty or repeated
// piece name, an undefined value, pieces that do not fit their global sizes, a single-shard
// job's split tensor with rows missing, optimizer state whose rows differ from its
// parameter's or that names no saved parameter, a split piece in a replicated state, a
// complete snapshot `seq` that exists already, keep_last < 1. Throws Error naming the path
// on an I/O failure (nothing is left that a reader would take for a snapshot).
std::string write_shard(const std::string& dir, const std::string& shard, int64_t seq,
                        const ShardState& state, const WriteOptions& options = {});

// A complete snapshot as read back: its sequence number, its directory and its state
// (tensors are CPU tensors of their own).
struct Snapshot {
  int64_t seq;
  std::string path;
  ShardState state;
};

// The newest COMPLETE snapshot of `shard` (one with a manifest whose files all check out; a
// snapshot without a manifest is an interrupted write and is skipped; a snapshot whose
// manifest or files are corrupt is refused with InvalidArgument naming the file and what
// is wrong -- never half-loaded). nullopt when the shard has none.
std::optional<Snapshot> read_latest(const std::string& dir, const std::string& shard);
// Snapshot `seq` of `shard`; nullopt when it does not exist or is incomplete (no manifest).
std::optional<Snapshot> read_snapshot(const std::string& dir, const std::string& shard,
                                      int64_t seq);

// A job's checkpoint: every shard's newest complete snapshot (or all at `seq`), checked
// together: each job_shards entry must be present (a missing one refused naming it), all
// shards must name the same job_shards, each split tensor's pieces must tile its global rows
// exactly once (a gap or overlap refused naming the tensor and rows), dtypes, global sizes
// and optimizer kinds agree. A whole tensor may be held by several shards (a replicated
// bias); they must agree in dtype and sizes, and the first shard (by name) that holds it
// provides it.
class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);               // newest complete of each shard
  static Checkpoint open(const std::string& dir, int64_t seq);  // that seq of each shard

  const std::string& dir() const;
  std::vector<std::string> shards() const;  // sorted
  const Snapshot& snapshot(const std::string& shard) const;
  std::vector<std::string> param_names() const;      // sorted
  std::vector<std::string> optimizer_names() const;  // sorted, "<param>/<key>"
  // A parameter's (or optimizer entry's) full sizes.
  std::vector<int64_t> global_sizes(const std::string& name) const;

  // Rows [begin, end) of a parameter / an optimizer state entry ("<param>/<key>"),
  // assembled from whatever shards hold them (bit-identical to what was saved);
  // InvalidArgument naming the tensor for an unknown name or rows out of range (a 0-d
  // tensor has no rows: read it whole). A whole tensor: read(name).
  Tensor read(const std::string& name, int64_t begin, int64_t end) const;
  Tensor read(const std::string& name) const;
  Tensor read_optimizer(const std::string& name, int64_t begin, int64_t end) const;
  Tensor read_optimizer(const std::string& name) const;

  // The state shard `index` of `count` new shards should load: for every split tensor
  // (parameter or optimizer entry) the rows row_range(rows, index, count) as a piece with
  // the global sizes; whole tensors whole. optimizer_kind and optimizer_hyper come from the
  // first shard (by name) that has an optimizer kind; counters and rng from the first
  // shard; replicated is true when every saved shard was. job_shards is left empty (the
  // new layout names its shards).
  ShardState reshard(int index, int count) const;

  // What `gradwire-ckpt inspect` prints: the shards with their seqs, counters and optimizer
  // kind, then every tensor with dtype, global sizes and which shard holds which rows.
  std::string describe() const;

 private:
  explicit Checkpoint(std::shared_ptr<const detail::CheckpointData> data)
      : data_(std::move(data)) {}
  static Checkpoint open_snapshots(const std::string& dir, std::optional<int64_t> seq);
  std::shared_ptr<const detail::CheckpointData> data_;
};

// Rows [first, last) that shard `index` of `count` holds of `rows` rows: contiguous ranges,
// the first rows % count shards one row more. InvalidArgument for rows < 0, count < 1 or
// index outside [0, count).
std::pair<int64_t, int64_t> row_range(int64_t rows, int index, int count);

// The pieces of an optimizer's state_dict() for parameters named `names` (in the
// optimizer's parameter order, one name per parameter): "state.<i>.<key>" becomes the piece
// "<names[i]>/<key>", a copy taken now (the optimizer may step on while the state is
// written). A state tensor of its parameter's shape is split like the parameter when
// global_sizes[i] is given (rows from row_offsets[i], 0 when row_offsets is empty); any
// other (a 0-d step count) is whole. Sets optimizer_kind, and optimizer_hyper to the
// state dict's other entries ("hyper.<k>", "param_groups", "group.<g>.hyper.<k>").
// InvalidArgument when names, global_sizes or row_offsets do not have one entry per
// parameter (global_sizes and row_offsets may be empty), or a global size disagrees with
// its parameter.
void add_optimizer(ShardState& state, const optim::Optimizer& optimizer,
                   const std::vector<std::string>& names,
                   const std::vector<std::vector<int64_t>>& global_sizes = {},
                   const std::vector<int64_t>& row_offsets = {});
// Puts saved pieces into an optimizer whose parameters have those names (in its parameter
// order): "<names[i]>/<key>" becomes "state.<i>.<key>", with the kind and hyperparameters;
// the optimizer's load_state_dict checks kind and shapes (InvalidArgument, the optimizer
// unchanged). Pieces of other parameters are not looked at.
void load_optimizer(optim::Optimizer& optimizer, const ShardState& state,
                    const std::vector<std::string>& names);

}  // namespace gradwire::checkpoint
