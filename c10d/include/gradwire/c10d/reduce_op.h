// ReduceOp: how a reducing collective (all_reduce, reduce, reduce_scatter) combines the
// values that the ranks contribute.
//
//   kSum, kProduct, kMin, kMax  elementwise, on every dtype the backend supports; on kBool
//                               tensors kSum and kMax are a logical OR, kProduct and kMin
//                               a logical AND
//   kAvg                        the sum divided by the group size, on floating-point
//                               dtypes only (an integer average would have to round, and
//                               there is no rounding every user would expect)
//
// float16 and bfloat16 are reduced in float32 and rounded once per combining step.
//
// Thread-safety: plain values and pure functions.
// Errors: parse_reduce_op throws InvalidArgument naming the text it could not read.
//
// Example:
//   group->all_reduce(t, {.op = ReduceOp::kMax}).wait();
#pragma once

#include <cstdint>
#include <ostream>
#include <string_view>

namespace gradwire::c10d {

enum class ReduceOp : uint8_t { kSum = 0, kAvg = 1, kProduct = 2, kMin = 3, kMax = 4 };

// "sum", "avg", "product", "min", "max".
std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);
std::ostream& operator<<(std::ostream& os, ReduceOp op);

}  // namespace gradwire::c10d
