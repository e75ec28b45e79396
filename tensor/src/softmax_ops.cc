// softmax, log_softmax and logsumexp along one dim.
//
// All three subtract the maximum along the dim before exponentiating, so logits such as
// 1000 and -1000 neither overflow nor underflow to 0/0. On the CPU the input is packed
// and seen as [outer, dim, inner]; one fused loop per slice finds the max, sums the
// exponentials in the accumulation type (float, or double for float64) and writes the
// result, never materialising intermediate tensors. CUDA tensors are composed from the
// amax/sub/exp/sum/log frontends, which already run on the device.
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "autograd_dispatch.h"
#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {

namespace {

enum class Kind { kSoftmax, kLogSoftmax, kLogSumExp };

// The maximum of a slice, nan if any element is nan.
template <typename A>
inline A nan_max(A m, A v) {
  return (v > m || v != v) ? v : m;
}

// The shift subtracted before exp: the max, except when it is infinite, where x - max
// would turn the infinite elements into nan (logsumexp of all -inf is -inf, not nan).
template <typename A>
inline A lse_shift(A m) {
  return std::isinf(m) ? A(0) : m;
}

// One [dim, inner] slice of the packed input. y has the same layout for softmax and
// log_softmax, and holds `inner` values for logsumexp.
template <typename T>
void slice_inner(Kind kind, const T* x, T* y, int64_t dim, int64_t inner,
                 std::vector<detail::acc_t<T>>& mx, std::vector<detail::acc_t<T>>& sm) {
  using A = detail::acc_t<T>;
  auto load = [&](int64_t d, int64_t i) { return detail::convert<A>(x[d * inner + i]); };
  std::fill(mx.begin(), mx.end(), -std::numeric_limits<A>::infinity());
  std::fill(sm.begin(), sm.end(), A(0));
  for (int64_t d = 0; d < dim; ++d) {
    for (int64_t i = 0; i < inner; ++i)
      mx[i] = nan_max(mx[i], load(d, i));
  }
  if (kind == Kind::kLogSumExp) {
    for (int64_t i = 0; i < inner; ++i)
      mx[i] = lse_shift(mx[i]);
  }
  // Softmax keeps exp(x - max) in y when y can hold it exactly (T is the accumulator),
  // so each element is exponentiated once; half types exponentiate again instead of
  // rounding the numerator twice.
  const bool keep = std::is_same_v<T, A> && kind == Kind::kSoftmax;
  for (int64_t d = 0; d < dim; ++d) {
    for (int64_t i = 0; i < inner; ++i) {
      const A e = std::exp(load(d, i) - mx[i]);
      sm[i] += e;
      if (keep) y[d * inner + i] = static_cast<T>(e);
    }
  }
  switch (kind) {
    case Kind::kSoftmax:
      for (int64_t i = 0; i < inner; ++i)
        sm[i] = A(1) / sm[i];
      for (int64_t d = 0; d < dim; ++d) {
        for (int64_t i = 0; i < inner; ++i) {
          const A e = keep ? detail::convert<A>(y[d * inner + i]) : std::exp(load(d, i) - mx[i]);
          y[d * inner + i] = static_cast<T>(e * sm[i]);
        }
      }
      break;
    case Kind::kLogSoftmax:
      for (int64_t i = 0; i < inner; ++i)
        sm[i] = std::log(sm[i]);
      for (int64_t d = 0; d < dim; ++d) {
        for (int64_t i = 0; i < inner; ++i) {
          y[d * inner + i] = static_cast<T>(load(d, i) - mx[i] - sm[i]);
        }
      }
      break;
    case Kind::kLogSumExp:
      for (int64_t i = 0; i < inner; ++i)
        y[i] = static_cast<T>(mx[i] + std::log(sm[i]));
      break;
  }
}

// The inner == 1 case (the dim is the last one): a contiguous row, kept in scalars.
template <typename T>
void slice_row(Kind kind, const T* x, T* y, int64_t dim) {
  using A = detail::acc_t<T>;
  auto load = [&](int64_t d) { return detail::convert<A>(x[d]); };
  A m = -std::numeric_limits<A>::infinity();
  for (int64_t d = 0; d < dim; ++d)
    m = nan_max(m, load(d));
  if (kind == Kind::kLogSumExp) m = lse_shift(m);
  // As in slice_inner: exponentiate once when y can hold the numerators exactly.
  const bool keep = std::is_same_v<T, A> && kind == Kind::kSoftmax;
  A s = 0;
  for (int64_t d = 0; d < dim; ++d) {
    const A e = std::exp(load(d) - m);
    s += e;
    if (keep) y[d] = static_cast<T>(e);
  }
  switch (kind) {
    case Kind::kSoftmax: {
      const A inv = A(1) / s;
      for (int64_t d = 0; d < dim; ++d) {
        const A e = keep ? detail::convert<A>(y[d]) : std::exp(load(d) - m);
        y[d] = static_cast<T>(e * inv);
      }
      break;
    }
    case Kind::kLogSoftmax: {
      // (x - m) - log(s), not x - (m + log(s)): m + log(s) would round away a small
      // log(s) next to a large max.
      const A ls = std::log(s);
      for (int64_t d = 0; d < dim; ++d)
        y[d] = static_cast<T>((load(d) - m) - ls);
      break;
    }
    case Kind::kLogSumExp:
      y[0] = static_cast<T>(m + std::log(s));
      break;
  }
}

template <typename T>
void run_cpu(Kind kind, const T* x, T* y, int64_t outer, int64_t dim, int64_t inner) {
  using A = detail::acc_t<T>;
  std::vector<A> mx(static_cast<size_t>(inner)), sm(static_cast<size_t>(inner));
  const int64_t y_stride = kind == Kind::kLogSumExp ? inner : dim * inner;
  if (inner == 1) {
    for (int64_t o = 0; o < outer; ++o)
      slice_row(kind, x + o * dim, y + o * y_stride, dim);
    return;
  }
  for (int64_t o = 0; o < outer; ++o) {
    slice_inner(kind, x + o * dim * inner, y + o * y_stride, dim, inner, mx, sm);
  }
}

const char* name_of(Kind kind) {
  switch (kind) {
    case Kind::kSoftmax:
      return "softmax";
    case Kind::kLogSoftmax:
      return "log_softmax";
    case Kind::kLogSumExp:
      return "logsumexp";
  }
  return "softmax";
}

Tensor compose_on_device(Kind kind, const Tensor& x, int64_t dim, bool keepdim) {
  // Half types compute in float32 here: the composed ops would round every intermediate.
  const DType out_dtype = x.dtype();
  const Tensor xf = x.dtype() == kFloat64 ? x : x.to(kFloat32);
  const Tensor m = amax(xf, {dim}, /*keepdim=*/true);
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor shift = kind == Kind::kLogSumExp ? where(lt(abs(m), inf), m, 0.0) : m;
  const Tensor z = sub(xf, shift);
  const Tensor s = sum(exp(z), {dim}, /*keepdim=*/true);
  Tensor r;
  switch (kind) {
    case Kind::kSoftmax:
      r = div(exp(z), s);
      break;
    case Kind::kLogSoftmax:
      r = sub(z, log(s));
      break;
    case Kind::kLogSumExp:
      r = add(log(s), shift);
      if (!keepdim && x.dim() > 0) r = r.squeeze(dim);
      break;
  }
  return r.to(out_dtype);
}

Tensor softmax_family(Kind kind, const Tensor& a, int64_t dim, bool keepdim) {
  const char* op = name_of(kind);
  GRADWIRE_CHECK_ARG(a.defined()) << op << ": input tensor is undefined";
  const int64_t d = a.wrap_dim(dim, op);
  // Integral inputs are probabilities of float32 logits, as PyTorch.
  const Tensor x = a.is_floating_point() ? a : a.to(kFloat32);
  if (x.is_cuda()) return compose_on_device(kind, x, d, keepdim);

  const Tensor in = x.contiguous();
  int64_t outer = 1, inner = 1;
  const int64_t len = x.dim() == 0 ? 1 : x.size(d);
  for (int64_t i = 0; i < d; ++i)
    outer *= x.size(i);
  for (int64_t i = d + 1; i < x.dim(); ++i)
    inner *= x.size(i);

  Shape out_shape = x.sizes();
  if (kind == Kind::kLogSumExp && x.dim() > 0) {
    if (keepdim) {
      out_shape[d] = 1;
    } else {
      out_shape.erase(out_shape.begin() + d);
    }
  }
  Tensor out = empty(out_shape, x.options());
  detail::dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    run_cpu<T>(kind, static_cast<const T*>(in.data_ptr()), static_cast<T*>(out.data_ptr()), outer,
               len, inner);
  });
  return out;
}

}  // namespace

Tensor softmax(const Tensor& a, int64_t dim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->softmax(a, dim);
  return softmax_family(Kind::kSoftmax, a, dim, false);
}

Tensor log_softmax(const Tensor& a, int64_t dim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->log_softmax(a, dim);
  return softmax_family(Kind::kLogSoftmax, a, dim, false);
}

Tensor logsumexp(const Tensor& a, int64_t dim, bool keepdim) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->logsumexp(a, dim, keepdim);
  return softmax_family(Kind::kLogSumExp, a, dim, keepdim);
}

}  // namespace gradwire
