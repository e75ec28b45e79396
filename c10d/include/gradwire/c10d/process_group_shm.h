// ProcessGroupShm: the CPU backend for ranks that share a host, over shared memory.
//
// Each rank creates one shared-memory segment of its own (shm_open, mode 0600, a name made
// from a random token that the ranks exchange through the Store; the name is unlinked once
// every rank has mapped it) and maps every other rank's segment read-only. A rank writes
// only into its own segment, so a crashed or hostile peer can spoil only what it
// contributes to a collective (the collective's result), never another rank's memory or
// control words. A segment holds a header (magic, version, rank, sizes, a random token, the
// owner's pid, a step counter and per-area lengths) and four data areas of
// ShmOptions::buffer_bytes each: two input areas and two output areas, used alternately so
// that copying chunk k+1 in overlaps the peers' reduction of chunk k. Larger tensors move in
// chunks of one area.
//
// Progress: every rank counts the steps it has published (a step is one area written).
// Every rank runs the same sequence of steps for the same collectives, so a rank knows which
// step of a peer it needs; it spins for ShmOptions::spin, then sleeps on a futex on the
// peer's step word in slices of ShmOptions::wait_slice (an idle rank uses no CPU). Each
// slice it checks that the peer is alive (a pidfd; the pid is in the header) and that its
// header still validates. A peer whose step goes backwards or runs further ahead than the
// protocol allows, whose header changed, or whose area holds a length other than the one
// expected fails the collective with a NetworkError naming the rank; it never causes an
// out-of-bounds read or a hang.
//
// all_reduce: each rank copies its chunk (less its own slice) into its input area and
// publishes; each rank combines slice r (1/n of the chunk, r = its rank) of every rank's
// input area (its own from its tensor), in rank order 0, 1, ..., n-1, into its output area
// and publishes; each rank copies every other rank's slice out. The reduction order is therefore
// fixed: results are deterministic run to run, bitwise equal to Gloo's for integer and bool
// tensors, and for floating types equal to the left-to-right sum x0 + x1 + ... + x(n-1) rounded at
// each step (float16 and bfloat16 are combined in float32 and rounded once per step, as Gloo's
// kernels do). Gloo's ring adds in another order, so floating results differ from Gloo's by at most
// the usual bound of a reordered sum, (n-1) * eps * sum |x_i| per element (eps of the dtype).
// reduce and reduce_scatter use the same fixed order. kAvg divides the sum by the size.
//
// The other collectives move data in rounds: each rank writes its part into an input
// area, publishes, waits for every rank, and reads what it needs. Point-to-point messages
// (send, recv, recv_any_source, and so monitored_barrier) go through an internal
// ProcessGroupGloo made from the same store under the prefix "shm_p2p/".
//
// Every rank of the group must share this host and network namespace (net::host_id and
// net::network_namespace_id, exchanged through the store); create() throws InvalidArgument
// naming the ranks that do not. make_process_group("cpu" | "shm", ...) makes a
// ProcessGroupShm when they all do and a HierarchicalProcessGroup (below) otherwise.
//
// Operations are queued in call order and run one at a time on a worker thread of the
// group, like ProcessGroupGloo's; Work and futures behave the same.
//
// Thread-safety: as ProcessGroup.
// Errors: creation throws InvalidArgument for bad options or ranks on other hosts,
// TimeoutError naming the ranks that did not appear, NetworkError when a segment cannot be
// made or a peer's does not validate. Operations fail with TimeoutError (options.timeout
// ran out while waiting for a rank, named) or NetworkError (a rank exited, by pid, or its
// segment failed validation); both name the ranks that did not reach the collective, and
// after a failure every later operation of the group fails at once with that error.
//
// Example:
//   auto group = c10d::ProcessGroupShm::create(store, rank, world, {.timeout = 30s});
//   group->all_reduce(grads).wait();
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/c10d/process_group.h"
#include "gradwire/c10d/process_group_gloo.h"

namespace gradwire::c10d {

struct ShmOptions {
  // Bytes of each of a segment's four data areas (>= 4096 and >= 64 per rank; rounded up
  // to the page size). A collective moves data in chunks of at most this size; the segment
  // is four times it. The default keeps every rank's live areas within a shared
  // last-level cache; areas that spill out of it make each chunk go to memory and back.
  size_t buffer_bytes{1 << 20};
  // How long a waiting rank polls a peer's step before sleeping on the futex.
  std::chrono::microseconds spin{10};
  // The longest single futex sleep: how often a waiter checks that its peers are alive and
  // their headers valid (> 0). A dead rank is named within about this long.
  std::chrono::milliseconds wait_slice{100};
  // Options of the internal Gloo group that carries point-to-point messages.
  GlooOptions gloo{};
};

// The header at the start of every segment. The owner writes it; the others validate it
// when they map the segment and whenever they read its control words.
struct ShmSegmentHeader {
  static constexpr uint64_t kMagic = 0x4753'4d48'5357'4731ULL;  // "GSMHSWG1"
  static constexpr uint32_t kVersion = 1;
  static constexpr size_t kBytes = 4096;  // the data areas start here

  uint64_t magic;
  uint32_t version;
  int32_t rank;
  uint64_t segment_bytes;  // the whole segment
  uint64_t area_bytes;     // each data area
  uint64_t token;          // random, also published in the store
  int32_t pid;
  uint32_t world;
  // Steps published so far (futex word). Waiters sleep on it; the owner wakes them.
  alignas(64) std::atomic<uint32_t> step;
  // Bytes the owner placed in each area (input 0, input 1, output 0, output 1) for the
  // step that last wrote it.
  alignas(64) std::atomic<uint64_t> lengths[4];
  // all_to_all: the rounds this rank needs.
  std::atomic<uint64_t> rounds;
};

class ShmExchange;  // one operation's view of the segments (internal)

class ProcessGroupShm : public ProcessGroup {
 public:
  static std::shared_ptr<ProcessGroupShm> create(std::shared_ptr<Store> store, int rank, int size,
                                                 ProcessGroupOptions options = {},
                                                 ShmOptions shm_options = {});
  ~ProcessGroupShm() override;

  std::string_view backend_name() const override { return "shm"; }
  // all_reduce reads its tensors and writes its results in place, however many tensors.
  bool all_reduce_in_place() const override { return true; }
  const ShmOptions& shm_options() const { return shm_options_; }

  // Whether every rank of a group about to be made shares this host and network
  // namespace: each rank publishes its ids under "<key>/<rank>" and reads the others'
  // (every rank must call it with the same key). Throws TimeoutError naming the ranks that
  // did not publish within `timeout`.
  static bool ranks_share_host(Store& store, int rank, int size, const std::string& key,
                               std::chrono::milliseconds timeout);
  // The same exchange, returning every rank's "<host id>/<network namespace id>".
  static std::vector<std::string> rank_hosts(Store& store, int rank, int size,
                                             const std::string& key,
                                             std::chrono::milliseconds timeout);

  // For tests that play a hostile peer: this rank's own segment header, writable.
  ShmSegmentHeader* own_header_for_testing();

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
  Work do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) override;
  Work do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) override;
  std::shared_ptr<ProcessGroup> make_subgroup(std::shared_ptr<Store> store, int rank, int size,
                                              ProcessGroupOptions options) override;
  bool supports_device(const Device& device) const override { return !device.is_cuda(); }
  bool supports_dtype(DType) const override { return true; }
  std::string_view supported_devices_text() const override { return "CPU tensors"; }

 private:
  ProcessGroupShm(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options,
                  ShmOptions shm_options);
  // Makes this rank's segment, maps the others' and makes the point-to-point group.
  void connect(const std::string& what);
  // Queues `run` on the worker; the Work completes with `outputs` when it returns.
  Work enqueue(const OpContext& ctx, std::vector<Tensor> outputs,
               std::function<void(ShmExchange&)> run);

  ShmOptions shm_options_;
  std::unique_ptr<Impl> impl_;
};

// HierarchicalProcessGroup: shared memory within each host, Gloo across hosts, for a group
// whose ranks span hosts or network namespaces. make_process_group("cpu" | "shm", ...)
// makes one when the ranks' host ids (or network namespaces) differ; its backend_name() is
// "shm-hierarchical".
//
// It holds a ProcessGroupShm of the ranks of this host (in rank order), a ProcessGroupGloo
// of one leader per host (the lowest rank of each host; only leaders hold it) and a
// ProcessGroupGloo of every rank. all_reduce runs in three stages: reduce to the host's
// leader over shared memory, all_reduce among the leaders over Gloo, broadcast from the
// leader over shared memory, so each host sends one copy of the data across instead of
// one per rank. Integer and bool results equal Gloo's bit for bit; floating sums are
// combined in a fixed order within a host and in Gloo's order across hosts. Every other
// operation (broadcast, reduce, the gathers and scatters, reduce_scatter, all_to_all,
// barrier, point-to-point) runs on the Gloo group of every rank.
//
// Thread-safety: as ProcessGroup. Errors: as the groups it holds; a failure of an
// all_reduce stage names the stage and how the host's ranks map to this group's.
class HierarchicalProcessGroup : public ProcessGroup {
 public:
  // `hosts[r]` says where rank r is (equal strings: same host and network namespace);
  // every rank passes the same list. Throws InvalidArgument when hosts.size() != size.
  static std::shared_ptr<HierarchicalProcessGroup> create(std::shared_ptr<Store> store, int rank,
                                                          int size, std::vector<std::string> hosts,
                                                          ProcessGroupOptions options = {},
                                                          ShmOptions shm_options = {});
  ~HierarchicalProcessGroup() override;

  std::string_view backend_name() const override { return "shm-hierarchical"; }
  // This host's ranks, in this group's numbering.
  const std::vector<int>& host_ranks() const { return host_ranks_; }

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
  Work do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) override;
  Work do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) override;
  std::shared_ptr<ProcessGroup> make_subgroup(std::shared_ptr<Store> store, int rank, int size,
                                              ProcessGroupOptions options) override;
  bool supports_device(const Device& device) const override { return !device.is_cuda(); }
  bool supports_dtype(DType) const override { return true; }
  std::string_view supported_devices_text() const override { return "CPU tensors"; }

 private:
  HierarchicalProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                           ProcessGroupOptions options);
  // A failed Work when one of the groups it holds has failed.
  std::optional<Work> held_failure(const OpContext& ctx) const;

  std::vector<int> host_ranks_;
  ShmOptions shm_options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradwire::c10d
