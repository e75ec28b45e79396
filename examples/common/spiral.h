// The examples' built-in task: points on three spiral arms, with angular noise, labelled
// by arm. A linear model cannot separate them; a small MLP learns them to > 90%.
#pragma once

#include <gradwire/gradwire.h>

#include <cmath>
#include <utility>
#include <vector>

namespace gradwire::examples {

// `per_class` points on each of three spiral arms: x float32 [3 * per_class, 2], y int64.
inline std::pair<Tensor, Tensor> spiral(int64_t per_class, Generator& gen) {
  const std::vector<float> noise = (randn({3 * per_class}, &gen) * 0.2).to_vector<float>();
  std::vector<float> points;
  std::vector<int64_t> labels;
  for (int64_t k = 0; k < 3; ++k) {
    for (int64_t i = 0; i < per_class; ++i) {
      const double t = static_cast<double>(i) / static_cast<double>(per_class - 1);
      const double r = 0.05 + 0.95 * t;
      const double theta = 4.0 * (static_cast<double>(k) + t) + noise[k * per_class + i];
      points.push_back(static_cast<float>(r * std::sin(theta)));
      points.push_back(static_cast<float>(r * std::cos(theta)));
      labels.push_back(k);
    }
  }
  return {tensor<float>(points, {3 * per_class, 2}), tensor<int64_t>(labels)};
}

// The share of rows of `logits` whose arg-max is `y`.
inline double accuracy_of(const Tensor& logits, const Tensor& y) {
  auto [best, predicted] = max(logits, 1);
  return mean(eq(predicted, y).to(kFloat32)).item<double>();
}

}  // namespace gradwire::examples
