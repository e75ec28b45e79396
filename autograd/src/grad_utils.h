// Small gradient helpers shared by the engine and the backward formulas.
#pragma once

#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::autograd::detail {

// Whether a tensor of shape `from` broadcasts to `to`.
bool broadcasts_to(const Shape& from, const Shape& to);
// Sums `g` over the dims along which `shape` was broadcast to g's shape (the gradient of
// a broadcast). `shape` must broadcast to g.sizes().
Tensor sum_to(const Tensor& g, const Shape& shape);
// Re-inserts reduced dims of size 1 into `g` so that it broadcasts against the input of a
// reduction over `dims` (all dims when empty) of an input with `ndim` dims.
Tensor unsqueeze_reduced(const Tensor& g, const Shape& dims, int64_t ndim, bool keepdim);
// The number of elements a reduction over `dims` combines into each output element.
int64_t reduced_count(const Shape& sizes, const Shape& dims);

}  // namespace gradwire::autograd::detail
