#include "gradwire/nn/activation.h"

#include "gradwire/tensor/ops.h"

namespace gradwire::nn {

Tensor ReLU::forward(const Tensor& input) {
  return relu(input);
}
Tensor Sigmoid::forward(const Tensor& input) {
  return sigmoid(input);
}
Tensor Tanh::forward(const Tensor& input) {
  return tanh(input);
}

}  // namespace gradwire::nn
