#include "gradwire/optim/optimizer.h"

#include <set>
#include <sstream>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"

namespace gradwire::optim {

Optimizer::Optimizer(std::vector<Tensor> params, std::string type_name)
    : params_(std::move(params)), type_name_(std::move(type_name)) {
  // Keeps gradwire::autograd loaded (see nn::Module's constructor: with shared libraries
  // and --as-needed nothing else here references it, and .grad() needs it).
  autograd::ensure_registered();
  detail::check_params(type_name_.c_str(), params_, /*need_requires_grad=*/true);
}

void Optimizer::zero_grad(bool set_to_none) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
}

std::vector<Tensor> Optimizer::grads() const {
  std::vector<Tensor> out;
  out.reserve(params_.size());
  for (const Tensor& p : params_)
    out.push_back(p.grad());
  return out;
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

StateReader::StateReader(const char* op, const StateDict& state, const std::vector<Tensor>& params)
    : op_(op), state_(state), params_(params), used_(state.size(), false) {}

bool StateReader::has(size_t i) const {
  const std::string prefix = "state." + std::to_string(i) + ".";
  for (const auto& entry : state_) {
    if (entry.first.compare(0, prefix.size(), prefix) == 0) return true;
  }
  return false;
}

Tensor StateReader::tensor(size_t i, const std::string& field, bool required) {
  const std::string key = state_key(i, field);
  for (size_t k = 0; k < state_.size(); ++k) {
    if (state_[k].first != key) continue;
    used_[k] = true;
    const Tensor& t = state_[k].second;
    const Tensor& p = params_[i];
    if (!t.defined()) {
      errors_.push_back("'" + key + "' is an undefined tensor");
    } else if (t.dtype() != p.dtype()) {
      std::ostringstream os;
      os << "'" << key << "' has dtype " << t.dtype() << ", parameter " << i << " has "
         << p.dtype();
      errors_.push_back(os.str());
    } else if (t.sizes() != p.sizes()) {
      errors_.push_back("'" + key + "' has shape " + t.shape_string() + ", parameter " +
                        std::to_string(i) + " has " + p.shape_string());
    } else {
      // A private copy on the parameter's device: the loaded state must not alias the
      // caller's tensors.
      return t.detach().to(p.device()).clone();
    }
    return Tensor();
  }
  if (required) errors_.push_back("missing key '" + key + "'");
  return Tensor();
}

int64_t StateReader::step(size_t i) {
  const std::string key = state_key(i, "step");
  for (size_t k = 0; k < state_.size(); ++k) {
    if (state_[k].first != key) continue;
    used_[k] = true;
    const Tensor& t = state_[k].second;
    if (!t.defined() || t.dtype() != kInt64 || t.numel() != 1) {
      errors_.push_back("'" + key + "' must be a one-element int64 tensor");
      return 0;
    }
    const auto v = t.item<int64_t>();
    if (v < 0) errors_.push_back("'" + key + "' is negative (" + std::to_string(v) + ")");
    return v;
  }
  errors_.push_back("missing key '" + key + "'");
  return 0;
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
