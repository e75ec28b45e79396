// GradientSink: where a backward pass delivers leaf gradients instead of each leaf's .grad.
//
// A dist-autograd context is one: every worker's pass for that context accumulates the
// gradients of its local leaves into the context, and the distributed optimizer reads them
// from there, so concurrent passes of different contexts never mix in .grad.
//
// The order, for each leaf a pass reaches (engine.h, accumulate_grad.h):
//   1. the leaf's tensor hooks (register_hook) on the complete gradient;
//   2. its leaf-gradient hooks (register_leaf_gradient_hook), which see the sink
//      (LeafGradient::sink) and may replace or withhold the gradient it is about to receive;
//   3. accumulate(), unless the gradient is undefined (the pass produced none, or a hook
//      withheld it);
//   4. the leaf's post-accumulate-grad hooks.
// None of these run while the engine holds a lock.
//
// Reading and replacing what a sink holds (gradient / set_gradient). A hook that reduces
// gradients across processes — DDP's Reducer — works on what the sink holds rather than on
// .grad:
//   - from a leaf's hook it reads the sink's gradient for the leaf (what earlier passes in
//     the same sink accumulated: a retained graph's second pass, no_sync passes), adds the
//     pass's own gradient, and withholds the pass's gradient from accumulate();
//   - from its end-of-pass callback (autograd::queue_callback, which runs before the pass
//     completes) it writes the reduced result back with set_gradient(), for every leaf it
//     reduces, also those the pass never reached.
// So when the pass completes, the sink holds the reduced gradients, and only those. A sink
// that does not hold gradients (a plain collector) keeps the defaults, which throw
// InvalidArgument: such a pass fails, naming the sink, rather than losing the reduction.
// set_gradient stores the tensor it is given: the caller hands over a tensor nobody else
// writes (DDP passes a copy of its bucket's slot, never the bucket).
//
// Thread-safety: passes on several threads may call accumulate() at once, also for the same
// leaf: implementations must be thread-safe, gradient and set_gradient included.
//
// Example:
//   struct Collect : autograd::GradientSink {
//     void accumulate(const Tensor& leaf, const Tensor& grad) override { ... }
//   };
//   autograd::ExecuteOptions options;
//   options.sink = std::make_shared<Collect>();
//   autograd::execute(autograd::make_roots({loss}), options);
#pragma once

#include "gradwire/core/error.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::autograd {

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // The complete gradient of `leaf` from one backward pass, after its hooks (see above).
  // An exception thrown here fails the pass.
  virtual void accumulate(const Tensor& leaf, const Tensor& grad) = 0;
  // What the sink holds for `leaf` (undefined: nothing yet).
  virtual Tensor gradient(const Tensor& leaf) const {
    (void)leaf;
    throw InvalidArgument("this GradientSink does not hold gradients (no gradient())");
  }
  // Replaces what the sink holds for `leaf` with `grad` (undefined: holds nothing for it).
  virtual void set_gradient(const Tensor& leaf, const Tensor& grad) {
    (void)leaf;
    (void)grad;
    throw InvalidArgument("this GradientSink does not hold gradients (no set_gradient())");
  }
};

}  // namespace gradwire::autograd
