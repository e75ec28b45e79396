// ProcessGroup: collectives and point-to-point messages among the ranks of a job.
//
// A group is `size` ranks that met through a Store; each rank holds one ProcessGroup
// object and calls the same collectives in the same order. Backends implement the
// transport (ProcessGroupGloo over TCP for CPU tensors, ProcessGroupNCCL for CUDA
// tensors); this base class owns what every backend shares:
//
//   - argument checks, done on the calling thread before anything is sent, so a bad call
//     throws at once (InvalidArgument naming the operation, the tensor, what was expected
//     and what was received) instead of hanging its peers;
//   - operation numbering (#1, #2, ... per group, in call order) used for tags, store keys
//     and messages. A collective is numbered only once its arguments have passed every
//     check (the backend's included), so a rank that catches InvalidArgument and retries
//     stays in step with its peers;
//   - the debug check (GRADWIRE_DISTRIBUTED_DEBUG=DETAIL): before each collective the
//     ranks exchange a short signature (operation, reduce op, root, dtypes, shapes)
//     through the store; when they differ every rank throws InvalidArgument naming which
//     ranks called what, instead of hanging or reducing mismatched buffers;
//   - failure reports: when a collective fails (timeout, lost peer), the ranks that
//     reached it mark their arrival in the store, and the error names the ranks that did
//     not ("all_reduce #3 (group 'default', rank 0) timed out after 500 ms; ranks that
//     did not reach it: [2]");
//   - sticky failure: after an operation fails, the transport's state is unknown, so
//     every later operation fails at once with that first error;
//   - subgroups (new_group) and monitored_barrier.
//
// Semantics follow torch.distributed: operations are asynchronous and return a Work;
// tensors are updated in place (all_reduce, broadcast, reduce on the root) or written
// into the outputs the caller passes (all_gather, gather, scatter, reduce_scatter,
// all_to_all, recv). The caller must not touch those tensors until the Work completes.
// Tensors must be contiguous and on a device the backend serves.
//
// Thread-safety: every method may be called from any thread, but collectives must be
// issued in the same order on every rank (issue them from one thread, or order them
// yourself); send/recv pairs are matched by (peer, tag) in issue order.
//
// Errors: see each method; a call after a failure rethrows nothing itself but returns a
// Work that already holds the first error.
//
// Example:
//   auto [store, rank, world] = c10d::rendezvous("env://");
//   auto group = c10d::ProcessGroupGloo::create(store, rank, world);
//   Tensor g = ...;
//   group->all_reduce(g, {.op = c10d::ReduceOp::kAvg}).wait();
//   auto evens = group->new_group({0, 2});          // every rank calls; nullptr if not in it
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gradwire/c10d/reduce_op.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/work.h"
#include "gradwire/core/mutex.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::c10d {

inline constexpr std::chrono::milliseconds kDefaultProcessGroupTimeout{300'000};

// GRADWIRE_DISTRIBUTED_DEBUG: OFF (default), INFO (log group creation, subgroups and
// failures), DETAIL (INFO, plus the signature check before every collective).
enum class DebugLevel : uint8_t { kOff = 0, kInfo = 1, kDetail = 2 };
DebugLevel parse_debug_level(std::string_view text);  // "OFF" | "INFO" | "DETAIL"
DebugLevel debug_level_from_env();                    // throws InvalidArgument if malformed

struct ProcessGroupOptions {
  // The deadline of every operation that names none, and of connecting.
  std::chrono::milliseconds timeout{kDefaultProcessGroupTimeout};
  // Unset: GRADWIRE_DISTRIBUTED_DEBUG decides when the group is created.
  std::optional<DebugLevel> debug_level{};
  // Appears in every message and log line about the group.
  std::string name{"default"};
};

// Per-operation options. A zero timeout means the group's timeout.
struct AllReduceOptions {
  ReduceOp op{ReduceOp::kSum};
  std::chrono::milliseconds timeout{0};
};
struct BroadcastOptions {
  int root{0};
  std::chrono::milliseconds timeout{0};
};
struct ReduceOptions {
  int root{0};
  ReduceOp op{ReduceOp::kSum};
  std::chrono::milliseconds timeout{0};
};
struct AllGatherOptions {
  std::chrono::milliseconds timeout{0};
};
struct GatherOptions {
  int root{0};
  std::chrono::milliseconds timeout{0};
};
struct ScatterOptions {
  int root{0};
  std::chrono::milliseconds timeout{0};
};
struct ReduceScatterOptions {
  ReduceOp op{ReduceOp::kSum};
  std::chrono::milliseconds timeout{0};
};
struct AllToAllOptions {
  std::chrono::milliseconds timeout{0};
};
struct BarrierOptions {
  std::chrono::milliseconds timeout{0};
};

// broadcast_coalesced packs tensors into buffers of at most this many bytes by default.
// Large enough that the per-broadcast cost (a round of messages) vanishes against the
// copy, small enough that the staging buffer stays a modest fraction of a model.
inline constexpr size_t kDefaultCoalescedBucketBytes = size_t{32} << 20;

struct BroadcastCoalescedOptions {
  int root{0};
  // Tensors of one dtype and device are packed, in order, into buffers of at most this
  // many bytes (> 0); a tensor larger than that travels alone, without a copy.
  size_t bucket_bytes{kDefaultCoalescedBucketBytes};
  std::chrono::milliseconds timeout{0};
};

class ProcessGroup : public std::enable_shared_from_this<ProcessGroup> {
 public:
  virtual ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& name() const { return options_.name; }
  virtual std::string_view backend_name() const = 0;
  std::chrono::milliseconds timeout() const { return options_.timeout; }
  DebugLevel debug_level() const { return debug_level_; }
  // The store this group's keys live in (already namespaced for the group).
  const std::shared_ptr<Store>& store() const { return store_; }
  // For a subgroup, the ranks (in the parent's numbering) of its members, in group-rank
  // order; for a group made directly, 0..size-1.
  const std::vector<int>& parent_ranks() const { return parent_ranks_; }

  // Every rank's tensors[i] are combined elementwise into every rank's tensors[i]. Several
  // tensors may differ in shape and dtype; tensors[i] must match across ranks.
  Work all_reduce(std::vector<Tensor> tensors, const AllReduceOptions& options = {});
  Work all_reduce(const Tensor& tensor, const AllReduceOptions& options = {});
  // Whether all_reduce of several tensors reads and writes each of them where it lies (no
  // staging buffer packed and unpacked around the exchange): a caller holding scattered
  // tensors then passes them as they are rather than packing them itself (DDP's Reducer
  // does so for its default hook). False unless a backend says otherwise (shm: true).
  virtual bool all_reduce_in_place() const { return false; }
  // The root's tensors[i] are copied into every other rank's tensors[i].
  Work broadcast(std::vector<Tensor> tensors, const BroadcastOptions& options = {});
  Work broadcast(const Tensor& tensor, const BroadcastOptions& options = {});
  // As broadcast, for many tensors (a model's parameters and buffers): tensors of one dtype
  // and device are packed, in order, into buckets of at most options.bucket_bytes, one
  // broadcast moves each bucket, and the received bytes are copied back into the tensors.
  // Several hundred small tensors thus cost a few broadcasts instead of one each. The
  // tensors may mix dtypes and shapes; tensors[i] must match across ranks (see
  // verify_params_across_ranks). The staging buffers are freed when the Work completes.
  // Throws InvalidArgument as broadcast, and for bucket_bytes == 0.
  //   group->broadcast_coalesced(model_state, {.root = 0}).wait();
  Work broadcast_coalesced(std::vector<Tensor> tensors,
                           const BroadcastCoalescedOptions& options = {});
  // Every rank's tensor combined into the root's tensor; other ranks' tensors unchanged.
  Work reduce(const Tensor& tensor, const ReduceOptions& options = {});
  // outputs[r] receives rank r's input; outputs.size() == size(), each shaped as input.
  Work all_gather(std::vector<Tensor> outputs, const Tensor& input,
                  const AllGatherOptions& options = {});
  // As all_gather, but only the root receives; other ranks pass an empty `outputs`.
  Work gather(std::vector<Tensor> outputs, const Tensor& input, const GatherOptions& options = {});
  // Rank r's output receives the root's inputs[r]; other ranks pass an empty `inputs`.
  Work scatter(const Tensor& output, std::vector<Tensor> inputs,
               const ScatterOptions& options = {});
  // Rank r's output receives the combination of every rank's inputs[r].
  Work reduce_scatter(const Tensor& output, std::vector<Tensor> inputs,
                      const ReduceScatterOptions& options = {});
  // Rank r sends inputs[j] to rank j, which receives it into outputs[r]. Sizes may differ
  // per pair, but inputs[j] on rank r and outputs[r] on rank j must match.
  Work all_to_all(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                  const AllToAllOptions& options = {});
  Work barrier(const BarrierOptions& options = {});

  // Point-to-point. Messages between two ranks with the same tag arrive in send order;
  // tag must be in [0, 2^31). The Work completes when the buffer may be reused (send) or
  // holds the message (recv). These do not take part in the collective numbering.
  Work send(const Tensor& tensor, int dst, int tag = 0);
  Work recv(const Tensor& tensor, int src, int tag = 0);
  // Receives from whichever rank sends first with this tag; Work::source_rank() says who.
  Work recv_any_source(const Tensor& tensor, int tag = 0);

  // A barrier that names the missing: rank 0 waits up to `timeout` for every other rank
  // at once, and when some do not arrive throws TimeoutError naming all of them (PyTorch
  // names only the first unless asked to wait for all; waiting concurrently costs
  // nothing more); the other ranks throw TimeoutError when rank 0 does not release them.
  // Runs on point-to-point messages of CPU tensors (a backend that serves them, such as
  // gloo). A timed-out monitored barrier leaves the group failed, like any timeout.
  void monitored_barrier(std::chrono::milliseconds timeout);

  // A group of the given ranks (this group's numbering; sorted, so group rank i is the
  // i-th smallest). Every rank of this group must call it, with the same ranks, in the
  // same order relative to other new_group calls; ranks not in it get nullptr. The
  // subgroup has its own keys (a PrefixStore), numbering and failure state.
  // Throws InvalidArgument for an empty list, a duplicate or an out-of-range rank, or when
  // the members were called with different lists.
  std::shared_ptr<ProcessGroup> new_group(std::vector<int> ranks,
                                          std::optional<ProcessGroupOptions> options = {});

  // The first error an operation of this group failed with, or nullptr.
  std::exception_ptr error() const;

 protected:
  // What a backend needs to know about one operation.
  struct OpContext {
    std::string name;         // "all_reduce"
    std::string description;  // "all_reduce #7 (group 'default', rank 1)"
    uint64_t seq{0};          // collective number, 1-based; 0 for point-to-point
    std::chrono::milliseconds timeout{0};
  };

  // One tensor argument of an operation and how messages name it ("tensors[2]",
  // "the input").
  struct TensorArg {
    const Tensor* tensor;
    std::string what;
  };

  ProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions options);

  // The transport. Arguments have been checked; tensors are non-empty vectors of defined,
  // contiguous tensors, validated against the backend's supports_device/supports_dtype.
  virtual Work do_all_reduce(std::vector<Tensor> tensors, ReduceOp op, const OpContext& ctx) = 0;
  virtual Work do_broadcast(std::vector<Tensor> tensors, int root, const OpContext& ctx) = 0;
  // `buckets` partition the indices of `tensors` (the caller's list, and the Work's
  // outputs): the tensors of a bucket share dtype and device, and a bucket of several holds
  // at most the option's bucket_bytes. The backend moves each bucket with one broadcast,
  // staging a bucket of several tensors in one flat buffer, and completes the Work once
  // every tensor holds the root's values.
  virtual Work do_broadcast_coalesced(std::vector<Tensor> tensors,
                                      std::vector<std::vector<size_t>> buckets, int root,
                                      const OpContext& ctx) = 0;
  virtual Work do_reduce(const Tensor& tensor, int root, ReduceOp op, const OpContext& ctx) = 0;
  virtual Work do_all_gather(std::vector<Tensor> outputs, const Tensor& input,
                             const OpContext& ctx) = 0;
  virtual Work do_gather(std::vector<Tensor> outputs, const Tensor& input, int root,
                         const OpContext& ctx) = 0;
  virtual Work do_scatter(const Tensor& output, std::vector<Tensor> inputs, int root,
                          const OpContext& ctx) = 0;
  virtual Work do_reduce_scatter(const Tensor& output, std::vector<Tensor> inputs, ReduceOp op,
                                 const OpContext& ctx) = 0;
  virtual Work do_all_to_all(std::vector<Tensor> outputs, std::vector<Tensor> inputs,
                             const OpContext& ctx) = 0;
  virtual Work do_barrier(const OpContext& ctx) = 0;
  // `tag` is the user's tag in [0, 2^31) or, for the group's own messages, at or above
  // kInternalTagBase.
  virtual Work do_send(const Tensor& tensor, int dst, uint64_t tag, const OpContext& ctx) = 0;
  // src < 0: any source.
  virtual Work do_recv(const Tensor& tensor, int src, uint64_t tag, const OpContext& ctx) = 0;
  virtual std::shared_ptr<ProcessGroup> make_subgroup(std::shared_ptr<Store> store, int rank,
                                                      int size, ProcessGroupOptions options) = 0;

  // Which tensors the backend serves; the message names what it accepts instead.
  virtual bool supports_device(const Device& device) const = 0;
  virtual bool supports_dtype(DType dtype) const = 0;
  virtual std::string_view supported_devices_text() const = 0;
  // What only the backend can check about an operation's tensors (the NCCL backend: that
  // they are on this rank's device), called after the shared checks and before the
  // operation is numbered; throws InvalidArgument. `args` is empty for a barrier.
  virtual void check_backend_args(const OpContext& ctx, const std::vector<TensorArg>& args) const;

  static constexpr uint64_t kInternalTagBase = uint64_t{1} << 31;

  // For backends, on an operation's worker: turns a transport failure into the typed error
  // the operation fails with (TimeoutError when `timed_out`, NetworkError otherwise), adds
  // the ranks that did not reach a collective, records it as the group's first error and
  // fails `state`.
  void fail_operation(const OpContext& ctx, WorkState& state, const std::string& what,
                      bool timed_out);
  // The failure to record for a non-transport error (a bug or resource failure).
  void fail_operation(const OpContext& ctx, WorkState& state, std::exception_ptr error);

  // Sets parent_ranks_ for a subgroup.
  void set_parent_ranks(std::vector<int> ranks) { parent_ranks_ = std::move(ranks); }

 private:
  // The context of an operation not yet numbered; its description has no number.
  OpContext begin(std::string_view name, std::chrono::milliseconds timeout);
  // Takes the next collective number, once the arguments have passed every check.
  void number(OpContext& ctx);
  // The shared checks of every tensor argument, then the backend's.
  void check_args(const OpContext& ctx, const std::vector<TensorArg>& args) const;
  // {&list[0], "what[0]"}, {&list[1], "what[1]"}, ...
  static std::vector<TensorArg> named(const std::vector<Tensor>& list, const std::string& what);
  // Returns a failed Work when the group has already failed.
  std::optional<Work> failed_work(const OpContext& ctx) const;
  void check_tensor(const OpContext& ctx, const Tensor& t, std::string_view what) const;
  void check_root(const OpContext& ctx, int root) const;
  void check_peer(const OpContext& ctx, int peer, std::string_view what) const;
  void check_tag(const OpContext& ctx, int tag) const;
  void debug_check(const OpContext& ctx, const std::string& signature);
  std::string missing_ranks(const OpContext& ctx);

  std::shared_ptr<Store> store_;
  int rank_;
  int size_;
  ProcessGroupOptions options_;
  DebugLevel debug_level_;
  std::vector<int> parent_ranks_;
  std::atomic<uint64_t> next_seq_{1};
  std::atomic<uint64_t> next_internal_{0};
  std::atomic<int> next_subgroup_{0};
  mutable Mutex mutex_;
  std::exception_ptr error_ GRADWIRE_GUARDED_BY(mutex_);
  bool failure_claimed_ GRADWIRE_GUARDED_BY(mutex_) = false;
};

// Makes a group of the named backend: "gloo", or "nccl" when built with NCCL; "cpu" or
// "shm": shared memory (ProcessGroupShm) when every rank shares this host and network
// namespace, else shared memory within hosts and Gloo across (HierarchicalProcessGroup);
// see process_group_shm.h. Throws InvalidArgument for an unknown name or one this build lacks.
std::shared_ptr<ProcessGroup> make_process_group(std::string_view backend,
                                                 std::shared_ptr<Store> store, int rank, int size,
                                                 ProcessGroupOptions options = {});
bool is_gloo_available();
bool is_nccl_available();

}  // namespace gradwire::c10d
