// ValueConverter<at::Tensor>'s two halves: a torch tensor to a gradwire tensor Value and
// back, each without a copy, with requires_grad carried as gradwire tensors carry it.
#include "gradwire/torch/value_convert.h"

#include <string>

#include "gradwire/core/error.h"

namespace gradwire::torch {

rpc::Value tensor_to_value(const at::Tensor& t) {
  if (!t.defined()) {
    throw InvalidArgument("an undefined torch tensor cannot be sent; send std::nullopt (None)");
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
  at::Tensor t = to_torch(g.detach());
  if (g.requires_grad()) t.set_requires_grad(true);
  return t;
}

}  // namespace gradwire::torch
