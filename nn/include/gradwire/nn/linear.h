// Linear: y = x W^T + b (torch.nn.Linear).
//
// weight is [out_features, in_features], bias [out_features]. Default initialisation is
// PyTorch's: weight by kaiming_uniform_(a = sqrt(5)), i.e. U(-1/sqrt(in), 1/sqrt(in)), and
// bias U(-1/sqrt(in), 1/sqrt(in)). Input is [..., in_features]; output [..., out_features].
//
// Errors: InvalidArgument for non-positive feature counts (construction) and for an input
// whose last dim is not in_features or whose dtype differs from the weight's (forward).
//
// Thread-safety: as Module: concurrent forward() calls are safe while nothing mutates the
// parameters.
//
// Example:
//   Generator gen(0);
//   nn::Linear fc(nn::LinearOptions{.in_features = 784, .out_features = 10, .generator = &gen});
//   Tensor logits = fc(x);  // x: [64, 784] -> [64, 10]
#pragma once

#include <cstdint>

#include "gradwire/nn/module.h"
#include "gradwire/tensor/generator.h"

namespace gradwire::nn {

struct LinearOptions {
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool bias = true;
  DType dtype = kFloat32;          // a floating dtype
  Generator* generator = nullptr;  // for the initial values; null: default_generator()
  void validate() const;
};

class Linear : public UnaryModule {
 public:
  explicit Linear(const LinearOptions& options);
  Linear(int64_t in_features, int64_t out_features, bool bias = true)
      : Linear(LinearOptions{in_features, out_features, bias}) {}

  Tensor forward(const Tensor& input) override;
  // Re-draws the parameters with the default initialisation.
  void reset_parameters(Generator* gen = nullptr);

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  const LinearOptions& options() const { return options_; }

 private:
  LinearOptions options_;
  Tensor weight_;
  Tensor bias_;
};

}  // namespace gradwire::nn
