// The ProcessGroup operations on torch tensors: each argument wrapped with from_torch
// (naming the operation and the argument when it is refused), the outputs' torch version
// counters bumped, then the group's operation.
#include "gradwire/torch/collectives.h"

#include <string>
#include <string_view>
#include <utility>

#include "gradwire/core/error.h"
#include "gradwire/torch/convert.h"

namespace gradwire::torch {

namespace {

enum class Access : bool { kRead, kWrite };

// `t` as a gradwire tensor; `what` names it in a refusal ("tensors[2]").
Tensor wrap(const at::Tensor& t, std::string_view op, const std::string& what, Access access) {
  Tensor g;
  try {
    g = from_torch(t);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(op) + ": " + what + ": " + e.what());
  }
  // Inference tensors have no version counter to bump.
  if (access == Access::kWrite && !t.is_inference()) t.unsafeGetTensorImpl()->bump_version();
  return g;
}

std::vector<Tensor> wrap_all(const std::vector<at::Tensor>& list, std::string_view op,
                             std::string_view what, Access access) {
  std::vector<Tensor> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i)
    out.push_back(wrap(list[i], op, std::string(what) + "[" + std::to_string(i) + "]", access));
  return out;
}

}  // namespace

c10d::Work all_reduce(c10d::ProcessGroup& group, const at::Tensor& tensor,
                      const c10d::AllReduceOptions& options) {
  return group.all_reduce(wrap(tensor, "all_reduce", "the tensor", Access::kWrite), options);
}

c10d::Work all_reduce(c10d::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                      const c10d::AllReduceOptions& options) {
  return group.all_reduce(wrap_all(tensors, "all_reduce", "tensors", Access::kWrite), options);
}

c10d::Work broadcast(c10d::ProcessGroup& group, const at::Tensor& tensor,
                     const c10d::BroadcastOptions& options) {
  return group.broadcast(wrap(tensor, "broadcast", "the tensor", Access::kWrite), options);
}

c10d::Work broadcast(c10d::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                     const c10d::BroadcastOptions& options) {
  return group.broadcast(wrap_all(tensors, "broadcast", "tensors", Access::kWrite), options);
}

c10d::Work broadcast_coalesced(c10d::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                               const c10d::BroadcastCoalescedOptions& options) {
  return group.broadcast_coalesced(
      wrap_all(tensors, "broadcast_coalesced", "tensors", Access::kWrite), options);
}

c10d::Work reduce(c10d::ProcessGroup& group, const at::Tensor& tensor,
                  const c10d::ReduceOptions& options) {
  return group.reduce(wrap(tensor, "reduce", "the tensor", Access::kWrite), options);
}

c10d::Work all_gather(c10d::ProcessGroup& group, const std::vector<at::Tensor>& outputs,
                      const at::Tensor& input, const c10d::AllGatherOptions& options) {
  return group.all_gather(wrap_all(outputs, "all_gather", "outputs", Access::kWrite),
                          wrap(input, "all_gather", "the input", Access::kRead), options);
}

c10d::Work gather(c10d::ProcessGroup& group, const std::vector<at::Tensor>& outputs,
                  const at::Tensor& input, const c10d::GatherOptions& options) {
  return group.gather(wrap_all(outputs, "gather", "outputs", Access::kWrite),
                      wrap(input, "gather", "the input", Access::kRead), options);
}

c10d::Work scatter(c10d::ProcessGroup& group, const at::Tensor& output,
                   const std::vector<at::Tensor>& inputs, const c10d::ScatterOptions& options) {
  return group.scatter(wrap(output, "scatter", "the output", Access::kWrite),
                       wrap_all(inputs, "scatter", "inputs", Access::kRead), options);
}

c10d::Work reduce_scatter(c10d::ProcessGroup& group, const at::Tensor& output,
                          const std::vector<at::Tensor>& inputs,
                          const c10d::ReduceScatterOptions& options) {
  return group.reduce_scatter(wrap(output, "reduce_scatter", "the output", Access::kWrite),
                              wrap_all(inputs, "reduce_scatter", "inputs", Access::kRead), options);
}

c10d::Work all_to_all(c10d::ProcessGroup& group, const std::vector<at::Tensor>& outputs,
                      const std::vector<at::Tensor>& inputs, const c10d::AllToAllOptions& options) {
  return group.all_to_all(wrap_all(outputs, "all_to_all", "outputs", Access::kWrite),
                          wrap_all(inputs, "all_to_all", "inputs", Access::kRead), options);
}

c10d::Work send(c10d::ProcessGroup& group, const at::Tensor& tensor, int dst, int tag) {
  return group.send(wrap(tensor, "send", "the tensor", Access::kRead), dst, tag);
}

c10d::Work recv(c10d::ProcessGroup& group, const at::Tensor& tensor, int src, int tag) {
  return group.recv(wrap(tensor, "recv", "the tensor", Access::kWrite), src, tag);
}

c10d::Work recv_any_source(c10d::ProcessGroup& group, const at::Tensor& tensor, int tag) {
  return group.recv_any_source(wrap(tensor, "recv_any_source", "the tensor", Access::kWrite), tag);
}

}  // namespace gradwire::torch
