// Distributed autograd and the distributed optimizer with LibTorch's autograd.
//
// Inside a gradwire dist_autograd::Context, a torch tensor that requires grad is recorded as
// it crosses an rpc call (an argument, a result, an element of a container): the sender
// records a send function whose gradient flows into the tensor's LibTorch graph, and the
// receiver's torch tensor gets a grad_fn (GradwireRecvBackward) that passes its gradient
// back to the sender. backward() below then runs the pass across workers from torch roots;
// the gradients of every worker's torch leaves (parameters, inputs that require grad)
// accumulate in the context on that worker, never in .grad():
//
//   // on the server: the model, and references to its parameters
//   auto model = torch::nn::Sequential(torch::nn::Linear(4, 3));
//   registry.def("forward", [&](const at::Tensor& x) { return model->forward(x); });
//   registry.def("params", [&] { return gradwire::torch::parameter_rrefs(*agent, *model); });
//   // on a trainer
//   auto params = agent->rpc_sync<std::vector<rref::RRef<Tensor>>>("ps", "params");
//   dist_optim::DistributedOptimizer opt(*agent, optim::SGDOptions{.lr = 0.1}, params);
//   {
//     gradwire::dist_autograd::Context ctx(*agent);
//     at::Tensor out = agent->rpc_sync<at::Tensor>("ps", "forward", x);
//     at::Tensor loss = torch::nn::functional::cross_entropy(out, y);
//     gradwire::torch::dist_autograd::backward(*agent, ctx.id(), {loss});
//     opt.step(ctx.id());                   // the server's torch parameters move
//   }
//
// How the two graphs join. LibTorch's graph is mirrored into gradwire's as tensors leave: one
// gradwire node per LibTorch node (made once, shared by every tensor whose history reaches
// it), which runs the LibTorch node itself on the gradients, shared with LibTorch without a
// copy. A torch leaf's gradient goes to its gradwire twin, a gradwire leaf viewing the
// leaf's memory (autograd_leaf()), which is what the context keys it by and what
// parameter_rrefs() hands to a DistributedOptimizer: its functional optimizers (SGD, Adam,
// AdamW, Adagrad, with PyTorch's numerics) update the twin in place, and so the torch
// parameter, on its owner.
//
// Semantics: gradwire's exact mode, not PyTorch's FAST mode. Before any gradient flows, the
// pass discovers which sends will receive one, on every worker (the mirrored LibTorch nodes
// included), and each worker runs its part as one graph task: a LibTorch node reached by
// several calls' gradients runs once, with their sum, and only then frees what it saved.
// A call whose result never reaches the loss is never waited for. PyTorch 1.13's FAST mode
// instead counts, on each worker, a dependency for every send recorded there, assuming each
// will receive a gradient: a node behind a send whose result is unused waits, and the pass
// fails on the rpc timeout. Where every send receives a gradient the two agree (the tests'
// fixtures come from PyTorch's own dist_autograd; docs/libtorch.md shows both graphs).
//
// What LibTorch's engine does that this pass does not: post-hooks of LibTorch nodes and a
// leaf's hooks do not run (the leaf's gradient goes to the context, not to .grad()); a
// non-leaf's register_hook() hooks (the node's pre-hooks) do. gradwire::torch's
// DistributedDataParallel is not driven by this pass (its hooks are AccumulateGrad's).
// Mirroring happens when a tensor is sent or a root is given: a forward pass that grows a
// graph later is mirrored then. A parameter whose memory is replaced (set_data, a move to
// another device) gets a new twin: make the DistributedOptimizer after such moves.
//
// Thread-safety: every function may be called from any thread (one context runs one pass at
// a time, as in dist_autograd.h).
//
// Errors: as gradwire's dist_autograd (dist_autograd.h: InvalidArgument for an unknown
// context; the first failure of any worker ends the pass everywhere, naming it), and
// InvalidArgument for no roots, an undefined root or one that does not require grad (naming
// its position), for autograd_leaf / parameter_rref(s) of an undefined tensor or a non-leaf
// (naming its grad_fn), and for a LibTorch node whose gradient has a dtype gradwire lacks
// (complex), naming the node. A LibTorch node failing in the pass fails it with Error naming the
// node and LibTorch's message. LibTorch's own backward() through a received tensor throws
// InvalidArgument: that gradient flows only in this pass.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::torch::dist_autograd {

using gradwire::dist_autograd::BackwardOptions;

// Runs a backward pass from torch `roots` (one-element tensors get gradient 1) in context
// `context_id`, across every worker the context's calls reached; returns when every
// worker's part is done, or throws the first failure.
void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<at::Tensor>& roots,
              const BackwardOptions& options = {});
// On the default agent (init_rpc).
void backward(uint64_t context_id, const std::vector<at::Tensor>& roots,
              const BackwardOptions& options = {});

// This worker's torch leaves and their gradients in a context (a snapshot). Leaves are told
// apart by identity (the TensorImpl); the gradients share the context's memory.
class Gradients {
 public:
  Gradients() = default;
  explicit Gradients(std::vector<std::pair<at::Tensor, at::Tensor>> items);
  // The gradient of `leaf`; InvalidArgument when the context holds none for it.
  at::Tensor at(const at::Tensor& leaf) const;
  bool contains(const at::Tensor& leaf) const;
  size_t size() const { return items_.size(); }
  // (leaf, gradient), in the order the leaves first received one.
  const std::vector<std::pair<at::Tensor, at::Tensor>>& items() const { return items_; }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> items_;
  std::unordered_map<const void*, size_t> index_;
};

// The torch leaves' gradients on this worker in the context (gradwire leaves' are in
// gradwire::dist_autograd::get_gradients). Error naming the failure when the context's last
// pass failed here.
Gradients get_gradients(rpc::RpcAgent& agent, uint64_t context_id);
Gradients get_gradients(uint64_t context_id);

// The gradwire twin of torch leaf `leaf`: a gradwire leaf that requires grad and views the
// leaf's memory, the same tensor each time while the leaf keeps its memory. InvalidArgument
// for an undefined tensor or a non-leaf.
Tensor autograd_leaf(const at::Tensor& leaf);

// An owner reference to `param`'s twin on this worker, for a DistributedOptimizer.
rref::RRef<Tensor> parameter_rref(rpc::RpcAgent& agent, const at::Tensor& param);
// One for each of `module`'s parameters (recursively, in parameters() order).
std::vector<rref::RRef<Tensor>> parameter_rrefs(rpc::RpcAgent& agent,
                                                const ::torch::nn::Module& module);

}  // namespace gradwire::torch::dist_autograd
