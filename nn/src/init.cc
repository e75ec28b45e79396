#include "gradwire/nn/init.h"

#include <algorithm>
#include <cmath>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::nn::init {
namespace {

void check_float(const Tensor& t, const char* op) {
  GRADWIRE_CHECK_ARG(t.defined()) << "nn::init::" << op << ": undefined tensor";
  GRADWIRE_CHECK_ARG(t.is_floating_point())
      << "nn::init::" << op << ": expected a floating tensor, got " << t.dtype();
}

int64_t fan(const Tensor& t, FanMode mode) {
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return mode == FanMode::kFanIn ? fan_in : fan_out;
}

}  // namespace

double calculate_gain(Nonlinearity nonlinearity, double param) {
  switch (nonlinearity) {
    case Nonlinearity::kLinear:
    case Nonlinearity::kSigmoid:
      return 1.0;
    case Nonlinearity::kTanh:
      return 5.0 / 3.0;
    case Nonlinearity::kRelu:
      return std::sqrt(2.0);
    case Nonlinearity::kLeakyRelu:
      return std::sqrt(2.0 / (1.0 + param * param));
  }
  GRADWIRE_THROW(InvalidArgument) << "nn::init::calculate_gain: unknown nonlinearity "
                                  << static_cast<int>(nonlinearity);
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  GRADWIRE_CHECK_ARG(t.defined()) << "nn::init: undefined tensor";
  GRADWIRE_CHECK_ARG(t.dim() >= 2) << "nn::init: fan in and fan out need a tensor of at least "
                                      "2 dims, got shape "
                                   << t.shape_string();
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d)
    receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor& uniform_(Tensor& t, double a, double b, Generator* gen) {
  check_float(t, "uniform_");
  GRADWIRE_CHECK_ARG(a <= b) << "nn::init::uniform_: a (" << a << ") must not exceed b (" << b
                             << ")";
  autograd::NoGradGuard no_grad;
  Tensor u = rand(t.sizes(), gen, TensorOptions(kFloat64));
  t.copy_(u * (b - a) + a);
  return t;
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* gen) {
  check_float(t, "normal_");
  GRADWIRE_CHECK_ARG(std >= 0) << "nn::init::normal_: std must be >= 0, got " << std;
  autograd::NoGradGuard no_grad;
  if (!t.is_contiguous()) {
    Tensor n = randn(t.sizes(), gen, TensorOptions(kFloat64));
    t.copy_(n * std + mean);
    return t;
  }
  // In blocks of an even number of elements: the generator hands out normals in pairs, in
  // order, so the values are those of one randn over the whole tensor, while the float64
  // scratch stays a few MB instead of twice the tensor (a 10^7-row embedding table would
  // otherwise need several times its own size to be initialised).
  constexpr int64_t kBlock = int64_t{1} << 20;
  Tensor flat = t.view({-1});
  for (int64_t offset = 0; offset < flat.numel(); offset += kBlock) {
    const int64_t len = std::min(kBlock, flat.numel() - offset);
    Tensor n = randn({len}, gen, TensorOptions(kFloat64));
    n.mul_(std).add_(mean);
    flat.narrow(0, offset, len).copy_(n);
  }
  return t;
}

Tensor& constant_(Tensor& t, double value) {
  GRADWIRE_CHECK_ARG(t.defined()) << "nn::init::constant_: undefined tensor";
  autograd::NoGradGuard no_grad;
  t.fill_(value);
  return t;
}

Tensor& zeros_(Tensor& t) {
  return constant_(t, 0.0);
}
Tensor& ones_(Tensor& t) {
  return constant_(t, 1.0);
}

Tensor& kaiming_uniform_(Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity,
                         Generator* gen) {
  check_float(t, "kaiming_uniform_");
  if (t.numel() == 0) return t;  // no fan to speak of; nothing to fill
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(double(fan(t, mode)));
  const double bound = std::sqrt(3.0) * std;
  return uniform_(t, -bound, bound, gen);
}

Tensor& kaiming_normal_(Tensor& t, double a, FanMode mode, Nonlinearity nonlinearity,
                        Generator* gen) {
  check_float(t, "kaiming_normal_");
  if (t.numel() == 0) return t;  // no fan to speak of; nothing to fill
  const double std = calculate_gain(nonlinearity, a) / std::sqrt(double(fan(t, mode)));
  return normal_(t, 0.0, std, gen);
}

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* gen) {
  check_float(t, "xavier_uniform_");
  if (t.numel() == 0) return t;  // no fan to speak of; nothing to fill
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const double a = gain * std::sqrt(6.0 / double(fan_in + fan_out));
  return uniform_(t, -a, a, gen);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* gen) {
  check_float(t, "xavier_normal_");
  if (t.numel() == 0) return t;  // no fan to speak of; nothing to fill
  auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  return normal_(t, 0.0, gain * std::sqrt(2.0 / double(fan_in + fan_out)), gen);
}

}  // namespace gradwire::nn::init
