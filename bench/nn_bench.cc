// nn/ + optim/ figure: one training step of a 784-1024-1024-1024-10 ReLU MLP at batch 64
// in float32 (zero_grad, forward, cross-entropy, backward, SGD step), against the same
// model and step in PyTorch 1.13 (bench/pytorch/mlp_peer.py under /usr/bin/python3 or
// $GRADWIRE_BENCH_PYTHON), measured in the same run.
//
// Threads: both sides use the same count n: $GRADWIRE_BENCH_THREADS, else the number of
// online CPUs. This process calls gradwire::set_num_threads(n), the intra-op policy its
// GEMMs and large ops follow (OpenBLAS itself stays single-threaded); the PyTorch child gets
// torch.set_num_threads(n) plus OMP_NUM_THREADS=n and OPENBLAS_NUM_THREADS=n in its environment.
//
// Timing: gradwire's steps run before and after the PyTorch child (never at the same
// time, so the two never share the cores); each side reports the median per-step time
// after its warm-up.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "gradwire/core/env.h"
#include "gradwire/nn/nn.h"
#include "gradwire/optim/optim.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/parallel.h"

namespace gradwire::bench {
namespace {

constexpr int kWarmup = 5;
constexpr int kSteps = 20;  // per round; gradwire runs two rounds

// Per-step seconds of the PyTorch peer, or nullopt with the reason in `why`.
std::optional<std::vector<double>> pytorch_steps(int threads, std::string& why,
                                                 std::string& version) {
  const std::string n = std::to_string(threads);
  auto timings = run_pytorch_peer(
      "mlp_peer.py", n + " " + std::to_string(kWarmup) + " " + std::to_string(2 * kSteps),
      "OMP_NUM_THREADS=" + n + " OPENBLAS_NUM_THREADS=" + n, why);
  if (!timings) return std::nullopt;
  version = timings->torch_version;
  return timings->seconds;
}

const Register mlp_bench({"nn.mlp_step_ms"}, [](const auto& emit) {
  const long online = ::sysconf(_SC_NPROCESSORS_ONLN);
  const int threads =
      static_cast<int>(env_int("GRADWIRE_BENCH_THREADS", online > 0 ? online : 1, 1, 1024));
  set_num_threads(threads);

  Generator gen(0);
  nn::MLP model(nn::MLPOptions{.sizes = {784, 1024, 1024, 1024, 10}, .generator = &gen});
  optim::SGD sgd(model.parameters(), optim::SGDOptions{.lr = 0.01});
  const Tensor x = randn({64, 784}, &gen);
  const Tensor y = randint(0, 10, {64}, &gen);
  auto step = [&] {
    sgd.zero_grad();
    nn::cross_entropy(model(x), y).backward();
    sgd.step();
  };
  std::vector<double> ours;
  auto round = [&](int warmup) {
    for (int i = 0; i < warmup; ++i)
      step();
    for (int i = 0; i < kSteps; ++i)
      ours.push_back(time_once(step));
  };
  round(kWarmup);
  std::string why, version;
  const auto theirs = pytorch_steps(threads, why, version);
  round(1);

  Figure f{"nn.mlp_step_ms",
           median(ours) * 1e3,
           "ms",
           {{"model", "784-1024-1024-1024-10 ReLU MLP"},
            {"batch", 64.0},
            {"dtype", "float32"},
            {"step", "zero_grad + forward + cross_entropy + backward + SGD(lr=0.01)"},
            {"steps", double(ours.size())},
            {"threads", double(threads)},
            {"threads_how",
             "GRADWIRE_BENCH_THREADS or online CPUs; gradwire::set_num_threads(n) here, "
             "torch.set_num_threads(n) + OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=n in the peer"},
            {"intra_op_threads", double(get_num_threads())},
            {"blas_core", blas_core()}}};
  if (theirs) {
    const double theirs_ms = median(*theirs) * 1e3;
    f.params.push_back({"pytorch", "torch " + version});
    f.params.push_back({"pytorch_ms", theirs_ms});
    f.params.push_back({"ratio", f.value / theirs_ms});
  } else {
    f.params.push_back({"pytorch", "unavailable"});
    f.params.push_back({"pytorch_reason", why});
    f.params.push_back({"pytorch_ms", std::numeric_limits<double>::quiet_NaN()});
    f.params.push_back({"ratio", std::numeric_limits<double>::quiet_NaN()});
  }
  f.params.push_back({"target_ratio_max", 1.0});
  emit(f);
});

}  // namespace
}  // namespace gradwire::bench
