// optim/ figures.
//
// optim.adam_step_us: one Adam step (FunctionalAdam, amsgrad off, weight decay 0) over the
// parameters of a 784-1024-1024-1024-10 MLP (2.9 M float32 values in 8 tensors), which
// takes the fused in-place loop. Baselines, in the same run: the tensor-op formulation of
// the same update (what optim/ ran before the fused loop, and still runs for other
// devices, dtypes and layouts), and memcpy of as many bytes as the step must move
// (p, g, m, v read, p, m, v written: 7 x 4 bytes per value).
//
// optim.mlp_adam_train_s: a time bound kept out of the unit tests: 150 full-batch Adam steps
// (zero_grad, forward, cross-entropy, backward, step) of a 2-32-32-3 MLP on 300 points.
// Baseline: the same loop without the optimizer step; adam_steps_s is the time spent in
// the 150 steps themselves (of the last run).
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "bench.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/nn/nn.h"
#include "gradwire/optim/optim.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::bench {
namespace {

std::vector<Tensor> mlp_shaped(Generator& gen) {
  const std::vector<Shape> shapes{{1024, 784},  {1024}, {1024, 1024}, {1024},
                                  {1024, 1024}, {1024}, {10, 1024},   {10}};
  std::vector<Tensor> out;
  for (const Shape& s : shapes)
    out.push_back(randn(s, &gen) * 0.05);
  return out;
}

// Adam as tensor ops, step for step the formulation optim/ falls back to.
struct UnfusedAdam {
  optim::AdamOptions o;
  std::vector<Tensor> m, v;
  int64_t t = 0;

  void step(std::vector<Tensor>& params, const std::vector<Tensor>& grads) {
    autograd::NoGradGuard no_grad;
    if (m.empty()) {
      for (const Tensor& p : params) {
        m.push_back(zeros_like(p));
        v.push_back(zeros_like(p));
      }
    }
    ++t;
    const double bc1 = 1.0 - std::pow(o.beta1, double(t));
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(o.beta2, double(t)));
    for (size_t i = 0; i < params.size(); ++i) {
      m[i].mul_(o.beta1).add_(grads[i], 1.0 - o.beta1);
      v[i].mul_(o.beta2).add_(square(grads[i]), 1.0 - o.beta2);
      Tensor denom = sqrt(v[i]);
      denom.div_(bc2_sqrt).add_(o.eps);
      params[i].add_(div(m[i], denom), -o.lr / bc1);
    }
  }
};

const Register adam_step_bench({"optim.adam_step_us"}, [](const auto& emit) {
  Generator gen(3);
  std::vector<Tensor> fused_params = mlp_shaped(gen), unfused_params = mlp_shaped(gen);
  const std::vector<Tensor> grads = mlp_shaped(gen);
  int64_t numel = 0;
  for (const Tensor& p : fused_params)
    numel += p.numel();
  const optim::AdamOptions options{.lr = 1e-3};
  optim::FunctionalAdam fused(options);
  UnfusedAdam unfused;
  unfused.o = options;
  auto [t_fused, t_unfused] = time_interleaved([&] { fused.step(fused_params, grads); },
                                               [&] { unfused.step(unfused_params, grads); }, 15);
  // The bytes the step must move (7 arrays of numel floats), as one memcpy of half of them
  // (a copy reads and writes each byte).
  const size_t bytes = static_cast<size_t>(numel) * 4 * 7 / 2;
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  auto [t_fused2, t_copy] =
      time_interleaved([&] { fused.step(fused_params, grads); },
                       [&] { std::memcpy(dst.data(), src.data(), bytes); }, 15);
  const double fused_us = 0.5 * (t_fused + t_fused2) * 1e6;
  emit(Figure{"optim.adam_step_us",
              fused_us,
              "us",
              {{"params", double(numel)},
               {"tensors", double(fused_params.size())},
               {"shapes", "784-1024-1024-1024-10 MLP"},
               {"dtype", "float32"},
               {"options", "lr 1e-3, betas (0.9, 0.999), eps 1e-8, no weight decay, no amsgrad"},
               {"unfused_us", t_unfused * 1e6},
               {"unfused", "the same update as tensor ops (3 temporaries per parameter)"},
               {"speedup_vs_unfused", t_unfused * 1e6 / fused_us},
               {"target_speedup_min", 2.0},
               {"memcpy_us", t_copy * 1e6},
               {"memcpy_bytes", double(bytes)},
               {"ratio_to_memcpy", fused_us / (t_copy * 1e6)}}});
});

// Three Gaussian blobs in 2-D, as tests/optim's training test.
void blobs(int64_t per_class, uint64_t seed, Tensor& x, Tensor& y) {
  Generator gen(seed);
  const std::vector<std::vector<float>> centres{{0.f, 0.f}, {3.f, 0.f}, {1.5f, 2.6f}};
  std::vector<Tensor> xs;
  std::vector<int64_t> labels;
  for (int64_t c = 0; c < 3; ++c) {
    xs.push_back(randn({per_class, 2}, &gen) * 0.6f + tensor<float>(centres[size_t(c)]));
    for (int64_t i = 0; i < per_class; ++i)
      labels.push_back(c);
  }
  x = cat(xs, 0);
  y = tensor<int64_t>(labels);
}

const Register train_bench({"optim.mlp_adam_train_s"}, [](const auto& emit) {
  constexpr int kSteps = 150;
  Tensor x, y;
  blobs(100, 1, x, y);
  double step_seconds = 0;  // the optimizer steps' part of the last timed run
  auto run = [&](bool with_step) {
    Generator gen(3);
    nn::MLP net(nn::MLPOptions{.sizes = {2, 32, 32, 3}, .generator = &gen});
    optim::Adam adam(net.parameters(), optim::AdamOptions{.lr = 0.02});
    double in_step = 0;
    for (int step = 0; step < kSteps; ++step) {
      adam.zero_grad();
      nn::cross_entropy(net(x), y).backward();
      if (with_step) in_step += time_once([&] { adam.step(); });
    }
    if (with_step) step_seconds = in_step;
  };
  auto [t_train, t_no_step] = time_interleaved([&] { run(true); }, [&] { run(false); }, 9);
  emit(Figure{"optim.mlp_adam_train_s",
              t_train,
              "s",
              {{"model", "2-32-32-3 ReLU MLP"},
               {"samples", 300.0},
               {"steps", double(kSteps)},
               {"step", "zero_grad + forward + cross_entropy + backward + Adam(lr=0.02)"},
               {"without_step_s", t_no_step},
               {"adam_steps_s", step_seconds},
               {"target_max_s", 5.0}}});
});

}  // namespace
}  // namespace gradwire::bench
