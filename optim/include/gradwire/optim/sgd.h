// SGD with momentum, dampening, Nesterov momentum and weight decay (torch.optim.SGD, 1.13).
//
// For each parameter p with gradient g (PyTorch's update, step for step):
//   g = g + weight_decay * p                          (when weight_decay != 0)
//   buf = g (first step) | momentum * buf + (1 - dampening) * g   (when momentum != 0)
//   g = g + momentum * buf (nesterov) | buf                        (when momentum != 0)
//   p = p - lr * g
//
// Errors: SGDOptions::validate() throws InvalidArgument for lr < 0, momentum < 0,
// weight_decay < 0, dampening outside [0, 1], or nesterov with momentum == 0 or
// dampening != 0 (each message names the option and the value); see optimizer.h for the
// parameter and gradient checks.
//
// Thread-safety: see optimizer.h.
//
// Example:
//   optim::SGDOptions o{.lr = 0.1, .momentum = 0.9, .nesterov = true};
//   optim::SGD opt(net.parameters(), o);
//   opt.step();
//   // functional forms, as the distributed optimizer uses them:
//   optim::FunctionalSGD sgd(o);
//   sgd.step(params, grads);
//   optim::SGDState state;
//   optim::sgd_step(params, grads, state, o);
#pragma once

#include <string>
#include <vector>

#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/optimizer.h"

namespace gradwire::optim {

struct SGDOptions {
  double lr = 0.01;  // torch.optim.SGD has no default; 0.01 is torch.optim's usual one
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  void validate() const;
};

// Per-parameter momentum buffers (undefined until a parameter's first step with momentum).
struct SGDState {
  std::vector<Tensor> momentum_buffers;

  // "state.<i>.momentum_buffer" for each parameter that has one.
  StateDict state_dict() const;
  // Replaces the state with the "state.*" entries of `state`, checked against `params`
  // (see optimizer.h); "type" and "hyper.*" entries, if any, are ignored.
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params);
};

// One SGD step over params[i] with grads[i] (undefined grads are skipped), in place.
void sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads, SGDState& state,
              const SGDOptions& options);

// SGD as a FunctionalOptimizer (functional_optimizer.h): options and state in one object.
class FunctionalSGD final : public FunctionalOptimizer {
 public:
  explicit FunctionalSGD(const SGDOptions& options = {});

  const std::string& type_name() const override;
  void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params) override;

  const SGDOptions& options() const { return options_; }
  // Changes the options (a learning-rate schedule); validated.
  void set_options(const SGDOptions& options);
  const SGDState& state() const { return state_; }

 private:
  SGDOptions options_;
  SGDState state_;
};

class SGD : public TypedOptimizer<FunctionalSGD> {
 public:
  using TypedOptimizer::TypedOptimizer;
};

}  // namespace gradwire::optim
