// ProcessGroupGloo: the CPU backend, on Gloo's TCP transport.
//
// Creating the group connects every pair of ranks (a full mesh), exchanging addresses
// through the Store under the group's prefix, and returns once every rank has connected. Operations
// are queued in call order and run on a small pool of worker threads (GlooOptions::threads), so the
// caller can overlap its own work with communication; two queued collectives may run at once, kept
// apart by their operation numbers. Point-to-point sends and receives start on the calling thread
// and complete on Gloo's I/O thread.
//
// Algorithms: all_reduce uses Gloo's bcube (halving/doubling) algorithm up to
// GlooOptions::small_all_reduce_bytes and its ring (bandwidth-optimal, segmented) above;
// reduce_scatter is a ring; the rest use Gloo's algorithms. Reductions run through
// gradwire's own vectorisable kernels for every dtype: float32/64, float16 and bfloat16
// (combined in float32), int32/64, uint8 and bool.
//
// Tensors must be contiguous CPU tensors (InvalidArgument otherwise, naming the operation
// and the tensor).
//
// Signals: Gloo writes to its sockets without MSG_NOSIGNAL, so the first group created sets
// SIGPIPE to be ignored if it still has its default action (a handler the program
// installed is kept); a peer that dies then fails operations with an error instead of
// killing this process with SIGPIPE.
//
// Thread-safety: as ProcessGroup. Destroying the group waits for queued operations to
// finish or fail (each within its timeout).
// Errors: creation throws TimeoutError when peers do not all appear within the timeout
// (naming the ranks whose addresses are missing), NetworkError when a peer cannot be
// reached; operations fail with TimeoutError or NetworkError naming the group, the
// operation and the ranks that did not reach it. Gloo raises one exception type for both;
// a failure is a TimeoutError when the operation's timeout had passed since it started
// (every Gloo wait of it is given that timeout), a NetworkError before.
//
// Example:
//   auto group = c10d::ProcessGroupGloo::create(store, rank, world,
//                                               {.timeout = 30s}, {.host = "10.0.0.7"});
//   group->all_reduce(t).wait();
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "gradwire/c10d/process_group.h"

namespace gradwire::c10d {

struct GlooOptions {
  // The address this rank listens on and advertises to its peers. Empty: the
  // GRADWIRE_GLOO_HOST variable; else the IPv4 address of the interface GLOO_SOCKET_IFNAME
  // names; else the address the rpc agent would choose (net::advertised_host, core/net.h):
  // GRADWIRE_RPC_HOST, GRADWIRE_SOCKET_IFNAME's interface, or the local address of the
  // interface that routes to the store's host (the rendezvous master, seen through
  // PrefixStores; MASTER_ADDR for a FileStore or HashStore), which is 127.0.0.1 only when
  // the master is on this host's loopback. So a group spans hosts and containers without
  // being told an address. An interface that does not exist is an InvalidArgument naming
  // it; a master that cannot be resolved or routed to, a NetworkError.
  std::string host{};
  // Worker threads that run queued operations (>= 1).
  int threads{2};
  // all_reduce switches from bcube to ring above this many bytes.
  size_t small_all_reduce_bytes{256 * 1024};
  // The ring all_reduce moves data in segments of at most this size, two in flight.
  // Larger than Gloo's own default of 1 MiB: each segment costs the peers a wake-up, so
  // larger segments move more bytes per wake-up, while much larger ones stall the pipeline.
  size_t all_reduce_segment_bytes{4 << 20};
};

class ProcessGroupGloo : public ProcessGroup {
 public:
  static std::shared_ptr<ProcessGroupGloo> create(std::shared_ptr<Store> store, int rank, int size,
                                                  ProcessGroupOptions options = {},
                                                  GlooOptions gloo_options = {});
  ~ProcessGroupGloo() override;

  std::string_view backend_name() const override { return "gloo"; }
  const GlooOptions& gloo_options() const { return gloo_options_; }

  struct Impl;

 protected:
  // ProcessGroupShm carries its point-to-point messages over an internal Gloo group;
  // HierarchicalProcessGroup runs the operations it does not stage itself on one.
  friend class ProcessGroupShm;
  friend class HierarchicalProcessGroup;
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
  Work do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) override;
  Work do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) override;
  std::shared_ptr<ProcessGroup> make_subgroup(std::shared_ptr<Store> store, int rank, int size,
                                              ProcessGroupOptions options) override;
  bool supports_device(const Device& device) const override { return !device.is_cuda(); }
  bool supports_dtype(DType) const override { return true; }
  std::string_view supported_devices_text() const override { return "CPU tensors"; }

 private:
  ProcessGroupGloo(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options,
                   GlooOptions gloo_options);
  // Connects the full mesh through the store and starts the workers.
  void connect(const std::string& what);
  // Queues `run` on the workers; the Work completes with `outputs` when run returns, or
  // with the error it threw.
  Work enqueue(const OpContext& ctx, std::vector<Tensor> outputs,
               std::function<void(WorkState&)> run);
  // One Gloo broadcast of `t`'s bytes, on an operation's worker.
  void broadcast_buffer(const Tensor& t, int root, const OpContext& ctx);
  // Posts a send or receive (peer < 0: from any rank) and hands the wait to a waiter.
  Work start_p2p(const Tensor& tensor, int peer, uint64_t tag, bool is_send, const OpContext& ctx);

  GlooOptions gloo_options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradwire::c10d
