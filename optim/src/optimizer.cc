#include "gradwire/optim/optimizer.h"

#include <set>
#include <sstream>

#include "detail.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/zero_grad.h"

namespace gradwire::optim {

Optimizer::Optimizer(std::vector<Tensor> params, std::unique_ptr<FunctionalOptimizer> functional)
    : params_(std::move(params)), functional_(std::move(functional)) {
  // Keeps gradwire::autograd loaded (see nn::Module's constructor: with shared libraries
  // and --as-needed nothing else here references it, and .grad() needs it).
  autograd::ensure_registered();
  GRADWIRE_CHECK_ARG(functional_ != nullptr) << "Optimizer: the functional optimizer is null";
  detail::check_params(functional_->type_name().c_str(), params_, /*need_requires_grad=*/true);
}

Optimizer::~Optimizer() = default;

void Optimizer::step() {
  std::vector<Tensor> grads;
  grads.reserve(params_.size());
  for (const Tensor& p : params_)
    grads.push_back(p.grad());
  functional_->step(params_, grads);
}

void Optimizer::zero_grad(bool set_to_none) {
  gradwire::zero_grad(params_, set_to_none);
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
