// The checks a ShardState passes before it is written and after it is read back.
#include <map>
#include <set>

#include "format.h"
#include "gradwire/core/check.h"

namespace gradwire::checkpoint::detail {
namespace {

std::string what(std::string_view part, const Piece& p) {
  return std::string(part) + " '" + p.name + "'";
}

// One piece on its own: a name, a value, and rows that fit its global sizes.
void check_piece(const Piece& p, std::string_view part, std::string_view op) {
  GRADWIRE_CHECK_ARG(!p.name.empty() && p.name.size() <= kMaxNameBytes)
      << op << ": a " << part << " piece has a name of " << p.name.size()
      << " bytes; names have 1 to " << kMaxNameBytes;
  GRADWIRE_CHECK_ARG(p.value.defined()) << op << ": " << what(part, p) << " is an undefined tensor";
  GRADWIRE_CHECK_ARG(!p.value.is_sparse())
      << op << ": " << what(part, p) << " is a sparse tensor; save its dense form";
  const std::vector<int64_t>& g = p.global_sizes;
  if (g.empty()) {
    GRADWIRE_CHECK_ARG(p.row_offset == 0)
        << op << ": " << what(part, p) << " has row_offset " << p.row_offset
        << " but no global sizes (a whole tensor starts at row 0)";
    return;
  }
  const std::vector<int64_t>& s = p.value.sizes();
  bool fits = s.size() == g.size() && !s.empty() && g[0] >= 0;
  for (size_t d = 1; fits && d < s.size(); ++d)
    fits = s[d] == g[d];
  GRADWIRE_CHECK_ARG(fits) << op << ": " << what(part, p) << " of sizes " << sizes_text(s)
                           << " cannot be rows of global sizes " << sizes_text(g)
                           << " (the same number of dimensions, at least one, and equal sizes "
                              "past the first)";
  const int64_t end = p.row_offset + s[0];
  GRADWIRE_CHECK_ARG(p.row_offset >= 0 && p.row_offset <= g[0] - s[0])
      << op << ": " << what(part, p) << " holds rows " << rows_text(p.row_offset, end)
      << ", which do not fit its " << g[0] << " global rows";
}

// A name given to two pieces: the rows of both, which overlap or repeat a tensor.
void check_unique(const std::vector<Piece>& pieces, std::string_view part, std::string_view op) {
  std::map<std::string, const Piece*> seen;
  for (const Piece& p : pieces) {
    auto [it, fresh] = seen.emplace(p.name, &p);
    if (fresh) continue;
    const Piece& first = *it->second;
    GRADWIRE_THROW(InvalidArgument)
        << op << ": " << what(part, p) << " is given twice (rows "
        << rows_text(first.row_offset,
                     first.row_offset + (first.value.dim() ? first.value.size(0) : 1))
        << " and " << rows_text(p.row_offset, p.row_offset + (p.value.dim() ? p.value.size(0) : 1))
        << "): a shard holds one piece of each tensor";
  }
}

// A job of one shard must hold every row of its split tensors.
void check_complete(const std::vector<Piece>& pieces, std::string_view part, std::string_view op) {
  for (const Piece& p : pieces) {
    if (p.global_sizes.empty()) continue;
    const int64_t end = p.row_offset + p.value.size(0);
    if (p.row_offset == 0 && end == p.global_sizes[0]) continue;
    GRADWIRE_THROW(InvalidArgument)
        << op << ": " << what(part, p) << " holds rows " << rows_text(p.row_offset, end) << " of "
        << p.global_sizes[0] << ", and this shard is the job's only one: rows "
        << (p.row_offset > 0 ? rows_text(0, p.row_offset) : rows_text(end, p.global_sizes[0]))
        << " are missing (list every shard in job_shards)";
  }
}

// The parameter an optimizer entry "<param>/<key>" belongs to: the longest saved
// parameter name that is followed by '/'.
const Piece* owner_of(const Piece& entry, const std::map<std::string, const Piece*>& params) {
  for (size_t slash = entry.name.rfind('/'); slash != std::string::npos && slash > 0;
       slash = entry.name.rfind('/', slash - 1)) {
    if (slash + 1 == entry.name.size()) continue;
    auto it = params.find(entry.name.substr(0, slash));
    if (it != params.end()) return it->second;
  }
  return nullptr;
}

void check_optimizer(const ShardState& state, std::string_view op) {
  std::map<std::string, const Piece*> params;
  for (const Piece& p : state.params)
    params.emplace(p.name, &p);
  for (const Piece& e : state.optimizer) {
    const Piece* param = owner_of(e, params);
    GRADWIRE_CHECK_ARG(param != nullptr)
        << op << ": optimizer entry '" << e.name
        << "' names no saved parameter (entries are '<parameter>/<key>')";
    if (e.global_sizes.empty()) continue;
    GRADWIRE_CHECK_ARG(!param->global_sizes.empty())
        << op << ": optimizer entry '" << e.name << "' is split by rows but its parameter '"
        << param->name << "' is saved whole";
    const int64_t rows = e.value.size(0), param_rows = param->value.size(0);
    GRADWIRE_CHECK_ARG(e.global_sizes[0] == param->global_sizes[0] &&
                       e.row_offset == param->row_offset && rows == param_rows)
        << op << ": optimizer entry '" << e.name << "' holds rows "
        << rows_text(e.row_offset, e.row_offset + rows) << " of " << e.global_sizes[0]
        << ", its parameter '" << param->name << "' rows "
        << rows_text(param->row_offset, param->row_offset + param_rows) << " of "
        << param->global_sizes[0] << " (optimizer state is split like its parameter)";
  }
}

}  // namespace

void validate_state(const ShardState& state, const std::string& shard, std::string_view op) {
  check_shard_name(shard, op);
  std::set<std::string> job;
  for (const std::string& s : state.job_shards) {
    check_shard_name(s, op);
    GRADWIRE_CHECK_ARG(job.insert(s).second) << op << ": job_shards names '" << s << "' twice";
  }
  GRADWIRE_CHECK_ARG(job.empty() || job.count(shard) == 1)
      << op << ": job_shards does not name this shard '" << shard << "'";
  for (const Piece& p : state.params)
    check_piece(p, "parameter", op);
  for (const Piece& p : state.optimizer)
    check_piece(p, "optimizer entry", op);
  check_unique(state.params, "parameter", op);
  check_unique(state.optimizer, "optimizer entry", op);
  if (job.size() <= 1) {
    check_complete(state.params, "parameter", op);
    check_complete(state.optimizer, "optimizer entry", op);
  }
  check_optimizer(state, op);
  if (state.replicated) {
    for (const Piece& p : state.params) {
      GRADWIRE_CHECK_ARG(p.global_sizes.empty())
          << op << ": parameter '" << p.name
          << "' is split by rows in a replicated state (a replica holds whole tensors)";
    }
  }
  for (const auto& [name, value] : state.counters) {
    GRADWIRE_CHECK_ARG(!name.empty() && name.size() <= kMaxNameBytes)
        << op << ": a counter has a name of " << name.size() << " bytes; names have 1 to "
        << kMaxNameBytes;
  }
  GRADWIRE_CHECK_ARG(state.optimizer_kind.size() <= kMaxNameBytes)
      << op << ": optimizer_kind has " << state.optimizer_kind.size() << " bytes";
}

}  // namespace gradwire::checkpoint::detail
