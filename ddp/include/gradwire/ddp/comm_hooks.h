// Built-in communication hooks (grad_bucket.h says what a hook is and must do).
//
//   allreduce_hook        sum across ranks in the bucket's dtype, divide by the divisor
//                         (the default); when the divisor is the group's size it asks the
//                         group for ReduceOp::kAvg (the same sums divided by the same
//                         number) and its future completes on the group's thread;
//   fp16_compress_hook    divide, cast to float16, all-reduce, cast back: half the bytes on
//                         the wire, float16's precision (about 3 decimal digits, values up to
//                         65504 after division);
//   bf16_compress_hook    the same through bfloat16 (float32's range, about 2 digits);
//   PowerSGD              low-rank compression with error feedback (Vogels et al., 2019);
//                         make_powersgd_hook(state).
//
// PowerSGD, per bucket, for every gradient that is a matrix worth compressing (shape
// n x m after folding trailing dims, with (n + m) * rank * min_compression_rate < n * m, as
// PyTorch's min_compression_rate, 2 by default):
//   M  = gradient + error (error feedback: what earlier rounds failed to transmit)
//   P  = M Q               all-reduced (sum), then orthonormalised (Gram-Schmidt)
//   Q  = M^T P             all-reduced (sum) and divided by the divisor
//   gradient <- P Q^T      the average's rank-`rank` approximation
//   error    <- M - P Q^T  (kept per bucket when use_error_feedback)
// Q starts from a seeded normal draw, the same on every rank; with warm_start it is kept
// from one iteration to the next (a power iteration spread over steps). Vectors and small
// matrices are all-reduced uncompressed together with the Qs. For the first
// start_iteration iterations the hook is plain allreduce_hook. The errors and Qs are kept
// per bucket, keyed by the parameters the bucket holds (in order), and dropped when the
// Reducer builds a new bucket layout (its rebuild after the first pass; GradBucket::layout):
// a bucket's state never feeds a bucket of other parameters, even one of the same size.
// When the averaged gradient has rank <= `rank`, the approximation reproduces it (up to
// rounding). The P all-reduce is waited for inside the hook, so the Q all-reduce is issued
// from the backward thread too and collectives stay in the same order on every rank: a
// bucket's compression overlaps with later buckets' backward only through its second half.
//
// Thread-safety: the hooks are stateless except PowerSGDState, which serialises its own
// updates; a state must serve one DDP instance.
// Errors: a failed collective fails the returned future (and so the backward pass);
// PowerSGDOptions::validate throws InvalidArgument for rank < 1.
//
// Example:
//   auto state = std::make_shared<ddp::PowerSGDState>(ddp::PowerSGDOptions{.rank = 2});
//   model.register_comm_hook(ddp::make_powersgd_hook(state));
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "gradwire/core/mutex.h"
#include "gradwire/ddp/grad_bucket.h"
#include "gradwire/tensor/generator.h"

namespace gradwire::ddp {

Future<Tensor> allreduce_hook(GradBucket& bucket);
Future<Tensor> fp16_compress_hook(GradBucket& bucket);
Future<Tensor> bf16_compress_hook(GradBucket& bucket);

struct PowerSGDOptions {
  int64_t rank{1};                // the approximation's rank, >= 1
  int64_t start_iteration{1000};  // plain all-reduce before this many iterations
  bool use_error_feedback{true};
  bool warm_start{true};
  uint64_t seed{0};  // for the initial Qs; the same on every rank
  // A matrix is compressed only when its factors are this many times smaller (> 0).
  double min_compression_rate{2.0};
  void validate() const;
};

class PowerSGDState {
 public:
  explicit PowerSGDState(PowerSGDOptions options = {});
  const PowerSGDOptions& options() const { return options_; }
  // Iterations (backward passes) seen so far.
  int64_t iteration() const;
  // The error-feedback residual of bucket `index` of the current layout (flat, like the
  // bucket), or an undefined tensor when none is kept. A copy.
  Tensor error(size_t index) const;
  // The same for the bucket holding exactly `parameters`, in this order.
  Tensor error(const std::vector<Tensor>& parameters) const;

 private:
  friend Future<Tensor> powersgd_hook(const std::shared_ptr<PowerSGDState>& state,
                                      GradBucket& bucket);
  using Key = std::vector<const void*>;  // the bucket's parameters' identities
  struct PerBucket {
    Tensor error;
    std::vector<Tensor> qs;
  };
  static Key key_of(const std::vector<Tensor>& parameters);
  // powersgd_hook's steps. Whether this round is still a plain all-reduce (counts the
  // iteration at the last bucket).
  bool plain_round(const GradBucket& bucket);
  // Takes up `bucket` (a new layout starts every bucket afresh): adds the error feedback to
  // the buffer, keeps the local input in `*local` (when error feedback is on) and returns
  // the Qs for `matrices`, warm-started when their shapes still match.
  std::vector<Tensor> begin_bucket(const GradBucket& bucket, const Key& key,
                                   const std::vector<Tensor>& matrices, Tensor* local);
  // Records the error of bucket `key` unless a newer layout than `layout` has started.
  void keep_error(uint64_t layout, const Key& key, Tensor error);
  PowerSGDOptions options_;
  mutable Mutex mutex_;
  int64_t iteration_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  Generator generator_ GRADWIRE_GUARDED_BY(mutex_);
  uint64_t layout_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  std::map<Key, PerBucket> buckets_ GRADWIRE_GUARDED_BY(mutex_);
  std::map<size_t, Key> keys_ GRADWIRE_GUARDED_BY(mutex_);  // bucket index -> key
};

// One PowerSGD round for `bucket` with `state` (see above).
Future<Tensor> powersgd_hook(const std::shared_ptr<PowerSGDState>& state, GradBucket& bucket);
// A CommHook bound to `state`.
CommHook make_powersgd_hook(std::shared_ptr<PowerSGDState> state);

}  // namespace gradwire::ddp
