// AccumulateGrad: the node at the end of every path to a leaf that requires grad.
//
// apply() adds the incoming gradient to the leaf's grad() (the first gradient is stored
// as a private copy, later ones are added in place, as PyTorch does without create_graph)
// and then runs the leaf's post-accumulate-grad hooks, once per backward pass: the engine
// sums every contribution to a leaf before this node runs. DDP launches its allreduces from
// those hooks. When a backward pass is given a GradientSink (engine.h), the engine hands
// the gradient to the sink instead and this node's apply() is not called.
//
// The leaf's tensor hooks (Tensor::register_hook on a leaf) run as this node's pre-hooks,
// before accumulation or the sink. The leaf keeps only a weak reference to its
// AccumulateGrad; graphs that use the leaf keep it alive, so all of them share one.
//
// Thread-safety: the engine serialises apply() on one node; the leaf's grad is read and
// written under the leaf's own lock, so grad() may be read concurrently.
#pragma once

#include <string>
#include <vector>

#include "gradwire/autograd/node.h"

namespace gradwire::autograd {

class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(Tensor variable);

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "AccumulateGrad"; }
  void run_pre_hooks(std::vector<Tensor>& grads) override;

  // The leaf this node accumulates into.
  const Tensor& variable() const { return variable_; }

 private:
  Tensor variable_;
};

}  // namespace gradwire::autograd
