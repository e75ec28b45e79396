// Elementwise activations as modules: ReLU, Sigmoid, Tanh (torch.nn.ReLU, ...). Each is the
// op of the same name in tensor/ops.h (sigmoid is computed stably for large |x|); they
// hold no parameters and exist so that Sequential can chain them.
//
// Errors: as the ops: InvalidArgument for an undefined input. Integral inputs to Sigmoid
// and Tanh give float32 results (ops.h).
//
// Thread-safety: stateless; concurrent forward() calls are safe.
//
// Example:
//   nn::Sequential net;
//   net.push_back(std::make_shared<nn::Linear>(4, 8));
//   net.push_back(std::make_shared<nn::Tanh>());
#pragma once

#include "gradwire/nn/module.h"

namespace gradwire::nn {

class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

class Sigmoid : public UnaryModule {
 public:
  Sigmoid() : UnaryModule("Sigmoid") {}
  Tensor forward(const Tensor& input) override;
};

class Tanh : public UnaryModule {
 public:
  Tanh() : UnaryModule("Tanh") {}
  Tensor forward(const Tensor& input) override;
};

}  // namespace gradwire::nn
