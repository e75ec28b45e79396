// DistributedDataParallel for torch::nn::Module: data-parallel training of a LibTorch model
// with gradwire's process groups and gradwire's DDP Reducer (gradwire/ddp/reducer.h).
//
// Each rank holds a replica of the LibTorch module and feeds it its own share of each batch.
// The wrapper keeps the replicas equal, as gradwire's ddp::DistributedDataParallel does for
// gradwire modules:
//   - at construction it checks that every rank has the same parameter shapes and dtypes in
//     the same order (c10d::verify_params_across_ranks; the error names the parameter), then
//     broadcasts rank 0's parameters and buffers to all — every parameter, frozen ones
//     included; only the parameters that require grad are reduced;
//   - forward()/forward_with() run the module's forward (with broadcast_buffers, rank 0's
//     buffers are broadcast first);
//   - the LibTorch backward pass after a forward leaves in every parameter's grad() the
//     average of the ranks' gradients; an optimizer step (torch::optim::SGD, Adam, ...) on
//     each rank then keeps the replicas equal.
// no_sync() suspends the averaging: gradients accumulate locally in grad(), and the next
// synchronised backward averages the accumulated sums.
//
// How LibTorch's autograd drives gradwire's Reducer. Every reduced parameter gets a
// post-hook on its LibTorch gradient accumulator (the AccumulateGrad node, the hook PyTorch
// 1.13's own DDP uses), and a gradwire stand-in: a gradwire leaf viewing the parameter's
// memory (from_torch), which the Reducer is built on. A synchronised forward walks the
// LibTorch graph from the forward's outputs to learn which parameters it reaches. In the
// backward pass, as each parameter's gradient is accumulated by LibTorch, its hook hands the
// accumulated grad() (the same memory, from_torch) to a gradwire autograd GraphTask that
// expects one gradient per reached parameter (autograd/graph_task.h); the task runs the
// stand-in's gradwire AccumulateGrad at once, which fires the Reducer's hook: the
// parameter's bucket fills, and a full bucket's all-reduce (or comm hook) starts while
// LibTorch's backward goes on. The hook of the last reached parameter completes the task,
// whose end-of-pass callback is the Reducer's: it waits for every bucket and writes the
// averages, which land in the LibTorch grad() (in place where the Reducer averages the
// gradient where it lies, else copied back) before LibTorch's backward returns. Bucketing
// (bucket_cap_mb, first_bucket_mb, the rebuild from the first pass's arrival order,
// broadcast from rank 0), the in-place average over the shm group, unused parameters and
// comm hooks are the Reducer's own (reducer.h).
//
// Unused parameters. A parameter the forward's outputs do not reach gets no gradient: the
// backward then fails, naming it (the Reducer's message), unless find_unused_parameters,
// with which it is counted ready with zeros: a parameter used on some rank averages over all
// ranks with zeros where unused, and one used on no rank keeps its grad() as it was. A
// parameter that the outputs reach but the loss does not (an output left out of the loss)
// never hears from LibTorch's backward: the pass then fails at its end, naming it.
//
// Comm hooks receive gradwire GradBuckets (grad_bucket.h) whose buffer and gradients are
// gradwire tensors; to_torch (convert.h) views them as torch tensors. The built-in hooks
// (ddp/comm_hooks.h: fp16/bf16 compression, PowerSGD) work unchanged.
//
// Options (DdpOptions): bucket_cap_mb (25) and first_bucket_mb (1) size the buckets;
// broadcast_buffers (true); find_unused_parameters (false); static_graph (false: with it
// the unused parameters are learnt from the first pass, as reducer.h says); timeout (zero:
// the group's) for the collectives and the end-of-pass wait. Parameters must be dense, contiguous
// leaves on the CPU (CUDA parameters are shared as from_torch shares them, with the group serving
// their device) of a dtype from_torch shares, with dense gradients.
//
// Thread-safety: one training loop per instance: forward, backward and no_sync from one
// thread at a time, never two backward passes over the model at once. LibTorch runs a CPU
// backward on the thread that calls it; the hooks and the end-of-pass wait run there.
// Errors: InvalidArgument at construction for a null module or group, a bad option, a
// module without parameters that require grad, a parameter from_torch cannot share or
// that is not a contiguous leaf, or replicas whose parameters differ (on every rank,
// naming the parameter); from forward() for a module without a unary forward (use
// forward_with); from register_comm_hook after the first synchronised backward.
// From backward (thrown out of LibTorch's backward()): gradwire::Error when parameters got
// no gradient (named, with the find_unused_parameters hint); InvalidArgument for a sparse
// gradient (an Embedding with sparse(true)), naming the parameter; the collectives'
// TimeoutError/NetworkError. A failed pass leaves grad() as the local gradients, or (over
// the shm group, whose failure ends the group) partly averaged.
//
// Example:
//   auto group = c10d::make_process_group("cpu", store, rank, world);
//   auto net = ::torch::nn::Sequential(::torch::nn::Linear(4, 8), ::torch::nn::Tanh(),
//                                      ::torch::nn::Linear(8, 1));
//   gradwire::torch::DistributedDataParallel model(net, group);
//   ::torch::optim::SGD opt(net->parameters(), ::torch::optim::SGDOptions(0.1));
//   for (auto& [x, y] : my_shard) {
//     opt.zero_grad();
//     ::torch::mse_loss(model.forward(x), y).backward();   // grad() = the ranks' mean
//     opt.step();
//   }
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/process_group.h"
#include "gradwire/ddp/distributed_data_parallel.h"
#include "gradwire/ddp/grad_bucket.h"
#include "gradwire/ddp/reducer.h"

namespace gradwire::torch {

// gradwire's own DDP options (ddp/distributed_data_parallel.h), with the same meaning here:
// the bucket sizes, broadcast_buffers, find_unused_parameters, static_graph (the set of
// parameters the forward reaches, and of those some rank uses, is learnt from the first
// synchronised pass), the timeout, and params_to_ignore (qualified names of parameters and
// buffers left out of the check, the broadcasts and the reduction). gradient_as_bucket_view
// is refused: LibTorch owns a parameter's grad(), so a bucket view would save no copy.
using DdpOptions = ddp::DdpOptions;

class DistributedDataParallel;

// Restores the previous synchronisation mode when it goes out of scope (no_sync()).
class [[nodiscard]] TorchNoSyncGuard {
 public:
  explicit TorchNoSyncGuard(DistributedDataParallel& ddp);
  ~TorchNoSyncGuard();
  TorchNoSyncGuard(const TorchNoSyncGuard&) = delete;
  TorchNoSyncGuard& operator=(const TorchNoSyncGuard&) = delete;

 private:
  DistributedDataParallel& ddp_;
  bool previous_;
};

class DistributedDataParallel {
 public:
  using ForwardFn = std::function<std::vector<at::Tensor>(::torch::nn::Module&)>;

  // A module of any type: forward_with runs its forward.
  DistributedDataParallel(std::shared_ptr<::torch::nn::Module> module,
                          std::shared_ptr<c10d::ProcessGroup> group, DdpOptions options = {});
  // A module whose forward takes one tensor (Linear, Sequential, a user's module ...):
  // forward(x) runs it too.
  template <typename M>
  requires std::derived_from<M, ::torch::nn::Module> DistributedDataParallel(
      std::shared_ptr<M> module, std::shared_ptr<c10d::ProcessGroup> group, DdpOptions options = {})
      : DistributedDataParallel(std::static_pointer_cast<::torch::nn::Module>(module),
                                std::move(group), options) {
    if constexpr (requires(M & m, const at::Tensor& x) {
                    { m.forward(x) } -> std::convertible_to<at::Tensor>;
                  }) {
      M* raw = module.get();
      unary_ = [raw](const at::Tensor& x) -> at::Tensor { return raw->forward(x); };
    }
  }
  // A ModuleHolder (torch::nn::Linear, torch::nn::Sequential, TORCH_MODULE types).
  template <typename M>
  DistributedDataParallel(const ::torch::nn::ModuleHolder<M>& holder,
                          std::shared_ptr<c10d::ProcessGroup> group, DdpOptions options = {})
      : DistributedDataParallel(holder.ptr(), std::move(group), options) {}
  // Removes the hooks. Must not run during a backward pass over the module.
  ~DistributedDataParallel();
  DistributedDataParallel(const DistributedDataParallel&) = delete;
  DistributedDataParallel& operator=(const DistributedDataParallel&) = delete;

  // The module's one-tensor forward, wrapped as described above.
  at::Tensor forward(const at::Tensor& input);
  at::Tensor operator()(const at::Tensor& input) { return forward(input); }
  // For modules of any signature: `fn` runs the forward and returns every output the loss
  // may be computed from (the outputs are walked for the parameters they reach).
  std::vector<at::Tensor> forward_with(const ForwardFn& fn);

  // Backward passes after forwards inside the guard's scope are not averaged.
  TorchNoSyncGuard no_sync() { return TorchNoSyncGuard(*this); }
  // Replaces how buckets are communicated (ddp/comm_hooks.h); before the first backward.
  void register_comm_hook(ddp::CommHook hook);

  ::torch::nn::Module& module() { return *module_; }
  const std::shared_ptr<::torch::nn::Module>& module_ptr() const { return module_; }
  // The gradwire Reducer the backward passes drive (bucket_indices(), iterations(), ...).
  const ddp::Reducer& reducer() const;
  const DdpOptions& options() const { return options_; }
  // Names of the reduced parameters, in the Reducer's index order.
  const std::vector<std::string>& parameter_names() const;

 private:
  friend class TorchNoSyncGuard;
  struct State;
  std::shared_ptr<::torch::nn::Module> module_;
  DdpOptions options_;
  std::function<at::Tensor(const at::Tensor&)> unary_;
  std::unique_ptr<State> state_;
};

}  // namespace gradwire::torch
