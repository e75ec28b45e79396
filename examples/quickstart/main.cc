// Quickstart: data-parallel linear regression on a thread pool, with gradwire's tensors
// and futures.
//
// A synthetic problem y = X w* + b* + noise is split into shards; each step, every shard's
// gradient of the mean squared error is computed on the pool (one Future per shard),
// collect_all gathers them, and the averaged gradient updates (w, b) — the same shape of
// computation a data-parallel trainer performs across processes. The program checks that
// the fit recovers w* and b* and exits non-zero if it does not.
//
//   gradwire-quickstart [--steps N] [--shards K] [--lr X]
#include <gradwire/gradwire.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace gradwire;

namespace {

struct Options {
  int steps = 300;
  int shards = 4;
  double lr = 0.1;
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument("missing value after " + arg);
      return argv[++i];
    };
    if (arg == "--steps") {
      o.steps = static_cast<int>(parse_int("--steps", next(), 1, 1000000));
    } else if (arg == "--shards") {
      o.shards = static_cast<int>(parse_int("--shards", next(), 1, 64));
    } else if (arg == "--lr") {
      o.lr = parse_double("--lr", next(), 1e-6, 10.0);
    } else {
      throw InvalidArgument("unknown argument '" + arg +
                            "' (expected --steps N, --shards K, --lr X)");
    }
  }
  return o;
}

// Gradient of mean((X w + b - y)^2) over one shard, as (dL/dw, dL/db), scaled so that
// summing over shards gives the gradient over the whole data set.
std::pair<Tensor, Tensor> shard_gradient(const Tensor& x, const Tensor& y, const Tensor& w,
                                         const Tensor& b, int64_t total_rows) {
  Tensor residual = matmul(x, w) + b - y;  // [n, 1]
  Tensor grad_w = matmul(x.t(), residual) * (2.0 / static_cast<double>(total_rows));
  Tensor grad_b = sum(residual) * (2.0 / static_cast<double>(total_rows));
  return {grad_w, grad_b};
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse_args(argc, argv);
    constexpr int64_t kRows = 4096, kFeatures = 8;
    Generator gen(2024);

    const Tensor true_w = randn({kFeatures, 1}, &gen);
    const double true_b = 0.5;
    const Tensor x = randn({kRows, kFeatures}, &gen);
    const Tensor y = matmul(x, true_w) + true_b + randn({kRows, 1}, &gen) * 0.01;

    std::vector<Tensor> xs = chunk(x, opt.shards, 0);
    std::vector<Tensor> ys = chunk(y, opt.shards, 0);
    auto pool = std::make_shared<ThreadPool>(
        ThreadPoolOptions{.num_threads = opt.shards, .name = "quickstart"});

    Tensor w = zeros({kFeatures, 1});
    Tensor b = zeros({});
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < opt.steps; ++step) {
      std::vector<Future<std::pair<Tensor, Tensor>>> parts;
      for (size_t s = 0; s < xs.size(); ++s) {
        parts.push_back(pool->submit([&, s] { return shard_gradient(xs[s], ys[s], w, b, kRows); }));
      }
      const auto grads = collect_all(parts).get(std::chrono::seconds(30));
      for (const auto& [gw, gb] : grads) {
        w.sub_(gw, opt.lr);
        b.sub_(gb, opt.lr);
      }
      if (step % 50 == 0 || step == opt.steps - 1) {
        const double loss = mean(pow(matmul(x, w) + b - y, 2)).item<double>();
        std::printf("step %4d  loss %.6f\n", step, loss);
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    const double w_error = max(abs(w - true_w)).item<double>();
    const double b_error = std::abs(b.item<double>() - true_b);
    std::printf("fitted in %.3f s on %d shards: max |w - w*| = %.2e, |b - b*| = %.2e\n", seconds,
                opt.shards, w_error, b_error);
    if (opt.steps >= 100 && (w_error > 1e-2 || b_error > 1e-2)) {
      std::fprintf(stderr, "quickstart: the fit did not converge\n");
      return 1;
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "quickstart: %s\n", e.what());
    return 2;
  }
}
