// Walking a Value tree: modules above rpc/ look inside the arguments and results of calls
// for what they care about (rref/ for RRef descriptors, dist_autograd/ for tensors that
// require grad) without knowing how lists and maps nest.
//
// Thread-safety: a walk only reads the tree; the visitor runs on the calling thread.
//
// Example:
//   std::vector<Tensor> tensors;
//   rpc::for_each_leaf(request.args, [&](const rpc::Value& v) {
//     if (v.type() == rpc::ValueType::kTensor) tensors.push_back(v.as_tensor());
//   });
#pragma once

#include <vector>

#include "gradwire/rpc/value.h"

namespace gradwire::rpc {

// Calls fn(leaf) for every Value in the tree that is not a list or a map, depth first, in
// order (a map's values in its order; keys are not visited). The depth is bounded by what
// the envelope's codec admits.
template <typename F>
void for_each_leaf(const Value& value, F&& fn) {
  switch (value.type()) {
    case ValueType::kList:
      for (const Value& item : value.as_list())
        for_each_leaf(item, fn);
      break;
    case ValueType::kMap:
      for (const auto& entry : value.as_map())
        for_each_leaf(entry.second, fn);
      break;
    default:
      fn(value);
      break;
  }
}

// The same over a call's arguments.
template <typename F>
void for_each_leaf(const std::vector<Value>& values, F&& fn) {
  for (const Value& v : values)
    for_each_leaf(v, fn);
}

}  // namespace gradwire::rpc
