// Dtype dispatch: turns a runtime DType into a compile-time element type.
//
//   dispatch_all(t, "op", [&](auto tag) { using T = typename decltype(tag)::type; ... });
//
// The variants restrict the accepted dtypes and throw InvalidArgument naming the op and
// the dtype for the others. compute_t<T> is the type arithmetic happens in (float for the
// 16-bit floats), acc_t<T> the accumulator of reductions.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gradwire/core/check.h"
#include "gradwire/tensor/dtype.h"

namespace gradwire::detail {

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename T>
struct ComputeType {
  using type = T;
};
template <>
struct ComputeType<Half> {
  using type = float;
};
template <>
struct ComputeType<BFloat16> {
  using type = float;
};
template <typename T>
using compute_t = typename ComputeType<T>::type;

template <typename T>
struct AccType {
  using type = T;
};
template <>
struct AccType<Half> {
  using type = float;
};
template <>
struct AccType<BFloat16> {
  using type = float;
};
template <>
struct AccType<int32_t> {
  using type = int64_t;
};
template <>
struct AccType<uint8_t> {
  using type = int64_t;
};
template <>
struct AccType<bool> {
  using type = int64_t;
};
template <typename T>
using acc_t = typename AccType<T>::type;

template <typename T>
inline constexpr bool is_floating_v =
    std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

[[noreturn]] void throw_unsupported_dtype(const char* op, DType t, const char* accepted);

template <typename F>
decltype(auto) dispatch_all(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
    case DType::kFloat16:
      return f(TypeTag<Half>{});
    case DType::kBFloat16:
      return f(TypeTag<BFloat16>{});
    case DType::kInt32:
      return f(TypeTag<int32_t>{});
    case DType::kInt64:
      return f(TypeTag<int64_t>{});
    case DType::kUInt8:
      return f(TypeTag<uint8_t>{});
    case DType::kBool:
      return f(TypeTag<bool>{});
  }
  throw_unsupported_dtype(op, t, "any dtype");
}

// Every dtype except bool.
template <typename F>
decltype(auto) dispatch_numeric(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
    case DType::kFloat16:
      return f(TypeTag<Half>{});
    case DType::kBFloat16:
      return f(TypeTag<BFloat16>{});
    case DType::kInt32:
      return f(TypeTag<int32_t>{});
    case DType::kInt64:
      return f(TypeTag<int64_t>{});
    case DType::kUInt8:
      return f(TypeTag<uint8_t>{});
    default:
      break;
  }
  throw_unsupported_dtype(op, t, "numeric dtypes (not bool)");
}

template <typename F>
decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::kFloat32:
      return f(TypeTag<float>{});
    case DType::kFloat64:
      return f(TypeTag<double>{});
    case DType::kFloat16:
      return f(TypeTag<Half>{});
    case DType::kBFloat16:
      return f(TypeTag<BFloat16>{});
    default:
      break;
  }
  throw_unsupported_dtype(op, t, "floating dtypes (float32, float64, float16, bfloat16)");
}

template <typename F>
decltype(auto) dispatch_index(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::kInt32:
      return f(TypeTag<int32_t>{});
    case DType::kInt64:
      return f(TypeTag<int64_t>{});
    default:
      break;
  }
  throw_unsupported_dtype(op, t, "int64 or int32 indices");
}

// Converts between element types, going through float for the 16-bit floats and
// mapping to bool by != 0. Also compiled for the device by the CUDA kernels.
template <typename To, typename From>
GRADWIRE_HOST_DEVICE inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<To, bool>) {
    return static_cast<compute_t<From>>(v) != compute_t<From>(0);
  } else if constexpr (std::is_same_v<To, Half> || std::is_same_v<To, BFloat16>) {
    return To(static_cast<float>(static_cast<compute_t<From>>(v)));
  } else {
    return static_cast<To>(static_cast<compute_t<From>>(v));
  }
}

}  // namespace gradwire::detail
