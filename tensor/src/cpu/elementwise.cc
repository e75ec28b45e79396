// CPU elementwise kernels: cpu::binary, cpu::unary and cpu::where (contracts in kernels.h).
//
// Every kernel runs a loop.h plan and picks, per innermost row, the tightest loop the
// operand layout allows: all contiguous and disjoint (restrict-qualified pointers, so the
// compiler vectorises without alias checks), the output written in place over an input,
// a broadcast scalar operand (stride 0) read once per row, or a general strided loop.
// The frontends guarantee that an output either is exactly an input (in-place ops) or
// shares no memory with any input; the loops rely on that, and so does splitting a large
// plan into chunks for the intra-op threads (loop.h: run_plan_parallel).
//
// Arithmetic happens in compute_t<T> (float for the 16-bit floats). Integer arithmetic
// wraps modulo 2^bits as in PyTorch; signed values go through their unsigned type because
// signed overflow is undefined behaviour in C++.
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "dispatch.h"
#include "gradwire/core/check.h"
#include "kernels.h"
#include "loop.h"
#include "scalar_math.h"

namespace gradwire::detail::cpu {
namespace {

// ---------------------------------------------------------------- scalar arithmetic

template <typename C>
inline C add_op(C a, C b) {
  if constexpr (std::is_same_v<C, bool>) {
    return a || b;
  } else if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) + static_cast<U>(b));
  } else {
    return a + b;
  }
}

template <typename C>
inline C sub_op(C a, C b) {
  if constexpr (std::is_same_v<C, bool>) {
    return a != b;  // (a - b) != 0; the frontend refuses bool - bool, as PyTorch does
  } else if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) - static_cast<U>(b));
  } else {
    return a - b;
  }
}

template <typename C>
inline C mul_op(C a, C b) {
  if constexpr (std::is_same_v<C, bool>) {
    return a && b;
  } else if constexpr (std::is_integral_v<C>) {
    // uint32_t/uint64_t multiply without promotion to a signed type; uint8_t promotes to
    // int, where 255 * 255 cannot overflow.
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(a) * static_cast<U>(b));
  } else {
    return a * b;
  }
}

// Integer powers use int_pow (scalar_math.h). A negative exponent follows PyTorch's
// tensor-exponent rule (1 and -1 stay units, others give 0); the scalar-exponent frontend
// refuses it before it gets here.
template <typename C>
inline C pow_op(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    return std::pow(a, b);
  } else {
    return int_pow<C>(a, static_cast<int64_t>(b));
  }
}

// NaN-propagating max/min, as torch.maximum/minimum.
template <typename C>
inline C max_op(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a > b ? a : b;
}
template <typename C>
inline C min_op(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (a != a) return a;
    if (b != b) return b;
  }
  return a < b ? a : b;
}

// A double converted to an integral type, saturating at its range (so +-inf and values
// beyond the range are well-defined, unlike static_cast).
template <typename C>
inline C saturate(double v) {
  if constexpr (std::is_same_v<C, bool>) {
    return v >= 1.0;
  } else {
    constexpr C lo = std::numeric_limits<C>::lowest();
    constexpr C hi = std::numeric_limits<C>::max();
    if (!(v > static_cast<double>(lo))) return lo;  // also NaN
    if (v >= static_cast<double>(hi)) return hi;
    return static_cast<C>(v);
  }
}

[[noreturn]] void unsupported(const char* what, DType t) {
  // The frontends convert integral inputs of these ops to a floating dtype first, so
  // reaching here means a frontend is wrong.
  GRADWIRE_THROW(Error) << "cpu kernel: " << what << " reached the kernel with dtype "
                        << dtype_name(t) << "; its frontend must convert to a floating dtype";
}

// ---------------------------------------------------------------- loops

template <typename T>
using C_t = compute_t<T>;

// Whether the byte ranges [p, p + n) and [q, q + m) are disjoint.
inline bool disjoint(const void* p, int64_t n, const void* q, int64_t m) {
  const char* a = static_cast<const char*>(p);
  const char* b = static_cast<const char*>(q);
  return a + n <= b || b + m <= a;
}

template <typename T, typename O, typename F>
void vv(O* __restrict o, const T* __restrict x, const T* __restrict y, int64_t n, F& f) {
  using C = C_t<T>;
  for (int64_t i = 0; i < n; ++i)
    o[i] = O(f(C(x[i]), C(y[i])));
}
template <typename T, typename F>
void vv_inplace(T* __restrict o, const T* __restrict y, int64_t n, F& f) {
  using C = C_t<T>;
  for (int64_t i = 0; i < n; ++i)
    o[i] = T(f(C(o[i]), C(y[i])));
}
template <typename T, typename O, typename F>
void vs(O* __restrict o, const T* __restrict x, C_t<T> y, int64_t n, F& f) {
  using C = C_t<T>;
  for (int64_t i = 0; i < n; ++i)
    o[i] = O(f(C(x[i]), y));
}
template <typename T, typename F>
void vs_inplace(T* __restrict o, C_t<T> y, int64_t n, F& f) {
  using C = C_t<T>;
  for (int64_t i = 0; i < n; ++i)
    o[i] = T(f(C(o[i]), y));
}
template <typename T, typename O, typename F>
void sv(O* __restrict o, C_t<T> x, const T* __restrict y, int64_t n, F& f) {
  using C = C_t<T>;
  for (int64_t i = 0; i < n; ++i)
    o[i] = O(f(x, C(y[i])));
}

// out[i] = f(a[i], b[i]) over a plan of (out, a, b); T is the input element type, O the
// output's (T, or bool for comparisons).
template <typename T, typename O, typename F>
void binary_loop(const LoopPlan<3>& plan, std::array<char*, 3> base, F f) {
  using C = C_t<T>;
  run_plan_parallel<3>(plan, base,
                       [&f](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
                         constexpr int64_t so = sizeof(O), st = sizeof(T);
                         O* o = reinterpret_cast<O*>(p[0]);
                         const T* x = reinterpret_cast<const T*>(p[1]);
                         const T* y = reinterpret_cast<const T*>(p[2]);
                         if (s[0] == so) {
                           const bool ox = disjoint(o, n * so, x, s[1] == 0 ? st : n * st);
                           const bool oy = disjoint(o, n * so, y, s[2] == 0 ? st : n * st);
                           if (s[1] == st && s[2] == st) {
                             if (ox && oy) return vv<T, O>(o, x, y, n, f);
                             if constexpr (std::is_same_v<T, O>) {
                               if (static_cast<const void*>(o) == x && oy)
                                 return vv_inplace<T>(o, y, n, f);
                             }
                           } else if (s[1] == st && s[2] == 0) {
                             const C yv = C(*y);
                             if (ox) return vs<T, O>(o, x, yv, n, f);
                             if constexpr (std::is_same_v<T, O>) {
                               if (static_cast<const void*>(o) == x)
                                 return vs_inplace<T>(o, yv, n, f);
                             }
                           } else if (s[1] == 0 && s[2] == st) {
                             if (oy) return sv<T, O>(o, C(*x), y, n, f);
                           }
                         }
                         // General strided rows, and outputs that are exactly an input: element i
                         // is read before it is written, so going in order is safe without
                         // restrict.
                         for (int64_t i = 0; i < n; ++i) {
                           const C a = C(*reinterpret_cast<const T*>(p[1] + i * s[1]));
                           const C b = C(*reinterpret_cast<const T*>(p[2] + i * s[2]));
                           *reinterpret_cast<O*>(p[0] + i * s[0]) = O(f(a, b));
                         }
                       });
}

template <typename T, typename O, typename F>
void v_unary(O* __restrict o, const T* __restrict x, int64_t n, F& f) {
  using C = C_t<T>;
  for (int64_t i = 0; i < n; ++i)
    o[i] = O(f(C(x[i])));
}
template <typename T, typename F>
void v_unary_inplace(T* __restrict o, int64_t n, F& f) {
  using C = C_t<T>;
  for (int64_t i = 0; i < n; ++i)
    o[i] = T(f(C(o[i])));
}

template <typename T, typename O, typename F>
void unary_loop(const LoopPlan<2>& plan, std::array<char*, 2> base, F f) {
  using C = C_t<T>;
  run_plan_parallel<2>(plan, base,
                       [&f](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
                         constexpr int64_t so = sizeof(O), st = sizeof(T);
                         O* o = reinterpret_cast<O*>(p[0]);
                         const T* x = reinterpret_cast<const T*>(p[1]);
                         if (s[0] == so && s[1] == st) {
                           if (disjoint(o, n * so, x, n * st)) return v_unary<T, O>(o, x, n, f);
                           if constexpr (std::is_same_v<T, O>) {
                             if (static_cast<const void*>(o) == x)
                               return v_unary_inplace<T>(o, n, f);
                           }
                         }
                         for (int64_t i = 0; i < n; ++i) {
                           const C a = C(*reinterpret_cast<const T*>(p[1] + i * s[1]));
                           *reinterpret_cast<O*>(p[0] + i * s[0]) = O(f(a));
                         }
                       });
}

template <typename T>
void binary_typed(BinaryOp op, const LoopPlan<3>& plan, std::array<char*, 3> base,
                  Scalar alpha_scalar, DType dtype) {
  using C = C_t<T>;
  switch (op) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub: {
      const C alpha = alpha_scalar.to<C>();
      const bool add = op == BinaryOp::kAdd;
      // alpha == 1 gets its own loop so that add is a bare a[i] + b[i].
      if (alpha == C(1)) {
        if (add) return binary_loop<T, T>(plan, base, [](C a, C b) { return add_op(a, b); });
        return binary_loop<T, T>(plan, base, [](C a, C b) { return sub_op(a, b); });
      }
      if (add) {
        return binary_loop<T, T>(plan, base,
                                 [alpha](C a, C b) { return add_op(a, mul_op(alpha, b)); });
      }
      return binary_loop<T, T>(plan, base,
                               [alpha](C a, C b) { return sub_op(a, mul_op(alpha, b)); });
    }
    case BinaryOp::kMul:
      return binary_loop<T, T>(plan, base, [](C a, C b) { return mul_op(a, b); });
    case BinaryOp::kDiv:
      if constexpr (is_floating_v<T>) {
        return binary_loop<T, T>(plan, base, [](C a, C b) { return a / b; });
      } else {
        unsupported("div", dtype);
      }
    case BinaryOp::kPow:
      return binary_loop<T, T>(plan, base, [](C a, C b) { return pow_op(a, b); });
    case BinaryOp::kMaximum:
      return binary_loop<T, T>(plan, base, [](C a, C b) { return max_op(a, b); });
    case BinaryOp::kMinimum:
      return binary_loop<T, T>(plan, base, [](C a, C b) { return min_op(a, b); });
    case BinaryOp::kEq:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a == b; });
    case BinaryOp::kNe:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a != b; });
    case BinaryOp::kLt:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a < b; });
    case BinaryOp::kLe:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a <= b; });
    case BinaryOp::kGt:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a > b; });
    case BinaryOp::kGe:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a >= b; });
    case BinaryOp::kLogicalAnd:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a != C(0) && b != C(0); });
    case BinaryOp::kLogicalOr:
      return binary_loop<T, bool>(plan, base, [](C a, C b) { return a != C(0) || b != C(0); });
  }
}

// One case per UnaryOp, each a single kernel: a flat dispatch table, kept whole so that every
// op's element function is read in one place.
template <typename T>
void unary_typed(UnaryOp op, const LoopPlan<2>& plan, std::array<char*, 2> base, double p0,
                 double p1, DType dtype) {
  using C = C_t<T>;
  constexpr bool floating = is_floating_v<T>;
  switch (op) {
    case UnaryOp::kExp:
      if constexpr (floating) return unary_loop<T, T>(plan, base, [](C x) { return std::exp(x); });
      unsupported("exp", dtype);
    case UnaryOp::kLog:
      if constexpr (floating) return unary_loop<T, T>(plan, base, [](C x) { return std::log(x); });
      unsupported("log", dtype);
    case UnaryOp::kSqrt:
      if constexpr (floating) {
        return unary_loop<T, T>(plan, base, [](C x) { return std::sqrt(x); });
      }
      unsupported("sqrt", dtype);
    case UnaryOp::kRsqrt:
      if constexpr (floating) {
        return unary_loop<T, T>(plan, base, [](C x) { return C(1) / std::sqrt(x); });
      }
      unsupported("rsqrt", dtype);
    case UnaryOp::kSigmoid:
      if constexpr (floating) {
        // exp(-|x|) never overflows: for x >= 0 it is 1 / (1 + e), for x < 0 e / (1 + e).
        return unary_loop<T, T>(plan, base, [](C x) {
          const C e = std::exp(-std::abs(x));
          const C r = C(1) / (C(1) + e);
          return x >= C(0) ? r : e * r;
        });
      }
      unsupported("sigmoid", dtype);
    case UnaryOp::kTanh:
      if constexpr (floating) {
        return unary_loop<T, T>(plan, base, [](C x) { return std::tanh(x); });
      }
      unsupported("tanh", dtype);
    case UnaryOp::kReciprocal:
      if constexpr (floating) return unary_loop<T, T>(plan, base, [](C x) { return C(1) / x; });
      unsupported("reciprocal", dtype);
    case UnaryOp::kAbs:
      return unary_loop<T, T>(plan, base, [](C x) -> C {
        if constexpr (std::is_floating_point_v<C>) {
          return std::abs(x);
        } else if constexpr (std::is_signed_v<C>) {
          return x < 0 ? sub_op(C(0), x) : x;  // abs(lowest) wraps to lowest, as PyTorch
        } else {
          return x;
        }
      });
    case UnaryOp::kNeg:
      return unary_loop<T, T>(plan, base, [](C x) -> C {
        if constexpr (std::is_same_v<C, bool>) {
          return x;  // -x != 0 exactly when x != 0
        } else if constexpr (std::is_integral_v<C>) {
          return sub_op(C(0), x);
        } else {
          return -x;
        }
      });
    case UnaryOp::kRelu:
      // NaN < 0 is false, so NaN passes through as in PyTorch.
      return unary_loop<T, T>(plan, base, [](C x) { return x < C(0) ? C(0) : x; });
    case UnaryOp::kSign:
      return unary_loop<T, T>(plan, base, [](C x) -> C {
        if constexpr (std::is_same_v<C, bool>) {
          return x;
        } else {
          if (x > C(0)) return C(1);
          if constexpr (std::is_signed_v<C>) {
            if (x < C(0)) return C(-1);
          }
          return x == C(0) ? C(0) : x;  // +0 for +-0; NaN stays NaN
        }
      });
    case UnaryOp::kSquare:
      return unary_loop<T, T>(plan, base, [](C x) { return mul_op(x, x); });
    case UnaryOp::kPowScalar:
      if constexpr (std::is_floating_point_v<C>) {
        const C e = static_cast<C>(p0);
        if (e == C(2)) return unary_loop<T, T>(plan, base, [](C x) { return x * x; });
        return unary_loop<T, T>(plan, base, [e](C x) { return std::pow(x, e); });
      } else {
        const int64_t e = saturate<int64_t>(p0);
        return unary_loop<T, T>(plan, base, [e](C x) { return int_pow<C>(x, e); });
      }
    case UnaryOp::kClamp: {
      C lo, hi;
      if constexpr (std::is_floating_point_v<C>) {
        lo = static_cast<C>(p0);
        hi = static_cast<C>(p1);
      } else {
        lo = saturate<C>(p0);
        hi = saturate<C>(p1);
      }
      // min(max(x, lo), hi): with lo > hi every element becomes hi, as PyTorch; NaN
      // fails both comparisons and passes through.
      return unary_loop<T, T>(plan, base, [lo, hi](C x) {
        const C r = x < lo ? lo : x;
        return r > hi ? hi : r;
      });
    }
    case UnaryOp::kLogicalNot:
      return unary_loop<T, bool>(plan, base, [](C x) { return !(x != C(0)); });
  }
}

// Element types of each size, for where(): selection only moves bits.
template <int64_t Size>
struct BitsOf;
template <>
struct BitsOf<1> {
  using type = uint8_t;
};
template <>
struct BitsOf<2> {
  using type = uint16_t;
};
template <>
struct BitsOf<4> {
  using type = uint32_t;
};
template <>
struct BitsOf<8> {
  using type = uint64_t;
};

template <typename E>
void where_typed(const LoopPlan<4>& plan, std::array<char*, 4> base) {
  // Both values are read whatever the condition (they are in bounds either way): a select
  // between two loaded values vectorizes, a load only under the condition does not.
  run_plan_parallel<4>(plan, base, [](std::array<char*, 4> p, std::array<int64_t, 4> s, int64_t n) {
    constexpr int64_t se = sizeof(E);
    if (s[0] == se && s[1] == 1 && s[2] == se && s[3] == se) {
      E* __restrict o = reinterpret_cast<E*>(p[0]);
      const uint8_t* __restrict c = reinterpret_cast<const uint8_t*>(p[1]);
      const E* __restrict x = reinterpret_cast<const E*>(p[2]);
      const E* __restrict y = reinterpret_cast<const E*>(p[3]);
      for (int64_t i = 0; i < n; ++i) {
        const E xi = x[i], yi = y[i];
        o[i] = c[i] != 0 ? xi : yi;
      }
      return;
    }
    // One side a scalar (ReLU's backward is where(out > 0, g, 0)): the same loop.
    if (s[0] == se && s[1] == 1 && (s[2] == se || s[2] == 0) && (s[3] == se || s[3] == 0)) {
      E* __restrict o = reinterpret_cast<E*>(p[0]);
      const uint8_t* __restrict c = reinterpret_cast<const uint8_t*>(p[1]);
      const E* __restrict x = reinterpret_cast<const E*>(p[2]);
      const E* __restrict y = reinterpret_cast<const E*>(p[3]);
      if (s[2] == se && s[3] == 0) {
        const E yv = *y;
        for (int64_t i = 0; i < n; ++i) {
          const E xi = x[i];
          o[i] = c[i] != 0 ? xi : yv;
        }
        return;
      }
      if (s[2] == 0 && s[3] == se) {
        const E xv = *x;
        for (int64_t i = 0; i < n; ++i) {
          const E yi = y[i];
          o[i] = c[i] != 0 ? xv : yi;
        }
        return;
      }
      if (s[2] == 0 && s[3] == 0) {
        const E xv = *x, yv = *y;
        for (int64_t i = 0; i < n; ++i)
          o[i] = c[i] != 0 ? xv : yv;
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) {
      const bool c = *reinterpret_cast<const uint8_t*>(p[1] + i * s[1]) != 0;
      *reinterpret_cast<E*>(p[0] + i * s[0]) =
          *reinterpret_cast<const E*>(p[c ? 2 : 3] + i * s[c ? 2 : 3]);
    }
  });
}

}  // namespace

void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, Scalar alpha) {
  const Shape& shape = out.sizes();
  const auto plan =
      make_plan<3>(shape, {broadcast_byte_strides(out, shape), broadcast_byte_strides(a, shape),
                           broadcast_byte_strides(b, shape)});
  const std::array<char*, 3> base{byte_ptr(out), byte_ptr(a), byte_ptr(b)};
  dispatch_all(a.dtype(), "binary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    binary_typed<T>(op, plan, base, alpha, a.dtype());
  });
}

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double p0, double p1) {
  const Shape& shape = out.sizes();
  const auto plan =
      make_plan<2>(shape, {broadcast_byte_strides(out, shape), broadcast_byte_strides(in, shape)});
  const std::array<char*, 2> base{byte_ptr(out), byte_ptr(in)};
  dispatch_all(in.dtype(), "unary", [&](auto tag) {
    using T = typename decltype(tag)::type;
    unary_typed<T>(op, plan, base, p0, p1, in.dtype());
  });
}

void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b) {
  const Shape& shape = out.sizes();
  const auto plan =
      make_plan<4>(shape, {broadcast_byte_strides(out, shape), broadcast_byte_strides(cond, shape),
                           broadcast_byte_strides(a, shape), broadcast_byte_strides(b, shape)});
  const std::array<char*, 4> base{byte_ptr(out), byte_ptr(cond), byte_ptr(a), byte_ptr(b)};
  switch (out.element_size()) {
    case 1:
      return where_typed<BitsOf<1>::type>(plan, base);
    case 2:
      return where_typed<BitsOf<2>::type>(plan, base);
    case 4:
      return where_typed<BitsOf<4>::type>(plan, base);
    case 8:
      return where_typed<BitsOf<8>::type>(plan, base);
  }
  GRADWIRE_THROW(Error) << "cpu::where: unexpected element size " << out.element_size();
}

}  // namespace gradwire::detail::cpu
