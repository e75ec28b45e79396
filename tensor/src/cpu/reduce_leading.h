// A CPU-only companion to cpu::reduce_rows (kernels.h) for reductions over the leading
// dims of a contiguous tensor (sum over the batch dim, the bias gradient, ...).
//
// reduce_rows needs the reduced elements of each output to be contiguous, which for
// leading dims costs a transposing copy of the whole input; reducing down the columns
// instead reads the input once, in order. Only the frontends in reduce_ops.cc call it.
#pragma once

#include "kernels.h"

namespace gradwire::detail::cpu {

// in: contiguous [rows, cols] of any dtype with rows >= 1 for kMax/kMin; out: contiguous
// [cols] of any dtype, each column reduced over the rows (kSum, kProd, kMax, kMin; the
// accumulators are those of reduce_rows, with the same pairwise summation bound).
void reduce_leading(ReduceOp op, const Tensor& out, const Tensor& in);

}  // namespace gradwire::detail::cpu
