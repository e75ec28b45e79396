// Fused optimizer updates (detail.h).
//
// Why: the tensor-op formulation of an Adam step makes 3-4 temporaries per parameter and
// walks memory about ten times; this loop reads p, g, m, v once and writes p, m, v once.
//
// Bit-identical to the tensor ops: every operation below is the one the tensor-op path
// performs (tensor/src/cpu/elementwise.cc): a scalar operand is rounded to the element
// type first, a + alpha * b is evaluated as written, max propagates NaN, and each
// intermediate is rounded to the element type. Nothing is reassociated (no -ffast-math);
// the file is built at -O3 so the loops vectorise, and with -fno-math-errno so that
// std::sqrt may become the vector square-root instruction (it sets no errno; the results,
// correctly rounded square roots and NaN for negatives, are the same).
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "detail.h"
#include "gradwire/core/check.h"

namespace gradwire::optim::detail {
namespace {

// torch.maximum's rule, as the tensor kernel: NaN in either operand wins.
template <typename T>
inline T max_nan(T a, T b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

// The switches are template parameters so that each variant is one branch-free loop the
// compiler vectorises.
template <typename T, bool kL2, bool kDecoupled, bool kAmsgrad>
void adam_loop(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v,
               T* __restrict vmax, int64_t n, const AdamCoefficients& c) {
  const T wd = T(c.weight_decay), decay = T(1.0 - c.lr * c.weight_decay);
  const T b1 = T(c.beta1), one_minus_b1 = T(1.0 - c.beta1);
  const T b2 = T(c.beta2), one_minus_b2 = T(1.0 - c.beta2);
  const T bc2 = T(c.bias_correction2_sqrt), eps = T(c.eps), alpha = T(-c.step_size);
  for (int64_t i = 0; i < n; ++i) {
    T pi = p[i];
    T gi = g[i];
    if constexpr (kL2) gi = gi + wd * pi;
    if constexpr (kDecoupled) pi = pi * decay;
    T mi = m[i] * b1;
    mi = mi + one_minus_b1 * gi;
    const T sq = gi * gi;
    T vi = v[i] * b2;
    vi = vi + one_minus_b2 * sq;
    T denom;
    if constexpr (kAmsgrad) {
      const T top = max_nan(vmax[i], vi);
      vmax[i] = top;
      denom = std::sqrt(top);
    } else {
      denom = std::sqrt(vi);
    }
    denom = denom / bc2;
    denom = denom + eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + alpha * (mi / denom);
  }
}

template <typename T>
void adam_dispatch(T* p, const T* g, T* m, T* v, T* vmax, int64_t n, const AdamCoefficients& c) {
  const bool decay = c.weight_decay != 0.0;
  const bool l2 = decay && !c.decoupled, decoupled = decay && c.decoupled;
  if (c.amsgrad) {
    if (l2) return adam_loop<T, true, false, true>(p, g, m, v, vmax, n, c);
    if (decoupled) return adam_loop<T, false, true, true>(p, g, m, v, vmax, n, c);
    return adam_loop<T, false, false, true>(p, g, m, v, vmax, n, c);
  }
  if (l2) return adam_loop<T, true, false, false>(p, g, m, v, vmax, n, c);
  if (decoupled) return adam_loop<T, false, true, false>(p, g, m, v, vmax, n, c);
  return adam_loop<T, false, false, false>(p, g, m, v, vmax, n, c);
}

template <typename T, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(T* __restrict p, const T* __restrict g, T* __restrict buf, int64_t n,
              const SGDCoefficients& c) {
  const T wd = T(c.weight_decay), mom = T(c.momentum), one_minus_damp = T(1.0 - c.dampening);
  const T alpha = T(-c.lr);
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i];
    if constexpr (kDecay) d = d + wd * p[i];
    if constexpr (kMomentum) {
      T b;
      if constexpr (kFirst) {
        b = d;
      } else {
        b = buf[i] * mom;
        b = b + one_minus_damp * d;
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + mom * b;
      } else {
        d = b;
      }
    }
    p[i] = p[i] + alpha * d;
  }
}

template <typename T, bool kDecay>
void sgd_dispatch_momentum(T* p, const T* g, T* buf, int64_t n, const SGDCoefficients& c) {
  if (c.momentum == 0.0) return sgd_loop<T, kDecay, false, false, false>(p, g, buf, n, c);
  if (c.first) {
    if (c.nesterov) return sgd_loop<T, kDecay, true, true, true>(p, g, buf, n, c);
    return sgd_loop<T, kDecay, true, true, false>(p, g, buf, n, c);
  }
  if (c.nesterov) return sgd_loop<T, kDecay, true, false, true>(p, g, buf, n, c);
  return sgd_loop<T, kDecay, true, false, false>(p, g, buf, n, c);
}

template <typename T>
void sgd_dispatch(T* p, const T* g, T* buf, int64_t n, const SGDCoefficients& c) {
  if (c.weight_decay != 0.0) return sgd_dispatch_momentum<T, true>(p, g, buf, n, c);
  return sgd_dispatch_momentum<T, false>(p, g, buf, n, c);
}

template <typename T, bool kDecay>
void adagrad_loop(T* __restrict p, const T* __restrict g, T* __restrict sum, int64_t n,
                  const AdagradCoefficients& c) {
  const T wd = T(c.weight_decay), eps = T(c.eps), alpha = T(-c.clr);
  for (int64_t i = 0; i < n; ++i) {
    T gi = g[i];
    if constexpr (kDecay) gi = gi + wd * p[i];
    const T s = sum[i] + gi * gi;
    sum[i] = s;
    T std = std::sqrt(s);
    std = std + eps;
    p[i] = p[i] + alpha * (gi / std);
  }
}

template <typename T>
void adagrad_dispatch(T* p, const T* g, T* sum, int64_t n, const AdagradCoefficients& c) {
  if (c.weight_decay != 0.0) return adagrad_loop<T, true>(p, g, sum, n, c);
  return adagrad_loop<T, false>(p, g, sum, n, c);
}

template <typename T>
T* data(const Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// The tensor ops bump a storage's version on every in-place write (autograd checks it
// for tensors saved for backward); the fused loops write in place too.
void bump(std::initializer_list<const Tensor*> written) {
  for (const Tensor* t : written) {
    if (t->defined()) t->storage().bump_version();
  }
}

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.data_ptr());
  const auto* b0 = static_cast<const char*>(b.data_ptr());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

bool fusable(std::initializer_list<const Tensor*> tensors) {
  const Tensor& first = **tensors.begin();
  if (!first.defined()) return false;
  const DType dtype = first.dtype();
  if (dtype != kFloat32 && dtype != kFloat64) return false;
  for (const Tensor* t : tensors) {
    if (!t->defined() || !t->device().is_cpu() || t->dtype() != dtype || !t->is_contiguous() ||
        t->numel() != first.numel()) {
      return false;
    }
    if (t != &first && first.numel() > 0 && overlaps(*t, first)) return false;
  }
  return true;
}

void fused_adam(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamCoefficients& c) {
  const int64_t n = param.numel();
  if (param.dtype() == kFloat32) {
    adam_dispatch<float>(data<float>(param), data<float>(grad), data<float>(exp_avg),
                         data<float>(exp_avg_sq), c.amsgrad ? data<float>(max_exp_avg_sq) : nullptr,
                         n, c);
  } else {
    GRADWIRE_CHECK(param.dtype() == kFloat64);
    adam_dispatch<double>(data<double>(param), data<double>(grad), data<double>(exp_avg),
                          data<double>(exp_avg_sq),
                          c.amsgrad ? data<double>(max_exp_avg_sq) : nullptr, n, c);
  }
  bump({&param, &exp_avg, &exp_avg_sq});
  if (c.amsgrad) bump({&max_exp_avg_sq});
}

void fused_sgd(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
               const SGDCoefficients& c) {
  const int64_t n = param.numel();
  const bool momentum = c.momentum != 0.0;
  if (param.dtype() == kFloat32) {
    sgd_dispatch<float>(data<float>(param), data<float>(grad),
                        momentum ? data<float>(momentum_buffer) : nullptr, n, c);
  } else {
    GRADWIRE_CHECK(param.dtype() == kFloat64);
    sgd_dispatch<double>(data<double>(param), data<double>(grad),
                         momentum ? data<double>(momentum_buffer) : nullptr, n, c);
  }
  bump({&param});
  if (momentum) bump({&momentum_buffer});
}

void fused_adagrad(const Tensor& param, const Tensor& grad, const Tensor& sum,
                   const AdagradCoefficients& c) {
  const int64_t n = param.numel();
  if (param.dtype() == kFloat32) {
    adagrad_dispatch<float>(data<float>(param), data<float>(grad), data<float>(sum), n, c);
  } else {
    GRADWIRE_CHECK(param.dtype() == kFloat64);
    adagrad_dispatch<double>(data<double>(param), data<double>(grad), data<double>(sum), n, c);
  }
  bump({&param, &sum});
}

void fused_adagrad_rows(const Tensor& param, const Tensor& rows, const Tensor& values,
                        const Tensor& sum, const AdagradCoefficients& c) {
  const int64_t n = rows.numel();
  const int64_t width = param.dim() == 0 ? 1 : param.numel() / param.size(0);
  const int64_t* r = rows.data<int64_t>();
  // How many rows ahead to prefetch: enough to cover a miss to memory at this row width.
  constexpr int64_t kAhead = 4;
  auto run = [&](auto* p, const auto* g, auto* s) {
    using T = std::remove_const_t<std::remove_pointer_t<decltype(g)>>;
    for (int64_t k = 0; k < n; ++k) {
      if (k + kAhead < n) {
        const int64_t next = r[k + kAhead] * width;
        for (int64_t b = 0; b < width * static_cast<int64_t>(sizeof(T)); b += 64) {
          __builtin_prefetch(reinterpret_cast<const char*>(p + next) + b, 1);
          __builtin_prefetch(reinterpret_cast<const char*>(s + next) + b, 1);
        }
      }
      const int64_t at = r[k] * width;
      adagrad_loop<T, false>(p + at, g + k * width, s + at, width, c);
    }
  };
  if (param.dtype() == kFloat32) {
    run(data<float>(param), data<float>(values), data<float>(sum));
  } else {
    GRADWIRE_CHECK(param.dtype() == kFloat64);
    run(data<double>(param), data<double>(values), data<double>(sum));
  }
  bump({&param, &sum});
}

}  // namespace gradwire::optim::detail
