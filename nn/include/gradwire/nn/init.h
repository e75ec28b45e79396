// Parameter initialisation, as torch.nn.init documents it. Every function fills `t` in
// place without recording autograd history (it runs under a NoGradGuard, so it may be
// applied to parameters that require grad) and returns it. Random draws come from `gen`,
// or from default_generator() when null, so a seeded Generator makes models reproducible.
//
// Fans (calculate_fan_in_and_fan_out): for a 2-d [out, in] weight, fan_in = in and
// fan_out = out; for more dims the trailing dims multiply both (a receptive field).
//
// Errors: InvalidArgument for an undefined or non-floating tensor, a fan on a tensor of
// fewer than 2 dims, b < a, std < 0, or an unknown nonlinearity.
//
// Thread-safety: concurrent calls on different tensors are safe (the generator locks).
//
// Example:
//   Tensor w = empty({256, 784});
//   nn::init::kaiming_uniform_(w, std::sqrt(5.0), nn::init::FanMode::kFanIn,
//                              nn::init::Nonlinearity::kLeakyRelu, &gen);
#pragma once

#include <cstdint>
#include <utility>

#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::nn::init {

enum class Nonlinearity { kLinear, kSigmoid, kTanh, kRelu, kLeakyRelu };
enum class FanMode { kFanIn, kFanOut };

// The recommended gain for a nonlinearity (torch.nn.init.calculate_gain); `param` is the
// negative slope of leaky ReLU.
double calculate_gain(Nonlinearity nonlinearity, double param = 0.01);
// (fan_in, fan_out) of a weight of at least 2 dims.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t);

Tensor& uniform_(Tensor& t, double a = 0.0, double b = 1.0, Generator* gen = nullptr);
Tensor& normal_(Tensor& t, double mean = 0.0, double std = 1.0, Generator* gen = nullptr);
Tensor& constant_(Tensor& t, double value);
Tensor& zeros_(Tensor& t);
Tensor& ones_(Tensor& t);
// U(-bound, bound), bound = gain * sqrt(3 / fan), gain = calculate_gain(nonlinearity, a).
Tensor& kaiming_uniform_(Tensor& t, double a = 0.0, FanMode mode = FanMode::kFanIn,
                         Nonlinearity nonlinearity = Nonlinearity::kLeakyRelu,
                         Generator* gen = nullptr);
// N(0, std^2), std = gain / sqrt(fan).
Tensor& kaiming_normal_(Tensor& t, double a = 0.0, FanMode mode = FanMode::kFanIn,
                        Nonlinearity nonlinearity = Nonlinearity::kLeakyRelu,
                        Generator* gen = nullptr);
// U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);
// N(0, std^2), std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& t, double gain = 1.0, Generator* gen = nullptr);

}  // namespace gradwire::nn::init
