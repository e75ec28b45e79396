// allclose and equal: whole-tensor comparisons, answered on the host.
//
// allclose accepts any two dtypes (unlike PyTorch, which refuses mixed dtypes): floating
// operands are compared as doubles, integral and bool ones as int64 so that equal values
// beyond 2^53 stay equal, with PyTorch's isclose rule
//   a == b  or  |a - b| <= atol + rtol * |b|  (and nan == nan only with equal_nan),
// which makes equal infinities close and any finite value far from an infinity.
#include <cmath>
#include <cstdint>

#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/ops.h"
#include "kernels.h"
#include "loop.h"

namespace gradwire {

namespace {

template <typename T>
bool all_close(const Tensor& a, const Tensor& b, const Shape& shape, double rtol, double atol,
               bool equal_nan) {
  const auto plan = detail::make_plan<2>(
      shape, {detail::broadcast_byte_strides(a, shape), detail::broadcast_byte_strides(b, shape)});
  bool close = true;
  detail::run_plan<2>(
      plan, {detail::byte_ptr(a), detail::byte_ptr(b)},
      [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
        for (int64_t i = 0; i < n && close; ++i) {
          const T x = *reinterpret_cast<const T*>(p[0] + i * s[0]);
          const T y = *reinterpret_cast<const T*>(p[1] + i * s[1]);
          if (x == y) continue;
          if constexpr (std::is_floating_point_v<T>) {
            if (std::isnan(x) || std::isnan(y)) {
              close = equal_nan && std::isnan(x) && std::isnan(y);
              continue;
            }
          }
          double err;
          if constexpr (std::is_floating_point_v<T>) {
            err = std::abs(x - y);
          } else {
            // The exact distance as uint64 (no signed overflow), rounded once.
            const uint64_t ux = static_cast<uint64_t>(x), uy = static_cast<uint64_t>(y);
            err = static_cast<double>(x > y ? ux - uy : uy - ux);
          }
          close = std::isfinite(err) && err <= atol + rtol * std::abs(static_cast<double>(y));
        }
      });
  return close;
}

}  // namespace

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol, bool equal_nan) {
  GRADWIRE_CHECK_ARG(a.defined() && b.defined()) << "allclose: undefined tensor argument";
  detail::check_same_device("allclose", {&a, &b});
  GRADWIRE_CHECK_ARG(rtol >= 0 && atol >= 0)
      << "allclose: rtol " << rtol << " and atol " << atol << " must be non-negative";
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), "allclose");
  const bool floating = a.is_floating_point() || b.is_floating_point();
  const DType common = floating ? kFloat64 : kInt64;
  const Tensor x = a.to(Device::cpu()).to(common);
  const Tensor y = b.to(Device::cpu()).to(common);
  return floating ? all_close<double>(x, y, shape, rtol, atol, equal_nan)
                  : all_close<int64_t>(x, y, shape, rtol, atol, equal_nan);
}

bool equal(const Tensor& a, const Tensor& b) {
  GRADWIRE_CHECK_ARG(a.defined() && b.defined()) << "equal: undefined tensor argument";
  detail::check_same_device("equal", {&a, &b});
  if (a.sizes() != b.sizes()) return false;
  // eq() compares in the promoted dtype; every element of its bool result must be set.
  const Tensor same = eq(a, b).to(Device::cpu());
  const bool* p = same.data<bool>();
  for (int64_t i = 0; i < same.numel(); ++i) {
    if (!p[i]) return false;
  }
  return true;
}

}  // namespace gradwire
