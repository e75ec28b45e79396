// GradientSink: where a backward pass delivers leaf gradients instead of each leaf's .grad.
//
// A dist-autograd context is one: every worker's pass for that context accumulates the
// gradients of its local leaves into the context, and the distributed optimizer reads them
// from there, so concurrent passes of different contexts never mix in .grad.
//
// The order, for each leaf a pass reaches (engine.h, accumulate_grad.h):
//   1. the leaf's tensor hooks (register_hook) on the complete gradient;
//   2. its leaf-gradient hooks (register_leaf_gradient_hook), which may replace the
//      gradient the sink is about to receive (DDP copies it into a bucket and hands the
//      sink the bucket's view, which its all-reduce then averages in place);
//   3. accumulate(), unless the gradient is undefined (the pass produced none);
//   4. the leaf's post-accumulate-grad hooks.
// None of these run while the engine holds a lock.
//
// Thread-safety: passes on several threads may call accumulate() at once, also for the same
// leaf: implementations must be thread-safe.
//
// Example:
//   struct Collect : autograd::GradientSink {
//     void accumulate(const Tensor& leaf, const Tensor& grad) override { ... }
//   };
//   autograd::ExecuteOptions options;
//   options.sink = std::make_shared<Collect>();
//   autograd::execute(autograd::make_roots({loss}), options);
#pragma once

#include "gradwire/tensor/tensor.h"

namespace gradwire::autograd {

class GradientSink {
 public:
  virtual ~GradientSink() = default;
  // The complete gradient of `leaf` from one backward pass, after its hooks (see above).
  // An exception thrown here fails the pass.
  virtual void accumulate(const Tensor& leaf, const Tensor& grad) = 0;
};

}  // namespace gradwire::autograd
