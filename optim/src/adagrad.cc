#include "gradwire/optim/adagrad.h"

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {

void AdagradOptions::validate() const {
  GRADWIRE_CHECK_ARG(lr >= 0.0) << "AdagradOptions: lr must be >= 0, got " << lr;
  GRADWIRE_CHECK_ARG(lr_decay >= 0.0) << "AdagradOptions: lr_decay must be >= 0, got " << lr_decay;
  GRADWIRE_CHECK_ARG(weight_decay >= 0.0)
      << "AdagradOptions: weight_decay must be >= 0, got " << weight_decay;
  GRADWIRE_CHECK_ARG(initial_accumulator_value >= 0.0)
      << "AdagradOptions: initial_accumulator_value must be >= 0, got "
      << initial_accumulator_value;
  GRADWIRE_CHECK_ARG(eps >= 0.0) << "AdagradOptions: eps must be >= 0, got " << eps;
}

StateDict AdagradState::state_dict() const {
  StateDict out;
  for (size_t i = 0; i < params.size(); ++i) {
    const AdagradParamState& s = params[i];
    if (!s.sum.defined()) continue;
    out.emplace_back(detail::state_key(i, "step"), scalar_tensor(s.step, TensorOptions(kInt64)));
    out.emplace_back(detail::state_key(i, "sum"), s.sum.detach());
  }
  return out;
}

void AdagradState::load_state_dict(const StateDict& state, const std::vector<Tensor>& ps) {
  detail::StateReader reader("Adagrad", state, ps);
  std::vector<AdagradParamState> loaded(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    if (!reader.has(i)) continue;
    loaded[i].step = reader.step(i);
    loaded[i].sum = reader.tensor(i, "sum", true);
  }
  reader.finish();
  params = std::move(loaded);
}

void adagrad_step(std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  AdagradState& state, const AdagradOptions& o) {
  o.validate();
  detail::check_step_args("adagrad_step", params, grads, state.params.size());
  state.params.resize(params.size());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    Tensor& p = params[i];
    Tensor g = grads[i];
    AdagradParamState& s = state.params[i];
    if (!s.sum.defined()) s.sum = full_like(p, o.initial_accumulator_value);
    s.step += 1;
    if (o.weight_decay != 0.0) g = add(g, p, o.weight_decay);
    const double clr = o.lr / (1.0 + static_cast<double>(s.step - 1) * o.lr_decay);
    s.sum.add_(square(g));
    Tensor std = sqrt(s.sum);
    std.add_(o.eps);
    p.add_(div(g, std), -clr);
  }
}

Adagrad::Adagrad(std::vector<Tensor> params, const AdagradOptions& options)
    : Optimizer(std::move(params), "Adagrad"), options_(options) {
  options_.validate();
}
void Adagrad::set_options(const AdagradOptions& options) {
  options.validate();
  options_ = options;
}
void Adagrad::step() {
  std::vector<Tensor> g = grads();
  adagrad_step(params_, g, state_, options_);
}

}  // namespace gradwire::optim
