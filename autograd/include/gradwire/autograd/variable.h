// Autograd state of tensors, for code that builds graphs by hand (custom nodes,
// dist_autograd's send/recv functions) and for code that needs the graph's edges.
//
// Most users need only Tensor's methods (requires_grad(), grad(), backward(), ...); these
// free functions expose the pieces below them.
//
// Thread-safety: as for Tensor: reading state concurrently is safe; giving one tensor a
// history from two threads at once is a race.
#pragma once

#include <memory>
#include <vector>

#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/node.h"

namespace gradwire::autograd {

// Where the gradient of `t` goes: (grad_fn, output_nr) for a non-leaf, the leaf's
// AccumulateGrad (created on first use) for a leaf that requires grad, else invalid.
Edge gradient_edge(const Tensor& t);
// gradient_edge of each tensor.
std::vector<Edge> collect_next_edges(const std::vector<Tensor>& tensors);
// Makes `fn` the grad_fn of `t` (which becomes a non-leaf that requires grad) and
// registers `t` as fn's next input: output_nr(t) = fn->add_input_metadata(t). The engine
// will then route t's gradient into fn. `t` must have a floating dtype.
void set_history(const Tensor& t, const std::shared_ptr<Node>& fn);
// Which input of grad_fn() receives t's gradient (0 for leaves).
uint32_t output_nr(const Tensor& t);
// The AccumulateGrad of a leaf that requires grad (created when missing); null otherwise.
std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf);
// Calls `hook` once per backward pass that reaches `leaf`, after accumulation or just before
// a gradient sink, with the gradient it may inspect or replace (accumulate_grad.h says
// exactly when). `leaf` must be a leaf that requires grad (InvalidArgument otherwise).
// Returns a handle for Tensor::remove_hook(). Hooks run in registration order.
uint64_t register_leaf_gradient_hook(const Tensor& leaf, LeafGradientHook hook);

// Anchors gradwire::autograd in a program: returns true once the op hooks are installed.
// Calling it is never needed when linking through CMake (the target forces the anchor);
// it exists for builds that link the archive by hand.
bool ensure_registered();

}  // namespace gradwire::autograd
