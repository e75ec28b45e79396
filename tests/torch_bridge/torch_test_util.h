// What the LibTorch bridge's suites share: a torch tensor's or a gradwire tensor's
// elements as doubles (row-major), to compare against values worked out by hand.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire::torch::test_util {

// Every element of `t`, converted to double, in row-major order.
inline std::vector<double> values(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  const double* p = d.data_ptr<double>();
  return std::vector<double>(p, p + d.numel());
}

inline std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

// 0, 1, ..., n-1 plus `offset`, as doubles.
inline std::vector<double> iota(int64_t n, double offset = 0) {
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<size_t>(i)] = static_cast<double>(i) + offset;
  return out;
}

}  // namespace gradwire::torch::test_util
