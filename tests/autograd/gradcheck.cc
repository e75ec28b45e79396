#include "gradcheck.h"

#include <cmath>
#include <sstream>

#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::testing {

Tensor uniform(const Shape& shape, double lo, double hi, uint64_t seed) {
  Generator gen(seed);
  return rand(shape, &gen, kFloat64) * (hi - lo) + lo;
}

namespace {
double loss_value(const Fn& f, const std::vector<Tensor>& xs, const Tensor& w) {
  autograd::NoGradGuard no_grad;
  Tensor out = f(xs);
  return sum(out.to(kFloat64) * w).item<double>();
}
}  // namespace

::testing::AssertionResult gradcheck(const Fn& f, const std::vector<Tensor>& inputs,
                                     GradcheckOptions options) {
  std::vector<Tensor> leaves;
  for (const Tensor& x : inputs)
    leaves.push_back(x.detach().clone().set_requires_grad(true));
  Tensor out = f(leaves);
  if (!out.requires_grad()) {
    return ::testing::AssertionFailure() << "the output does not require grad";
  }
  Tensor w = uniform(out.sizes(), 0.5, 1.5, /*seed=*/7);
  Tensor loss = sum(out * w);
  std::vector<Tensor> analytic =
      autograd::grad({loss}, leaves, {}, /*retain_graph=*/false, /*allow_unused=*/true);

  for (size_t k = 0; k < leaves.size(); ++k) {
    Tensor a = analytic[k].defined() ? analytic[k].contiguous() : zeros_like(inputs[k]);
    if (a.sizes() != inputs[k].sizes()) {
      return ::testing::AssertionFailure()
             << "input " << k << ": gradient shape " << a.shape_string() << ", input shape "
             << inputs[k].shape_string();
    }
    std::vector<double> av = a.to_vector<double>();
    for (int64_t i = 0; i < inputs[k].numel(); ++i) {
      std::vector<Tensor> plus, minus;
      for (size_t j = 0; j < inputs.size(); ++j) {
        plus.push_back(inputs[j].detach().clone());
        minus.push_back(inputs[j].detach().clone());
      }
      plus[k].data<double>()[i] += options.eps;
      minus[k].data<double>()[i] -= options.eps;
      const double numeric = (loss_value(f, plus, w) - loss_value(f, minus, w)) / (2 * options.eps);
      if (std::abs(av[i] - numeric) > options.atol + options.rtol * std::abs(numeric)) {
        return ::testing::AssertionFailure()
               << "input " << k << " element " << i << ": analytic " << av[i] << ", numeric "
               << numeric << " (grad_fn " << (out.grad_fn() ? out.grad_fn()->name() : "none")
               << ")";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace gradwire::testing
