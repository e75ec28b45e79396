// Strided loops over N operands that share one iteration shape.
//
// An operand is a base pointer plus byte strides in the iteration shape (0 where it is
// broadcast). make_plan() drops size-1 dims and merges dims that are contiguous for every
// operand, so the common cases (all contiguous, or contiguous with a broadcast scalar)
// become one long inner loop the compiler vectorises. run_plan() then calls
//   inner(ptrs, inner_strides, n)
// once per row of the innermost dim, with the pointers advanced to that row.
#pragma once

#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire::detail {

template <size_t N>
struct LoopPlan {
  Shape sizes;                    // innermost dim last; empty means one element
  std::array<Shape, N> strides;   // bytes, per operand per dim
  int64_t numel = 1;
};

template <size_t N>
LoopPlan<N> make_plan(const Shape& shape, const std::array<Shape, N>& byte_strides) {
  LoopPlan<N> plan;
  for (int64_t s : shape) plan.numel *= s;
  // Keep dims of size != 1, outermost first.
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    plan.sizes.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) plan.strides[k].push_back(byte_strides[k][d]);
  }
  // Merge dim d-1 into d when, for every operand, stride[d-1] == stride[d] * size[d].
  Shape sizes;
  std::array<Shape, N> strides;
  for (size_t d = 0; d < plan.sizes.size(); ++d) {
    bool merge = !sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = strides[k].back() == plan.strides[k][d] * plan.sizes[d];
    }
    if (merge) {
      sizes.back() *= plan.sizes[d];
      for (size_t k = 0; k < N; ++k) strides[k].back() = plan.strides[k][d];
    } else {
      sizes.push_back(plan.sizes[d]);
      for (size_t k = 0; k < N; ++k) strides[k].push_back(plan.strides[k][d]);
    }
  }
  plan.sizes = std::move(sizes);
  plan.strides = std::move(strides);
  return plan;
}

template <size_t N, typename Inner>
void run_plan(const LoopPlan<N>& plan, std::array<char*, N> base, Inner&& inner) {
  if (plan.numel == 0) return;
  const int64_t ndim = static_cast<int64_t>(plan.sizes.size());
  if (ndim == 0) {
    std::array<int64_t, N> zero{};
    inner(base, zero, int64_t{1});
    return;
  }
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k) inner_strides[k] = plan.strides[k][ndim - 1];
  const int64_t inner_n = plan.sizes[ndim - 1];
  if (ndim == 1) {
    inner(base, inner_strides, inner_n);
    return;
  }
  // Odometer over the outer dims.
  std::vector<int64_t> counter(ndim - 1, 0);
  std::array<char*, N> ptrs = base;
  const int64_t rows = plan.numel / inner_n;
  for (int64_t r = 0; r < rows; ++r) {
    inner(ptrs, inner_strides, inner_n);
    for (int64_t d = ndim - 2; d >= 0; --d) {
      if (++counter[d] < plan.sizes[d]) {
        for (size_t k = 0; k < N; ++k) ptrs[k] += plan.strides[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k) ptrs[k] -= plan.strides[k][d] * (plan.sizes[d] - 1);
      counter[d] = 0;
    }
  }
}

// Byte strides of `t` when broadcast to `shape` (t's dims aligned at the end; 0 where t
// has size 1 or lacks the dim). The caller has checked that the shapes broadcast.
Shape broadcast_byte_strides(const Tensor& t, const Shape& shape);

// Element pointer of a tensor as char* (first element of the view).
inline char* byte_ptr(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace gradwire::detail
