// ValueConverter<at::Tensor>'s two halves: a torch tensor to a gradwire tensor Value and
// back, each without a copy, with requires_grad carried as gradwire tensors carry it, and
// within a dist_autograd context the LibTorch history joined to gradwire's (graph.h).
#include "gradwire/torch/value_convert.h"

#include <string>

#include "gradwire/core/error.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "graph.h"

namespace gradwire::torch {

rpc::Value tensor_to_value(const at::Tensor& t) {
  if (!t.defined()) {
    throw InvalidArgument("an undefined torch tensor cannot be sent; send std::nullopt (None)");
  }
  // Within a dist_autograd context, a tensor that requires grad leaves with its LibTorch
  // history mirrored (graph.h): the context's send function will lead into it.
  if (t.requires_grad() && dist_autograd::current_context_id() != 0) {
    return rpc::Value(graph::recorded(t));
  }
  Tensor g = from_torch(t);
  // The flag travels with the tensor (the rpc codec reads requires_grad()); from_torch's
  // result is a fresh tensor with no history, so marking it records nothing.
  if (t.requires_grad()) g.set_requires_grad(true);
  return rpc::Value(std::move(g));
}

at::Tensor tensor_from_value(const rpc::Value& v, const rpc::Where& where) {
  if (v.type() != rpc::ValueType::kTensor) {
    rpc::detail::throw_type_mismatch(where, rpc::type_name<at::Tensor>(), v);
  }
  const Tensor& g = v.as_tensor();
  if (g.is_sparse()) {
    throw InvalidArgument(where.str() + ": expected a strided Tensor for a torch tensor, got " +
                          v.describe() + " (sparse rows)");
  }
  // Received within a context (dist_autograd gave it its recv function): its torch tensor's
  // gradient goes back into that history.
  if (g.requires_grad() && !g.is_leaf()) return graph::received(g);
  at::Tensor t = to_torch(g.detach());
  if (g.requires_grad()) t.set_requires_grad(true);
  return t;
}

}  // namespace gradwire::torch
