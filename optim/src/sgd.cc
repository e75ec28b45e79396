#include "gradwire/optim/sgd.h"

#include "detail.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {
namespace {

const std::string kSGD = "SGD";

// The options' fields as state-dict hyperparameters (detail.h), for writing and reading.
constexpr auto kHypers = [](auto& o, auto&& f) {
  f("lr", o.lr);
  f("momentum", o.momentum);
  f("dampening", o.dampening);
  f("weight_decay", o.weight_decay);
  f("nesterov", o.nesterov);
};

SGDState read_state(detail::StateReader& reader, size_t n) {
  SGDState state;
  state.momentum_buffers.resize(n);
  for (size_t i = 0; i < n; ++i)
    state.momentum_buffers[i] = reader.tensor(i, "momentum_buffer", /*required=*/false);
  return state;
}

}  // namespace

void SGDOptions::validate() const {
  GRADWIRE_CHECK_ARG(lr >= 0.0) << "SGDOptions: lr must be >= 0, got " << lr;
  GRADWIRE_CHECK_ARG(momentum >= 0.0) << "SGDOptions: momentum must be >= 0, got " << momentum;
  GRADWIRE_CHECK_ARG(dampening >= 0.0 && dampening <= 1.0)
      << "SGDOptions: dampening must be in [0, 1], got " << dampening;
  GRADWIRE_CHECK_ARG(weight_decay >= 0.0)
      << "SGDOptions: weight_decay must be >= 0, got " << weight_decay;
  GRADWIRE_CHECK_ARG(!nesterov || (momentum > 0.0 && dampening == 0.0))
      << "SGDOptions: nesterov needs momentum > 0 and dampening == 0, got momentum " << momentum
      << " and dampening " << dampening;
}

StateDict SGDState::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < momentum_buffers.size(); ++i) {
    if (momentum_buffers[i].defined()) {
      out.emplace_back(detail::state_key(i, "momentum_buffer"), momentum_buffers[i].detach());
    }
  }
  return out;
}

void SGDState::load_state_dict(const StateDict& state, const std::vector<Tensor>& params) {
  detail::StateReader reader("SGD", state, params);
  reader.skip_optimizer_entries();
  SGDState loaded = read_state(reader, params.size());
  reader.finish();
  *this = std::move(loaded);
}

void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, SGDState& state,
              const SGDOptions& options) {
  options.validate();
  detail::check_step_args("sgd_step", params, grads, state.momentum_buffers.size());
  const bool momentum = options.momentum != 0.0;
  for (size_t i = 0; i < params.size(); ++i) {  // before any parameter moves
    if (grads[i].defined() && grads[i].is_sparse() && (momentum || options.weight_decay != 0.0)) {
      detail::refuse_sparse("sgd_step", i, params[i],
                            "which SGD takes only without momentum and weight decay (momentum " +
                                std::to_string(options.momentum) + ", weight_decay " +
                                std::to_string(options.weight_decay) + "), as PyTorch");
    }
  }
  state.momentum_buffers.resize(params.size());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    Tensor p = params[i];  // a handle: updates land in the caller's tensor
    if (grads[i].is_sparse()) {
      detail::sgd_sparse_update(p, grads[i], options.lr);
      continue;
    }
    Tensor& buf = state.momentum_buffers[i];
    if (detail::fusable({&p, &grads[i]}) &&
        (!momentum || !buf.defined() || detail::fusable({&p, &buf}))) {
      const bool first = momentum && !buf.defined();
      if (first) buf = empty_like(p);
      detail::fused_sgd(p, grads[i], buf,
                        {options.lr, options.momentum, options.dampening, options.weight_decay,
                         options.nesterov, first});
      continue;
    }
    Tensor d_p = grads[i];
    if (options.weight_decay != 0.0) d_p = add(d_p, p, options.weight_decay);
    if (momentum) {
      if (!buf.defined()) {
        buf = d_p.clone();
      } else {
        buf.mul_(options.momentum).add_(d_p, 1.0 - options.dampening);
      }
      d_p = options.nesterov ? add(d_p, buf, options.momentum) : buf;
    }
    p.add_(d_p, -options.lr);
  }
}

FunctionalSGD::FunctionalSGD(const SGDOptions& options) : options_(options) {
  options_.validate();
}

const std::string& FunctionalSGD::type_name() const {
  return kSGD;
}

void FunctionalSGD::step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  sgd_step(params, grads, state_, options_);
}

void FunctionalSGD::set_lr(double lr) {
  SGDOptions o = options_;
  o.lr = lr;
  set_options(o);
}

void FunctionalSGD::set_options(const SGDOptions& options) {
  options.validate();
  options_ = options;
}

StateDict FunctionalSGD::state_dict() const {
  return detail::save_optimizer(kSGD, options_, kHypers, state_.state_dict());
}

void FunctionalSGD::load_state_dict(const StateDict& state, const std::vector<Tensor>& params) {
  detail::load_optimizer(kSGD, state, params, kHypers, read_state, options_, state_);
}

}  // namespace gradwire::optim
