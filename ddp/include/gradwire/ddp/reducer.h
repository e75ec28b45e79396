// Reducer: turns a backward pass's parameter gradients into their average across ranks,
// overlapping communication with the rest of the pass.
//
// Buckets. Parameters are grouped into flat buffers ("buckets") of one dtype and device:
// the first of each dtype holds about first_bucket_bytes (so that communication starts
// early in the pass), later ones about bucket_bytes. Initially parameters are taken in
// reverse registration order (gradients of a feed-forward model arrive roughly from the
// last layer to the first). After the first synchronised pass the buckets are rebuilt,
// once, from the order in which gradients actually arrived; rank 0's order is broadcast
// so every rank builds the same buckets.
//
// One pass. Each parameter has a leaf-gradient hook (autograd/accumulate_grad.h), which
// fires once per pass that reaches the parameter, after accumulation. The hook copies the
// parameter's gradient into its slot of the bucket (no copy when the gradient already is
// that slot: with gradient_as_bucket_view the parameter's .grad() *is* a view of the bucket,
// so accumulation writes straight into it) and marks the parameter ready. When every
// parameter of a bucket is ready, and every earlier bucket has been launched, the bucket is
// handed to the communication hook (allreduce_hook by default: an asynchronous all_reduce)
// while backward goes on. The first hook of a pass queues an end-of-pass callback
// (autograd::queue_callback) that waits for every bucket's future and writes the averages
// into the parameters' .grad() (or leaves them there, for bucket views). Every pass after
// a synchronised forward is reduced, until the next forward: a second pass over a retained
// graph adds its average to the first's (every rank must run the same passes).
//
// In place. Over a group whose all_reduce of a tensor list reads and writes the tensors
// where they lie (the shm group), with the default hook, no bucket views and the plain
// average, a pass uses no bucket buffer: a bucket's gradients (each parameter's own .grad(),
// or a private tensor where averaging .grad() in place would be wrong) go to one coalesced
// all_reduce(kAvg) as they are, and the average lands in them (averages_in_place()). The
// result is bit for bit the bucketed pass's; two copies of every gradient are saved.
//
// Passes with a gradient sink (a dist_autograd context; autograd/gradient_sink.h). Then the
// gradients live in the sink, not in .grad(), and the contract is:
//   - a parameter's hook reads what the sink already holds for it (earlier passes in the
//     same context: no_sync passes, a retained graph's first pass), adds the pass's own
//     gradient, copies the sum into the bucket, and withholds the pass's gradient from the
//     sink; a parameter marked ready without a hook (find_unused_parameters) contributes
//     what the sink holds, or zeros;
//   - the end-of-pass callback, which runs before the pass completes, writes a copy of
//     every parameter's averaged slot into the sink (set_gradient) — parameters this rank
//     did not use included, since some rank did; parameters no rank used keep what the
//     sink held — and never touches .grad();
//   - gradient_as_bucket_view then only saves the bucket copy of .grad(); the sink always
//     holds its own tensors, never a bucket view (the next pass, of any context, reuses
//     the buckets).
// So the context's gradients of DDP's parameters are the averages, on every rank, with
// every option (no_sync, comm hooks, static_graph, bucket views, retained graphs). A
// failed pass leaves the sink's gradients of these parameters as they were before it.
//
// Unused parameters. A parameter the pass never reaches has no hook firing and its bucket
// never completes: the pass fails at its end with an error naming the parameters (every
// rank's collectives are then out of step). With find_unused_parameters the Reducer walks
// the graph from the forward's outputs and marks every parameter not in it ready at the
// pass's first hook, contributing zeros; a parameter used on some rank but not on another
// thus averages over all ranks with zeros where unused. A small all-reduce of the
// "used somewhere" flags lets a parameter unused on every rank keep an undefined gradient.
// static_graph skips the walk and that all-reduce after the first pass (the set of unused
// parameters, and of parameters used somewhere, is assumed fixed: the first pass's hold).
//
// Thread-safety: one training loop drives a Reducer: prepare_* and shadow_iteration from the
// thread that calls forward, hooks and the end-of-pass callback on the thread that runs
// backward (normally the same one), never two passes at once. Hook continuations run on
// the Reducer's own executor.
// Errors: gradwire::Error at the end of a pass whose buckets were not all reduced (names
// the parameters that got no gradient, with the find_unused_parameters hint);
// InvalidArgument when a parameter is marked ready twice in one pass, for options out of
// range, and for parameters that are not dense contiguous leaves requiring grad; a failed
// collective's TimeoutError/NetworkError from the end of the pass. A failed bucketed pass
// leaves .grad() as the local gradients; a failed in-place pass (averages_in_place()) may
// leave some of them averaged, or partly so (the group has failed then: what it held is
// not to be used).
//
// Example (DistributedDataParallel does this; users rarely hold a Reducer):
//   ddp::Reducer reducer(params, names, group, {.gradient_as_bucket_view = true});
//   reducer.prepare_for_forward();
//   Tensor loss = ...;                 // forward
//   reducer.prepare_for_backward({loss});
//   loss.backward();                    // params' grads now hold the averages
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/c10d/process_group.h"
#include "gradwire/ddp/grad_bucket.h"

namespace gradwire::ddp {

inline constexpr size_t kDefaultBucketBytes = size_t{25} << 20;
inline constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;

struct ReducerOptions {
  size_t bucket_bytes{kDefaultBucketBytes};             // > 0
  size_t first_bucket_bytes{kDefaultFirstBucketBytes};  // > 0
  bool find_unused_parameters{false};
  bool static_graph{false};
  bool gradient_as_bucket_view{false};
  // How long the end of a pass waits for a bucket's communication; zero: the group's timeout.
  std::chrono::milliseconds timeout{0};
  void validate() const;
};

class Reducer {
 public:
  // `names[i]` names params[i] in messages. Registers one hook per parameter.
  Reducer(std::vector<Tensor> params, std::vector<std::string> names,
          std::shared_ptr<c10d::ProcessGroup> group, ReducerOptions options = {});
  // Removes the hooks. Must not run during a backward pass over these parameters.
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Replaces the communication hook (default: allreduce_hook). Throws InvalidArgument for
  // an empty hook, or once a synchronised pass has run (every rank must use the same hook
  // from the start, as in PyTorch).
  void register_comm_hook(CommHook hook);

  // Before each forward: rebuilds the buckets when the first pass has taught the arrival
  // order (a broadcast from `root`, so every rank must call this before every forward).
  void prepare_for_forward(int root = 0);
  // After the forward of a synchronised step: the next backward pass will be reduced.
  // `outputs` are the forward's results (walked for unused parameters).
  void prepare_for_backward(const std::vector<Tensor>& outputs);
  // Whether the next pass is synchronised (no_sync turns it off; gradients then
  // accumulate locally and are reduced with the next synchronised pass).
  void set_require_sync(bool on) { require_sync_ = on; }
  bool require_sync() const { return require_sync_; }
  // What the bucket sums are divided by (the world size, or under Join the number of
  // ranks with data).
  void set_divisor(int divisor);
  int divisor() const { return divisor_; }

  // For a rank that has run out of data (Join): issues the collectives of one
  // synchronised pass on zeros, so that the ranks with data are not left waiting, and
  // waits for them. Call after prepare_for_forward.
  void shadow_iteration();

  // The parameters of each bucket (indices into the constructor's list), in bucket order.
  std::vector<std::vector<size_t>> bucket_indices() const;
  // Whether the buckets have been rebuilt from the arrival order.
  bool buckets_rebuilt() const { return rebuilt_; }
  // Whether synchronised passes skip the bucket buffers: the default hook, no bucket views,
  // the plain average (no Join divisor), and a group whose all_reduce of a tensor list works
  // in place (c10d::ProcessGroup::all_reduce_in_place; the shm group). Then each bucket's
  // gradients are averaged where they lie, by one coalesced all_reduce, and .grad() (or a
  // private tensor put in its place at the end of the pass) holds the average: two passes
  // over every gradient (into the bucket, and back) saved. The same on every rank, as the
  // collectives must be. In such a pass .grad() turns from the local gradient into the
  // average while backward goes on (a bucket's parameters once the bucket is launched).
  bool averages_in_place() const;
  // Synchronised passes completed.
  int64_t iterations() const { return iterations_; }
  // All-reduces of the "used somewhere" flags issued so far (find_unused_parameters: one
  // per pass; static_graph: only the first).
  int64_t used_flag_reductions() const { return used_flag_reductions_; }
  const std::vector<Tensor>& parameters() const { return params_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    Tensor buffer;
    std::vector<Tensor> views;
    // Direct passes (see averages_in_place()): the tensor each slot hands to the all-reduce, which
    // averages it in place: the parameter's own .grad(), or a private tensor (a
    // parameter marked ready without a hook, a sink's gradient, a gradient that is not a
    // plain contiguous tensor) written back at the end of the pass.
    std::vector<Tensor> direct;
    size_t pending{0};
    Future<Tensor> result;
    bool launched{false};
    // Tracing (0 and null while it is off): the pass's first gradient for this bucket, its
    // launch, and when its result completed (set by the result's continuation).
    int64_t first_grad_ns{0};
    int64_t launch_ns{0};
    std::shared_ptr<std::atomic<int64_t>> done_ns;
  };

  std::vector<std::vector<size_t>> assign(const std::vector<size_t>& order) const;
  void build(const std::vector<std::vector<size_t>>& assignment);
  void hook(size_t index, autograd::LeafGradient& g);
  void mark_ready(size_t index, autograd::LeafGradient* g);
  // The gradient parameter `index` contributes to its bucket (`g` null: marked ready
  // without a hook); `fresh`, when given, says whether it is a tensor made here (a sink's
  // sum), which nothing else holds.
  Tensor local_gradient(size_t index, autograd::LeafGradient* g, bool* fresh = nullptr) const;
  std::vector<char> all_reduce_used_flags();
  void launch_ready_buckets();
  GradBucket make_grad_bucket(size_t b, const Tensor& buffer, const std::vector<Tensor>& views);
  void finalize();
  // finalize()'s steps, in order.
  void throw_if_buckets_missing();
  std::vector<char> used_somewhere_this_pass();
  void wait_for_buckets();
  void write_gradients(const std::vector<char>& used_somewhere);
  void reset_pass();
  // A bucketed pass: copies parameter `index`'s gradient into its slot of `bucket`.
  void copy_into_bucket(Bucket& bucket, size_t slot, size_t index, autograd::LeafGradient* g);
  // The slot tensor of a direct pass for parameter `index` (see Bucket::direct).
  Tensor direct_tensor(size_t index, autograd::LeafGradient* g) const;
  std::vector<size_t> unused_from_graph(const std::vector<Tensor>& outputs) const;
  std::chrono::milliseconds wait_timeout() const;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<c10d::ProcessGroup> group_;
  ReducerOptions options_;
  std::shared_ptr<Executor> executor_;
  CommHook comm_hook_;
  bool default_hook_{true};     // comm_hook_ is allreduce_hook
  bool in_place_group_{false};  // group_->all_reduce_in_place()
  bool direct_{false};          // this pass is direct (decided by its first hook)
  std::vector<uint64_t> hook_handles_;

  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // param -> (bucket, slot)
  std::vector<char> ready_;
  std::vector<int32_t> local_used_;
  std::vector<size_t> unused_;  // marked ready at the first hook of a pass
  std::vector<size_t> static_unused_;
  std::vector<char> static_used_somewhere_;  // static_graph: the first pass's flags
  // The sink of the pass in progress (null: .grad()); set by its first hook.
  autograd::GradientSink* sink_{nullptr};
  int64_t used_flag_reductions_{0};
  uint64_t layout_{0};  // incremented by every build() (GradBucket::layout)
  std::vector<size_t> arrival_;
  size_t next_bucket_{0};
  bool expect_hooks_{false};
  bool first_hook_seen_{false};
  int64_t pass_start_ns_{0};  // tracing: the pass's first hook (0: not traced)
  bool require_sync_{true};
  bool rebuilt_{false};
  bool rebuild_pending_{false};
  int divisor_{1};
  int64_t iterations_{0};
};

}  // namespace gradwire::ddp
