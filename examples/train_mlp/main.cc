// Train an MLP classifier on a three-arm spiral, data-parallel over threads.
//
// Every step, the batch is split into shards; each shard's forward and backward pass runs
// as a task on a thread pool, all against the same parameters. Each shard's loss is scaled
// by its share of the batch, so the gradients the concurrent backward passes accumulate
// into .grad add up to exactly the full-batch gradient — what a data-parallel trainer's
// all-reduce produces across processes. Adam then updates the parameters. At the end the
// program reports held-out accuracy, saves the model, loads it into a fresh network and
// checks that both give identical outputs; it exits non-zero when accuracy or the round
// trip falls short.
//
//   gradwire-train-mlp [--steps N] [--shards K] [--save PATH]
#include <gradwire/gradwire.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

using namespace gradwire;

namespace {

struct Options {
  int steps = 400;
  int shards = 4;
  std::string save_path = "spiral_model.gw";
};

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw InvalidArgument("missing value after " + arg);
      return argv[++i];
    };
    if (arg == "--steps") {
      o.steps = static_cast<int>(parse_int("--steps", next(), 1, 1000000));
    } else if (arg == "--shards") {
      o.shards = static_cast<int>(parse_int("--shards", next(), 1, 64));
    } else if (arg == "--save") {
      o.save_path = next();
    } else {
      throw InvalidArgument("unknown argument '" + arg +
                            "' (expected --steps N, --shards K, --save PATH)");
    }
  }
  return o;
}

// `per_class` points on each of three spiral arms, with angular noise.
std::pair<Tensor, Tensor> spiral(int64_t per_class, Generator& gen) {
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

double accuracy(nn::Module& net, const Tensor& x, const Tensor& y) {
  autograd::NoGradGuard no_grad;
  auto [best, predicted] = max(dynamic_cast<nn::UnaryModule&>(net).forward(x), 1);
  return mean(eq(predicted, y).to(kFloat32)).item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opt = parse_args(argc, argv);
    Generator gen(7);
    auto [train_x, train_y] = spiral(300, gen);
    auto [test_x, test_y] = spiral(100, gen);

    nn::MLP net(nn::MLPOptions{.sizes = {2, 64, 64, 3}, .generator = &gen});
    optim::Adam adam(net.parameters(), optim::AdamOptions{.lr = 0.01});
    auto pool = std::make_shared<ThreadPool>(
        ThreadPoolOptions{.num_threads = opt.shards, .name = "train-mlp"});

    const std::vector<Tensor> xs = chunk(train_x, opt.shards), ys = chunk(train_y, opt.shards);
    const double total = static_cast<double>(train_x.size(0));
    const auto start = std::chrono::steady_clock::now();
    for (int step = 0; step < opt.steps; ++step) {
      adam.zero_grad();
      std::vector<Future<double>> losses;
      for (size_t s = 0; s < xs.size(); ++s) {
        losses.push_back(pool->submit([&, s] {
          // mean over the shard x (shard size / batch size) = this shard's part of the mean.
          Tensor loss = nn::cross_entropy(net(xs[s]), ys[s]) * (xs[s].size(0) / total);
          loss.backward();
          return loss.item<double>();
        }));
      }
      double loss = 0;
      for (double part : collect_all(losses).get(std::chrono::seconds(60)))
        loss += part;
      adam.step();
      if (step % 100 == 0 || step == opt.steps - 1) {
        std::printf("step %4d  loss %.4f  train accuracy %.3f\n", step, loss,
                    accuracy(net, train_x, train_y));
      }
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double test_accuracy = accuracy(net, test_x, test_y);
    std::printf("trained %d steps on %d shards in %.2f s; held-out accuracy %.3f\n", opt.steps,
                opt.shards, seconds, test_accuracy);

    nn::save(net, opt.save_path);
    Generator other(99);
    nn::MLP reloaded(nn::MLPOptions{.sizes = {2, 64, 64, 3}, .generator = &other});
    nn::load(reloaded, opt.save_path);
    autograd::NoGradGuard no_grad;
    const bool same = equal(net(test_x), reloaded(test_x));
    std::printf("saved to %s and reloaded: outputs %s\n", opt.save_path.c_str(),
                same ? "identical" : "DIFFER");
    if (!same) return 1;
    if (opt.steps >= 300 && test_accuracy < 0.9) {
      std::fprintf(stderr, "train-mlp: held-out accuracy %.3f is below 0.9\n", test_accuracy);
      return 1;
    }
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "train-mlp: %s\n", e.what());
    return 2;
  }
}
