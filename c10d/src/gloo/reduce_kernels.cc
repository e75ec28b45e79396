#include "reduce_kernels.h"

#include <algorithm>
#include <cstdint>

#include "gradwire/core/error.h"

namespace gradwire::c10d::gloo_backend {

namespace {

struct Sum {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a + b);
  }
};
struct Product {
  template <typename T>
  static T apply(T a, T b) {
    return static_cast<T>(a * b);
  }
};
struct Min {
  template <typename T>
  static T apply(T a, T b) {
    return std::min(a, b);
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    return std::max(a, b);
  }
};
struct Or {
  static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>((a | b) != 0); }
};
struct And {
  static uint8_t apply(uint8_t a, uint8_t b) { return static_cast<uint8_t>(a != 0 && b != 0); }
};

// The loops promise no overlap (restrict) so that the compiler vectorises them without
// runtime alias checks (this file is built at -O3: c10d/CMakeLists.txt). Gloo passes out == a (or
// out == b) or three distinct buffers, never a partial overlap; every op here is commutative, so
// the in-place forms cover both.
template <typename T, typename Op>
void combine_into(T* __restrict o, const T* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i)
    o[i] = Op::apply(o[i], y[i]);
}

template <typename T, typename Op>
void combine_apart(T* __restrict o, const T* __restrict x, const T* __restrict y, size_t n) {
  for (size_t i = 0; i < n; ++i)
    o[i] = Op::apply(x[i], y[i]);
}

template <typename T, typename Op>
void combine(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  if (o == x) {
    combine_into<T, Op>(o, y, n);
  } else if (o == y) {
    combine_into<T, Op>(o, x, n);
  } else {
    combine_apart<T, Op>(o, x, y, n);
  }
}

// Reduced precision: widen, combine, round back. Processed in blocks so the widening and
// narrowing loops stay simple enough to vectorise.
template <typename H, typename Op>
void combine_narrow(void* out, const void* a, const void* b, size_t n) {
  constexpr size_t kBlock = 256;
  float fx[kBlock];
  float fy[kBlock];
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  for (size_t start = 0; start < n; start += kBlock) {
    const size_t m = std::min(kBlock, n - start);
    for (size_t i = 0; i < m; ++i) {
      fx[i] = H::to_float(x[start + i]);
      fy[i] = H::to_float(y[start + i]);
    }
    for (size_t i = 0; i < m; ++i)
      fx[i] = Op::apply(fx[i], fy[i]);
    for (size_t i = 0; i < m; ++i)
      o[start + i] = H::from_float(fx[i]);
  }
}

template <typename Op>
RawReduceFn for_dtype(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return &combine<float, Op>;
    case DType::kFloat64:
      return &combine<double, Op>;
    case DType::kFloat16:
      return &combine_narrow<Half, Op>;
    case DType::kBFloat16:
      return &combine_narrow<BFloat16, Op>;
    case DType::kInt32:
      return &combine<int32_t, Op>;
    case DType::kInt64:
      return &combine<int64_t, Op>;
    case DType::kUInt8:
      return &combine<uint8_t, Op>;
    case DType::kBool:
      break;
  }
  throw Error("gloo reduce kernel: unexpected dtype " + std::string(dtype_name(dtype)));
}

}  // namespace

RawReduceFn reduce_kernel(DType dtype, ReduceOp op) {
  if (dtype == DType::kBool) {
    return op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kAvg
               ? &combine<uint8_t, Or>
               : &combine<uint8_t, And>;
  }
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return for_dtype<Sum>(dtype);
    case ReduceOp::kProduct:
      return for_dtype<Product>(dtype);
    case ReduceOp::kMin:
      return for_dtype<Min>(dtype);
    case ReduceOp::kMax:
      return for_dtype<Max>(dtype);
  }
  throw Error("gloo reduce kernel: unexpected reduce op");
}

}  // namespace gradwire::c10d::gloo_backend
