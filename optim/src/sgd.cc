#include "gradwire/optim/sgd.h"

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {

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
  std::vector<Tensor> buffers(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    buffers[i] = reader.tensor(i, "momentum_buffer", /*required=*/false);
  }
  reader.finish();
  momentum_buffers = std::move(buffers);
}

void sgd_step(std::vector<Tensor>& params, const std::vector<Tensor>& grads, SGDState& state,
              const SGDOptions& options) {
  options.validate();
  detail::check_step_args("sgd_step", params, grads, state.momentum_buffers.size());
  state.momentum_buffers.resize(params.size());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    Tensor& p = params[i];
    Tensor d_p = grads[i];
    if (options.weight_decay != 0.0) d_p = add(d_p, p, options.weight_decay);
    if (options.momentum != 0.0) {
      Tensor& buf = state.momentum_buffers[i];
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

SGD::SGD(std::vector<Tensor> params, const SGDOptions& options)
    : Optimizer(std::move(params), "SGD"), options_(options) {
  options_.validate();
}

void SGD::set_options(const SGDOptions& options) {
  options.validate();
  options_ = options;
}

void SGD::step() {
  std::vector<Tensor> g = grads();
  sgd_step(params_, g, state_, options_);
}

}  // namespace gradwire::optim
