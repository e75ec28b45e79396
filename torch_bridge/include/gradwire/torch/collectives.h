// gradwire's collectives on torch tensors, in place and without a copy.
//
// Each function wraps its torch tensors with from_torch (convert.h) — the gradwire tensors
// view the torch tensors' memory — and runs the ProcessGroup operation of the same name on
// them (process_group.h has the semantics, the options and the errors), so the results
// land in the torch tensors the caller passed: all_reduce, broadcast and reduce (on the
// root) update them in place; all_gather, gather, scatter, reduce_scatter, all_to_all and
// recv write into the outputs. Any backend works (shm, Gloo, hierarchical, NCCL for CUDA
// tensors); as with gradwire tensors, the tensors must be contiguous and of a dtype and
// device the backend serves.
//
//   auto group = c10d::make_process_group("shm", store, rank, world);
//   at::Tensor grad = model->parameters()[0].grad();
//   gradwire::torch::all_reduce(*group, grad, {.op = c10d::ReduceOp::kAvg}).wait();
//
// The returned Work is the group's: wait() on it before reading the outputs or touching
// any of the tensors; it keeps their memory alive until the operation ends. Every tensor
// the operation writes has its torch version counter bumped when the call is made, so a
// torch autograd graph that saved one of them reports the modification at backward
// (writes from another rank arrive without torch's dispatcher).
//
// Errors: InvalidArgument, thrown at the call, for a tensor from_torch refuses, naming the
// operation and the argument ("all_gather: outputs[1]: from_torch: torch dtype torch.int8
// (Char) has no gradwire dtype ..."); everything else as ProcessGroup's operations report
// it (a non-contiguous tensor, mismatched sizes, an invalid root, timeouts, lost peers).
//
// Thread-safety: as the group's operations (issue collectives in the same order on every
// rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "gradwire/c10d/process_group.h"

namespace gradwire::torch {

c10d::Work all_reduce(c10d::ProcessGroup& group, const at::Tensor& tensor,
                      const c10d::AllReduceOptions& options = {});
c10d::Work all_reduce(c10d::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                      const c10d::AllReduceOptions& options = {});
c10d::Work broadcast(c10d::ProcessGroup& group, const at::Tensor& tensor,
                     const c10d::BroadcastOptions& options = {});
c10d::Work broadcast(c10d::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                     const c10d::BroadcastOptions& options = {});
// Many tensors (a module's parameters and buffers) packed into few broadcasts.
c10d::Work broadcast_coalesced(c10d::ProcessGroup& group, const std::vector<at::Tensor>& tensors,
                               const c10d::BroadcastCoalescedOptions& options = {});
c10d::Work reduce(c10d::ProcessGroup& group, const at::Tensor& tensor,
                  const c10d::ReduceOptions& options = {});
c10d::Work all_gather(c10d::ProcessGroup& group, const std::vector<at::Tensor>& outputs,
                      const at::Tensor& input, const c10d::AllGatherOptions& options = {});
// Only the root passes outputs; the other ranks pass an empty list.
c10d::Work gather(c10d::ProcessGroup& group, const std::vector<at::Tensor>& outputs,
                  const at::Tensor& input, const c10d::GatherOptions& options = {});
// Only the root passes inputs; the other ranks pass an empty list.
c10d::Work scatter(c10d::ProcessGroup& group, const at::Tensor& output,
                   const std::vector<at::Tensor>& inputs, const c10d::ScatterOptions& options = {});
c10d::Work reduce_scatter(c10d::ProcessGroup& group, const at::Tensor& output,
                          const std::vector<at::Tensor>& inputs,
                          const c10d::ReduceScatterOptions& options = {});
c10d::Work all_to_all(c10d::ProcessGroup& group, const std::vector<at::Tensor>& outputs,
                      const std::vector<at::Tensor>& inputs,
                      const c10d::AllToAllOptions& options = {});
// Takes no tensors; here so that code written against these functions needs no other.
inline c10d::Work barrier(c10d::ProcessGroup& group, const c10d::BarrierOptions& options = {}) {
  return group.barrier(options);
}

c10d::Work send(c10d::ProcessGroup& group, const at::Tensor& tensor, int dst, int tag = 0);
c10d::Work recv(c10d::ProcessGroup& group, const at::Tensor& tensor, int src, int tag = 0);
// Work::source_rank() names the sender.
c10d::Work recv_any_source(c10d::ProcessGroup& group, const at::Tensor& tensor, int tag = 0);

}  // namespace gradwire::torch
