#include "gradwire/optim/sparse_adam.h"

#include <cmath>

#include "detail.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {
namespace {

const std::string kSparseAdam = "SparseAdam";

// SparseAdamOptions' fields as state-dict hyperparameters (detail.h).
constexpr auto kHypers = [](auto& o, auto&& f) {
  f("lr", o.lr);
  f("beta1", o.beta1);
  f("beta2", o.beta2);
  f("eps", o.eps);
};

SparseAdamState read_state(detail::StateReader& reader, size_t n) {
  SparseAdamState state;
  state.params.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (!reader.has(i)) continue;
    state.params[i].step = reader.step(i);
    state.params[i].exp_avg = reader.tensor(i, "exp_avg", true);
    state.params[i].exp_avg_sq = reader.tensor(i, "exp_avg_sq", true);
  }
  return state;
}

}  // namespace

void SparseAdamOptions::validate() const {
  GRADWIRE_CHECK_ARG(lr >= 0.0) << "SparseAdamOptions: lr must be >= 0, got " << lr;
  GRADWIRE_CHECK_ARG(eps >= 0.0) << "SparseAdamOptions: eps must be >= 0, got " << eps;
  GRADWIRE_CHECK_ARG(beta1 >= 0.0 && beta1 < 1.0)
      << "SparseAdamOptions: beta1 must be in [0, 1), got " << beta1;
  GRADWIRE_CHECK_ARG(beta2 >= 0.0 && beta2 < 1.0)
      << "SparseAdamOptions: beta2 must be in [0, 1), got " << beta2;
}

StateDict SparseAdamState::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < params.size(); ++i) {
    const SparseAdamParamState& s = params[i];
    if (!s.exp_avg.defined()) continue;
    out.emplace_back(detail::state_key(i, "step"), scalar_tensor(s.step, TensorOptions(kInt64)));
    out.emplace_back(detail::state_key(i, "exp_avg"), s.exp_avg.detach());
    out.emplace_back(detail::state_key(i, "exp_avg_sq"), s.exp_avg_sq.detach());
  }
  return out;
}

void SparseAdamState::load_state_dict(const StateDict& state, const std::vector<Tensor>& ps) {
  detail::StateReader reader("SparseAdam", state, ps);
  reader.skip_optimizer_entries();
  SparseAdamState loaded = read_state(reader, ps.size());
  reader.finish();
  *this = std::move(loaded);
}

void sparse_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      SparseAdamState& state, const SparseAdamOptions& o) {
  o.validate();
  detail::check_step_args("sparse_adam_step", params, grads, state.params.size());
  for (size_t i = 0; i < params.size(); ++i) {  // before any parameter moves
    if (grads[i].defined() && !grads[i].is_sparse()) {
      detail::refuse_dense("sparse_adam_step", i, params[i],
                           "which SparseAdam does not take (it updates sparse-rows gradients "
                           "only; step dense parameters with Adam)");
    }
  }
  state.params.resize(params.size());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Tensor& p = params[i];
    SparseAdamParamState& s = state.params[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = zeros_like(p);
      s.exp_avg_sq = zeros_like(p);
    }
    s.step += 1;
    const double t = static_cast<double>(s.step);
    const double bias_correction1 = 1.0 - std::pow(o.beta1, t);
    const double bias_correction2 = 1.0 - std::pow(o.beta2, t);
    detail::sparse_adam_update(
        p, grads[i], s.exp_avg, s.exp_avg_sq,
        {o.beta1, o.beta2, o.eps, o.lr * std::sqrt(bias_correction2) / bias_correction1});
  }
}

FunctionalSparseAdam::FunctionalSparseAdam(const SparseAdamOptions& options) : options_(options) {
  options_.validate();
}
const std::string& FunctionalSparseAdam::type_name() const {
  return kSparseAdam;
}
void FunctionalSparseAdam::step(const std::vector<Tensor>& params,
                                const std::vector<Tensor>& grads) {
  sparse_adam_step(params, grads, state_, options_);
}
void FunctionalSparseAdam::set_lr(double lr) {
  SparseAdamOptions o = options_;
  o.lr = lr;
  set_options(o);
}
void FunctionalSparseAdam::set_options(const SparseAdamOptions& options) {
  options.validate();
  options_ = options;
}
StateDict FunctionalSparseAdam::state_dict() const {
  return detail::save_optimizer(kSparseAdam, options_, kHypers, state_.state_dict());
}
void FunctionalSparseAdam::load_state_dict(const StateDict& state,
                                           const std::vector<Tensor>& params) {
  detail::load_optimizer(kSparseAdam, state, params, kHypers, read_state, options_, state_);
}

}  // namespace gradwire::optim
