#include "gradwire/nn/dropout.h"

#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::nn {

void DropoutOptions::validate() const {
  GRADWIRE_CHECK_ARG(p >= 0.0 && p <= 1.0) << "DropoutOptions: p must be in [0, 1], got " << p;
}

Dropout::Dropout(const DropoutOptions& options) : UnaryModule("Dropout"), options_(options) {
  options_.validate();
}

Tensor Dropout::forward(const Tensor& input) {
  GRADWIRE_CHECK_ARG(input.defined()) << "Dropout: undefined input";
  GRADWIRE_CHECK_ARG(input.is_floating_point())
      << "Dropout: expected a floating input, got " << input.dtype();
  if (!is_training() || options_.p == 0.0) return input;
  if (options_.p == 1.0) return input * 0.0;  // keeps the graph: the gradient is zero too
  // mask = keep / (1 - p), drawn in the input's dtype so the product stays in it.
  Tensor keep =
      ge(rand(input.sizes(), options_.generator, TensorOptions(input.dtype())), Scalar(options_.p));
  Tensor mask = keep.to(input.dtype()) * (1.0 / (1.0 - options_.p));
  return input * mask;
}

}  // namespace gradwire::nn
