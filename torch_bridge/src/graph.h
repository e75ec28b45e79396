// LibTorch's autograd graph joined to gradwire's, for dist_autograd (dist_autograd.h of
// this module says what users see).
//
// A torch tensor that requires grad and is sent within a dist_autograd context travels as
// a gradwire tensor whose history leads into a mirror of its torch graph: one gradwire node
// (TorchNodeBackward) per torch node, made once per torch node and shared by every tensor
// whose history reaches it, whose apply() runs the torch node itself on the gradients
// (shared with torch without a copy). A torch leaf's AccumulateGrad is replaced by the
// AccumulateGrad of the leaf's gradwire twin (a gradwire leaf viewing the leaf's memory),
// so its gradient lands in the context, keyed by the twin. A tensor received within a
// context becomes a torch tensor whose grad_fn (GradwireRecvBackward) hands its gradient to
// the received gradwire tensor's history (the recv function); mirroring a graph that
// reaches it continues in gradwire's graph there. gradwire's engine then runs one graph:
// discovery, dependencies and the exact accounting of dist_autograd cover the torch parts.
//
// Thread-safety: every function may be called from any thread (one process-wide mutex
// guards the mirror and twin tables while a graph is walked).
#pragma once

#include <ATen/core/Tensor.h>

#include "gradwire/autograd/node.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::torch::graph {

// The gradwire tensor a torch tensor `t` that requires grad travels as within a context: the
// twin of a leaf, or a tensor sharing t's memory whose history mirrors t's torch graph.
Tensor recorded(const at::Tensor& t);

// The torch tensor a received gradwire tensor `g` with a history becomes: g's memory, with
// a grad_fn that passes its gradient into g's history.
at::Tensor received(const Tensor& g);

// The gradwire twin of torch leaf `leaf` (made on first use; the same tensor while the leaf
// lives and keeps its memory). InvalidArgument for a tensor that is not a leaf.
Tensor twin_of(const at::Tensor& leaf);

// The torch leaf whose twin `twin` is; undefined when `twin` is no twin (or its leaf is
// gone).
at::Tensor leaf_of_twin(const Tensor& twin);

}  // namespace gradwire::torch::graph
