// add_optimizer / load_optimizer: an optim::Optimizer's state_dict() ("type", "hyper.*",
// "state.<i>.<key>", and with several groups "param_groups" and "group.<g>.hyper.*") as
// the pieces of a ShardState, named by parameter, and back.
#include <charconv>
#include <cstring>
#include <optional>

#include "gradwire/checkpoint/checkpoint.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::checkpoint {
namespace {

constexpr std::string_view kTypeKey = "type";
constexpr std::string_view kStatePrefix = "state.";

// "state.<i>.<key>" as (i, key); nullopt for any other key.
std::optional<std::pair<size_t, std::string>> state_key(const std::string& key) {
  if (key.compare(0, kStatePrefix.size(), kStatePrefix) != 0) return std::nullopt;
  const char* begin = key.data() + kStatePrefix.size();
  const char* end = key.data() + key.size();
  size_t index = 0;
  const auto [dot, ec] = std::from_chars(begin, end, index);
  if (ec != std::errc() || dot == begin || dot == end || *dot != '.' || dot + 1 == end)
    return std::nullopt;
  return std::make_pair(index, std::string(dot + 1, end));
}

std::string kind_of(const Tensor& type) {
  GRADWIRE_CHECK_ARG(type.defined() && type.dtype() == kUInt8 && type.dim() == 1)
      << "checkpoint::add_optimizer: the optimizer's 'type' entry is not a 1-d uint8 tensor";
  const Tensor chars = type.contiguous();
  return std::string(static_cast<const char*>(chars.data_ptr()), chars.nbytes());
}

void check_layout_args(const optim::Optimizer& optimizer, const std::vector<std::string>& names,
                       const std::vector<std::vector<int64_t>>& global_sizes,
                       const std::vector<int64_t>& row_offsets) {
  const size_t n = optimizer.params().size();
  GRADWIRE_CHECK_ARG(names.size() == n) << "checkpoint::add_optimizer: " << names.size()
                                        << " names for an optimizer of " << n << " parameters";
  GRADWIRE_CHECK_ARG(global_sizes.empty() || global_sizes.size() == n)
      << "checkpoint::add_optimizer: " << global_sizes.size()
      << " global sizes for an optimizer of " << n << " parameters (give none or one each)";
  GRADWIRE_CHECK_ARG(row_offsets.empty() || (row_offsets.size() == n && !global_sizes.empty()))
      << "checkpoint::add_optimizer: " << row_offsets.size() << " row offsets for "
      << global_sizes.size() << " global sizes and " << n
      << " parameters (give none, or one each with the global sizes)";
  for (size_t i = 0; i < global_sizes.size(); ++i) {
    const std::vector<int64_t>& g = global_sizes[i];
    const std::vector<int64_t>& s = optimizer.params()[i].sizes();
    if (g.empty()) continue;
    bool fits = g.size() == s.size() && !s.empty();
    for (size_t d = 1; fits && d < s.size(); ++d)
      fits = g[d] == s[d];
    GRADWIRE_CHECK_ARG(fits) << "checkpoint::add_optimizer: parameter '" << names[i]
                             << "' of sizes " << optimizer.params()[i].shape_string()
                             << " cannot be rows of global sizes " << shape_to_string(g);
  }
}

}  // namespace

void add_optimizer(ShardState& state, const optim::Optimizer& optimizer,
                   const std::vector<std::string>& names,
                   const std::vector<std::vector<int64_t>>& global_sizes,
                   const std::vector<int64_t>& row_offsets) {
  check_layout_args(optimizer, names, global_sizes, row_offsets);
  std::string kind;
  StateDict hyper;
  std::vector<Piece> pieces;
  for (const auto& [key, t] : optimizer.state_dict()) {
    if (key == kTypeKey) {
      kind = kind_of(t);
      continue;
    }
    const auto entry = state_key(key);
    if (!entry) {
      hyper.emplace_back(key, t.clone());
      continue;
    }
    const auto& [i, field] = *entry;
    GRADWIRE_CHECK(i < names.size()) << "optimizer state '" << key << "' of parameter " << i
                                     << " past its " << names.size() << " parameters";
    Piece p{names[i] + "/" + field, t.detach().clone(), {}, 0};
    const bool split = !global_sizes.empty() && !global_sizes[i].empty() &&
                       t.sizes() == optimizer.params()[i].sizes();
    if (split) {
      p.global_sizes = global_sizes[i];
      p.row_offset = row_offsets.empty() ? 0 : row_offsets[i];
    }
    pieces.push_back(std::move(p));
  }
  state.optimizer_kind = kind;
  state.optimizer_hyper = std::move(hyper);
  for (Piece& p : pieces)
    state.optimizer.push_back(std::move(p));
}

void load_optimizer(optim::Optimizer& optimizer, const ShardState& state,
                    const std::vector<std::string>& names) {
  GRADWIRE_CHECK_ARG(names.size() == optimizer.params().size())
      << "checkpoint::load_optimizer: " << names.size() << " names for an optimizer of "
      << optimizer.params().size() << " parameters";
  GRADWIRE_CHECK_ARG(!state.optimizer_kind.empty())
      << "checkpoint::load_optimizer: the state holds no optimizer (its optimizer_kind is empty)";
  StateDict dict;
  Tensor type = empty({static_cast<int64_t>(state.optimizer_kind.size())}, TensorOptions(kUInt8));
  std::memcpy(type.data_ptr(), state.optimizer_kind.data(), state.optimizer_kind.size());
  dict.emplace_back(std::string(kTypeKey), type);
  for (const auto& entry : state.optimizer_hyper)
    dict.push_back(entry);
  for (const Piece& p : state.optimizer) {
    // The parameter an entry belongs to: the longest name in `names` followed by '/'.
    std::optional<size_t> owner;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& n = names[i];
      const bool match = p.name.size() > n.size() + 1 && p.name.compare(0, n.size(), n) == 0 &&
                         p.name[n.size()] == '/';
      if (match && (!owner || n.size() > names[*owner].size())) owner = i;
    }
    if (!owner) continue;
    dict.emplace_back(
        "state." + std::to_string(*owner) + "." + p.name.substr(names[*owner].size() + 1), p.value);
  }
  try {
    optimizer.load_state_dict(dict);
  } catch (const InvalidArgument& e) {
    GRADWIRE_THROW(InvalidArgument) << "checkpoint::load_optimizer: " << e.what();
  }
}

}  // namespace gradwire::checkpoint
