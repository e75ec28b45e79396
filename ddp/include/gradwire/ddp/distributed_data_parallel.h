// DistributedDataParallel: data-parallel training of one nn::Module replica per rank.
//
// Each rank holds a replica of the model and feeds it its own share of each batch. The
// wrapper keeps the replicas equal:
//   - at construction it checks that every rank has the same parameter shapes in the same
//     order (c10d::verify_params_across_ranks; the error names the first difference and
//     the parameter's name), then broadcasts rank 0's parameters and buffers to all
//     (broadcast_coalesced) — every parameter, frozen ones (requires_grad = false)
//     included, as in PyTorch; only the parameters that require grad are reduced;
//   - forward() runs the module's forward; with broadcast_buffers, rank 0's buffers are
//     broadcast first (running statistics stay those of rank 0, as in PyTorch);
//   - the backward pass after a forward leaves in every parameter's .grad() the average of
//     the ranks' gradients, computed bucket by bucket while backward goes on (reducer.h);
//     an optimizer step on each rank then keeps the replicas equal. A backward pass in a
//     dist_autograd context leaves the averages in the context instead, never in .grad()
//     (reducer.h: the Reducer and the gradient sink), for the DistributedOptimizer.
// no_sync() suspends the averaging: gradients accumulate locally, and the next
// synchronised backward averages the accumulated sums (gradient accumulation across
// micro-batches at the cost of one all-reduce).
//
// Options (DdpOptions): bucket_cap_mb (25) and first_bucket_mb (1) size the buckets;
// broadcast_buffers (true); find_unused_parameters (false) tolerates parameters the
// forward does not use, at the cost of a graph walk per step; static_graph (false) says
// the set of used parameters never changes, so it is learnt once; gradient_as_bucket_view
// (false) makes each .grad() a view into its bucket, saving a copy and the gradients'
// memory (then .grad() must not be replaced by the user, only zeroed or set to none).
//
// Excluded parameters. DdpOptions::params_to_ignore names parameters (and buffers) by their
// qualified names (Module::named_parameters: "emb.weight") that DDP leaves alone entirely,
// as PyTorch's _set_params_and_buffers_to_ignore_for_model: not checked across ranks, not
// broadcast, not reduced; their gradients stay each rank's own. A parameter that does not
// require grad is checked and broadcast but never reduced.
//
// Sparse gradients. The all-reduce averages dense buckets, so a parameter whose gradient is
// sparse-rows (tensor/sparse.h) cannot be reduced. At construction, the weight of every
// nn::Embedding and nn::EmbeddingBag with `sparse = true` among the module's submodules
// must be excluded (params_to_ignore, or requires_grad = false), or DDP refuses it; a
// sparse gradient that reaches a reduced parameter in backward by any other way fails the
// pass, naming the parameter. Such a table is typically kept on a parameter server instead
// (rpc/, dist_autograd/, whose contexts hold sparse gradients; docs/ddp.md).
//
// Thread-safety: one training loop per instance: forward, backward and no_sync from one
// thread at a time (the backward of a forward may run on another thread, not concurrently
// with the next forward). Collectives run on the group's threads; hook continuations on a
// thread of the Reducer.
// Errors: InvalidArgument at construction for a bad option, a name in params_to_ignore that
// is neither a parameter nor a buffer of the module, a module without parameters requiring
// grad (and not ignored), the weight of a sparse embedding that is not excluded (naming it
// and how to exclude it), or replicas whose parameters differ (on every rank, naming the
// parameter); InvalidArgument from backward for a sparse gradient of a reduced parameter; from
// forward() for a module that is not an nn::UnaryModule (use forward_with); gradwire::Error from
// backward when some parameters got no gradient (see reducer.h), and from forward under a Join with
// throw_on_early_termination once a rank has run out (join.h); collectives'
// TimeoutError/NetworkError.
//
// Example:
//   auto group = c10d::make_process_group("cpu", store, rank, world);  // shm on one host
//   auto net = std::make_shared<nn::MLP>(nn::MLPOptions{.sizes = {784, 1024, 10}});
//   ddp::DistributedDataParallel model(net, group, {.gradient_as_bucket_view = true});
//   optim::SGD opt(net->parameters(), {.lr = 0.1});   // optim/sgd.h
//   for (auto& [x, y] : my_shard) {
//     opt.zero_grad();
//     nn::cross_entropy(model.forward(x), y).backward();   // .grad() = the ranks' mean
//     opt.step();
//   }
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/process_group.h"
#include "gradwire/ddp/grad_bucket.h"
#include "gradwire/ddp/join.h"
#include "gradwire/ddp/reducer.h"
#include "gradwire/nn/module.h"

namespace gradwire::ddp {

struct DdpOptions {
  double bucket_cap_mb{25.0};   // > 0
  double first_bucket_mb{1.0};  // > 0
  bool broadcast_buffers{true};
  bool find_unused_parameters{false};
  bool static_graph{false};
  bool gradient_as_bucket_view{false};
  // Collective and end-of-pass waits; zero: the group's timeout.
  std::chrono::milliseconds timeout{0};
  // Qualified names of parameters and buffers DDP leaves alone (see above), e.g. the weight
  // of a sparse embedding that a parameter server keeps: {"emb.weight"}.
  std::vector<std::string> params_to_ignore{};
  void validate() const;
};

class DistributedDataParallel;

// Restores the previous synchronisation mode when it goes out of scope (no_sync()).
class [[nodiscard]] NoSyncGuard {
 public:
  explicit NoSyncGuard(DistributedDataParallel& ddp);
  ~NoSyncGuard();
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;

 private:
  DistributedDataParallel& ddp_;
  bool previous_;
};

class DistributedDataParallel final : public Joinable {
 public:
  DistributedDataParallel(std::shared_ptr<nn::Module> module,
                          std::shared_ptr<c10d::ProcessGroup> group, DdpOptions options = {});
  ~DistributedDataParallel() override;
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The module's forward (an nn::UnaryModule), wrapped as described above.
  Tensor forward(const Tensor& input);
  Tensor operator()(const Tensor& input) { return forward(input); }
  // For modules of any signature: `fn` runs the forward and returns every output the loss
  // may be computed from.
  std::vector<Tensor> forward_with(const std::function<std::vector<Tensor>(nn::Module&)>& fn);

  // Gradients of backward passes after forwards inside the guard's scope are not averaged.
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  // Replaces how buckets are communicated (comm_hooks.h); before the first backward.
  void register_comm_hook(CommHook hook) { reducer_->register_comm_hook(std::move(hook)); }

  nn::Module& module() { return *module_; }
  const std::shared_ptr<nn::Module>& module_ptr() const { return module_; }
  const Reducer& reducer() const { return *reducer_; }
  const DdpOptions& options() const { return options_; }

  // Joinable
  c10d::ProcessGroup& join_process_group() override { return *group_; }
  void set_join(Join* join) override;
  void join_shadow_step(int participants, int root, bool sync) override;
  void join_finish(int root) override;

 private:
  friend class NoSyncGuard;
  void before_forward();
  void broadcast_buffers(int root);
  // What a step under the Join divides by (JoinOptions::divide_by_initial_world_size).
  int join_divisor(int participants) const;
  std::chrono::milliseconds wait_timeout() const;

  std::shared_ptr<nn::Module> module_;
  std::shared_ptr<c10d::ProcessGroup> group_;
  DdpOptions options_;
  std::vector<Tensor> params_;      // those that require grad and are not ignored (reduced)
  std::vector<Tensor> all_params_;  // every parameter not ignored, frozen ones too (checked,
                                    // broadcast)
  std::vector<Tensor> buffers_;     // every buffer not ignored
  std::unique_ptr<Reducer> reducer_;
  Join* join_{nullptr};
};

}  // namespace gradwire::ddp
