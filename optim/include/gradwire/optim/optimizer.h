// Optimizer: the base of the optimizer objects (SGD, Adam, AdamW, Adagrad), and the
// state-dict type their state is saved in.
//
// Every optimizer comes in two forms:
//   - an object over a fixed list of parameters (leaf tensors that require grad), whose
//     step() reads each parameter's .grad() and updates it in place;
//   - a functional step, e.g. sgd_step(params, grads, state, options), over explicit
//     (param, grad) lists and a state object the caller keeps. The distributed optimizer
//     calls these with gradients taken from a dist-autograd context instead of .grad().
// The object's step() is the functional step on (params, their .grad()s), so both give the
// same numbers. A parameter whose gradient is undefined is skipped, state included, as in
// PyTorch. All updates run under a NoGradGuard, in place on the parameters (handles held
// elsewhere, such as a module's, see the new values).
//
// State: per-parameter tensors (momentum buffers, moment estimates) and step counts, saved
// as a StateDict with keys "state.<i>.<name>" (i: the parameter's position; step counts as
// 0-d int64 tensors). The hyperparameters are not part of it: an optimizer is rebuilt with
// its options, then given the state. nn::save / nn::load store a StateDict in a file
// (optim/ sits beside nn/, not above it, so it has no file functions of its own).
//
// Errors: InvalidArgument for an undefined, non-floating, non-leaf or repeated parameter,
// a parameter that does not require grad (objects only), a gradient whose shape or dtype
// differs from its parameter's, a state built for another number of parameters, and from
// load_state_dict for missing, unexpected or mis-shaped entries (all listed by name).
//
// Thread-safety: an optimizer (or functional state) is used by one thread at a time;
// step() must not run concurrently with a forward or backward pass over the same
// parameters.
//
// Example:
//   optim::SGD opt(net.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
//   for (...) { opt.zero_grad(); nn::cross_entropy(net(x), y).backward(); opt.step(); }
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire::optim {

// Named tensors in order; the same type as gradwire::nn::StateDict.
using StateDict = std::vector<std::pair<std::string, Tensor>>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  // Clears each parameter's gradient (set_to_none) or zeroes it in place.
  void zero_grad(bool set_to_none = true);

  const std::vector<Tensor>& params() const { return params_; }
  const std::string& type_name() const { return type_name_; }

  virtual StateDict state_dict() const = 0;
  // Replaces the state; validates everything before changing anything.
  virtual void load_state_dict(const StateDict& state) = 0;

 protected:
  Optimizer(std::vector<Tensor> params, std::string type_name);
  // Each parameter's .grad() (undefined where none).
  std::vector<Tensor> grads() const;

  std::vector<Tensor> params_;

 private:
  std::string type_name_;
};

namespace detail {
// Shared checks of the functional steps: params and grads pair up (same count, each grad
// undefined or shaped and typed like its param), and the state holds `state_size`
// entries (0 meaning "fresh", resized by the caller). `op` names the step in messages.
void check_step_args(const char* op, const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, size_t state_size);
// Checks a parameter list given to an optimizer object.
void check_params(const char* op, const std::vector<Tensor>& params, bool need_requires_grad);

// Reads per-parameter entries "state.<i>.<field>" out of a StateDict, collecting every
// problem (missing, unexpected, wrong shape or dtype) so they can be reported at once.
class StateReader {
 public:
  StateReader(const char* op, const StateDict& state, const std::vector<Tensor>& params);
  // Whether any entry "state.<i>.*" exists (a parameter never stepped has none).
  bool has(size_t i) const;
  // The entry, checked to be shaped and typed like param i; undefined when absent and
  // !required (an absent required entry is an error).
  Tensor tensor(size_t i, const std::string& field, bool required);
  // A 0-d int64 step count >= 0; absent counts as an error.
  int64_t step(size_t i);
  // Throws InvalidArgument listing every problem (and every entry never read).
  void finish();

 private:
  const char* op_;
  const StateDict& state_;
  const std::vector<Tensor>& params_;
  std::vector<bool> used_;
  std::vector<std::string> errors_;
};

std::string state_key(size_t i, const std::string& field);
}  // namespace detail

}  // namespace gradwire::optim
