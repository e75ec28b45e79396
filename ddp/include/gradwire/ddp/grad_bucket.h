// GradBucket and CommHook: what a communication hook receives, and what it returns.
//
// The Reducer (reducer.h) packs parameters' gradients into flat buckets. When every
// gradient of a bucket is ready it hands the bucket to the DDP's communication hook, a
// callable that starts whatever communication it likes and returns a Future of the
// bucket's *averaged* flat gradient. The Reducer waits for these futures at the end of the
// backward pass and writes the result into the parameters' gradients.
//
// The default hook is allreduce_hook (comm_hooks.h): sum across ranks, then divide by
// `divisor`. A hook must:
//   - issue the same collectives, in the same order, on every rank (it is called on the
//     backward thread, bucket by bucket, in bucket order; collectives it issues from a
//     continuation could interleave differently on different ranks, so issue them from
//     the hook itself);
//   - complete its future with a tensor shaped and typed like `buffer` (it may be `buffer`
//     itself, updated in place), or with an error, which then fails the backward pass;
//   - divide by `divisor`, not by the group's size: under Join (join.h) it may count only
//     the ranks that still have data (JoinOptions::divide_by_initial_world_size = false),
//     and the ranks that have run out call the hook on zeros.
//
// Thread-safety: a GradBucket is a value handed to one hook call; its tensors must not be
// touched by anyone else until the hook's future completes.
//
// Example (a hook that all-reduces in float64 whatever the parameters' dtype):
//   ddp.register_comm_hook([](ddp::GradBucket& b) {
//     Tensor wide = b.buffer.to(kFloat64);
//     c10d::Work w = b.group->all_reduce(wide);
//     Tensor out = b.buffer;
//     double d = b.divisor;
//     return w.get_future().then(b.executor, [wide, out, d](Future<std::vector<Tensor>> f) {
//       f.value();                                  // rethrows a failed all-reduce
//       out.copy_(wide.div_(d));
//       return out;
//     });
//   });
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/process_group.h"
#include "gradwire/core/executor.h"
#include "gradwire/core/future.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::ddp {

struct GradBucket {
  // Position of the bucket in the Reducer's current bucket order (0 is reduced first).
  size_t index{0};
  // The bucket's gradients, flat and contiguous, in the order of `parameters`.
  Tensor buffer;
  // gradients[i] is a view of `buffer` shaped like parameters[i].
  std::vector<Tensor> gradients;
  std::vector<Tensor> parameters;
  std::vector<std::string> parameter_names;
  // The group to communicate over.
  std::shared_ptr<c10d::ProcessGroup> group;
  // What the sum across ranks must be divided by to give the average.
  int divisor{1};
  // Where continuations may run (Future::then needs one); owned by the Reducer.
  std::shared_ptr<Executor> executor;
  // Whether this is the last bucket of the pass (stateful hooks count iterations by it).
  bool is_last{false};
  // Which bucket layout this bucket belongs to: changes whenever the Reducer builds its
  // buckets anew (the rebuild after the first pass), so that hooks with per-bucket state
  // (PowerSGD) can tell that `index` now names other parameters.
  uint64_t layout{0};
};

// A communication hook: starts the bucket's communication, returns its averaged buffer.
using CommHook = std::function<Future<Tensor>(GradBucket& bucket)>;

}  // namespace gradwire::ddp
