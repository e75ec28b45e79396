// FunctionalOptimizer: any of SGD, Adam, AdamW, Adagrad and SparseAdam behind one
// interface -- a step over explicit (param, grad) lists, the per-parameter state that step
// keeps, and a state dict that holds the whole optimizer (kind, hyperparameters and state).
//
// Why: a distributed optimizer applies gradients taken from a dist-autograd context, not
// from .grad(), and holds whichever optimizer its user chose; through this interface it
// needs no switch over the kinds and no dynamic_cast chain. The optimizer objects
// (optim::SGD, ...; optimizer.h) are thin shells over the same classes, so an object and
// a functional optimizer given the same gradients compute the same bits.
//
// The concrete kinds are FunctionalSGD (sgd.h), FunctionalAdam and FunctionalAdamW
// (adam.h), FunctionalAdagrad (adagrad.h) and FunctionalSparseAdam (sparse_adam.h);
// make_functional_optimizer() builds one from its options, or rebuilds one from a saved
// state dict. SGD (without momentum and weight decay), Adagrad (without weight decay) and
// SparseAdam take sparse-rows gradients (tensor/sparse.h) and update only their rows;
// SparseAdam takes nothing else; Adam and AdamW refuse them, naming the parameter.
//
// State dict: the entries, in this order,
//   "type"               1-d uint8 tensor: the kind's name ("SGD", "Adam", "AdamW", "Adagrad",
//                        "SparseAdam")
//   "hyper.<name>"       0-d float64 per numeric hyperparameter ("hyper.lr", ...), 0-d bool
//                        per switch ("hyper.nesterov", "hyper.amsgrad")
//   "state.<i>.<field>"  the state of parameter i, for each parameter that has any (step
//                        counts are 0-d int64)
// so that save -> load round-trips the optimizer: load_state_dict() replaces the
// hyperparameters as well as the state (as PyTorch's param_groups do); change them after
// a load with set_lr() or the kind's set_options().
//
// Errors: step() as the functional steps (optimizer.h). load_state_dict() validates
// everything before it changes anything and throws one InvalidArgument listing every
// problem: a missing key (the type, a hyperparameter, a required state field), an
// unexpected key, a type naming another kind, a hyperparameter that is not a one-element
// float64 (bool for switches) tensor or whose value its options reject (negative lr, a
// beta outside [0, 1), ...), a state tensor whose shape or dtype differs from its
// parameter's. make_functional_optimizer(saved, params) also rejects an unknown type.
//
// Thread-safety: one thread at a time. A FunctionalOptimizer keeps mutable state; calls on
// one object (step, load_state_dict, set_lr, state_dict) must not overlap, and a step must
// not overlap a forward or backward pass over the same parameters. Distinct objects are
// independent.
//
// Example:
//   std::unique_ptr<optim::FunctionalOptimizer> opt =
//       optim::make_functional_optimizer(optim::AdamWOptions{.lr = 1e-3});
//   opt->step(params, grads);                       // grads from a dist-autograd context
//   nn::save(opt->state_dict(), "opt.gw");
//   auto again = optim::make_functional_optimizer(nn::load("opt.gw"), params);
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "gradwire/tensor/state_dict.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::optim {

using StateDict = gradwire::StateDict;

class FunctionalOptimizer {
 public:
  virtual ~FunctionalOptimizer() = default;
  FunctionalOptimizer(const FunctionalOptimizer&) = delete;
  FunctionalOptimizer& operator=(const FunctionalOptimizer&) = delete;

  // "SGD", "Adam", "AdamW", "Adagrad" or "SparseAdam".
  virtual const std::string& type_name() const = 0;

  // One update of params[i] with grads[i], in place (the tensors are not rebound: handles
  // held elsewhere see the new values). An undefined gradient skips its parameter, state
  // included. The first step sizes the state to params.size(); later steps must pass as
  // many parameters, in the same order.
  virtual void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) = 0;

  // The learning rate, the one hyperparameter every kind has (what a schedule changes).
  virtual double lr() const = 0;
  // Validated as the options are (InvalidArgument for a negative or NaN lr).
  virtual void set_lr(double lr) = 0;

  // Type, hyperparameters and per-parameter state (see the header comment). The state
  // tensors share storage with the optimizer's (no copy).
  virtual StateDict state_dict() const = 0;
  // Replaces hyperparameters and state with `state`, checked against `params` (the
  // parameters the state is for). Loaded tensors are private copies on each parameter's
  // device.
  virtual void load_state_dict(const StateDict& state, const std::vector<Tensor>& params) = 0;

 protected:
  FunctionalOptimizer() = default;
};

struct SGDOptions;
struct AdamOptions;
struct AdamWOptions;
struct AdagradOptions;
struct SparseAdamOptions;

// A fresh optimizer of the kind the options name (validated: InvalidArgument as the
// options' validate()).
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const SGDOptions& options);
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const AdamOptions& options);
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const AdamWOptions& options);
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const AdagradOptions& options);
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const SparseAdamOptions& options);
// The optimizer a state dict describes: the kind its "type" names, with its
// hyperparameters and state (checked against `params` as load_state_dict does).
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const StateDict& saved,
                                                               const std::vector<Tensor>& params);

}  // namespace gradwire::optim
