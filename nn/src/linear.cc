#include "gradwire/nn/linear.h"

#include <cmath>

#include "gradwire/core/check.h"
#include "gradwire/nn/init.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::nn {

void LinearOptions::validate() const {
  GRADWIRE_CHECK_ARG(in_features > 0)
      << "LinearOptions: in_features must be positive, got " << in_features;
  GRADWIRE_CHECK_ARG(out_features > 0)
      << "LinearOptions: out_features must be positive, got " << out_features;
  GRADWIRE_CHECK_ARG(is_floating_point(dtype))
      << "LinearOptions: dtype must be floating, got " << dtype;
}

Linear::Linear(const LinearOptions& options) : UnaryModule("Linear"), options_(options) {
  options_.validate();
  weight_ = register_parameter("weight", empty({options_.out_features, options_.in_features},
                                               TensorOptions(options_.dtype)));
  if (options_.bias) {
    bias_ =
        register_parameter("bias", empty({options_.out_features}, TensorOptions(options_.dtype)));
  }
  reset_parameters(options_.generator);
}

void Linear::reset_parameters(Generator* gen) {
  // kaiming_uniform_(a = sqrt(5)) gives bound = 1 / sqrt(fan_in), PyTorch's default.
  init::kaiming_uniform_(weight_, std::sqrt(5.0), init::FanMode::kFanIn,
                         init::Nonlinearity::kLeakyRelu, gen);
  if (bias_.defined()) {
    const double bound = 1.0 / std::sqrt(double(options_.in_features));
    init::uniform_(bias_, -bound, bound, gen);
  }
}

Tensor Linear::forward(const Tensor& input) {
  GRADWIRE_CHECK_ARG(input.defined()) << "Linear: undefined input";
  GRADWIRE_CHECK_ARG(input.dim() >= 1 && input.size(-1) == options_.in_features)
      << "Linear: expected input [..., " << options_.in_features << "], got "
      << input.shape_string();
  GRADWIRE_CHECK_ARG(input.dtype() == weight_.dtype())
      << "Linear: input dtype " << input.dtype() << " does not match weight dtype "
      << weight_.dtype();
  if (input.dim() == 2) {
    Tensor out = mm(input, weight_.t());
    return bias_.defined() ? out + bias_ : out;
  }
  Tensor out = matmul(input, weight_.t());
  return bias_.defined() ? out + bias_ : out;
}

}  // namespace gradwire::nn
