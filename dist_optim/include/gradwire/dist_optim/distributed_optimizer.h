// DistributedOptimizer: updates parameters where they live, with the gradients a
// dist_autograd context holds for them there.
//
//   std::vector<RRef<Tensor>> params = ps.rpc_sync<std::vector<RRef<Tensor>>>("parameter_rrefs");
//   dist_optim::DistributedOptimizer opt(*agent, optim::SGDOptions{.lr = 0.05, .momentum = 0.9},
//                                        params);
//   {
//     dist_autograd::Context ctx(*agent);
//     Tensor loss = ...;                      // forward through remote calls
//     dist_autograd::backward(*agent, ctx.id(), {loss});
//     opt.step(ctx.id());                     // every owner steps its own parameters
//   }
//
// The parameters are grouped by owner. On each owner one functional optimizer (optim/'s
// FunctionalOptimizer: SGD with momentum, Nesterov and weight decay, Adam, AdamW, Adagrad,
// with the same numerics as optim/) is created, in an object the optimizer holds an RRef
// to. step(ctx) asks every owner at once to update its parameters with the gradients the
// context holds there, and returns when all have. A parameter the context has no gradient
// for is skipped, state included, as PyTorch does. Several DistributedOptimizers (one per
// trainer) may step the same parameters concurrently: the steps on one owner are
// serialised, so each sees the others' updates whole. A gradient that reaches the owner as
// the transposed view of a dense matrix (a weight used as W.transpose(0, 1) in a matmul,
// as nn::Linear does) is first copied into the parameter's layout, so the update takes
// optim/'s fused path; each such parameter keeps one buffer of its size on its owner for
// this. The update is the same, bit for bit.
//
// Learning rate: every owner's optimizer has the rate of the spec it was made from;
// set_lr(lr) changes it on every owner in one round of messages (one request to each
// owner, all sent before any answer is awaited), and lr() is the last rate set everywhere
// (kept on the trainer: reading it sends nothing). A DistributedOptimizer is an
// optim::LrTarget of one group, so optim/'s schedules drive it:
//   optim::SequentialLR sched(opt, optim::LinearLR(opt, 0.1, 1.0, 5),
//                             optim::CosineAnnealingLR(opt, 95), 5);
//   ... opt.step(ctx.id()); sched.step();      // each sched.step() is one set_lr round
//
// Thread-safety: step, set_lr, lr, state_dict and load_state_dict may be called from any
// thread; calls on one optimizer are serialised on each owner, and set_lr calls (and
// load_state_dict's change of the rate) one at a time on the trainer, so that every owner
// ends with the same rate.
//
// Errors: construction with no parameters, or an empty RRef, is InvalidArgument; options
// are validated as optim/ does. step(): an owner that fails names itself (a RemoteError
// carrying the owner's error and type, e.g. InvalidArgument for a context it does not know,
// or Error naming the failure for a context whose last backward pass failed there, which
// moves no parameter; NetworkError when it is gone), after every other owner has finished.
// set_lr(): InvalidArgument for a negative or NaN rate, before anything is sent; then, as
// step(), the first owner's error (naming it) once every owner has answered -- the owners
// that answered well have the new rate, lr() keeps the old one, and calling set_lr again
// sets it everywhere. load_state_dict(): InvalidArgument, before anything is sent, when the
// owners' saved rates differ.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/core/mutex.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/lr_target.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/state_dict.h"

namespace gradwire::dist_optim {

// How a group's learning rate follows the gradients an update combines (TrainerGroup).
enum class LrScaling {
  kNone,             // the optimizer's rate as set
  kLinear,           // x the number of gradients averaged into the update (the linear
                     // scaling rule: an average of K trainers' gradients, K times the rate)
  kInverseTrainers,  // / the group's trainer count (damps N asynchronous trainers' updates,
                     // each computed at parameters up to N updates old)
};

// The trainers of a parameter-server job sharing one optimizer on each owner (see "Trainer
// groups" in docs/parameter-server.md). Without a group (empty name) every
// DistributedOptimizer has optimizers of its own, as PyTorch's does: N asynchronous
// trainers then run N optimizers (N Adam states) over the same parameters.
struct TrainerGroup {
  // The group, the same on every trainer of the job; the owners keep one optimizer per name.
  std::string name;
  // How many trainers take part. A trainer's step waits for members that have not joined
  // yet as for the slowest (their clock is 0). A trainer that joins once they all have
  // (an elastic job's late trainer) starts level with the slowest member.
  int trainers = 1;
  // Bounded staleness S: a member's k-th step is answered once every member still in the
  // group has finished step k - S, so no trainer runs more than S steps ahead of the
  // slowest. -1: unbounded (fully asynchronous); 0: synchronous.
  int max_staleness = -1;
  // Server-side aggregation K: each update averages K members' gradients (the K steps that
  // arrive together), and a step is answered once the update holding its gradient is
  // applied. 1: every gradient is applied as it arrives. K = trainers with S = 0 is
  // synchronous data-parallel SGD with a batch of K x the trainers' batch. 0: every member
  // of the moment (the expected trainers until they have joined; then each trainer that
  // joins a running job counts from its first step, and each one that leaves stops
  // counting), for elastic jobs.
  int aggregate = 1;
  LrScaling lr_scaling = LrScaling::kNone;
  void validate() const;  // InvalidArgument naming the bad field
};

namespace detail {

class TrainerGroupState;  // trainer_group.h

// The optimizer of one owner's parameters, living on that owner (registered as
// "gradwire.dist_optim.Shard" on every agent's registry).
class Shard {
 public:
  Shard(const StateDict& spec, const std::vector<rref::RRef<Tensor>>& params);
  // Steps with the gradients of dist-autograd context `context_id` on this worker; returns
  // how many parameters had one.
  int64_t step(const rpc::CallContext& ctx, uint64_t context_id);
  // The same, once this worker's part in pass `pass_id` of the context has ended well
  // (dist_autograd::part_done); the part's error, and no step, when it failed.
  Future<int64_t> step_after(const rpc::CallContext& ctx, uint64_t context_id, uint64_t pass_id);
  StateDict state_dict();
  void load_state_dict(const StateDict& state);
  // Sets the optimizer's learning rate.
  void set_lr(double lr);
  // A group's step (TrainerGroup): answered once the update holding this member's gradient
  // is applied and the staleness bound lets it go on.
  Future<int64_t> group_step(const rpc::CallContext& ctx, uint64_t context_id);
  // The same, once this worker's part in pass `pass_id` has ended well (as step_after).
  Future<int64_t> group_step_after(const rpc::CallContext& ctx, uint64_t context_id,
                                   uint64_t pass_id);
  // The caller leaves this shard's group (it will step no more).
  void leave_group(const rpc::CallContext& ctx);

  // With its group's gradients (matched to the parameters; undefined: no gradient), under
  // the agent's step lock, the learning rate scaled by `lr_factor` for this update.
  void apply(rpc::RpcAgent& agent, std::vector<Tensor> grads, double lr_factor);
  const std::vector<Tensor>& params() const { return state_->params; }
  // The spec it was made from (kind and hyperparameters).
  const StateDict& state_dict_spec() const { return spec_; }
  void set_group(const std::shared_ptr<TrainerGroupState>& group) {
    group_ = group;
    grouped_ = true;
  }

 private:
  // Shared with a step that runs after its request's handler returned.
  struct State {
    int64_t step(rpc::RpcAgent& agent, int caller, uint64_t request_id, uint64_t context_id);
    // One update with `matched` (a gradient per parameter, undefined: none), the rate
    // scaled by `lr_factor` for it.
    void update(rpc::RpcAgent& agent, std::vector<Tensor> matched, double lr_factor,
                uint64_t context_id);
    std::vector<Tensor> params;
    Mutex mutex;
    // Per parameter: where a gradient laid out as a transposed matrix is copied in the
    // parameter's layout for the fused update (allocated at the first such step, then
    // reused).
    std::vector<Tensor> scratch GRADWIRE_GUARDED_BY(mutex);
    std::unique_ptr<optim::FunctionalOptimizer> optimizer GRADWIRE_GUARDED_BY(mutex);
  };
  std::shared_ptr<State> state_;
  StateDict spec_;
  // Its group (the group owns the shard: a weak reference, so that neither keeps the other
  // alive); empty for a trainer's own shard.
  std::weak_ptr<TrainerGroupState> group_;
  bool grouped_ = false;
  // The group, or InvalidArgument naming `op` when there is none (any more).
  std::shared_ptr<TrainerGroupState> group(const char* op) const;
};

bool ensure_registered();
inline const bool kRegistered = ensure_registered();

}  // namespace detail

class DistributedOptimizer : public optim::LrTarget {
 public:
  // `options`: optim::SGDOptions, AdamOptions, AdamWOptions or AdagradOptions. Creates one
  // shard per owner (waits for them, at most the agent's rpc_timeout).
  template <typename Options>
  DistributedOptimizer(rpc::RpcAgent& agent, const Options& options,
                       std::vector<rref::RRef<Tensor>> params)
      : DistributedOptimizer(agent, optim::make_functional_optimizer(options)->state_dict(),
                             std::move(params)) {}
  // From a spec: a FunctionalOptimizer's state dict (kind and hyperparameters).
  DistributedOptimizer(rpc::RpcAgent& agent, const StateDict& spec,
                       std::vector<rref::RRef<Tensor>> params);
  // A member of trainer group `group` (TrainerGroup): the first member to reach an owner
  // makes the group's optimizer there from this spec; later members join it and must name
  // the same kind, hyperparameters, parameters and group settings (InvalidArgument naming
  // the group, the owner and what differs). step() then contributes to the group's shared
  // updates, within its staleness bound; state_dict, load_state_dict and set_lr act on the
  // shared optimizers. A trainer leaves with leave() or when the optimizer is destroyed; a
  // member whose worker is lost leaves by itself, so nobody waits for it.
  template <typename Options>
  DistributedOptimizer(rpc::RpcAgent& agent, const Options& options,
                       std::vector<rref::RRef<Tensor>> params, const TrainerGroup& group)
      : DistributedOptimizer(agent, optim::make_functional_optimizer(options)->state_dict(),
                             std::move(params), group) {}
  DistributedOptimizer(rpc::RpcAgent& agent, const StateDict& spec,
                       std::vector<rref::RRef<Tensor>> params, const TrainerGroup& group);
  // Leaves the group (best effort; what fails is logged).
  ~DistributedOptimizer() override;
  DistributedOptimizer(const DistributedOptimizer&) = delete;
  DistributedOptimizer& operator=(const DistributedOptimizer&) = delete;

  // Leaves the trainer group on every owner: the others stop waiting for this trainer
  // (staleness) and aggregate without it. A no-op without a group or when already left;
  // step() afterwards is an InvalidArgument. Errors: an owner's, naming it.
  void leave();

  // Steps every owner with context `context_id`'s gradients (see the file comment). In a
  // trainer group: contributes them to each owner's shared update and returns once the
  // update is applied and the staleness bound lets this trainer go on.
  void step(uint64_t context_id);

  // dist_autograd::backward(agent, context_id, roots, options) then step(context_id), with
  // the same result bit for bit, one round trip shorter where it can be: once every part of
  // the pass but one owner's has ended well (BackwardOptions::on_last_part), that owner is
  // sent its step at once and applies it the moment its part ends, while the others are
  // stepped as step() does after the pass. (A hook already in `options` is still called,
  // after that step is sent.) In a parameter-server step (the trainer's part ends when it
  // has sent the server its gradients) the server's update thus follows its part at once
  // instead of waiting for a round trip through the trainer. If the hook comes only after
  // the pass (it runs on the pool), every owner is stepped after the pass. The early step's
  // call waits out the owner's part, so it is bounded by `options.timeout` plus the agent's
  // rpc_timeout rather than by rpc_timeout alone (a pass may outlast rpc_timeout).
  // Errors: backward()'s, unchanged (no owner steps after a failed pass; the one exception,
  // a pass that fails at its deadline after the early owner's part ended and stepped, is an
  // Error naming that owner); then step()'s.
  void backward_and_step(uint64_t context_id, const std::vector<Tensor>& roots,
                         dist_autograd::BackwardOptions options = {});

  // Every owner's optimizer state, keys prefixed with "<owner name>/".
  StateDict state_dict();
  // Loads what state_dict() returned (each owner its own part), the learning rate included
  // (the owners' saved rates must agree).
  void load_state_dict(const StateDict& state);

  // The learning rate every owner's optimizer has (see the file comment).
  double lr() const;
  // Sets it on every owner, in one round of messages; validated first.
  void set_lr(double lr);
  // optim::LrTarget: one group, the rate of every owner.
  size_t num_lr_groups() const override { return 1; }
  double group_lr(size_t group) const override;
  void set_group_lrs(const std::vector<double>& lrs) override;

  size_t num_owners() const { return shards_.size(); }

 private:
  // Drops a lost owner's optimizer without leaving the group anywhere: the optimizer it
  // makes instead joins as the same member.
  friend class ServerFailover;

  // The rate last set everywhere; `mutex` is held across a set_lr round.
  struct Lr {
    mutable Mutex mutex;
    double value GRADWIRE_GUARDED_BY(mutex) = 0.0;
  };

  rpc::RpcAgent* agent_;  // the trainer's; it outlives the optimizer, as the RRefs need
  TrainerGroup group_;    // name empty: no group
  bool left_ = false;
  std::vector<rpc::WorkerInfo> owners_;
  std::vector<rref::RRef<detail::Shard>> shards_;
  std::shared_ptr<Lr> lr_ = std::make_shared<Lr>();
};

// What trainer group `name` holds on its owner now, for monitoring and tests: its members
// (those that joined, and of them those still in it), the gradients gathered for the next
// update, and the updates applied. Call it on the owner's agent; InvalidArgument naming the
// group and the worker when no member has joined such a group there. Thread-safe.
struct TrainerGroupStats {
  int64_t members = 0;
  int64_t active = 0;
  int64_t pending = 0;
  int64_t updates = 0;
};
TrainerGroupStats trainer_group_stats(const rpc::RpcAgent& owner, const std::string& name);

}  // namespace gradwire::dist_optim
