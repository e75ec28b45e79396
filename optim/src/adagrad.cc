#include "gradwire/optim/adagrad.h"

#include "detail.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {
namespace {

const std::string kAdagrad = "Adagrad";

// AdagradOptions' fields as state-dict hyperparameters (detail.h).
constexpr auto kHypers = [](auto& o, auto&& f) {
  f("lr", o.lr);
  f("lr_decay", o.lr_decay);
  f("weight_decay", o.weight_decay);
  f("initial_accumulator_value", o.initial_accumulator_value);
  f("eps", o.eps);
};

AdagradState read_state(detail::StateReader& reader, size_t n) {
  AdagradState state;
  state.params.resize(n);
  for (size_t i = 0; i < n; ++i) {
    if (!reader.has(i)) continue;
    state.params[i].step = reader.step(i);
    state.params[i].sum = reader.tensor(i, "sum", true);
  }
  return state;
}

}  // namespace

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
  reader.skip_optimizer_entries();
  AdagradState loaded = read_state(reader, ps.size());
  reader.finish();
  *this = std::move(loaded);
}

void adagrad_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  AdagradState& state, const AdagradOptions& o) {
  o.validate();
  detail::check_step_args("adagrad_step", params, grads, state.params.size());
  for (size_t i = 0; i < params.size(); ++i) {  // before any parameter moves
    if (grads[i].defined() && grads[i].is_sparse() && o.weight_decay != 0.0) {
      detail::refuse_sparse("adagrad_step", i, params[i],
                            "which Adagrad takes only without weight decay (weight_decay " +
                                std::to_string(o.weight_decay) + "), as PyTorch");
    }
  }
  state.params.resize(params.size());
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    if (!grads[i].defined()) continue;
    Tensor p = params[i];  // a handle: updates land in the caller's tensor
    AdagradParamState& s = state.params[i];
    if (!s.sum.defined()) s.sum = full_like(p, o.initial_accumulator_value);
    s.step += 1;
    const double clr = o.lr / (1.0 + static_cast<double>(s.step - 1) * o.lr_decay);
    if (grads[i].is_sparse()) {
      detail::adagrad_sparse_update(p, grads[i], s.sum, clr, o.eps);
      continue;
    }
    if (detail::fusable({&p, &grads[i], &s.sum})) {
      detail::fused_adagrad(p, grads[i], s.sum, {clr, o.eps, o.weight_decay});
      continue;
    }
    Tensor g = grads[i];
    if (o.weight_decay != 0.0) g = add(g, p, o.weight_decay);
    s.sum.add_(square(g));
    Tensor std = sqrt(s.sum);
    std.add_(o.eps);
    p.add_(div(g, std), -clr);
  }
}

FunctionalAdagrad::FunctionalAdagrad(const AdagradOptions& options) : options_(options) {
  options_.validate();
}
const std::string& FunctionalAdagrad::type_name() const {
  return kAdagrad;
}
void FunctionalAdagrad::step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
  adagrad_step(params, grads, state_, options_);
}
void FunctionalAdagrad::set_lr(double lr) {
  AdagradOptions o = options_;
  o.lr = lr;
  set_options(o);
}
void FunctionalAdagrad::set_options(const AdagradOptions& options) {
  options.validate();
  options_ = options;
}
StateDict FunctionalAdagrad::state_dict() const {
  return detail::save_optimizer(kAdagrad, options_, kHypers, state_.state_dict());
}
void FunctionalAdagrad::load_state_dict(const StateDict& state, const std::vector<Tensor>& params) {
  detail::load_optimizer(kAdagrad, state, params, kHypers, read_state, options_, state_);
}

}  // namespace gradwire::optim
