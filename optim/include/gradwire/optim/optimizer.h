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
// Parameter groups (PyTorch's param_groups): the parameters may be split into groups, each
// with its own options (its own lr, momentum, ...) and its own state; every group is of
// the optimizer's kind. The object holds one FunctionalOptimizer per group. The
// constructor makes group 0; add_param_group() adds more, with the options the optimizer
// was made with or with its own. params() is every group's parameters, group after group.
// set_lr(lr) sets every group's learning rate, set_lr(group, lr) one group's; lr() is group
// 0's. An Optimizer is an LrTarget (lr_target.h), so a schedule (lr_scheduler.h) drives all
// its groups, each from its own initial rate.
//
// State: state_dict() holds the kind ("type"), the hyperparameters ("hyper.<name>") and
// the per-parameter tensors and step counts ("state.<i>.<field>", i: the parameter's
// position); functional_optimizer.h lists the layout. load_state_dict() restores all of
// it. With more than one group the layout is
//   "type"                      as for one group
//   "param_groups"              1-d int64: each group's number of parameters
//   "group.<g>.hyper.<name>"    group g's hyperparameters
//   "state.<i>.<field>"         i: the parameter's position in params() (all groups)
// and a state dict loads only into an optimizer with as many groups of the same sizes (a
// one-group dict, without "param_groups", only into a one-group optimizer). nn::save /
// nn::load store a StateDict in a file (optim/ sits beside nn/, not above it, so it has no
// file functions of its own).
//
// Errors: InvalidArgument for an undefined, non-floating, non-leaf or repeated parameter,
// a parameter that does not require grad (objects only), a gradient whose shape or dtype
// differs from its parameter's, a state built for another number of parameters, and from
// load_state_dict for missing, unexpected or mis-shaped entries, a state dict of another
// kind or another grouping, or bad hyperparameters (all listed by name, with their group);
// from add_param_group for a group of another kind or a parameter already in a group;
// from set_lr / set_group_lrs for a negative or NaN rate or a group out of range (no group
// changes).
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
//   // Two groups: the embedding at a tenth of the rate.
//   optim::SGD two(body.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
//   two.add_param_group(emb.parameters(), optim::SGDOptions{.lr = 0.01, .momentum = 0.9});
//   two.set_lr(1, 0.005);
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/lr_target.h"
#include "gradwire/tensor/state_dict.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::optim {

class Optimizer;

// One parameter group of an Optimizer: its parameters and the FunctionalOptimizer (its
// options and state) that steps them.
class ParamGroup {
 public:
  const std::vector<Tensor>& params() const { return params_; }
  FunctionalOptimizer& optimizer() { return *optimizer_; }
  const FunctionalOptimizer& optimizer() const { return *optimizer_; }
  double lr() const { return optimizer_->lr(); }
  // Validated (InvalidArgument for a negative or NaN lr).
  void set_lr(double lr) { optimizer_->set_lr(lr); }

 private:
  friend class Optimizer;
  ParamGroup(std::vector<Tensor> params, std::unique_ptr<FunctionalOptimizer> optimizer)
      : params_(std::move(params)), optimizer_(std::move(optimizer)) {}

  std::vector<Tensor> params_;
  std::unique_ptr<FunctionalOptimizer> optimizer_;
};

class Optimizer : public LrTarget {
 public:
  // Checks `params` (see the header comment); `functional` must not be null. They make
  // group 0, and `functional`'s kind and hyperparameters are the defaults of
  // add_param_group(params).
  Optimizer(std::vector<Tensor> params, std::unique_ptr<FunctionalOptimizer> functional);
  ~Optimizer() override;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient, each group with its own options.
  void step();
  // Clears each parameter's gradient (set_to_none) or zeroes it in place
  // (gradwire::zero_grad over params()).
  void zero_grad(bool set_to_none = true);

  // Every group's parameters, group after group.
  const std::vector<Tensor>& params() const { return params_; }
  const std::string& type_name() const { return groups_.front().optimizer().type_name(); }

  // ---- parameter groups
  size_t num_param_groups() const { return groups_.size(); }
  std::span<ParamGroup> param_groups() { return groups_; }
  std::span<const ParamGroup> param_groups() const { return groups_; }
  // A new group over `params` (checked as the constructor's, and none may be in a group
  // already), with the kind and hyperparameters the optimizer was made with.
  void add_param_group(std::vector<Tensor> params);
  // A new group stepped by `functional`, which must be of this optimizer's kind.
  void add_param_group(std::vector<Tensor> params, std::unique_ptr<FunctionalOptimizer> functional);

  // ---- learning rate
  // Group 0's.
  double lr() const { return groups_.front().lr(); }
  double lr(size_t group) const;
  // Every group's; a rate the kind rejects changes none.
  void set_lr(double lr);
  // One group's.
  void set_lr(size_t group, double lr);
  // LrTarget: each parameter group is a group.
  size_t num_lr_groups() const override { return groups_.size(); }
  double group_lr(size_t group) const override { return lr(group); }
  void set_group_lrs(const std::vector<double>& lrs) override;

  // Kind, hyperparameters and state (see the header comment for several groups).
  StateDict state_dict() const;
  // Replaces hyperparameters and state; validates everything before changing anything.
  void load_state_dict(const StateDict& state);

  // The optimizer that steps group `group` (to change its options, or hand it elsewhere).
  FunctionalOptimizer& functional(size_t group = 0) { return checked_group(group).optimizer(); }
  const FunctionalOptimizer& functional(size_t group = 0) const {
    return checked_group(group).optimizer();
  }

 private:
  ParamGroup& checked_group(size_t group);
  const ParamGroup& checked_group(size_t group) const;

  std::vector<ParamGroup> groups_;
  std::vector<Tensor> params_;  // every group's, in order
  StateDict defaults_;          // "type" and "hyper.*" of group 0's optimizer when made
};

// The optimizer object of one functional kind F (SGD, Adam, AdamW, Adagrad derive from it):
// typed access to F's options and state on top of Optimizer, per group.
template <typename F>
class TypedOptimizer : public Optimizer {
 public:
  using Options = std::decay_t<decltype(std::declval<const F&>().options())>;
  using State = std::decay_t<decltype(std::declval<const F&>().state())>;

  TypedOptimizer(std::vector<Tensor> params, const Options& options)
      : Optimizer(std::move(params), std::make_unique<F>(options)) {}

  using Optimizer::add_param_group;
  // A new group over `params` with its own options (validated).
  void add_param_group(std::vector<Tensor> params, const Options& options) {
    Optimizer::add_param_group(std::move(params), std::make_unique<F>(options));
  }

  const Options& options(size_t group = 0) const { return typed(group).options(); }
  // Changes every group's options (validated first: a bad value changes no group).
  void set_options(const Options& options) {
    options.validate();
    for (size_t g = 0; g < num_param_groups(); ++g)
      typed(g).set_options(options);
  }
  // Changes one group's options (validated).
  void set_options(size_t group, const Options& options) { typed(group).set_options(options); }
  const State& state(size_t group = 0) const { return typed(group).state(); }

 private:
  F& typed(size_t group) { return static_cast<F&>(functional(group)); }
  const F& typed(size_t group) const { return static_cast<const F&>(functional(group)); }
};

}  // namespace gradwire::optim
