// One rank of a data-parallel job, for the multinode tests: started by gradwire-run on each
// node of the test bed, it meets the others through env:// (rank 0's TCPStore), forms a Gloo
// group with them (its address chosen by the library's defaults, so the group spans the
// nodes only if each rank advertises an address its peers can reach), and trains a small
// float64 MLP with DistributedDataParallel on its own share of every batch.
//
//   gradwire-run ... multinode_ddp_worker [--steps N]
//
// Every rank starts from different parameters (DDP's first broadcast makes them equal) and
// checks, after N SGD steps, that
//   - every rank holds the same parameters (an all_gather of each rank's flattened copy), and
//   - they equal, within 1e-9, N steps of single-process training on the concatenation of
//     every rank's batch, computed here from the same deterministic data.
// It prints one line saying so and exits 0, or names what differed on stderr and exits 1
// (2 for a bad command line or environment, with the reason).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gradwire/autograd/grad_mode.h>
#include <gradwire/c10d/process_group_gloo.h>
#include <gradwire/c10d/rendezvous.h>
#include <gradwire/core/env.h>
#include <gradwire/core/error.h>
#include <gradwire/ddp/ddp.h>
#include <gradwire/nn/nn.h>
#include <gradwire/tensor/factory.h>
#include <gradwire/tensor/ops.h>

namespace {

using namespace gradwire;
using namespace std::chrono_literals;

constexpr int64_t kIn = 6;
constexpr int64_t kHidden = 16;
constexpr int64_t kOut = 3;
constexpr int64_t kRowsPerRank = 8;
constexpr double kLr = 0.05;
constexpr double kTolerance = 1e-9;

struct Batch {
  Tensor x;
  Tensor y;
};

// Rank `rank`'s batch at `step`: the same values on whichever rank computes it.
Batch batch(int rank, int step) {
  Generator gen(5000 + 131 * static_cast<uint64_t>(rank) + 7 * static_cast<uint64_t>(step));
  return {randn({kRowsPerRank, kIn}, &gen, kFloat64), randn({kRowsPerRank, kOut}, &gen, kFloat64)};
}

std::shared_ptr<nn::MLP> make_mlp(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<nn::MLP>(
      nn::MLPOptions{.sizes = {kIn, kHidden, kOut}, .dtype = kFloat64, .generator = &gen});
}

void sgd_step(const std::vector<Tensor>& params) {
  autograd::NoGradGuard no_grad;
  for (const Tensor& p : params) {
    Tensor q = p;
    q.sub_(p.grad(), Scalar(kLr));
    q.set_grad(Tensor());
  }
}

// Every parameter, flattened into one float64 vector.
Tensor flatten(const std::vector<Tensor>& params) {
  std::vector<Tensor> parts;
  for (const Tensor& p : params)
    parts.push_back(p.detach().reshape({-1}));
  return cat(parts);
}

// `steps` steps of one model on every rank's batches at once: what DDP must reproduce (the
// mean over the concatenation is the mean of the ranks' means, the batches being equal in
// size).
Tensor single_process(int world, int steps) {
  auto net = make_mlp(11);
  for (int s = 0; s < steps; ++s) {
    std::vector<Tensor> xs;
    std::vector<Tensor> ys;
    for (int r = 0; r < world; ++r) {
      Batch b = batch(r, s);
      xs.push_back(b.x);
      ys.push_back(b.y);
    }
    nn::mse_loss(net->forward(cat(xs)), cat(ys)).backward();
    sgd_step(net->parameters());
  }
  return flatten(net->parameters());
}

int steps_from(int argc, char** argv) {
  int steps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--steps" && i + 1 < argc) {
      steps = static_cast<int>(parse_int("--steps", argv[++i], 1, 100000));
    } else {
      throw InvalidArgument("unknown argument '" + flag + "' (expected --steps N)");
    }
  }
  return steps;
}

int run(int steps) {
  auto [store, rank, world] = c10d::rendezvous("env://", 60s);
  auto group =
      c10d::ProcessGroupGloo::create(store, rank, world, {.timeout = 60s, .name = "multinode-ddp"});
  // Different initial parameters on every rank but 0: the constructor's broadcast must
  // replace them with rank 0's (the reference's seed).
  auto net = make_mlp(rank == 0 ? 11 : 1000 + static_cast<uint64_t>(rank));
  ddp::DistributedDataParallel model(net, group,
                                     {.bucket_cap_mb = 0.001, .first_bucket_mb = 0.001});
  for (int s = 0; s < steps; ++s) {
    Batch b = batch(rank, s);
    nn::mse_loss(model.forward(b.x), b.y).backward();
    sgd_step(net->parameters());
  }
  const Tensor mine = flatten(net->parameters());
  std::vector<Tensor> all;
  for (int r = 0; r < world; ++r)
    all.push_back(zeros({mine.size(0)}, kFloat64));
  group->all_gather(all, mine).wait();
  int status = 0;
  for (int r = 0; r < world; ++r) {
    if (!equal(all[static_cast<size_t>(r)], mine)) {
      std::fprintf(stderr, "ddp rank %d: rank %d's parameters differ from this rank's\n", rank, r);
      status = 1;
    }
  }
  const double diff = max(abs(sub(mine, single_process(world, steps)))).item<double>();
  if (!(diff <= kTolerance)) {
    std::fprintf(stderr,
                 "ddp rank %d: parameters differ from single-process training by %.3g (> %.0e)\n",
                 rank, diff, kTolerance);
    status = 1;
  }
  if (status == 0) {
    std::printf(
        "ddp rank %d of %d: %d steps; replicas identical on all ranks; equal to single-process "
        "training on the whole batch (largest difference %.2g)\n",
        rank, world, steps, diff);
  }
  std::fflush(stdout);
  // Nobody leaves before everyone has compared (the group's peers may still read from us).
  group->barrier().wait();
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 0;
  try {
    steps = steps_from(argc, argv);
  } catch (const gradwire::Error& e) {
    std::fprintf(stderr, "multinode_ddp_worker: %s\n", e.what());
    return 2;
  }
  try {
    return run(steps);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "multinode_ddp_worker: %s\n", e.what());
    return 1;
  }
}
