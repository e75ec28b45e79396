// torch tensors as rpc values: ValueConverter<at::Tensor>.
//
// Including this header lets an at::Tensor (torch::Tensor) be an argument or result of
// rpc_sync / rpc_async / remote, an RRef's value (RRef<at::Tensor>, to_here()), and an
// element of the containers rpc converts (std::vector<at::Tensor>, std::tuple, std::pair,
// std::optional, std::map with bool, integer or string keys):
//
//   rpc::registry().def("scale", [](const at::Tensor& x, double s) { return x * s; });
//   at::Tensor y = agent->rpc_sync<at::Tensor>("w1", "scale", at::ones({2, 3}), 2.0);
//
// A torch tensor travels as a gradwire tensor (value.h's kind Tensor, shown as "Tensor" in
// signatures and messages): the sender wraps it with from_torch (convert.h) without a
// copy, and the receiver wraps the received memory with to_torch, so the torch tensor it
// gets owns that memory with no copy after the transport's. One side may therefore use
// torch tensors where the other uses gradwire Tensors, in calls and in RRefs alike.
//
// What travels: the values, dtype and sizes, as any tensor (a view travels as its
// elements, packed; a CUDA tensor is staged through host memory and delivered on the
// device the agent's device map names, as gradwire's are), and requires_grad: outside a
// dist_autograd context a tensor that requires grad arrives as a fresh leaf that requires
// grad; within one, its LibTorch history is recorded (the sender's graph mirrored, the
// receiver's tensor given a grad_fn leading back to it), so that
// gradwire::torch::dist_autograd::backward runs through the call (dist_autograd.h).
//
// Errors: sending an undefined at::Tensor (send std::nullopt for None), or one from_torch
// refuses (the dtype or layout it names), throws InvalidArgument at the call; a received
// value that is not a tensor, or a sparse-rows tensor, throws InvalidArgument naming where
// it was (the argument or the result) and what it got.
//
// Thread-safety: stateless, as every converter.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "gradwire/rpc/value_convert.h"
#include "gradwire/torch/convert.h"

namespace gradwire::torch {

// The Value an at::Tensor travels as (from_torch, with its requires_grad).
rpc::Value tensor_to_value(const at::Tensor& t);
// The at::Tensor a received Value holds (to_torch, with its requires_grad); `where`
// starts the message of the InvalidArgument thrown for anything else.
at::Tensor tensor_from_value(const rpc::Value& v, const rpc::Where& where);

}  // namespace gradwire::torch

namespace gradwire::rpc {

template <>
struct ValueConverter<at::Tensor> {
  static Value to(const at::Tensor& t) { return gradwire::torch::tensor_to_value(t); }
  static at::Tensor from(const Value& v, const Where& where) {
    return gradwire::torch::tensor_from_value(v, where);
  }
  static std::string name() { return "Tensor"; }
};

}  // namespace gradwire::rpc
