// Data-parallel training of a LibTorch model with gradwire: a torch::nn::Sequential MLP
// (float32) wrapped in gradwire::torch::DistributedDataParallel, one replica per rank,
// trained with LibTorch's Adam on a three-arm spiral, each rank on its share of every epoch.
//
// The ranks are processes started by gradwire-run (or torchrun, mpirun, srun: anything
// c10d::rendezvous("env://") reads), which meet through the launcher's store and make a
// process group over it (--backend cpu: shared memory between ranks of one host, Gloo
// across hosts; or shm, or gloo). Each rank initialises its model from its own seed; the
// wrapper broadcasts rank 0's parameters at construction, so the replicas start equal.
//
// Every rank generates the same data from --seed: points on three spiral arms, labelled by
// arm, a training set and a held-out set. Each epoch, every rank draws the same permutation
// of the training set (seeded by --seed and the epoch) and takes every world-th index from
// its rank on, the permutation padded with its first indices to a multiple of the world
// size (as torch.utils.data.DistributedSampler splits): the ranks hold disjoint shares of
// equal length, so they run the same number of steps. After each backward pass every
// parameter's grad() holds the ranks' average, and each rank's Adam step keeps the replicas
// equal.
//
// Rank 0 prints one line per epoch (the mean training loss over all ranks, the held-out
// accuracy) and a final line. At the end the ranks gather a checksum of their parameters
// (float64, each parameter weighted by its position) and every rank checks that all are
// equal to its own. The program exits 1 when a rank's parameters differ or the held-out
// accuracy is below --min-accuracy, and on any error (named on stderr).
//
//   gradwire-run --nproc-per-node 2 gradwire-ddp-train-torch [--epochs N] [--batch-size B]
//       [--lr LR] [--hidden H] [--seed S] [--min-accuracy A] [--backend cpu|shm|gloo]
#include <gradwire/c10d/prefix_store.h>
#include <gradwire/c10d/process_group.h>
#include <gradwire/c10d/rendezvous.h>
#include <gradwire/torch/collectives.h>
#include <gradwire/torch/ddp.h>
#include <gradwire/torch/memory.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../common/args.h"

namespace {

namespace c10d = gradwire::c10d;
using namespace std::chrono_literals;

struct Options {
  int epochs = 30;
  int64_t batch_size = 32;  // per rank
  double lr = 0.01;
  int64_t hidden = 64;
  uint64_t seed = 7;
  double min_accuracy = 0.85;
  std::string backend = "cpu";
};

Options parse_args(int argc, char** argv) {
  Options o;
  gradwire::examples::Args args(argc, argv,
                                "--epochs N, --batch-size B, --lr LR, --hidden H, --seed S, "
                                "--min-accuracy A, --backend cpu|shm|gloo");
  while (args.next()) {
    if (args.is("--epochs")) {
      o.epochs = static_cast<int>(args.integer(1, 100000));
    } else if (args.is("--batch-size")) {
      o.batch_size = args.integer(1, 1 << 20);
    } else if (args.is("--lr")) {
      o.lr = args.number(1e-9, 10.0);
    } else if (args.is("--hidden")) {
      o.hidden = args.integer(1, 1 << 16);
    } else if (args.is("--seed")) {
      o.seed = static_cast<uint64_t>(args.integer(0, INT64_MAX));
    } else if (args.is("--min-accuracy")) {
      o.min_accuracy = args.number(0.0, 1.0);
    } else if (args.is("--backend")) {
      o.backend = args.one_of({"cpu", "shm", "gloo"});
    } else {
      args.unknown();
    }
  }
  return o;
}

// `per_class` points on each of three spiral arms with angular noise: x float32
// [3 * per_class, 2], y int64 (the arm).
std::pair<torch::Tensor, torch::Tensor> spiral(int64_t per_class) {
  const torch::Tensor t = torch::linspace(0.0, 1.0, per_class);
  std::vector<torch::Tensor> xs, ys;
  for (int64_t arm = 0; arm < 3; ++arm) {
    const torch::Tensor r = 0.05 + 0.95 * t;
    const torch::Tensor theta =
        4.0 * (static_cast<double>(arm) + t) + 0.2 * torch::randn({per_class});
    xs.push_back(torch::stack({r * torch::sin(theta), r * torch::cos(theta)}, 1));
    ys.push_back(torch::full({per_class}, arm, torch::kInt64));
  }
  return {torch::cat(xs), torch::cat(ys)};
}

// This rank's share of epoch `epoch`: the same permutation on every rank, padded with its
// first indices to a multiple of `world`, every world-th index from `rank` on.
torch::Tensor shard_indices(int64_t n, int epoch, int rank, int world, uint64_t seed) {
  torch::manual_seed(seed * 1000003 + static_cast<uint64_t>(epoch));
  torch::Tensor perm = torch::randperm(n);
  const int64_t padded = (n + world - 1) / world * world;
  if (padded > n) perm = torch::cat({perm, perm.slice(0, 0, padded - n)});
  return perm.slice(0, rank, padded, world);
}

double accuracy(torch::nn::Sequential& net, const torch::Tensor& x, const torch::Tensor& y) {
  torch::NoGradGuard no_grad;
  return net->forward(x).argmax(1).eq(y).to(torch::kFloat64).mean().item<double>();
}

// The sum over all parameters of (position + 1) * sum(parameter), in float64.
torch::Tensor parameter_checksum(torch::nn::Module& net) {
  torch::NoGradGuard no_grad;
  torch::Tensor sum = torch::zeros({1}, torch::kFloat64);
  double position = 1.0;
  for (const torch::Tensor& p : net.parameters())
    sum += position++ * p.to(torch::kFloat64).sum();
  return sum;
}

// One epoch over this rank's share; returns the sum of the batch losses and their count,
// summed over all ranks.
std::pair<double, double> train_epoch(gradwire::torch::DistributedDataParallel& model,
                                      torch::optim::Optimizer& opt, c10d::ProcessGroup& group,
                                      const torch::Tensor& x, const torch::Tensor& y,
                                      const torch::Tensor& indices, int64_t batch_size) {
  double loss_sum = 0, batches = 0;
  for (int64_t begin = 0; begin < indices.size(0); begin += batch_size) {
    const torch::Tensor batch = indices.slice(0, begin, begin + batch_size);
    // The gradients reset to none rather than zeroed (LibTorch 1.13's zero_grad()): the
    // backward then makes each grad() without accumulating into zeros.
    for (auto& group : opt.param_groups())
      for (torch::Tensor& p : group.params())
        p.mutable_grad().reset();
    const torch::Tensor loss = torch::nn::functional::cross_entropy(
        model.forward(x.index_select(0, batch)), y.index_select(0, batch));
    loss.backward();  // every parameter's grad() is now the ranks' average
    opt.step();
    loss_sum += loss.item<double>();
    batches += 1;
  }
  const torch::Tensor sums = torch::tensor({loss_sum, batches}, torch::kFloat64);
  gradwire::torch::all_reduce(group, sums).wait();
  return {sums[0].item<double>(), sums[1].item<double>()};
}

// Whether every rank's parameters equal this rank's, by their checksums.
bool replicas_equal(torch::nn::Module& net, c10d::ProcessGroup& group, int world,
                    double& checksum) {
  const torch::Tensor mine = parameter_checksum(net);
  std::vector<torch::Tensor> all;
  for (int r = 0; r < world; ++r)
    all.push_back(torch::zeros({1}, torch::kFloat64));
  gradwire::torch::all_gather(group, all, mine).wait();
  checksum = mine.item<double>();
  bool equal = true;
  for (int r = 0; r < world; ++r) {
    if (!torch::equal(all[static_cast<size_t>(r)], mine)) {
      std::fprintf(stderr,
                   "ddp_train_torch: rank %d's parameter checksum %.17g differs from %.17g\n", r,
                   all[static_cast<size_t>(r)].item<double>(), checksum);
      equal = false;
    }
  }
  return equal;
}

int run(const Options& opt) {
  auto [store, rank, world] = c10d::rendezvous("env://", 60s);
  torch::set_num_threads(1);  // the ranks share this host's cores
  auto group = c10d::make_process_group(
      opt.backend, std::make_shared<c10d::PrefixStore>("ddp_train_torch", store), rank, world,
      {.timeout = 60s, .name = "ddp-train-torch"});

  torch::manual_seed(opt.seed);  // the same data on every rank
  auto [train_x, train_y] = spiral(300);
  auto [test_x, test_y] = spiral(100);

  torch::manual_seed(opt.seed + 1 + static_cast<uint64_t>(rank));  // replicas start apart
  torch::nn::Sequential net(torch::nn::Linear(2, opt.hidden), torch::nn::ReLU(),
                            torch::nn::Linear(opt.hidden, opt.hidden), torch::nn::ReLU(),
                            torch::nn::Linear(opt.hidden, 3));
  // Checks the replicas' parameters across ranks and broadcasts rank 0's.
  gradwire::torch::DistributedDataParallel model(net, group);
  torch::optim::Adam opt_adam(net->parameters(), torch::optim::AdamOptions(opt.lr));

  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < opt.epochs; ++epoch) {
    const torch::Tensor indices = shard_indices(train_x.size(0), epoch, rank, world, opt.seed);
    auto [loss_sum, batches] =
        train_epoch(model, opt_adam, *group, train_x, train_y, indices, opt.batch_size);
    if (rank == 0) {
      std::printf("epoch %3d  loss %.4f  held-out accuracy %.3f\n", epoch + 1, loss_sum / batches,
                  accuracy(net, test_x, test_y));
      std::fflush(stdout);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  double checksum = 0;
  const bool equal = replicas_equal(*net, *group, world, checksum);
  const double test_accuracy = accuracy(net, test_x, test_y);
  if (rank == 0) {
    std::printf(
        "trained %d epochs on %d ranks (%s group) in %.2f s: held-out accuracy %.3f; parameter "
        "checksum %.17g %s\n",
        opt.epochs, world, std::string(group->backend_name()).c_str(), seconds, test_accuracy,
        checksum, equal ? "on every rank" : "NOT on every rank");
  }
  if (!equal) return 1;
  if (test_accuracy < opt.min_accuracy) {
    std::fprintf(stderr, "ddp_train_torch rank %d: held-out accuracy %.3f is below %.3f\n", rank,
                 test_accuracy, opt.min_accuracy);
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // LibTorch's CPU tensors in gradwire's host memory, before any tensor is made: the
    // gradients of every backward reuse kept blocks instead of refaulting trimmed heap pages.
    gradwire::torch::use_gradwire_host_memory();
    return run(parse_args(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddp_train_torch: %s\n", e.what());
    return 1;
  }
}
