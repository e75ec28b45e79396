// Checkpoint: a job's shards read together, each tensor's layout across them checked,
// rows assembled and split again.
#include "gradwire/checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <sstream>
#include <system_error>

#include "format.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::checkpoint {
namespace detail {

// Which rows of a tensor one shard's piece holds.
struct Holder {
  size_t shard = 0;  // index into CheckpointData::snapshots
  size_t piece = 0;  // index into that state's params or optimizer
  int64_t begin = 0;
  int64_t end = 0;
};

// A tensor across the job: its dtype and global sizes, and who holds which rows.
struct Layout {
  DType dtype = kFloat32;
  std::vector<int64_t> sizes;  // the global sizes (a whole tensor's own)
  bool split = false;
  std::vector<Holder> holders;  // split: by first row; whole: by shard name
};

struct CheckpointData {
  std::string dir;
  std::vector<std::string> shards;  // sorted
  std::vector<Snapshot> snapshots;  // one per shard, in the same order
  std::map<std::string, Layout> params;
  std::map<std::string, Layout> optimizer;
};

}  // namespace detail

namespace {

namespace fs = std::filesystem;
using detail::CheckpointData;
using detail::Holder;
using detail::Layout;
using detail::rows_text;
using detail::sizes_text;

constexpr std::string_view kOpen = "checkpoint::Checkpoint::open";

std::string list_text(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size(); ++i)
    out += (i ? ", " : "") + names[i];
  return out + "]";
}

const Piece& piece_of(const CheckpointData& d, const Holder& h, bool optimizer) {
  const ShardState& s = d.snapshots[h.shard].state;
  return optimizer ? s.optimizer[h.piece] : s.params[h.piece];
}

// "[0,5) ps0; [5,10) ps1", or "whole: ps0, ps1".
std::string holders_text(const CheckpointData& d, const Layout& l) {
  std::string out = l.split ? "" : "whole: ";
  for (size_t i = 0; i < l.holders.size(); ++i) {
    const Holder& h = l.holders[i];
    if (l.split) {
      out += (i ? "; " : "") + rows_text(h.begin, h.end) + " " + d.shards[h.shard];
    } else {
      out += (i ? ", " : "") + d.shards[h.shard];
    }
  }
  return out;
}

std::string layout_text(const Layout& l) {
  std::ostringstream os;
  os << l.dtype << " " << sizes_text(l.sizes) << (l.split ? " split by rows" : " whole");
  return os.str();
}

// Adds shard `shard`'s pieces to `layouts`, refusing a tensor whose dtype, sizes or split
// differ from another shard's.
void add_pieces(const CheckpointData& d, size_t shard, bool optimizer,
                std::map<std::string, Layout>& layouts) {
  const ShardState& s = d.snapshots[shard].state;
  const std::vector<Piece>& pieces = optimizer ? s.optimizer : s.params;
  for (size_t j = 0; j < pieces.size(); ++j) {
    const Piece& p = pieces[j];
    Layout mine;
    mine.dtype = p.value.dtype();
    mine.split = !p.global_sizes.empty();
    mine.sizes = mine.split ? p.global_sizes : p.value.sizes();
    const int64_t rows = mine.split ? p.value.size(0) : (p.value.dim() ? p.value.size(0) : 0);
    auto [it, fresh] = layouts.emplace(p.name, mine);
    Layout& l = it->second;
    if (!fresh && (l.dtype != mine.dtype || l.sizes != mine.sizes || l.split != mine.split)) {
      GRADWIRE_THROW(InvalidArgument)
          << kOpen << ": '" << d.dir << "': tensor '" << p.name << "': shard '"
          << d.shards[l.holders.front().shard] << "' holds it as " << layout_text(l) << ", shard '"
          << d.shards[shard] << "' as " << layout_text(mine);
    }
    l.holders.push_back({shard, j, p.row_offset, p.row_offset + rows});
  }
}

// A split tensor's pieces must hold every row exactly once.
void check_tiling(const CheckpointData& d, const std::string& name, Layout& l) {
  std::stable_sort(l.holders.begin(), l.holders.end(),
                   [](const Holder& a, const Holder& b) { return a.begin < b.begin; });
  int64_t next = 0;
  const Holder* last = nullptr;
  for (const Holder& h : l.holders) {
    if (h.begin == h.end) continue;  // a shard holding none of the rows
    GRADWIRE_CHECK_ARG(h.begin <= next)
        << kOpen << ": '" << d.dir << "': rows " << rows_text(next, h.begin) << " of '" << name
        << "' are held by no shard (held: " << holders_text(d, l) << ")";
    GRADWIRE_CHECK_ARG(h.begin == next)
        << kOpen << ": '" << d.dir << "': rows " << rows_text(h.begin, std::min(next, h.end))
        << " of '" << name << "' are held by both '" << d.shards[last->shard] << "' and '"
        << d.shards[h.shard] << "' (held: " << holders_text(d, l) << ")";
    next = h.end;
    last = &h;
  }
  GRADWIRE_CHECK_ARG(next == l.sizes[0])
      << kOpen << ": '" << d.dir << "': rows " << rows_text(next, l.sizes[0]) << " of '" << name
      << "' are held by no shard (held: " << holders_text(d, l) << ")";
}

// Every shard names the same job, and every shard of it is present.
void check_job(const CheckpointData& d, std::optional<int64_t> seq) {
  const auto declared = [&](size_t i) {
    std::vector<std::string> v = d.snapshots[i].state.job_shards;
    if (v.empty()) v.push_back(d.shards[i]);
    std::sort(v.begin(), v.end());
    return v;
  };
  const std::vector<std::string> job = declared(0);
  for (size_t i = 1; i < d.snapshots.size(); ++i) {
    GRADWIRE_CHECK_ARG(declared(i) == job)
        << kOpen << ": '" << d.dir << "': shards '" << d.shards[0] << "' and '" << d.shards[i]
        << "' disagree on the job's shards: " << list_text(job) << " and " << list_text(declared(i))
        << " (one directory per job layout)";
  }
  for (const std::string& name : job) {
    GRADWIRE_CHECK_ARG(std::binary_search(d.shards.begin(), d.shards.end(), name))
        << kOpen << ": '" << d.dir << "': shard '" << name << "' is missing: the job's shards are "
        << list_text(job) << " and '" << (fs::path(d.dir) / name).string()
        << "' has no complete snapshot" << (seq ? " at seq " + std::to_string(*seq) : "");
  }
}

void check_kinds(const CheckpointData& d) {
  const std::string* kind = nullptr;
  size_t first = 0;
  for (size_t i = 0; i < d.snapshots.size(); ++i) {
    const std::string& k = d.snapshots[i].state.optimizer_kind;
    if (k.empty()) continue;
    if (kind == nullptr) {
      kind = &k;
      first = i;
    }
    GRADWIRE_CHECK_ARG(k == *kind)
        << kOpen << ": '" << d.dir << "': shard '" << d.shards[first] << "' saved a " << *kind
        << " optimizer, shard '" << d.shards[i] << "' a " << k;
  }
}

std::vector<std::string> shard_dirs(const std::string& dir) {
  std::error_code ec;
  GRADWIRE_CHECK_ARG(fs::is_directory(dir, ec)) << kOpen << ": '" << dir << "' is not a directory";
  std::vector<std::string> out;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code gone;
    const std::string name = it->path().filename().string();
    if (detail::valid_shard_name(name) && it->is_directory(gone)) out.push_back(name);
  }
  if (ec) GRADWIRE_THROW(Error) << kOpen << ": cannot list '" << dir << "': " << ec.message();
  std::sort(out.begin(), out.end());
  return out;
}

const Layout& find_layout(const CheckpointData& d, const std::string& name, bool optimizer) {
  const auto& layouts = optimizer ? d.optimizer : d.params;
  auto it = layouts.find(name);
  if (it != layouts.end()) return it->second;
  std::vector<std::string> known;
  for (const auto& [n, l] : layouts) {
    if (known.size() == 20) {
      known.push_back("...");
      break;
    }
    known.push_back(n);
  }
  GRADWIRE_THROW(InvalidArgument) << "checkpoint '" << d.dir << "': no "
                                  << (optimizer ? "optimizer entry '" : "parameter '") << name
                                  << "' (it holds " << list_text(known) << ")";
}

// Rows [begin, end) of a tensor, as a new contiguous tensor.
Tensor read_rows(const CheckpointData& d, const std::string& name, bool optimizer, int64_t begin,
                 int64_t end) {
  const Layout& l = find_layout(d, name, optimizer);
  GRADWIRE_CHECK_ARG(!l.sizes.empty())
      << "checkpoint '" << d.dir << "': '" << name << "' is a 0-d tensor, which has no rows; read "
      << "it whole";
  GRADWIRE_CHECK_ARG(0 <= begin && begin <= end && end <= l.sizes[0])
      << "checkpoint '" << d.dir << "': rows " << rows_text(begin, end) << " of '" << name
      << "' are out of range: it has " << l.sizes[0] << " rows";
  std::vector<Tensor> parts;
  for (const Holder& h : l.holders) {
    const int64_t lo = std::max(begin, h.begin), hi = std::min(end, h.end);
    if (lo >= hi) continue;
    parts.push_back(piece_of(d, h, optimizer).value.slice(0, lo - h.begin, hi - h.begin));
    if (!l.split) break;  // the first shard holding a whole tensor provides it
  }
  if (parts.empty()) {
    std::vector<int64_t> sizes = l.sizes;
    sizes[0] = 0;
    return empty(sizes, TensorOptions(l.dtype));
  }
  return parts.size() == 1 ? parts[0].clone() : cat(parts, 0);
}

Tensor read_whole(const CheckpointData& d, const std::string& name, bool optimizer) {
  const Layout& l = find_layout(d, name, optimizer);
  if (l.split) return read_rows(d, name, optimizer, 0, l.sizes[0]);
  return piece_of(d, l.holders.front(), optimizer).value.clone();
}

std::vector<Piece> reshard_part(const CheckpointData& d, bool optimizer, int index, int count) {
  std::vector<Piece> out;
  for (const auto& [name, l] : optimizer ? d.optimizer : d.params) {
    if (!l.split) {
      out.push_back(Piece{name, read_whole(d, name, optimizer), {}, 0});
      continue;
    }
    const auto [first, last] = row_range(l.sizes[0], index, count);
    out.push_back(Piece{name, read_rows(d, name, optimizer, first, last), l.sizes, first});
  }
  return out;
}

std::string counters_text(const std::map<std::string, int64_t>& counters) {
  if (counters.empty()) return "none";
  std::string out;
  for (const auto& [name, value] : counters)
    out += (out.empty() ? "" : " ") + name + "=" + std::to_string(value);
  return out;
}

void describe_tensors(std::ostringstream& os, const CheckpointData& d,
                      const std::map<std::string, Layout>& layouts) {
  for (const auto& [name, l] : layouts) {
    os << "  " << name << "  " << l.dtype << "  " << sizes_text(l.sizes) << "  "
       << holders_text(d, l) << "\n";
  }
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  return open_snapshots(dir, std::nullopt);
}

Checkpoint Checkpoint::open(const std::string& dir, int64_t seq) {
  detail::check_seq(seq, kOpen);
  return open_snapshots(dir, seq);
}

Checkpoint Checkpoint::open_snapshots(const std::string& dir, std::optional<int64_t> seq) {
  auto d = std::make_shared<CheckpointData>();
  d->dir = dir;
  for (const std::string& name : shard_dirs(dir)) {
    std::optional<Snapshot> snap = seq ? read_snapshot(dir, name, *seq) : read_latest(dir, name);
    if (!snap) continue;
    d->shards.push_back(name);
    d->snapshots.push_back(std::move(*snap));
  }
  GRADWIRE_CHECK_ARG(!d->snapshots.empty())
      << kOpen << ": '" << dir << "' holds no complete snapshot of any shard"
      << (seq ? " at seq " + std::to_string(*seq) : "");
  check_job(*d, seq);
  check_kinds(*d);
  for (size_t i = 0; i < d->snapshots.size(); ++i) {
    add_pieces(*d, i, false, d->params);
    add_pieces(*d, i, true, d->optimizer);
  }
  for (auto* layouts : {&d->params, &d->optimizer}) {
    for (auto& [name, l] : *layouts)
      if (l.split) check_tiling(*d, name, l);
  }
  return Checkpoint(std::move(d));
}

const std::string& Checkpoint::dir() const {
  return data_->dir;
}

std::vector<std::string> Checkpoint::shards() const {
  return data_->shards;
}

const Snapshot& Checkpoint::snapshot(const std::string& shard) const {
  const auto it = std::lower_bound(data_->shards.begin(), data_->shards.end(), shard);
  GRADWIRE_CHECK_ARG(it != data_->shards.end() && *it == shard)
      << "checkpoint '" << data_->dir << "': no shard '" << shard << "' (it holds "
      << list_text(data_->shards) << ")";
  return data_->snapshots[static_cast<size_t>(it - data_->shards.begin())];
}

std::vector<std::string> Checkpoint::param_names() const {
  std::vector<std::string> out;
  for (const auto& [name, l] : data_->params)
    out.push_back(name);
  return out;
}

std::vector<std::string> Checkpoint::optimizer_names() const {
  std::vector<std::string> out;
  for (const auto& [name, l] : data_->optimizer)
    out.push_back(name);
  return out;
}

std::vector<int64_t> Checkpoint::global_sizes(const std::string& name) const {
  if (data_->optimizer.count(name) == 1 && data_->params.count(name) == 0)
    return data_->optimizer.at(name).sizes;
  return find_layout(*data_, name, false).sizes;
}

Tensor Checkpoint::read(const std::string& name, int64_t begin, int64_t end) const {
  return read_rows(*data_, name, false, begin, end);
}

Tensor Checkpoint::read(const std::string& name) const {
  return read_whole(*data_, name, false);
}

Tensor Checkpoint::read_optimizer(const std::string& name, int64_t begin, int64_t end) const {
  return read_rows(*data_, name, true, begin, end);
}

Tensor Checkpoint::read_optimizer(const std::string& name) const {
  return read_whole(*data_, name, true);
}

ShardState Checkpoint::reshard(int index, int count) const {
  row_range(0, index, count);  // checks index and count even when nothing is split
  ShardState out;
  out.params = reshard_part(*data_, false, index, count);
  out.optimizer = reshard_part(*data_, true, index, count);
  const auto& snaps = data_->snapshots;
  const auto with_kind = std::find_if(snaps.begin(), snaps.end(), [](const Snapshot& s) {
    return !s.state.optimizer_kind.empty();
  });
  if (with_kind != snaps.end()) {
    out.optimizer_kind = with_kind->state.optimizer_kind;
    for (const auto& [key, t] : with_kind->state.optimizer_hyper)
      out.optimizer_hyper.emplace_back(key, t.clone());
  }
  out.counters = snaps.front().state.counters;
  out.rng = snaps.front().state.rng;
  out.replicated =
      std::all_of(snaps.begin(), snaps.end(), [](const Snapshot& s) { return s.state.replicated; });
  return out;
}

std::string Checkpoint::describe() const {
  const CheckpointData& d = *data_;
  std::ostringstream os;
  os << "checkpoint " << d.dir << "\n";
  os << "shards (" << d.shards.size() << "):\n";
  for (size_t i = 0; i < d.shards.size(); ++i) {
    const Snapshot& s = d.snapshots[i];
    os << "  " << d.shards[i] << "  seq " << s.seq << "  replicated "
       << (s.state.replicated ? "yes" : "no") << "  optimizer "
       << (s.state.optimizer_kind.empty() ? "none" : s.state.optimizer_kind) << "  rng "
       << s.state.rng.size() << " bytes  counters " << counters_text(s.state.counters) << "\n";
  }
  os << "parameters (" << d.params.size() << "):\n";
  describe_tensors(os, d, d.params);
  os << "optimizer state (" << d.optimizer.size() << "):\n";
  describe_tensors(os, d, d.optimizer);
  return os.str();
}

std::pair<int64_t, int64_t> row_range(int64_t rows, int index, int count) {
  GRADWIRE_CHECK_ARG(rows >= 0) << "checkpoint::row_range: rows " << rows << " is negative";
  GRADWIRE_CHECK_ARG(count >= 1) << "checkpoint::row_range: count " << count
                                 << " is not a positive number of shards";
  GRADWIRE_CHECK_ARG(index >= 0 && index < count)
      << "checkpoint::row_range: index " << index << " is outside [0, " << count << ")";
  const int64_t base = rows / count, extra = rows % count;
  const int64_t first = index * base + std::min<int64_t>(index, extra);
  return {first, first + base + (index < extra ? 1 : 0)};
}

}  // namespace gradwire::checkpoint
