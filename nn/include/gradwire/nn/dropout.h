// Dropout (torch.nn.Dropout): in training mode each element is zeroed with probability p
// and the survivors are scaled by 1 / (1 - p), so the expected value is unchanged; in
// eval mode (and for p == 0) the input is returned as is. p == 1 gives zeros.
//
// The mask is drawn from the options' Generator (default_generator() when null), so a
// seeded generator reproduces it. The gradient flows through the same mask.
//
// Errors: InvalidArgument for p outside [0, 1] or a non-floating input.
//
// Thread-safety: concurrent forward() calls are safe (draws lock the generator); which
// call gets which mask is then unspecified.
//
// Example:
//   Generator gen(1);
//   nn::Dropout drop(nn::DropoutOptions{.p = 0.5, .generator = &gen});
//   Tensor y = drop(x);   // training mode: about half of x zeroed, the rest doubled
//   drop.eval();
//   Tensor z = drop(x);   // z is x
#pragma once

#include "gradwire/nn/module.h"
#include "gradwire/tensor/generator.h"

namespace gradwire::nn {

struct DropoutOptions {
  double p = 0.5;
  Generator* generator = nullptr;
  void validate() const;
};

class Dropout : public UnaryModule {
 public:
  explicit Dropout(const DropoutOptions& options = {});
  explicit Dropout(double p) : Dropout(DropoutOptions{p}) {}

  Tensor forward(const Tensor& input) override;
  const DropoutOptions& options() const { return options_; }

 private:
  DropoutOptions options_;
};

}  // namespace gradwire::nn
