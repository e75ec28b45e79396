// Adam and AdamW, with bias correction and the amsgrad variant (torch.optim.Adam and
// torch.optim.AdamW, 1.13).
//
// For each parameter p with gradient g, at step t (counted per parameter, from 1):
//   Adam:  g = g + weight_decay * p                   (L2 penalty, when weight_decay != 0)
//   AdamW: p = p * (1 - lr * weight_decay)            (decoupled weight decay)
//   m = beta1 * m + (1 - beta1) * g;   v = beta2 * v + (1 - beta2) * g^2
//   v_hat = max(v_max, v) when amsgrad (kept in v_max), else v
//   p = p - (lr / (1 - beta1^t)) * m / (sqrt(v_hat) / sqrt(1 - beta2^t) + eps)
//
// Errors: validate() throws InvalidArgument for lr < 0, eps < 0, a beta outside [0, 1),
// or weight_decay < 0; see optimizer.h for the parameter and gradient checks.
//
// Thread-safety: see optimizer.h.
//
// Example:
//   optim::Adam opt(net.parameters(), optim::AdamOptions{.lr = 1e-3, .amsgrad = true});
//   optim::FunctionalAdamW adamw(optim::AdamWOptions{});           // functional forms
//   adamw.step(params, grads);
//   optim::AdamState state;
//   optim::adamw_step(params, grads, state, optim::AdamWOptions{});
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/optimizer.h"

namespace gradwire::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  void validate() const;
};

// AdamW's defaults differ from Adam's only in weight_decay (1e-2, as PyTorch).
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool amsgrad = false;
  void validate() const;
};

struct AdamParamState {
  int64_t step = 0;       // steps taken by this parameter
  Tensor exp_avg;         // m
  Tensor exp_avg_sq;      // v
  Tensor max_exp_avg_sq;  // v_max (amsgrad only)
};

// Per-parameter state of Adam and AdamW (the same shape; either step may use it).
struct AdamState {
  std::vector<AdamParamState> params;

  // "state.<i>.step" / "exp_avg" / "exp_avg_sq" / "max_exp_avg_sq" for each stepped param.
  StateDict state_dict() const;
  // Replaces the state with the "state.*" entries of `state` ("type" and "hyper.*" are
  // ignored), checked against `params`.
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params);
};

void adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
               AdamState& state, const AdamOptions& options);
void adamw_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                AdamState& state, const AdamWOptions& options);

// Adam and AdamW as FunctionalOptimizers (functional_optimizer.h). Their state dicts
// differ in "type", so one never loads the other's.
class FunctionalAdam final : public FunctionalOptimizer {
 public:
  explicit FunctionalAdam(const AdamOptions& options = {});

  const std::string& type_name() const override;
  void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params) override;

  const AdamOptions& options() const { return options_; }
  void set_options(const AdamOptions& options);
  const AdamState& state() const { return state_; }

 private:
  AdamOptions options_;
  AdamState state_;
};

class FunctionalAdamW final : public FunctionalOptimizer {
 public:
  explicit FunctionalAdamW(const AdamWOptions& options = {});

  const std::string& type_name() const override;
  void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params) override;

  const AdamWOptions& options() const { return options_; }
  void set_options(const AdamWOptions& options);
  const AdamState& state() const { return state_; }

 private:
  AdamWOptions options_;
  AdamState state_;
};

class Adam : public TypedOptimizer<FunctionalAdam> {
 public:
  using TypedOptimizer::TypedOptimizer;
};

class AdamW : public TypedOptimizer<FunctionalAdamW> {
 public:
  using TypedOptimizer::TypedOptimizer;
};

}  // namespace gradwire::optim
