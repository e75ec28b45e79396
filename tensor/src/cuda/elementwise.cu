// Elementwise kernels for CUDA tensors: binary, unary and where (contracts in kernels.h).
//
// One kernel per element type, with the op chosen by a switch inside it: the branch is the
// same for every thread, so it costs next to nothing next to the memory traffic, and it
// keeps the number of instantiations (and the build time) small. Each operand carries a
// StridedIndexer, so broadcast (stride 0), transposed and sliced operands need no copies;
// dims are merged first, so all-contiguous operands index with one multiply.
//
// Arithmetic happens in dcompute_t<T>: float for the 16-bit floats, as on the CPU.
#include <cuda_runtime.h>

#include <cmath>
#include <limits>
#include <type_traits>

#include "cuda/cuda_utils.h"
#include "kernels.h"
#include "scalar_math.h"

namespace gradwire::detail::cuda {

namespace {

// ---------------------------------------------------------------- device math

__device__ inline float d_fabs(float x) {
  return fabsf(x);
}
__device__ inline double d_fabs(double x) {
  return fabs(x);
}
__device__ inline float d_exp(float x) {
  return expf(x);
}
__device__ inline double d_exp(double x) {
  return exp(x);
}
__device__ inline float d_log(float x) {
  return logf(x);
}
__device__ inline double d_log(double x) {
  return log(x);
}
__device__ inline float d_sqrt(float x) {
  return sqrtf(x);
}
__device__ inline double d_sqrt(double x) {
  return sqrt(x);
}
__device__ inline float d_tanh(float x) {
  return tanhf(x);
}
__device__ inline double d_tanh(double x) {
  return tanh(x);
}
__device__ inline float d_pow(float x, float y) {
  return powf(x, y);
}
__device__ inline double d_pow(double x, double y) {
  return pow(x, y);
}

// Integer arithmetic wraps modulo 2^bits, as on the CPU: signed values go through their
// unsigned type, because signed overflow is undefined behaviour.
template <typename C>
__device__ inline C wrap_add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}
template <typename C>
__device__ inline C wrap_sub(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}
template <typename C>
__device__ inline C wrap_mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// ---------------------------------------------------------------- binary

template <typename C>
__device__ inline C binary_value(BinaryOp op, C a, C b, C alpha) {
  switch (op) {
    case BinaryOp::kAdd:
      return wrap_add(a, wrap_mul(alpha, b));
    case BinaryOp::kSub:
      return wrap_sub(a, wrap_mul(alpha, b));
    case BinaryOp::kMul:
      return wrap_mul(a, b);
    case BinaryOp::kDiv:
      if constexpr (std::is_floating_point_v<C>) {
        return a / b;
      } else {
        return C(0);  // refused on the host: the frontend divides in a floating dtype
      }
    case BinaryOp::kPow:
      if constexpr (std::is_floating_point_v<C>) {
        return d_pow(a, b);
      } else {
        return int_pow(a, static_cast<int64_t>(b));
      }
    // nan wins in both directions: `a > b` is false when either is nan.
    case BinaryOp::kMaximum:
      return (is_nan(a) || a > b) ? a : b;
    case BinaryOp::kMinimum:
      return (is_nan(a) || a < b) ? a : b;
    default:
      return C(0);  // comparisons are handled by compare_value
  }
}

template <typename C>
__device__ inline bool compare_value(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::kEq:
      return a == b;
    case BinaryOp::kNe:
      return a != b;
    case BinaryOp::kLt:
      return a < b;
    case BinaryOp::kLe:
      return a <= b;
    case BinaryOp::kGt:
      return a > b;
    case BinaryOp::kGe:
      return a >= b;
    case BinaryOp::kLogicalAnd:
      return a != C(0) && b != C(0);
    case BinaryOp::kLogicalOr:
      return a != C(0) || b != C(0);
    default:
      return false;  // arithmetic is handled by binary_value
  }
}

template <typename T>
__global__ void binary_kernel(BinaryOp op, void* out, StridedIndexer out_index, const T* a,
                              StridedIndexer a_index, const T* b, StridedIndexer b_index,
                              dcompute_t<T> alpha, int64_t n) {
  using C = dcompute_t<T>;
  const bool comparison = op >= BinaryOp::kEq;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const C x = static_cast<C>(a[a_index.offset(i)]);
    const C y = static_cast<C>(b[b_index.offset(i)]);
    if (comparison) {
      static_cast<bool*>(out)[out_index.offset(i)] = compare_value(op, x, y);
    } else {
      static_cast<T*>(out)[out_index.offset(i)] = convert<T>(binary_value(op, x, y, alpha));
    }
  }
}

// ---------------------------------------------------------------- unary

// Ops defined for floating dtypes only (the frontend computes them in float for others).
bool is_floating_only(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp:
    case UnaryOp::kLog:
    case UnaryOp::kSqrt:
    case UnaryOp::kRsqrt:
    case UnaryOp::kSigmoid:
    case UnaryOp::kTanh:
    case UnaryOp::kReciprocal:
      return true;
    default:
      return false;
  }
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp:
      return "exp";
    case UnaryOp::kLog:
      return "log";
    case UnaryOp::kSqrt:
      return "sqrt";
    case UnaryOp::kRsqrt:
      return "rsqrt";
    case UnaryOp::kAbs:
      return "abs";
    case UnaryOp::kNeg:
      return "neg";
    case UnaryOp::kRelu:
      return "relu";
    case UnaryOp::kSigmoid:
      return "sigmoid";
    case UnaryOp::kTanh:
      return "tanh";
    case UnaryOp::kSign:
      return "sign";
    case UnaryOp::kSquare:
      return "square";
    case UnaryOp::kReciprocal:
      return "reciprocal";
    case UnaryOp::kPowScalar:
      return "pow";
    case UnaryOp::kClamp:
      return "clamp";
    case UnaryOp::kLogicalNot:
      return "logical_not";
  }
  return "unary";
}

// Parameters of kPowScalar and kClamp, converted on the host.
template <typename C>
struct UnaryParams {
  C exponent{};              // kPowScalar on floating types
  int64_t int_exponent = 0;  // kPowScalar on integral types
  C lo{};                    // kClamp; an open side is the type's extreme (or +-inf)
  C hi{};
};

template <typename C>
__device__ inline C unary_value(UnaryOp op, C x, const UnaryParams<C>& p) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case UnaryOp::kExp:
        return d_exp(x);
      case UnaryOp::kLog:
        return d_log(x);
      case UnaryOp::kSqrt:
        return d_sqrt(x);
      case UnaryOp::kRsqrt:
        return C(1) / d_sqrt(x);
      case UnaryOp::kSigmoid: {
        // exp(-|x|) never overflows: 1 / (1 + e) for x >= 0, e / (1 + e) below.
        const C e = d_exp(-d_fabs(x));
        const C r = C(1) / (C(1) + e);
        return x >= C(0) ? r : e * r;
      }
      case UnaryOp::kTanh:
        return d_tanh(x);
      case UnaryOp::kReciprocal:
        return C(1) / x;
      case UnaryOp::kAbs:
        return d_fabs(x);
      case UnaryOp::kPowScalar:
        return p.exponent == C(2) ? x * x : d_pow(x, p.exponent);
      default:
        break;
    }
  } else {
    if (op == UnaryOp::kPowScalar) return int_pow(x, p.int_exponent);
    if (op == UnaryOp::kAbs) {
      if constexpr (std::is_signed_v<C>) {
        return x < C(0) ? wrap_sub(C(0), x) : x;  // abs(lowest) wraps to lowest
      } else {
        return x;
      }
    }
  }
  switch (op) {
    case UnaryOp::kNeg:
      return wrap_sub(C(0), x);
    case UnaryOp::kRelu:
      if constexpr (std::is_unsigned_v<C>) {
        return x;
      } else {
        return x < C(0) ? C(0) : x;  // nan passes through
      }
    case UnaryOp::kSign:
      if (x > C(0)) return C(1);
      if constexpr (std::is_signed_v<C>) {
        if (x < C(0)) return C(-1);
      }
      return x == C(0) ? C(0) : x;  // +0 for +-0; nan stays nan
    case UnaryOp::kSquare:
      return wrap_mul(x, x);
    case UnaryOp::kClamp: {
      // min(max(x, lo), hi): lo > hi gives hi everywhere; nan fails both tests.
      const C r = x < p.lo ? p.lo : x;
      return r > p.hi ? p.hi : r;
    }
    default:
      return x;  // floating-only ops on integral types are refused on the host
  }
}

template <typename T>
__global__ void unary_kernel(UnaryOp op, void* out, StridedIndexer out_index, const T* in,
                             StridedIndexer in_index, UnaryParams<dcompute_t<T>> params,
                             int64_t n) {
  using C = dcompute_t<T>;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const C x = static_cast<C>(in[in_index.offset(i)]);
    if (op == UnaryOp::kLogicalNot) {
      static_cast<bool*>(out)[out_index.offset(i)] = x == C(0);
    } else {
      static_cast<T*>(out)[out_index.offset(i)] = convert<T>(unary_value(op, x, params));
    }
  }
}

// A double as the compute type of T, saturating at the type's range for integral types
// (so +-inf bounds are open sides and nothing is undefined), as the CPU kernel does. bool
// computes in int here but follows the CPU's bool rule: a bound is true when >= 1.
template <typename T>
dcompute_t<T> saturate(double v) {
  using C = dcompute_t<T>;
  if constexpr (std::is_same_v<T, bool>) {
    return v >= 1.0 ? 1 : 0;
  } else if constexpr (std::is_floating_point_v<C>) {
    return static_cast<C>(v);
  } else {
    constexpr C lo = std::numeric_limits<C>::lowest();
    constexpr C hi = std::numeric_limits<C>::max();
    if (!(v > static_cast<double>(lo))) return lo;  // also nan
    if (v >= static_cast<double>(hi)) return hi;
    return static_cast<C>(v);
  }
}

// alpha in the compute type; bool computes in int but takes alpha as a bool, as the CPU.
template <typename T>
dcompute_t<T> alpha_as(Scalar alpha) {
  if constexpr (std::is_same_v<T, bool>) {
    return alpha.to<bool>() ? 1 : 0;
  } else {
    return alpha.to<dcompute_t<T>>();
  }
}

// ---------------------------------------------------------------- where

template <typename T>
__global__ void where_kernel(T* out, StridedIndexer out_index, const uint8_t* cond,
                             StridedIndexer cond_index, const T* a, StridedIndexer a_index,
                             const T* b, StridedIndexer b_index, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    out[out_index.offset(i)] =
        cond[cond_index.offset(i)] != 0 ? a[a_index.offset(i)] : b[b_index.offset(i)];
  }
}

}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, Scalar alpha) {
  GRADWIRE_CHECK(op != BinaryOp::kDiv || is_floating_point(a.dtype()))
      << "cuda kernel: div reached the kernel with dtype " << a.dtype()
      << "; its frontend must convert to a floating dtype";
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(device_of(out));
  const auto index =
      make_indexers<3>("binary op", out.sizes(), {out.strides(), a.strides(), b.strides()});
  dispatch_all(a.dtype(), "binary op", [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_kernel<T><<<blocks_for(n), kBlockSize>>>(
        op, out.data_ptr(), index[0], static_cast<const T*>(a.data_ptr()), index[1],
        static_cast<const T*>(b.data_ptr()), index[2], alpha_as<T>(alpha), n);
    GRADWIRE_CUDA_CHECK_LAUNCH("binary_kernel");
  });
}

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double p0, double p1) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(device_of(out));
  const auto index = make_indexers<2>(unary_name(op), out.sizes(), {out.strides(), in.strides()});
  auto launch = [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = dcompute_t<T>;
    UnaryParams<C> params;
    if (op == UnaryOp::kPowScalar) {
      if constexpr (std::is_floating_point_v<C>) {
        params.exponent = static_cast<C>(p0);
      } else {
        params.int_exponent = saturate<int64_t>(p0);
      }
    } else if (op == UnaryOp::kClamp) {
      params.lo = saturate<T>(p0);
      params.hi = saturate<T>(p1);
    }
    unary_kernel<T><<<blocks_for(n), kBlockSize>>>(
        op, out.data_ptr(), index[0], static_cast<const T*>(in.data_ptr()), index[1], params, n);
    GRADWIRE_CUDA_CHECK_LAUNCH("unary_kernel");
  };
  if (is_floating_only(op)) {
    // The frontends compute these in a floating dtype; reaching here otherwise is a bug.
    GRADWIRE_CHECK(is_floating_point(in.dtype()))
        << "cuda kernel: " << unary_name(op) << " reached the kernel with dtype " << in.dtype()
        << "; its frontend must convert to a floating dtype";
  }
  dispatch_all(in.dtype(), unary_name(op), launch);
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceGuard guard(device_of(out));
  const auto index = make_indexers<4>("where", out.sizes(),
                                      {out.strides(), cond.strides(), a.strides(), b.strides()});
  dispatch_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    where_kernel<T><<<blocks_for(n), kBlockSize>>>(
        static_cast<T*>(out.data_ptr()), index[0], static_cast<const uint8_t*>(cond.data_ptr()),
        index[1], static_cast<const T*>(a.data_ptr()), index[2],
        static_cast<const T*>(b.data_ptr()), index[3], n);
    GRADWIRE_CUDA_CHECK_LAUNCH("where_kernel");
  });
}

}  // namespace gradwire::detail::cuda
