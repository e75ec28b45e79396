// Finite-difference gradient checks for modules and losses, in float64.
//
// check_gradients(f, wrt) compares autograd's gradient of L = sum(f() * W) (W fixed
// pseudo-random weights in [0.5, 1.5), so misplaced gradients show) with respect to each
// tensor of `wrt` (float64 leaves that require grad: inputs and module parameters that f
// closes over) with central differences, perturbing each element of each tensor in place.
// Tolerance: |analytic - numeric| <= 1e-6 + 1e-5 |numeric|, eps = 1e-6 (central
// differences in float64 are accurate to ~1e-9 for the smooth functions here; inputs of
// ReLU are kept away from 0).
#pragma once

#include <cmath>
#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "gradwire/autograd/autograd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::nn::testing {

inline Tensor uniform64(const Shape& shape, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  return rand(shape, &gen, TensorOptions(kFloat64)) * (hi - lo) + lo;
}

inline ::testing::AssertionResult check_gradients(const std::function<Tensor()>& f,
                                                  const std::vector<Tensor>& wrt) {
  Tensor out = f();
  if (!out.requires_grad()) return ::testing::AssertionFailure() << "output has no grad_fn";
  const Tensor w = uniform64(out.sizes(), 0.5, 1.5, 7);
  std::vector<Tensor> analytic = autograd::grad({sum(out * w)}, wrt, {}, false, true);
  auto loss = [&] {
    autograd::NoGradGuard no_grad;
    return sum(f() * w).item<double>();
  };
  constexpr double eps = 1e-6;
  for (size_t k = 0; k < wrt.size(); ++k) {
    if (wrt[k].dtype() != kFloat64 || !wrt[k].is_contiguous()) {
      return ::testing::AssertionFailure() << "tensor " << k << " is not contiguous float64";
    }
    Tensor a = analytic[k].defined() ? analytic[k].contiguous() : zeros_like(wrt[k]);
    const std::vector<double> av = a.to_vector<double>();
    double* x = wrt[k].data<double>();
    for (int64_t i = 0; i < wrt[k].numel(); ++i) {
      const double saved = x[i];
      x[i] = saved + eps;
      const double plus = loss();
      x[i] = saved - eps;
      const double minus = loss();
      x[i] = saved;
      const double numeric = (plus - minus) / (2 * eps);
      if (std::abs(av[size_t(i)] - numeric) > 1e-6 + 1e-5 * std::abs(numeric)) {
        return ::testing::AssertionFailure() << "tensor " << k << " element " << i << ": analytic "
                                             << av[size_t(i)] << ", numeric " << numeric;
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace gradwire::nn::testing
