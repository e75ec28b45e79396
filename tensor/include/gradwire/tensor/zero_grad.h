// zero_grad: clears the gradients of a list of parameters -- what Module::zero_grad and
// Optimizer::zero_grad both do, written once.
//
// With set_to_none (the default, as PyTorch 2) each parameter's .grad() becomes undefined,
// so the next backward pass allocates a fresh gradient instead of adding into a zeroed
// one, and a parameter that got no gradient is told apart from one whose gradient is 0.
// Otherwise each defined gradient is zeroed in place (handles to it see the zeros).
// Parameters without a gradient are left alone. The work runs with grad mode off, so
// zeroing a gradient that itself requires grad (after a create_graph backward) records
// nothing.
//
// It lives in tensor/ because Tensor declares grad() and set_grad() (they forward to
// autograd when it is linked; without it no tensor has a gradient and this is a no-op).
//
// Errors: none of its own; an undefined tensor in `params` is skipped.
//
// Thread-safety: must not run concurrently with a backward pass or an optimizer step over
// the same parameters (it rewrites their gradients).
//
// Example:
//   gradwire::zero_grad(net.parameters());               // set_to_none
//   gradwire::zero_grad(params, /*set_to_none=*/false);  // zero in place
#pragma once

#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire {

void zero_grad(const std::vector<Tensor>& params, bool set_to_none = true);

}  // namespace gradwire
