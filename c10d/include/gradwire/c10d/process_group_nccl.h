// ProcessGroupNCCL: the CUDA backend, on NCCL.
//
// Each rank of the group drives one GPU: the device of the first tensor it is given (or,
// for a barrier before any tensor, the calling thread's current device). The first
// operation creates the NCCL communicator: rank 0 draws NCCL's unique id and publishes it
// in the Store under the group's prefix ("nccl/uid/<n>"), the others read it, and every
// rank joins with a non-blocking ncclCommInitRankConfig that is aborted when the
// operation's deadline passes. NCCL refuses two ranks of one communicator on one GPU, so
// run one rank per GPU (one process per GPU, or one thread per GPU).
//
// Streams: every operation runs on the group's own CUDA stream (non-blocking, optionally
// of high priority). Before it starts, that stream waits for the work already queued on
// the device's legacy default stream, where gradwire's tensor kernels and copies run, so
// inputs written just before the call are read correctly. Work::wait() does not block the
// host: it makes the legacy default stream wait for the operation and returns (its timeout
// does not apply; the operation's own deadline does), so tensor code issued afterwards (a
// kernel, a copy to the CPU) sees the result. Code that runs on other streams must order
// itself after the legacy default stream. Work::is_completed() and the Work's future
// report completion on the GPU: a watchdog thread per group polls the operations in
// flight, completes their futures and enforces their deadlines. With
// NcclOptions::blocking_wait, and always for barrier(), wait(timeout) blocks the host
// until the operation has finished on the GPU instead.
//
// Reductions run in NCCL for float32/64, float16, bfloat16, int32/64 and uint8; bool
// tensors travel as bytes, kSum and kMax reduced as a maximum (logical OR), kProduct and
// kMin as a minimum (logical AND); kAvg uses NCCL's own average. all_gather and
// reduce_scatter use one ncclAllGather / ncclReduceScatter when the per-rank tensors are
// consecutive pieces of one buffer (views of one flat tensor), and one grouped
// ncclBroadcast / ncclReduce per rank otherwise, so no staging buffer is allocated.
// gather, scatter and all_to_all are grouped ncclSend/ncclRecv.
//
// Point-to-point: NCCL has no tags. Tags are accepted and checked, but messages to and
// from one peer are matched in issue order on the group's stream, as in PyTorch's NCCL
// backend: post the sends and receives of every pair in the same order on both sides (a
// send blocks the stream until the peer receives, so two ranks that each send to the other
// before receiving can deadlock once a message exceeds NCCL's buffering).
// recv_any_source throws InvalidArgument: NCCL cannot receive from any source.
//
// Network interface: NCCL chooses the interface of its sockets from NCCL_SOCKET_IFNAME.
// When that is unset and GRADWIRE_SOCKET_IFNAME is set (the interface every gradwire
// transport then uses, core/net.h), the first ProcessGroupNCCL created sets
// NCCL_SOCKET_IFNAME to it, before any communicator exists (setenv: create the first group
// while no other thread reads the environment).
//
// Thread-safety: as ProcessGroup. Operations of one group are issued one at a time (a
// lock), in call order. Destroying the group waits for the operations in flight to finish
// or pass their deadlines, then releases the communicator (ncclCommFinalize and
// ncclCommDestroy, or ncclCommAbort when it is busy or broken).
// Errors: a CPU tensor throws InvalidArgument, as does a tensor on a device other than the
// rank's (naming both devices). An operation whose communicator cannot be created in
// time, that does not finish before its deadline, or that NCCL reports broken fails with
// TimeoutError or NetworkError naming the operation, the NCCL call and NCCL's error text,
// and the ranks that did not reach it; the communicator is then aborted, and every later
// operation of the group fails at once with that first error. A failing CUDA call fails
// the operation, and so the group, with gradwire::Error naming the call and the device.
//
// Example:
//   auto [store, rank, world] = c10d::rendezvous("env://");
//   auto group = c10d::ProcessGroupNCCL::create(store, rank, world, {.timeout = 60s});
//   Tensor g = grads.to(Device::cuda(local_rank));
//   group->all_reduce(g, {.op = c10d::ReduceOp::kAvg}).wait();   // orders the stream
//   std::vector<float> host = g.to_vector<float>();              // sees the average
#pragma once

#include <chrono>
#include <memory>
#include <string_view>

#include "gradwire/c10d/process_group.h"
#include "gradwire/config.h"

#if GRADWIRE_HAS_NCCL

namespace gradwire::c10d {

struct NcclOptions {
  // Create the group's stream with the device's highest priority, so that communication
  // overlapping with computation is scheduled first.
  bool high_priority_stream{false};
  // wait() blocks the host until the operation has finished on the GPU (up to its
  // timeout) instead of ordering the legacy default stream after it.
  bool blocking_wait{false};
  // How often the watchdog looks at the operations in flight (> 0). Futures complete and
  // deadlines are noticed this much late at most; an idle group does not poll.
  std::chrono::microseconds watchdog_interval{500};
};

class ProcessGroupNCCL : public ProcessGroup {
 public:
  // Does not touch the GPU: the communicator is created by the first operation.
  // Throws InvalidArgument for bad options (as ProcessGroup, and a non-positive
  // watchdog_interval).
  static std::shared_ptr<ProcessGroupNCCL> create(std::shared_ptr<Store> store, int rank, int size,
                                                  ProcessGroupOptions options = {},
                                                  NcclOptions nccl_options = {});
  ~ProcessGroupNCCL() override;

  std::string_view backend_name() const override { return "nccl"; }
  const NcclOptions& nccl_options() const { return nccl_options_; }

  struct Impl;

 protected:
  Work do_all_reduce(std::vector<Tensor> tensors, ReduceOp op, const OpContext& ctx) override;
  Work do_broadcast(std::vector<Tensor> tensors, int root, const OpContext& ctx) override;
  Work do_broadcast_coalesced(std::vector<Tensor> tensors, std::vector<std::vector<size_t>> buckets,
                              int root, const OpContext& ctx) override;
  Work do_reduce(const Tensor& tensor, int root, ReduceOp op, const OpContext& ctx) override;
  Work do_all_gather(std::vector<Tensor> outputs, const Tensor& input,
                     const OpContext& ctx) override;
  Work do_gather(std::vector<Tensor> outputs, const Tensor& input, int root,
                 const OpContext& ctx) override;
  Work do_scatter(const Tensor& output, std::vector<Tensor> inputs, int root,
                  const OpContext& ctx) override;
  Work do_reduce_scatter(const Tensor& output, std::vector<Tensor> inputs, ReduceOp op,
                         const OpContext& ctx) override;
  Work do_all_to_all(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                     const OpContext& ctx) override;
  Work do_barrier(const OpContext& ctx) override;
  // `tag` is accepted but not matched on: see the file comment.
  Work do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) override;
  // Throws InvalidArgument for src < 0 (any source).
  Work do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) override;
  std::shared_ptr<ProcessGroup> make_subgroup(std::shared_ptr<Store> store, int rank, int size,
                                              ProcessGroupOptions options) override;
  bool supports_device(const Device& device) const override { return device.is_cuda(); }
  bool supports_dtype(DType) const override { return true; }
  std::string_view supported_devices_text() const override { return "CUDA tensors"; }
  // Every tensor on this rank's device (or, before the group has one, on the first
  // tensor's), checked before the operation is numbered.
  void check_backend_args(const OpContext& ctx, const std::vector<TensorArg>& args) const override;

 private:
  ProcessGroupNCCL(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options,
                   NcclOptions nccl_options);

  NcclOptions nccl_options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradwire::c10d

#endif  // GRADWIRE_HAS_NCCL
