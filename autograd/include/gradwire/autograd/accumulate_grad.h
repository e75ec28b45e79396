// AccumulateGrad: the node at the end of every path to a leaf that requires grad.
//
// The engine sums every contribution to a leaf before this node runs, so each pass reaches a
// leaf exactly once, with its complete gradient (undefined when the leaf is in the graph but
// the pass produced no gradient for it — a parameter whose consumer returned none). Then, in
// this order:
//   1. the leaf's tensor hooks (Tensor::register_hook on a leaf) run as this node's
//      pre-hooks on a defined gradient (an undefined one is not shown to them);
//   2. without a sink: the gradient is added to the leaf's grad() (the first one is stored as
//      a private copy — or taken, when nothing else can see it — and later ones are added in
//      place, as PyTorch does without create_graph; a grad() bound to a view of a bucket
//      with set_grad() therefore receives the accumulation in place);
//   3. the leaf-gradient hooks (register_leaf_gradient_hook, variable.h) see the gradient and
//      may replace it: without a sink, the accumulated grad(); with a sink, the gradient the
//      sink is about to receive (and the sink itself, LeafGradient::sink);
//   4. with a sink: the sink receives the (possibly replaced) gradient, if defined;
//   5. the post-accumulate-grad hooks (Tensor::register_post_accumulate_grad_hook) run, with
//      or without a sink, also when the gradient was undefined: DDP counts a parameter
//      ready from them and must hear of every parameter in the graph, or its bucket hangs.
// Hooks and the sink run under no lock: a hook may read grad() or start other work.
//
// The leaf keeps only a weak reference to its AccumulateGrad; graphs that use the leaf keep
// it alive, so all of them share one.
//
// Thread-safety: passes on several threads may reach one leaf at once; the leaf's grad is
// read and written under the leaf's own lock, so grad() may be read concurrently, and steps
// 2 and 3 of one pass are not atomic with respect to another pass's.
//
// Example (what DDP does under a sink: copy into a bucket, hand the sink the bucket's view):
//   autograd::register_leaf_gradient_hook(w, [&](autograd::LeafGradient& g) {
//     if (!g.grad.defined()) return;
//     bucket_view.copy_(g.grad);
//     g.grad = bucket_view;
//   });
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "gradwire/autograd/gradient_sink.h"
#include "gradwire/autograd/node.h"

namespace gradwire::autograd {

// What a leaf-gradient hook sees of one pass's gradient for one leaf.
struct LeafGradient {
  // The leaf.
  const Tensor& leaf;
  // Without a sink, the leaf's accumulated grad() (undefined if it has none); with a sink,
  // the gradient the sink will receive (undefined when the pass produced none). Assign a
  // tensor shaped, typed and placed like the leaf to replace it (grad(), or what the sink
  // receives); assigning an undefined tensor clears grad(), or under a sink withholds the
  // gradient.
  Tensor grad;
  // Whether this pass produced a gradient for the leaf.
  bool produced;
  // Whether the gradient goes to a GradientSink rather than grad().
  bool sunk;
  // The pass's sink (null without one): a hook may read and replace what it holds for any
  // leaf (gradient_sink.h), e.g. to reduce across processes what earlier passes left there.
  GradientSink* sink = nullptr;
};
using LeafGradientHook = std::function<void(LeafGradient&)>;

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);

  // Steps 2, 3 and 5 above (no sink): what Node::apply means for a leaf.
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  void run_pre_hooks(std::vector<Tensor>& grads) override;

  // Steps 2 to 5 above for one pass's gradient (the engine calls this). `sink` may be null.
  void accumulate_pass(Tensor grad, GradientSink* sink);

  // The leaf this node accumulates into.
  const Tensor& variable() const { return variable_; }

 private:
  Tensor variable_;
};

}  // namespace gradwire::autograd
