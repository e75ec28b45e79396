// Finite-difference gradient checking for the autograd tests.
//
// gradcheck(f, inputs) compares the gradient autograd computes for
//   L(x) = sum(f(x) * W)        (W: fixed pseudo-random weights shaped like f's output)
// with central differences (L(x + eps e_i) - L(x - eps e_i)) / (2 eps) for every element
// of every input, in float64. A random W (rather than ones) makes every output element
// count with a different weight, so permuted or misplaced gradients are caught.
//
// Tolerances: eps = 1e-6; an element passes when |analytic - numeric| <= atol + rtol *
// |numeric| with atol = 1e-6 and rtol = 1e-5 (central differences in float64 are accurate
// to about eps^2 * |f'''| + 1e-16 / eps ~ 1e-10 for the smooth functions tested).
#pragma once

#include <functional>
#include <vector>

#include <gtest/gtest.h>

#include "gradwire/autograd/autograd.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-5;
};

// `inputs` are float64 tensors; each becomes a fresh leaf that requires grad.
::testing::AssertionResult gradcheck(const Fn& f, const std::vector<Tensor>& inputs,
                                     GradcheckOptions options = {});

// A float64 tensor of `shape` with values uniform in [lo, hi), from a fixed seed.
Tensor uniform(const Shape& shape, double lo = -1.0, double hi = 1.0, uint64_t seed = 1);

}  // namespace gradwire::testing
