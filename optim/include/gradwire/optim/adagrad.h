// Adagrad (torch.optim.Adagrad, 1.13).
//
// For each parameter p with gradient g, at step t (per parameter, from 1):
//   g = g + weight_decay * p                    (when weight_decay != 0)
//   clr = lr / (1 + (t - 1) * lr_decay)
//   sum = sum + g^2                             (sum starts at initial_accumulator_value)
//   p = p - clr * g / (sqrt(sum) + eps)
//
// Errors: validate() throws InvalidArgument for lr < 0, lr_decay < 0, weight_decay < 0,
// initial_accumulator_value < 0 or eps < 0; see optimizer.h for the other checks.
//
// Thread-safety: see optimizer.h.
//
// Example:
//   optim::Adagrad opt(emb.parameters(), optim::AdagradOptions{.lr = 0.1});
//   opt.step();
//   optim::FunctionalAdagrad ada(optim::AdagradOptions{.lr = 0.1});  // functional form
//   ada.step(params, grads);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/optimizer.h"

namespace gradwire::optim {

struct AdagradOptions {
  double lr = 1e-2;
  double lr_decay = 0.0;
  double weight_decay = 0.0;
  double initial_accumulator_value = 0.0;
  double eps = 1e-10;
  void validate() const;
};

struct AdagradParamState {
  int64_t step = 0;
  Tensor sum;  // running sum of squared gradients
};

struct AdagradState {
  std::vector<AdagradParamState> params;

  // "state.<i>.step" and "state.<i>.sum" for each stepped parameter.
  StateDict state_dict() const;
  // Replaces the state with the "state.*" entries of `state` ("type" and "hyper.*" are
  // ignored), checked against `params`.
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params);
};

void adagrad_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                  AdagradState& state, const AdagradOptions& options);

// Adagrad as a FunctionalOptimizer (functional_optimizer.h).
class FunctionalAdagrad final : public FunctionalOptimizer {
 public:
  explicit FunctionalAdagrad(const AdagradOptions& options = {});

  const std::string& type_name() const override;
  void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params) override;

  const AdagradOptions& options() const { return options_; }
  void set_options(const AdagradOptions& options);
  const AdagradState& state() const { return state_; }

 private:
  AdagradOptions options_;
  AdagradState state_;
};

class Adagrad : public TypedOptimizer<FunctionalAdagrad> {
 public:
  using TypedOptimizer::TypedOptimizer;
};

}  // namespace gradwire::optim
