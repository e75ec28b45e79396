// Parameter-server training of a LibTorch model with gradwire: a torch::nn::Sequential with a
// Conv2d, held by one server process and trained by the others through rpc, with
// gradwire::torch's distributed autograd and a DistributedOptimizer (PyTorch's RPC
// parameter-server pattern, in C++).
//
// Rank 0 is the server "ps": it builds the model (Conv2d(1, 8, 3, padding 1), ReLU,
// MaxPool2d(2), Flatten, Linear(128, 4)) and serves three functions: "forward" (the model on
// a batch), "parameters" (an RRef to each parameter's gradwire twin,
// gradwire::torch::dist_autograd::parameter_rrefs) and "trained" (below). Every other rank is a
// trainer "trainer<rank>". Each trainer makes a DistributedOptimizer over the server's parameters
// (one optimizer per trainer on the server, as PyTorch's DistributedOptimizer does), and
// for each batch:
//
//   gradwire::dist_autograd::Context ctx(agent);
//   at::Tensor logits = agent.rpc_sync<at::Tensor>("ps", "forward", images);   // recorded
//   at::Tensor loss = cross_entropy(logits, labels);
//   gradwire::torch::dist_autograd::backward(agent, ctx.id(), {loss});  // into the server
//   optimizer.step(ctx.id());                                   // the server's parameters
//
// The trainers update the one model concurrently without locks (Hogwild-style, as PyTorch's
// parameter-server tutorial does): a forward on the server may read a parameter while another
// trainer's step writes it.
//
// The data: 8x8 single-channel images of four shapes (a horizontal bar, a vertical bar, a
// diagonal, a hollow 3x3 square) at random places, with Gaussian noise; each trainer draws
// its own training images from --seed and its rank, and every trainer the same held-out set.
// Each trainer prints its mean loss per epoch; when every trainer has finished (the server's
// "trained" answers each trainer once all have called it), each prints the held-out accuracy
// of the server's model (asked for outside any context: nothing is recorded). A trainer lost
// before its "trained" call leaves the others' calls to fail at the agent's rpc timeout,
// naming the server. The program exits 1 when a trainer's accuracy is below --min-accuracy,
// and on any error (named on stderr).
//
//   gradwire-run --nproc-per-node 3 gradwire-ps-train-torch [--epochs N] [--batch-size B]
//       [--samples N] [--lr LR] [--optimizer sgd|adam] [--seed S] [--min-accuracy A]
#include <gradwire/core/env.h>
#include <gradwire/dist_autograd/dist_autograd.h>
#include <gradwire/dist_optim/distributed_optimizer.h>
#include <gradwire/optim/optim.h>
#include <gradwire/rpc/rpc.h>
#include <gradwire/torch/dist_autograd.h>
#include <gradwire/torch/memory.h>
#include <gradwire/torch/value_convert.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "../common/args.h"

namespace {

namespace rpc = gradwire::rpc;
namespace tda = gradwire::torch::dist_autograd;
using gradwire::rref::RRef;

struct Options {
  int epochs = 10;
  int64_t batch_size = 32;
  int64_t samples = 640;  // training images per trainer
  double lr = 0.02;
  std::string optimizer = "adam";
  uint64_t seed = 5;
  double min_accuracy = 0.85;
};

Options parse_args(int argc, char** argv) {
  Options o;
  gradwire::examples::Args args(argc, argv,
                                "--epochs N, --batch-size B, --samples N, --lr LR, "
                                "--optimizer sgd|adam, --seed S, --min-accuracy A");
  while (args.next()) {
    if (args.is("--epochs")) {
      o.epochs = static_cast<int>(args.integer(1, 100000));
    } else if (args.is("--batch-size")) {
      o.batch_size = args.integer(1, 1 << 20);
    } else if (args.is("--samples")) {
      o.samples = args.integer(1, 1 << 24);
    } else if (args.is("--lr")) {
      o.lr = args.number(1e-9, 10.0);
    } else if (args.is("--optimizer")) {
      o.optimizer = args.one_of({"sgd", "adam"});
    } else if (args.is("--seed")) {
      o.seed = static_cast<uint64_t>(args.integer(0, INT64_MAX));
    } else if (args.is("--min-accuracy")) {
      o.min_accuracy = args.number(0.0, 1.0);
    } else {
      args.unknown();
    }
  }
  return o;
}

constexpr int64_t kClasses = 4;

// `n` noisy 8x8 images of the four shapes, drawn from `seed`: x float32 [n, 1, 8, 8], y int64.
std::pair<torch::Tensor, torch::Tensor> shapes(int64_t n, uint64_t seed) {
  torch::manual_seed(seed);
  torch::Tensor x = 0.3 * torch::randn({n, 1, 8, 8});
  torch::Tensor y = torch::randint(0, kClasses, {n}, torch::kInt64);
  const torch::Tensor place = torch::randint(0, 6, {n, 2}, torch::kInt64);
  auto img = x.accessor<float, 4>();
  auto cls = y.accessor<int64_t, 1>();
  auto at = place.accessor<int64_t, 2>();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = at[i][0], c = at[i][1];
    switch (cls[i]) {
      case 0:  // a horizontal bar of 3
        for (int64_t k = 0; k < 3; ++k)
          img[i][0][r + 1][c + k] += 1.0f;
        break;
      case 1:  // a vertical bar of 3
        for (int64_t k = 0; k < 3; ++k)
          img[i][0][r + k][c + 1] += 1.0f;
        break;
      case 2:  // a diagonal of 3
        for (int64_t k = 0; k < 3; ++k)
          img[i][0][r + k][c + k] += 1.0f;
        break;
      default:  // a hollow 3x3 square
        for (int64_t a = 0; a < 3; ++a)
          for (int64_t b = 0; b < 3; ++b)
            if (a != 1 || b != 1) img[i][0][r + a][c + b] += 1.0f;
        break;
    }
  }
  return {x, y};
}

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 3).padding(1)),
                               torch::nn::ReLU(),
                               torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2)),
                               torch::nn::Flatten(), torch::nn::Linear(8 * 4 * 4, kClasses));
}

// The server: the model, its functions, and a count of the forwards served.
int serve(int world) {
  torch::manual_seed(1);
  torch::nn::Sequential model = make_model();
  std::atomic<int64_t> forwards{0};
  // "trained": each trainer's call is answered once every trainer has called it.
  std::mutex mutex;
  std::vector<gradwire::Future<bool>> finished;
  rpc::registry().def("trained", [&mutex, &finished, world] {
    gradwire::Future<bool> mine;
    std::vector<gradwire::Future<bool>> all;
    {
      std::lock_guard<std::mutex> lock(mutex);
      finished.push_back(mine);
      if (static_cast<int>(finished.size()) == world - 1) all.swap(finished);
    }
    for (gradwire::Future<bool>& f : all)
      f.set_value(true);
    return mine;
  });
  rpc::registry().def("forward", [&model, &forwards](const at::Tensor& x) {
    forwards.fetch_add(1, std::memory_order_relaxed);
    return model->forward(x);
  });
  rpc::registry().def("parameters", [&model](const rpc::CallContext& call) {
    return tda::parameter_rrefs(*call.agent(), *model);
  });
  rpc::init_rpc("ps", 0, world);
  std::printf("ps: serving a %zu-parameter LibTorch model to %d trainer(s)\n",
              model->parameters().size(), world - 1);
  std::fflush(stdout);
  rpc::shutdown();  // waits for every trainer to finish
  std::printf("ps: served %lld forward calls\n", static_cast<long long>(forwards.load()));
  return 0;
}

std::unique_ptr<gradwire::dist_optim::DistributedOptimizer> make_optimizer(
    rpc::RpcAgent& agent, const Options& o, std::vector<RRef<gradwire::Tensor>> params) {
  if (o.optimizer == "sgd") {
    return std::make_unique<gradwire::dist_optim::DistributedOptimizer>(
        agent, gradwire::optim::SGDOptions{.lr = o.lr, .momentum = 0.9}, std::move(params));
  }
  return std::make_unique<gradwire::dist_optim::DistributedOptimizer>(
      agent, gradwire::optim::AdamOptions{.lr = o.lr}, std::move(params));
}

int train(const Options& o, int rank, int world) {
  const std::string name = "trainer" + std::to_string(rank);
  auto agent = rpc::init_rpc(name, rank, world);
  auto [train_x, train_y] = shapes(o.samples, o.seed * 7919 + static_cast<uint64_t>(rank));
  auto [test_x, test_y] = shapes(400, o.seed * 7919 + 100003);
  auto params = agent->rpc_sync<std::vector<RRef<gradwire::Tensor>>>("ps", "parameters");
  auto optimizer = make_optimizer(*agent, o, std::move(params));
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    torch::manual_seed(o.seed * 1000003 + static_cast<uint64_t>(epoch * world + rank));
    const torch::Tensor order = torch::randperm(o.samples);
    double loss_sum = 0;
    int64_t batches = 0;
    for (int64_t begin = 0; begin < o.samples; begin += o.batch_size) {
      const torch::Tensor idx = order.slice(0, begin, begin + o.batch_size);
      gradwire::dist_autograd::Context ctx(*agent);
      const at::Tensor logits =
          agent->rpc_sync<at::Tensor>("ps", "forward", train_x.index_select(0, idx));
      const at::Tensor loss =
          torch::nn::functional::cross_entropy(logits, train_y.index_select(0, idx));
      tda::backward(*agent, ctx.id(), {loss});
      optimizer->step(ctx.id());
      loss_sum += loss.item<double>();
      ++batches;
    }
    std::printf("%s: epoch %d  loss %.4f\n", name.c_str(), epoch + 1, loss_sum / batches);
    std::fflush(stdout);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The model is done once every trainer is.
  agent->rpc_sync<bool>("ps", "trained");
  // Outside a context: nothing is recorded, the server only runs its model.
  const at::Tensor logits = agent->rpc_sync<at::Tensor>("ps", "forward", test_x);
  const double accuracy = logits.argmax(1).eq(test_y).to(torch::kFloat64).mean().item<double>();
  std::printf("%s: trained %d epochs (%lld steps) in %.2f s; held-out accuracy %.3f\n",
              name.c_str(), o.epochs,
              static_cast<long long>(o.epochs * ((o.samples + o.batch_size - 1) / o.batch_size)),
              seconds, accuracy);
  std::fflush(stdout);
  optimizer.reset();
  agent.reset();
  rpc::shutdown();
  if (accuracy < o.min_accuracy) {
    std::fprintf(stderr, "%s: held-out accuracy %.3f is below %.3f\n", name.c_str(), accuracy,
                 o.min_accuracy);
    return 1;
  }
  return 0;
}

int env_int(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    throw gradwire::InvalidArgument(std::string(name) +
                                    " is not set: start this program with gradwire-run");
  }
  return static_cast<int>(gradwire::parse_int(name, v, 0, 1 << 20));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    // LibTorch's CPU tensors in gradwire's host memory, before any tensor is made: batches
    // and gradients of 64 KiB and more reuse kept blocks (memory.h).
    gradwire::torch::use_gradwire_host_memory();
    const Options o = parse_args(argc, argv);
    torch::set_num_threads(1);  // the processes share this host's cores
    const int rank = env_int("RANK");
    const int world = env_int("WORLD_SIZE");
    if (world < 2)
      throw gradwire::InvalidArgument("WORLD_SIZE must be at least 2 (a server and a trainer)");
    return rank == 0 ? serve(world) : train(o, rank, world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ps_train_torch: %s\n", e.what());
    return 1;
  }
}
