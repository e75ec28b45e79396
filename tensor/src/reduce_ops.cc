// Reductions: sum, mean, prod, amax/amin, max/min, argmax/argmin, norm.
//
// Every reduction is brought to one shape: the reduced dims are permuted to the end and
// the tensor made contiguous (a no-op when they already trail a contiguous tensor), then
// viewed as [rows = kept elements, cols = reduced elements] for device_reduce_rows. That
// path is device-agnostic, so the same frontends serve CUDA tensors. On the CPU, a
// contiguous tensor reduced over its leading dims (the batch dim, typically) is instead
// reduced down its columns in place, which saves a transposing copy of the input.
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpu/reduce_leading.h"
#include "autograd_dispatch.h"
#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "kernels.h"

namespace gradwire {

namespace {

using detail::ReduceOp;

void check_defined(const Tensor& a, const char* op) {
  GRADWIRE_CHECK_ARG(a.defined()) << op << ": input tensor is undefined";
}

struct Reduction {
  Tensor matrix;    // contiguous [rows, cols], or [cols, rows] when `leading`
  Shape out_shape;  // kept dims, with 1s for reduced dims when keepdim
  int64_t rows = 1;
  int64_t cols = 1;
  // The reduced dims lead a contiguous CPU tensor: reduce down the columns of the
  // unpermuted input (cpu::reduce_leading) instead of paying a transposing copy.
  bool leading = false;
};

// `dims` empty reduces every dim. `as` converts the input while it is packed (one copy at
// most), for sum(..., dtype). `allow_leading` permits the column form.
Reduction prepare(const Tensor& a, const Shape& dims, bool keepdim, const char* op,
                  std::optional<DType> as = std::nullopt, bool allow_leading = false) {
  check_defined(a, op);
  const int64_t nd = a.dim();
  std::vector<bool> reduced(nd, dims.empty());
  for (int64_t d : dims) {
    const int64_t w = a.wrap_dim(d, op);
    if (nd == 0) continue;  // dim 0 or -1 of a scalar names the scalar itself
    GRADWIRE_CHECK_ARG(!reduced[w])
        << op << ": dim " << d << " appears more than once in dims " << shape_to_string(dims);
    reduced[w] = true;
  }
  Reduction r;
  Shape perm;
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[d]) continue;
    perm.push_back(d);
    r.rows *= a.size(d);
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (!reduced[d]) {
      r.out_shape.push_back(a.size(d));
      continue;
    }
    perm.push_back(d);
    r.cols *= a.size(d);
    if (keepdim) r.out_shape.push_back(1);
  }
  const bool converts = as.has_value() && *as != a.dtype();
  int64_t prefix = 0;
  while (prefix < nd && reduced[prefix])
    ++prefix;
  bool is_prefix = prefix > 0 && prefix < nd;
  for (int64_t d = prefix; is_prefix && d < nd; ++d)
    is_prefix = !reduced[d];
  if (allow_leading && is_prefix && !converts && !a.is_cuda() && a.is_contiguous() && r.rows > 1) {
    r.leading = true;
    r.matrix = a.view({r.cols, r.rows});
    return r;
  }
  Tensor p = a.permute(perm);
  p = converts ? p.to(*as) : p.contiguous();
  r.matrix = p.view({r.rows, r.cols});
  return r;
}

std::string dims_string(const Shape& dims) {
  return dims.empty() ? "all" : shape_to_string(dims);
}

// Runs one reduction into a new tensor of `out_dtype`; fills *index when given.
Tensor run(ReduceOp rop, const char* op, const Tensor& a, const Shape& dims, bool keepdim,
           DType out_dtype, std::optional<DType> as = std::nullopt, Tensor* index = nullptr) {
  const bool with_index = index != nullptr || rop == ReduceOp::kArgMax || rop == ReduceOp::kArgMin;
  Reduction r = prepare(a, dims, keepdim, op, as, /*allow_leading=*/!with_index);
  const bool needs_elements = rop != ReduceOp::kSum && rop != ReduceOp::kProd;
  if (needs_elements && r.cols == 0) {
    GRADWIRE_THROW(InvalidArgument)
        << op << ": cannot reduce over a zero-size dim (shape " << a.shape_string() << ", dims "
        << dims_string(dims) << "); the result of an empty max/min is undefined";
  }
  Tensor out = empty({r.rows}, a.options().dtype(out_dtype));
  Tensor idx;
  if (with_index) idx = empty({r.rows}, a.options().dtype(kInt64));
  if (r.leading) {
    detail::cpu::reduce_leading(rop, out, r.matrix);
  } else if (r.rows > 0) {
    detail::device_reduce_rows(rop, out, idx, r.matrix);
  }
  if (index != nullptr) *index = idx.view(r.out_shape);
  return out.view(r.out_shape);
}

DType sum_dtype(DType t) {
  return is_integral(t, /*include_bool=*/true) ? kInt64 : t;
}

void require_floating(const Tensor& a, const char* op) {
  check_defined(a, op);
  GRADWIRE_CHECK_ARG(a.is_floating_point())
      << op << ": expected a floating tensor, got " << dtype_name(a.dtype())
      << "; pass a floating tensor (e.g. a.to(kFloat32))";
}

template <typename T>
void divide_cpu(Tensor& t, double n) {
  T* p = t.data<T>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<T>(static_cast<double>(p[i]) / n);
}

// t /= n in place, t float32 or float64. The quotient is formed in double and rounded
// once, so a float mean is the correctly rounded sum / n.
void divide_in_place(Tensor& t, int64_t n) {
  const double dn = static_cast<double>(n);
  if (t.is_cuda()) {
    t.div_(dn);
  } else if (t.dtype() == kFloat64) {
    divide_cpu<double>(t, dn);
  } else {
    divide_cpu<float>(t, dn);
  }
}

Tensor mean_impl(const Tensor& a, const Shape& dims, bool keepdim) {
  require_floating(a, "mean");
  const DType acc = a.dtype() == kFloat64 ? kFloat64 : kFloat32;
  Tensor s = run(ReduceOp::kSum, "mean", a, dims, keepdim, acc);
  // run() has validated dims; an empty reduction divides 0 by 0 and gives nan, as PyTorch.
  int64_t count = 1;
  if (dims.empty()) {
    count = a.numel();
  } else if (a.dim() > 0) {
    for (int64_t d : dims)
      count *= a.size(d);
  }
  divide_in_place(s, count);
  return s.to(a.dtype());
}

Tensor extreme_all(ReduceOp rop, const char* op, const Tensor& a) {
  check_defined(a, op);
  GRADWIRE_CHECK_ARG(a.numel() > 0) << op << ": cannot take the " << op
                                    << " of an empty tensor (shape " << a.shape_string() << ")";
  return run(rop, op, a, {}, false, a.dtype());
}

std::pair<Tensor, Tensor> extreme_dim(ReduceOp rop, const char* op, const Tensor& a, int64_t dim,
                                      bool keepdim) {
  Tensor index;
  Tensor values = run(rop, op, a, {dim}, keepdim, a.dtype(), std::nullopt, &index);
  return {values, index};
}

Tensor arg_extreme(ReduceOp rop, const char* op, const Tensor& a, const Shape& dims, bool keepdim) {
  Tensor index;
  run(rop, op, a, dims, keepdim, a.dtype(), std::nullopt, &index);
  return index;
}

// Sum of squares in double, scaled by the largest magnitude for float64 so that neither
// huge nor tiny elements overflow or underflow when squared.
template <typename T>
double cpu_norm(const T* x, int64_t n) {
  double scale = 1.0;
  if constexpr (std::is_same_v<T, double>) {
    double m = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double v = std::fabs(x[i]);
      if (v != v) return v;
      m = v > m ? v : m;
    }
    if (m == 0.0 || std::isinf(m)) return m;
    scale = m;
  }
  const double inv = 1.0 / scale;
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) {
      const double v = static_cast<double>(static_cast<detail::compute_t<T>>(x[i + j])) * inv;
      s[j] += v * v;
    }
  }
  double total = (s[0] + s[1]) + (s[2] + s[3]);
  for (; i < n; ++i) {
    const double v = static_cast<double>(static_cast<detail::compute_t<T>>(x[i])) * inv;
    total += v * v;
  }
  return scale * std::sqrt(total);
}

}  // namespace

Tensor sum(const Tensor& a, std::optional<DType> dtype) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->sum(a, {}, false, dtype);
  return sum(a, {}, false, dtype);
}

Tensor sum(const Tensor& a, const Shape& dims, bool keepdim, std::optional<DType> dtype) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->sum(a, dims, keepdim, dtype);
  check_defined(a, "sum");
  const DType out = dtype.value_or(sum_dtype(a.dtype()));
  return run(ReduceOp::kSum, "sum", a, dims, keepdim, out, dtype);
}

Tensor mean(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->mean(a, {}, false);
  return mean_impl(a, {}, false);
}
Tensor mean(const Tensor& a, const Shape& dims, bool keepdim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->mean(a, dims, keepdim);
  return mean_impl(a, dims, keepdim);
}

Tensor prod(const Tensor& a, int64_t dim, bool keepdim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->prod(a, dim, keepdim);
  check_defined(a, "prod");
  return run(ReduceOp::kProd, "prod", a, {dim}, keepdim, sum_dtype(a.dtype()));
}

Tensor amax(const Tensor& a, const Shape& dims, bool keepdim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->amax(a, dims, keepdim);
  check_defined(a, "amax");
  return run(ReduceOp::kMax, "amax", a, dims, keepdim, a.dtype());
}

Tensor amin(const Tensor& a, const Shape& dims, bool keepdim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->amin(a, dims, keepdim);
  check_defined(a, "amin");
  return run(ReduceOp::kMin, "amin", a, dims, keepdim, a.dtype());
}

Tensor max(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->max(a);
  return extreme_all(ReduceOp::kMax, "max", a);
}
Tensor min(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->min(a);
  return extreme_all(ReduceOp::kMin, "min", a);
}

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->max(a, dim, keepdim);
  check_defined(a, "max");
  return extreme_dim(ReduceOp::kMax, "max", a, dim, keepdim);
}

std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->min(a, dim, keepdim);
  check_defined(a, "min");
  return extreme_dim(ReduceOp::kMin, "min", a, dim, keepdim);
}

Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) {
  check_defined(a, "argmax");
  return arg_extreme(ReduceOp::kArgMax, "argmax", a, {dim}, keepdim);
}

Tensor argmin(const Tensor& a, int64_t dim, bool keepdim) {
  check_defined(a, "argmin");
  return arg_extreme(ReduceOp::kArgMin, "argmin", a, {dim}, keepdim);
}

Tensor argmax(const Tensor& a) {
  check_defined(a, "argmax");
  GRADWIRE_CHECK_ARG(a.numel() > 0)
      << "argmax: cannot take the argmax of an empty tensor (shape " << a.shape_string() << ")";
  return arg_extreme(ReduceOp::kArgMax, "argmax", a, {}, false);
}

Tensor argmin(const Tensor& a) {
  check_defined(a, "argmin");
  GRADWIRE_CHECK_ARG(a.numel() > 0)
      << "argmin: cannot take the argmin of an empty tensor (shape " << a.shape_string() << ")";
  return arg_extreme(ReduceOp::kArgMin, "argmin", a, {}, false);
}

Tensor norm(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->norm(a);
  require_floating(a, "norm");
  if (a.is_cuda()) {
    // Squares of large float32 values overflow float32: accumulate in float64.
    return sqrt(sum(square(a.to(kFloat64)))).to(a.dtype());
  }
  Tensor x = a.contiguous();
  return detail::dispatch_floating(a.dtype(), "norm", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const double r = cpu_norm(x.data<T>(), x.numel());
    return scalar_tensor(r, a.dtype());
  });
}

}  // namespace gradwire
