#include "gradwire/optim/adam.h"

#include <cmath>

#include "detail.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {
namespace {

const std::string kAdam = "Adam";
const std::string kAdamW = "AdamW";

// The hyperparameters both variants share; `decoupled` selects AdamW's weight decay.
struct Hyper {
  double lr, beta1, beta2, eps, weight_decay;
  bool amsgrad, decoupled;
};

// AdamOptions' and AdamWOptions' fields as state-dict hyperparameters (detail.h).
constexpr auto kHypers = [](auto& o, auto&& f) {
  f("lr", o.lr);
  f("beta1", o.beta1);
  f("beta2", o.beta2);
  f("eps", o.eps);
  f("weight_decay", o.weight_decay);
  f("amsgrad", o.amsgrad);
};

void validate(const char* what, double lr, double beta1, double beta2, double eps,
              double weight_decay) {
  GRADWIRE_CHECK_ARG(lr >= 0.0) << what << ": lr must be >= 0, got " << lr;
  GRADWIRE_CHECK_ARG(eps >= 0.0) << what << ": eps must be >= 0, got " << eps;
  GRADWIRE_CHECK_ARG(beta1 >= 0.0 && beta1 < 1.0)
      << what << ": beta1 must be in [0, 1), got " << beta1;
  GRADWIRE_CHECK_ARG(beta2 >= 0.0 && beta2 < 1.0)
      << what << ": beta2 must be in [0, 1), got " << beta2;
  GRADWIRE_CHECK_ARG(weight_decay >= 0.0)
      << what << ": weight_decay must be >= 0, got " << weight_decay;
}

// The tensor-op formulation: any device, dtype and layout.
void unfused_update(const Tensor& param, const Tensor& grad, AdamParamState& s, const Hyper& h,
                    double step_size, double bias_correction2_sqrt) {
  Tensor p = param;
  Tensor g = grad;
  if (h.weight_decay != 0.0) {
    if (h.decoupled) {
      p.mul_(1.0 - h.lr * h.weight_decay);
    } else {
      g = add(g, p, h.weight_decay);
    }
  }
  s.exp_avg.mul_(h.beta1).add_(g, 1.0 - h.beta1);
  s.exp_avg_sq.mul_(h.beta2).add_(square(g), 1.0 - h.beta2);
  Tensor denom;
  if (h.amsgrad) {
    s.max_exp_avg_sq.copy_(maximum(s.max_exp_avg_sq, s.exp_avg_sq));
    denom = sqrt(s.max_exp_avg_sq);
  } else {
    denom = sqrt(s.exp_avg_sq);
  }
  denom.div_(bias_correction2_sqrt).add_(h.eps);
  p.add_(div(s.exp_avg, denom), -step_size);
}

void step_impl(const char* op, const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               AdamState& state, const Hyper& h) {
  detail::check_step_args(op, params, grads, state.params.size());
  for (size_t i = 0; i < params.size(); ++i) {  // before any parameter moves
    if (grads[i].defined() && grads[i].is_sparse()) {
      detail::refuse_sparse(op, i, params[i],
                            "which Adam and AdamW do not take; use SparseAdam (sparse_adam.h)");
    }
  }
  state.params.resize(params.size());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    const Tensor& p = params[i];
    AdamParamState& s = state.params[i];
    if (!s.exp_avg.defined()) {
      s.exp_avg = zeros_like(p);
      s.exp_avg_sq = zeros_like(p);
    }
    if (h.amsgrad && !s.max_exp_avg_sq.defined()) s.max_exp_avg_sq = zeros_like(p);
    s.step += 1;
    const double t = static_cast<double>(s.step);
    const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
    const double bias_correction2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, t));
    const double step_size = h.lr / bias_correction1;
    const bool fused =
        h.amsgrad ? detail::fusable({&p, &grads[i], &s.exp_avg, &s.exp_avg_sq, &s.max_exp_avg_sq})
                  : detail::fusable({&p, &grads[i], &s.exp_avg, &s.exp_avg_sq});
    if (fused) {
      detail::fused_adam(p, grads[i], s.exp_avg, s.exp_avg_sq, s.max_exp_avg_sq,
                         {h.beta1, h.beta2, h.eps, h.weight_decay, h.amsgrad, h.decoupled, h.lr,
                          step_size, bias_correction2_sqrt});
    } else {
      unfused_update(p, grads[i], s, h, step_size, bias_correction2_sqrt);
    }
  }
}

AdamState read_state(detail::StateReader& reader, size_t n) {
  AdamState state;
  state.params.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (!reader.has(i)) continue;
    AdamParamState& s = state.params[i];
    s.step = reader.step(i);
    s.exp_avg = reader.tensor(i, "exp_avg", true);
    s.exp_avg_sq = reader.tensor(i, "exp_avg_sq", true);
    s.max_exp_avg_sq = reader.tensor(i, "max_exp_avg_sq", false);
  }
  return state;
}

}  // namespace

void AdamOptions::validate() const {
  optim::validate("AdamOptions", lr, beta1, beta2, eps, weight_decay);
}
void AdamWOptions::validate() const {
  optim::validate("AdamWOptions", lr, beta1, beta2, eps, weight_decay);
}

StateDict AdamState::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < params.size(); ++i) {
    const AdamParamState& s = params[i];
    if (s.step == 0 && !s.exp_avg.defined()) continue;
    out.emplace_back(detail::state_key(i, "step"), scalar_tensor(s.step, TensorOptions(kInt64)));
    out.emplace_back(detail::state_key(i, "exp_avg"), s.exp_avg.detach());
    out.emplace_back(detail::state_key(i, "exp_avg_sq"), s.exp_avg_sq.detach());
    if (s.max_exp_avg_sq.defined()) {
      out.emplace_back(detail::state_key(i, "max_exp_avg_sq"), s.max_exp_avg_sq.detach());
    }
  }
  return out;
}

void AdamState::load_state_dict(const StateDict& state, const std::vector<Tensor>& params_in) {
  detail::StateReader reader("Adam", state, params_in);
  reader.skip_optimizer_entries();
  AdamState loaded = read_state(reader, params_in.size());
  reader.finish();
  *this = std::move(loaded);
}

void adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               AdamState& state, const AdamOptions& o) {
  o.validate();
  step_impl("adam_step", params, grads, state,
            Hyper{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad, false});
}

void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                AdamState& state, const AdamWOptions& o) {
  o.validate();
  step_impl("adamw_step", params, grads, state,
            Hyper{o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.amsgrad, true});
}

// ---- FunctionalAdam

FunctionalAdam::FunctionalAdam(const AdamOptions& options) : options_(options) {
  options_.validate();
}
const std::string& FunctionalAdam::type_name() const {
  return kAdam;
}
void FunctionalAdam::step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  adam_step(params, grads, state_, options_);
}
void FunctionalAdam::set_lr(double lr) {
  AdamOptions o = options_;
  o.lr = lr;
  set_options(o);
}
void FunctionalAdam::set_options(const AdamOptions& options) {
  options.validate();
  options_ = options;
}
StateDict FunctionalAdam::state_dict() const {
  return detail::save_optimizer(kAdam, options_, kHypers, state_.state_dict());
}
void FunctionalAdam::load_state_dict(const StateDict& state, const std::vector<Tensor>& params) {
  detail::load_optimizer(kAdam, state, params, kHypers, read_state, options_, state_);
}

// ---- FunctionalAdamW

FunctionalAdamW::FunctionalAdamW(const AdamWOptions& options) : options_(options) {
  options_.validate();
}
const std::string& FunctionalAdamW::type_name() const {
  return kAdamW;
}
void FunctionalAdamW::step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  adamw_step(params, grads, state_, options_);
}
void FunctionalAdamW::set_lr(double lr) {
  AdamWOptions o = options_;
  o.lr = lr;
  set_options(o);
}
void FunctionalAdamW::set_options(const AdamWOptions& options) {
  options.validate();
  options_ = options;
}
StateDict FunctionalAdamW::state_dict() const {
  return detail::save_optimizer(kAdamW, options_, kHypers, state_.state_dict());
}
void FunctionalAdamW::load_state_dict(const StateDict& state, const std::vector<Tensor>& params) {
  detail::load_optimizer(kAdamW, state, params, kHypers, read_state, options_, state_);
}

}  // namespace gradwire::optim
