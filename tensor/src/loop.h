// Strided loops over N operands that share one iteration shape.
//
// An operand is a base pointer plus byte strides in the iteration shape (0 where it is
// broadcast). make_plan() drops size-1 dims and merges dims that are contiguous for every
// operand, so the common cases (all contiguous, or contiguous with a broadcast scalar)
// become one long inner loop the compiler vectorises. run_plan() then calls
//   inner(ptrs, inner_strides, n)
// once per row of the innermost dim, with the pointers advanced to that row.
// run_plan_parallel() does the same over chunks of elements through parallel_for, for
// kernels whose elements are independent.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "gradwire/tensor/parallel.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::detail {

template <size_t N>
struct LoopPlan {
  Shape sizes;                   // innermost dim last; empty means one element
  std::array<Shape, N> strides;  // bytes, per operand per dim
  int64_t numel = 1;
};

template <size_t N>
LoopPlan<N> make_plan(const Shape& shape, const std::array<Shape, N>& byte_strides) {
  LoopPlan<N> plan;
  for (int64_t s : shape)
    plan.numel *= s;
  // Dims of size != 1, outermost first; dim d merges into the one kept before it when, for
  // every operand, that one's stride == stride[d] * size[d]. Built in place, each vector
  // allocated once: a plan is made for every elementwise op, however small.
  plan.sizes.reserve(shape.size());
  for (size_t k = 0; k < N; ++k)
    plan.strides[k].reserve(shape.size());
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !plan.sizes.empty();
    for (size_t k = 0; k < N && merge; ++k) {
      merge = plan.strides[k].back() == byte_strides[k][d] * shape[d];
    }
    if (merge) {
      plan.sizes.back() *= shape[d];
      for (size_t k = 0; k < N; ++k)
        plan.strides[k].back() = byte_strides[k][d];
    } else {
      plan.sizes.push_back(shape[d]);
      for (size_t k = 0; k < N; ++k)
        plan.strides[k].push_back(byte_strides[k][d]);
    }
  }
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
  for (size_t k = 0; k < N; ++k)
    inner_strides[k] = plan.strides[k][ndim - 1];
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
        for (size_t k = 0; k < N; ++k)
          ptrs[k] += plan.strides[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k)
        ptrs[k] -= plan.strides[k][d] * (plan.sizes[d] - 1);
      counter[d] = 0;
    }
  }
}

// Elements per parallel_for chunk of an elementwise kernel: a plan with fewer than two
// chunks' worth runs on the caller alone, where splitting would cost more than it saves.
constexpr int64_t kParallelGrain = int64_t{1} << 15;

// As run_plan, for elements [begin, end) in row-major order of plan.sizes (ndim >= 1):
// the first and last rows may be partial.
template <size_t N, typename Inner>
void run_plan_range(const LoopPlan<N>& plan, std::array<char*, N> base, int64_t begin, int64_t end,
                    Inner& inner) {
  const int64_t ndim = static_cast<int64_t>(plan.sizes.size());
  std::array<int64_t, N> inner_strides;
  for (size_t k = 0; k < N; ++k)
    inner_strides[k] = plan.strides[k][ndim - 1];
  const int64_t inner_n = plan.sizes[ndim - 1];
  int64_t col = begin % inner_n;
  // The odometer of the outer dims at begin's row, and that row's pointers.
  std::vector<int64_t> counter(static_cast<size_t>(std::max<int64_t>(0, ndim - 1)), 0);
  std::array<char*, N> row = base;
  for (int64_t d = ndim - 2, rest = begin / inner_n; d >= 0; --d) {
    counter[d] = rest % plan.sizes[d];
    rest /= plan.sizes[d];
    for (size_t k = 0; k < N; ++k)
      row[k] += counter[d] * plan.strides[k][d];
  }
  for (int64_t left = end - begin; left > 0;) {
    const int64_t len = std::min(inner_n - col, left);
    std::array<char*, N> ptrs = row;
    for (size_t k = 0; k < N; ++k)
      ptrs[k] += col * inner_strides[k];
    inner(ptrs, inner_strides, len);
    left -= len;
    col = 0;
    for (int64_t d = ndim - 2; d >= 0; --d) {
      if (++counter[d] < plan.sizes[d]) {
        for (size_t k = 0; k < N; ++k)
          row[k] += plan.strides[k][d];
        break;
      }
      for (size_t k = 0; k < N; ++k)
        row[k] -= plan.strides[k][d] * (plan.sizes[d] - 1);
      counter[d] = 0;
    }
  }
}

// run_plan over chunks of kParallelGrain elements on the intra-op threads (parallel.h).
// Only for kernels where each element's result depends on that element alone, and whose
// output is exactly an input or disjoint from every input: then chunks never touch each
// other's elements and the result is the serial one.
template <size_t N, typename Inner>
void run_plan_parallel(const LoopPlan<N>& plan, std::array<char*, N> base, Inner&& inner) {
  if (plan.numel < 2 * kParallelGrain || plan.sizes.empty()) {
    run_plan<N>(plan, base, inner);
    return;
  }
  parallel_for(0, plan.numel, kParallelGrain,
               [&](int64_t b, int64_t e) { run_plan_range<N>(plan, base, b, e, inner); });
}

// Byte strides of `t` when broadcast to `shape` (t's dims aligned at the end; 0 where t
// has size 1 or lacks the dim). The caller has checked that the shapes broadcast.
Shape broadcast_byte_strides(const Tensor& t, const Shape& shape);

// Element pointer of a tensor as char* (first element of the view).
inline char* byte_ptr(const Tensor& t) {
  return static_cast<char*>(t.data_ptr());
}

}  // namespace gradwire::detail
