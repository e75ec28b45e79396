#include "gradwire/optim/optimizer.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <typeinfo>

#include "detail.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/zero_grad.h"

namespace gradwire::optim {

namespace {

constexpr const char* kGroupsKey = "param_groups";
constexpr const char* kGroupPrefix = "group.";
constexpr const char* kStatePrefix = "state.";
constexpr const char* kHyperPrefixKey = "hyper.";

bool starts_with(const std::string& s, const char* prefix) {
  return s.rfind(prefix, 0) == 0;
}

// The number that starts `s` at `pos` and is followed by '.', or nullopt.
std::optional<size_t> index_at(const std::string& s, size_t pos, size_t* end) {
  size_t i = pos;
  size_t value = 0;
  while (i < s.size() && s[i] >= '0' && s[i] <= '9' && i - pos < 9) {
    value = value * 10 + static_cast<size_t>(s[i] - '0');
    ++i;
  }
  if (i == pos || i >= s.size() || s[i] != '.') return std::nullopt;
  *end = i + 1;
  return value;
}

// "type" and "hyper.*": the kind and hyperparameters of a state dict, without its state.
StateDict spec_of(const StateDict& full) {
  StateDict spec;
  for (const auto& [key, t] : full) {
    if (key == "type" || starts_with(key, kHyperPrefixKey)) spec.emplace_back(key, t);
  }
  return spec;
}

}  // namespace

Optimizer::Optimizer(std::vector<Tensor> params, std::unique_ptr<FunctionalOptimizer> functional) {
  // Keeps gradwire::autograd loaded (see nn::Module's constructor: with shared libraries
  // and --as-needed nothing else here references it, and .grad() needs it).
  autograd::ensure_registered();
  GRADWIRE_CHECK_ARG(functional != nullptr) << "Optimizer: the functional optimizer is null";
  detail::check_params(functional->type_name().c_str(), params, /*need_requires_grad=*/true);
  defaults_ = spec_of(functional->state_dict());
  params_ = params;
  groups_.push_back(ParamGroup(std::move(params), std::move(functional)));
}

Optimizer::~Optimizer() = default;

void Optimizer::step() {
  std::vector<Tensor> grads;
  for (ParamGroup& group : groups_) {
    grads.clear();
    grads.reserve(group.params_.size());
    for (const Tensor& p : group.params_)
      grads.push_back(p.grad());
    group.optimizer_->step(group.params_, grads);
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  gradwire::zero_grad(params_, set_to_none);
}

void Optimizer::add_param_group(std::vector<Tensor> params) {
  add_param_group(params, make_functional_optimizer(defaults_, {}));
}

void Optimizer::add_param_group(std::vector<Tensor> params,
                                std::unique_ptr<FunctionalOptimizer> functional) {
  GRADWIRE_CHECK_ARG(functional != nullptr)
      << "Optimizer.add_param_group: the functional optimizer is null";
  const FunctionalOptimizer& first = groups_.front().optimizer();
  const FunctionalOptimizer& added = *functional;
  GRADWIRE_CHECK_ARG(typeid(added) == typeid(first))
      << "Optimizer.add_param_group: the new group's optimizer is a " << functional->type_name()
      << ", this optimizer is a " << first.type_name() << " (every group is of one kind)";
  detail::check_params(type_name().c_str(), params, /*need_requires_grad=*/true);
  std::map<const TensorImpl*, size_t> owner;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const Tensor& p : groups_[g].params_)
      owner.emplace(p.impl_ptr().get(), g);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = owner.find(params[i].impl_ptr().get());
    GRADWIRE_CHECK_ARG(it == owner.end())
        << "Optimizer.add_param_group: parameter " << i << " of the new group is already in group "
        << it->second << " (a parameter belongs to one group)";
  }
  params_.insert(params_.end(), params.begin(), params.end());
  groups_.push_back(ParamGroup(std::move(params), std::move(functional)));
}

ParamGroup& Optimizer::checked_group(size_t group) {
  GRADWIRE_CHECK_ARG(group < groups_.size())
      << "Optimizer: no parameter group " << group << " (there are " << groups_.size() << ")";
  return groups_[group];
}

const ParamGroup& Optimizer::checked_group(size_t group) const {
  GRADWIRE_CHECK_ARG(group < groups_.size())
      << "Optimizer: no parameter group " << group << " (there are " << groups_.size() << ")";
  return groups_[group];
}

double Optimizer::lr(size_t group) const {
  return checked_group(group).lr();
}

void Optimizer::set_lr(double lr) {
  set_group_lrs(std::vector<double>(groups_.size(), lr));
}

void Optimizer::set_lr(size_t group, double lr) {
  ParamGroup& g = checked_group(group);
  try {
    g.set_lr(lr);
  } catch (const InvalidArgument& e) {
    GRADWIRE_THROW(InvalidArgument) << "Optimizer.set_lr: group " << group << ": " << e.what();
  }
}

void Optimizer::set_group_lrs(const std::vector<double>& lrs) {
  GRADWIRE_CHECK_ARG(lrs.size() == groups_.size())
      << "Optimizer.set_group_lrs: " << lrs.size() << " learning rates for " << groups_.size()
      << " parameter groups";
  // Each group's kind validates its rate; one it rejects puts the groups already set back.
  std::vector<double> before;
  for (const ParamGroup& g : groups_)
    before.push_back(g.lr());
  for (size_t g = 0; g < groups_.size(); ++g) {
    try {
      groups_[g].set_lr(lrs[g]);
    } catch (const InvalidArgument& e) {
      for (size_t k = 0; k < g; ++k)
        groups_[k].set_lr(before[k]);
      GRADWIRE_THROW(InvalidArgument) << "Optimizer.set_lr: group " << g << ": " << e.what();
    }
  }
}

StateDict Optimizer::state_dict() const {
  if (groups_.size() == 1) return groups_.front().optimizer().state_dict();
  StateDict out;
  std::vector<int64_t> sizes;
  for (const ParamGroup& g : groups_)
    sizes.push_back(static_cast<int64_t>(g.params_.size()));
  bool typed = false;
  StateDict states;
  size_t offset = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (auto& [key, t] : groups_[g].optimizer().state_dict()) {
      size_t end = 0;
      if (key == "type") {
        if (!typed) {
          out.emplace_back(key, t);
          out.emplace_back(kGroupsKey, tensor<int64_t>(sizes));
          typed = true;
        }
      } else if (starts_with(key, kHyperPrefixKey)) {
        out.emplace_back(kGroupPrefix + std::to_string(g) + "." + key, t);
      } else if (auto i = index_at(key, std::char_traits<char>::length(kStatePrefix), &end);
                 starts_with(key, kStatePrefix) && i) {
        states.emplace_back(detail::state_key(offset + *i, key.substr(end)), t);
      } else {
        GRADWIRE_CHECK(false) << "Optimizer.state_dict: group " << g << "'s optimizer wrote '"
                              << key << "'";
      }
    }
    offset += groups_[g].params_.size();
  }
  for (auto& entry : states)
    out.push_back(std::move(entry));
  return out;
}

void Optimizer::load_state_dict(const StateDict& state) {
  const char* op = "Optimizer.load_state_dict";
  const Tensor* sizes = nullptr;
  for (const auto& [key, t] : state) {
    if (key == kGroupsKey) sizes = &t;
  }
  if (groups_.size() == 1 && sizes == nullptr) {
    groups_.front().optimizer().load_state_dict(state, groups_.front().params_);
    return;
  }
  GRADWIRE_CHECK_ARG(sizes != nullptr)
      << op << ": the state dict is of one parameter group (it has no '" << kGroupsKey
      << "' entry), this optimizer has " << groups_.size();
  GRADWIRE_CHECK_ARG(sizes->defined() && sizes->dtype() == kInt64 && sizes->dim() == 1)
      << op << ": '" << kGroupsKey << "' must be a 1-d int64 tensor of the groups' sizes";
  const Tensor counts = sizes->contiguous();
  std::vector<int64_t> saved(counts.data<int64_t>(), counts.data<int64_t>() + counts.numel());
  std::vector<int64_t> mine;
  for (const ParamGroup& g : groups_)
    mine.push_back(static_cast<int64_t>(g.params_.size()));
  if (saved != mine) {
    std::ostringstream os;
    os << op << ": the state dict's parameter groups have sizes [";
    for (size_t i = 0; i < saved.size(); ++i)
      os << (i ? ", " : "") << saved[i];
    os << "], this optimizer's [";
    for (size_t i = 0; i < mine.size(); ++i)
      os << (i ? ", " : "") << mine[i];
    os << "]";
    GRADWIRE_THROW(InvalidArgument) << os.str();
  }
  // Each group's part, under the keys its own optimizer reads.
  std::vector<StateDict> parts(groups_.size());
  std::vector<size_t> first(groups_.size() + 1, 0);
  for (size_t g = 0; g < groups_.size(); ++g)
    first[g + 1] = first[g] + groups_[g].params_.size();
  std::vector<std::string> unexpected;
  for (const auto& [key, t] : state) {
    size_t end = 0;
    if (key == kGroupsKey) continue;
    if (key == "type") {
      for (StateDict& part : parts)
        part.emplace_back(key, t);
    } else if (auto g = index_at(key, std::char_traits<char>::length(kGroupPrefix), &end);
               starts_with(key, kGroupPrefix) && g && *g < groups_.size() &&
               starts_with(key.substr(end), kHyperPrefixKey)) {
      parts[*g].emplace_back(key.substr(end), t);
    } else if (auto i = index_at(key, std::char_traits<char>::length(kStatePrefix), &end);
               starts_with(key, kStatePrefix) && i && *i < first.back()) {
      const size_t group =
          static_cast<size_t>(std::upper_bound(first.begin(), first.end(), *i) - first.begin()) - 1;
      parts[group].emplace_back(detail::state_key(*i - first[group], key.substr(end)), t);
    } else {
      unexpected.push_back(key);
    }
  }
  // Every part is checked on a scratch optimizer of this kind before any group changes.
  std::vector<std::string> problems;
  for (const std::string& key : unexpected)
    problems.push_back("unexpected key '" + key + "'");
  for (size_t g = 0; g < groups_.size(); ++g) {
    try {
      make_functional_optimizer(defaults_, {})->load_state_dict(parts[g], groups_[g].params_);
    } catch (const InvalidArgument& e) {
      problems.push_back("group " + std::to_string(g) + ": " + e.what());
    }
  }
  if (!problems.empty()) {
    std::ostringstream os;
    os << op << ": ";
    for (size_t i = 0; i < problems.size(); ++i)
      os << (i ? "; " : "") << problems[i];
    GRADWIRE_THROW(InvalidArgument) << os.str();
  }
  for (size_t g = 0; g < groups_.size(); ++g)
    groups_[g].optimizer().load_state_dict(parts[g], groups_[g].params_);
}

namespace detail {

void check_params(const char* op, const std::vector<Tensor>& params, bool need_requires_grad) {
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    GRADWIRE_CHECK_ARG(p.defined()) << op << ": parameter " << i << " is undefined";
    GRADWIRE_CHECK_ARG(p.is_floating_point())
        << op << ": parameter " << i << " has dtype " << p.dtype() << "; expected floating";
    GRADWIRE_CHECK_ARG(!need_requires_grad || p.requires_grad())
        << op << ": parameter " << i << " does not require grad";
    GRADWIRE_CHECK_ARG(p.is_leaf())
        << op << ": parameter " << i << " is not a leaf tensor (it has a grad_fn)";
    GRADWIRE_CHECK_ARG(seen.insert(p.impl_ptr().get()).second)
        << op << ": parameter " << i << " appears more than once";
  }
}

void check_step_args(const char* op, const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, size_t state_size) {
  GRADWIRE_CHECK_ARG(params.size() == grads.size())
      << op << ": " << params.size() << " parameters but " << grads.size() << " gradients";
  GRADWIRE_CHECK_ARG(state_size == 0 || state_size == params.size())
      << op << ": the state holds " << state_size << " parameters, the step was given "
      << params.size();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const Tensor& g = grads[i];
    GRADWIRE_CHECK_ARG(p.defined()) << op << ": parameter " << i << " is undefined";
    GRADWIRE_CHECK_ARG(p.is_floating_point())
        << op << ": parameter " << i << " has dtype " << p.dtype() << "; expected floating";
    if (!g.defined()) continue;
    GRADWIRE_CHECK_ARG(g.sizes() == p.sizes())
        << op << ": gradient " << i << " has shape " << g.shape_string() << ", its parameter "
        << p.shape_string();
    GRADWIRE_CHECK_ARG(g.dtype() == p.dtype()) << op << ": gradient " << i << " has dtype "
                                               << g.dtype() << ", its parameter " << p.dtype();
  }
}

std::string state_key(size_t i, const std::string& field) {
  return "state." + std::to_string(i) + "." + field;
}

namespace {
constexpr const char* kTypeKey = "type";
constexpr const char* kHyperPrefix = "hyper.";

bool is_optimizer_entry(const std::string& key) {
  return key == kTypeKey || key.compare(0, 6, kHyperPrefix) == 0;
}
}  // namespace

void put_type(StateDict& out, const std::string& type_name) {
  const std::vector<uint8_t> chars(type_name.begin(), type_name.end());
  out.emplace_back(kTypeKey, tensor<uint8_t>(chars));
}

void put_hyper(StateDict& out, const char* name, double value) {
  out.emplace_back(std::string(kHyperPrefix) + name, scalar_tensor(value, TensorOptions(kFloat64)));
}

void put_hyper(StateDict& out, const char* name, bool value) {
  out.emplace_back(std::string(kHyperPrefix) + name, scalar_tensor(value, TensorOptions(kBool)));
}

void throw_bad_hyper(const char* op, const std::string& message) {
  GRADWIRE_THROW(InvalidArgument) << op << ".load_state_dict: bad hyperparameter: " << message;
}

StateReader::StateReader(const char* op, const StateDict& state, const std::vector<Tensor>& params)
    : op_(op), state_(state), params_(params), used_(state.size(), false) {}

const Tensor* StateReader::find(const std::string& key) {
  for (size_t k = 0; k < state_.size(); ++k) {
    if (state_[k].first != key) continue;
    used_[k] = true;
    return &state_[k].second;
  }
  return nullptr;
}

bool StateReader::has(size_t i) const {
  const std::string prefix = "state." + std::to_string(i) + ".";
  for (const auto& entry : state_) {
    if (entry.first.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

Tensor StateReader::tensor(size_t i, const std::string& field, bool required) {
  const std::string key = state_key(i, field);
  const Tensor* found = find(key);
  if (found == nullptr) {
    if (required) errors_.push_back("missing key '" + key + "'");
    return Tensor();
  }
  const Tensor& t = *found;
  const Tensor& p = params_[i];
  if (!t.defined()) {
    errors_.push_back("'" + key + "' is an undefined tensor");
  } else if (t.dtype() != p.dtype()) {
    std::ostringstream os;
    os << "'" << key << "' has dtype " << t.dtype() << ", parameter " << i << " has " << p.dtype();
    errors_.push_back(os.str());
  } else if (t.sizes() != p.sizes()) {
    errors_.push_back("'" + key + "' has shape " + t.shape_string() + ", parameter " +
                      std::to_string(i) + " has " + p.shape_string());
  } else {
    // A private contiguous copy on the parameter's device: the loaded state must not
    // alias the caller's tensors, and the fused updates want contiguous state.
    return t.detach().to(p.device()).contiguous().clone();
  }
  return Tensor();
}

int64_t StateReader::step(size_t i) {
  const std::string key = state_key(i, "step");
  const Tensor* found = find(key);
  if (found == nullptr) {
    errors_.push_back("missing key '" + key + "'");
    return 0;
  }
  const Tensor& t = *found;
  if (!t.defined() || t.dtype() != kInt64 || t.numel() != 1) {
    errors_.push_back("'" + key + "' must be a one-element int64 tensor");
    return 0;
  }
  const auto v = t.item<int64_t>();
  if (v < 0) errors_.push_back("'" + key + "' is negative (" + std::to_string(v) + ")");
  return v;
}

void StateReader::type(const std::string& expected) {
  const Tensor* found = find(kTypeKey);
  if (found == nullptr) {
    errors_.push_back(std::string("missing key '") + kTypeKey + "' (the optimizer's kind)");
    return;
  }
  const Tensor& t = *found;
  if (!t.defined() || t.dtype() != kUInt8 || t.dim() != 1) {
    errors_.push_back(std::string("'") + kTypeKey +
                      "' must be a 1-d uint8 tensor holding the optimizer's name");
    return;
  }
  const Tensor c = t.contiguous();
  const std::string name(static_cast<const char*>(c.data_ptr()), c.nbytes());
  if (name != expected) {
    errors_.push_back("the state dict is of type '" + name + "', this optimizer is '" + expected +
                      "'");
  }
}

double StateReader::number(const char* name, double fallback) {
  const std::string key = std::string(kHyperPrefix) + name;
  const Tensor* found = find(key);
  if (found == nullptr) {
    errors_.push_back("missing key '" + key + "'");
    return fallback;
  }
  if (!found->defined() || found->dtype() != kFloat64 || found->numel() != 1) {
    errors_.push_back("'" + key + "' must be a one-element float64 tensor" +
                      (found->defined() ? ", got " + std::string(dtype_name(found->dtype())) + " " +
                                              found->shape_string()
                                        : std::string(", got an undefined tensor")));
    return fallback;
  }
  return found->item<double>();
}

bool StateReader::flag(const char* name, bool fallback) {
  const std::string key = std::string(kHyperPrefix) + name;
  const Tensor* found = find(key);
  if (found == nullptr) {
    errors_.push_back("missing key '" + key + "'");
    return fallback;
  }
  if (!found->defined() || found->dtype() != kBool || found->numel() != 1) {
    errors_.push_back("'" + key + "' must be a one-element bool tensor" +
                      (found->defined() ? ", got " + std::string(dtype_name(found->dtype())) + " " +
                                              found->shape_string()
                                        : std::string(", got an undefined tensor")));
    return fallback;
  }
  return found->item<bool>();
}

void StateReader::skip_optimizer_entries() {
  for (size_t k = 0; k < state_.size(); ++k) {
    if (is_optimizer_entry(state_[k].first)) used_[k] = true;
  }
}

void StateReader::finish() {
  for (size_t k = 0; k < state_.size(); ++k) {
    if (!used_[k]) errors_.push_back("unexpected key '" + state_[k].first + "'");
  }
  if (errors_.empty()) return;
  std::ostringstream os;
  os << op_ << ".load_state_dict: " << errors_.size() << " problem"
     << (errors_.size() == 1 ? "" : "s") << ": ";
  for (size_t i = 0; i < errors_.size(); ++i)
    os << (i ? "; " : "") << errors_[i];
  GRADWIRE_THROW(InvalidArgument) << os.str();
}

}  // namespace detail
}  // namespace gradwire::optim
