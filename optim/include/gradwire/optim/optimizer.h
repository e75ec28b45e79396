// Optimizer: an optimizer object over a fixed list of parameters, whose step() reads each
// parameter's .grad() -- the base of SGD, Adam, AdamW and Adagrad, and usable as is over
// any FunctionalOptimizer.
//
// Every optimizer comes in three forms:
//   - an object over a fixed list of parameters (leaf tensors that require grad), whose
//     step() reads each parameter's .grad() and updates it in place;
//   - a FunctionalOptimizer (functional_optimizer.h): the same kind, hyperparameters and
//     state behind one interface, stepped over explicit (param, grad) lists. The
//     distributed optimizer holds these, with gradients taken from a dist-autograd
//     context instead of .grad();
//   - a functional step, e.g. sgd_step(params, grads, state, options), over explicit
//     lists and a state object the caller keeps.
// The object is a shell over a FunctionalOptimizer, whose step() is the functional step,
// so all three give the same numbers. A parameter whose gradient is undefined is skipped,
// state included, as in PyTorch. All updates run under a NoGradGuard, in place on the
// parameters (handles held elsewhere, such as a module's, see the new values). On the
// CPU, contiguous float32 and float64 parameters are updated by one fused loop per
// parameter (no temporaries); other devices, dtypes and layouts use tensor ops; both give
// the same bits.
//
// State: state_dict() holds the kind ("type"), the hyperparameters ("hyper.<name>") and
// the per-parameter tensors and step counts ("state.<i>.<field>", i: the parameter's
// position); functional_optimizer.h lists the layout. load_state_dict() restores all of
// it. nn::save / nn::load store a StateDict in a file (optim/ sits beside nn/, not above
// it, so it has no file functions of its own).
//
// Errors: InvalidArgument for an undefined, non-floating, non-leaf or repeated parameter,
// a parameter that does not require grad (objects only), a gradient whose shape or dtype
// differs from its parameter's, a state built for another number of parameters, and from
// load_state_dict for missing, unexpected or mis-shaped entries, a state dict of another
// kind, or bad hyperparameters (all listed by name).
//
// Thread-safety: an optimizer (or functional state) is used by one thread at a time;
// step() must not run concurrently with a forward or backward pass over the same
// parameters.
//
// Example:
//   optim::SGD opt(net.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
//   for (...) { opt.zero_grad(); nn::cross_entropy(net(x), y).backward(); opt.step(); }
//   optim::Optimizer any(net.parameters(), optim::make_functional_optimizer(
//                                              optim::AdagradOptions{.lr = 0.1}));
#pragma once

#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/tensor/state_dict.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::optim {

class Optimizer {
 public:
  // Checks `params` (see the header comment); `functional` must not be null.
  Optimizer(std::vector<Tensor> params, std::unique_ptr<FunctionalOptimizer> functional);
  virtual ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  void step();
  // Clears each parameter's gradient (set_to_none) or zeroes it in place
  // (gradwire::zero_grad over params()).
  void zero_grad(bool set_to_none = true);

  const std::vector<Tensor>& params() const { return params_; }
  const std::string& type_name() const { return functional_->type_name(); }

  // Kind, hyperparameters and state (functional_optimizer.h).
  StateDict state_dict() const { return functional_->state_dict(); }
  // Replaces hyperparameters and state; validates everything before changing anything.
  void load_state_dict(const StateDict& state) { functional_->load_state_dict(state, params_); }

  // The optimizer the object steps (to change its learning rate, or hand it elsewhere).
  FunctionalOptimizer& functional() { return *functional_; }
  const FunctionalOptimizer& functional() const { return *functional_; }

 private:
  std::vector<Tensor> params_;
  std::unique_ptr<FunctionalOptimizer> functional_;
};

// The optimizer object of one functional kind F (SGD, Adam, AdamW, Adagrad derive from it):
// typed access to F's options and state on top of Optimizer.
template <typename F>
class TypedOptimizer : public Optimizer {
 public:
  using Options = std::decay_t<decltype(std::declval<const F&>().options())>;
  using State = std::decay_t<decltype(std::declval<const F&>().state())>;

  TypedOptimizer(std::vector<Tensor> params, const Options& options)
      : Optimizer(std::move(params), std::make_unique<F>(options)),
        typed_(static_cast<F*>(&functional())) {}

  const Options& options() const { return typed_->options(); }
  // Changes the options (a learning-rate schedule); validated.
  void set_options(const Options& options) { typed_->set_options(options); }
  const State& state() const { return typed_->state(); }

 private:
  F* typed_;  // functional(), typed
};

}  // namespace gradwire::optim
