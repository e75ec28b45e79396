// Elementwise combining kernels for the Gloo backend: out[i] = op(a[i], b[i]).
//
// Gloo calls them with raw pointers and an element count; out may be a or b.
// float16 and bfloat16 are combined in float32 and rounded to nearest even once.
#pragma once

#include <cstddef>
#include <functional>

#include "gradwire/c10d/reduce_op.h"
#include "gradwire/tensor/dtype.h"

namespace gradwire::c10d::gloo_backend {

using ReduceFn = std::function<void(void*, const void*, const void*, size_t)>;
using RawReduceFn = void (*)(void*, const void*, const void*, size_t);

// The kernel for (dtype, op). kAvg combines as kSum (the caller divides afterwards).
RawReduceFn reduce_kernel(DType dtype, ReduceOp op);

}  // namespace gradwire::c10d::gloo_backend
