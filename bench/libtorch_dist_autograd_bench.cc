// libtorch/ distributed-autograd figures: dist_autograd.step_ms's step (bench/
// dist_autograd_bench.cc) with LibTorch tensors and a LibTorch parameter, through the bridge's
// distributed autograd (gradwire/torch/dist_autograd.h), against the same step with gradwire
// tensors in the same two rank processes, and against PyTorch 1.13 doing it
// (bench/pytorch/dist_autograd_peer.py), all in the same run. The trainer w0 holds x
// (256x256 float32, requires grad); w1 holds W (256x256 float32, requires grad).
//   libtorch.dist_autograd_step_ms  one step on w0: a dist_autograd::Context; y =
//                          rpc_sync "mm"(x) on w1, which returns x W; loss = sum(y);
//                          backward; x's gradient read; the context released. The torch step
//                          sends an at::Tensor (its history mirrored as it leaves), w1
//                          multiplies by a torch parameter (at::mm), the reply comes back as
//                          a torch tensor with a grad_fn, and gradwire::torch::dist_autograd's
//                          backward and get_gradients run the pass. Baseline: the gradwire
//                          step (ratio_to_gradwire; the bridge's own cost), and PyTorch's
//                          dist_autograd (ratio_to_pytorch).
//   libtorch.dist_optim_step_ms  the same with W's RRef (the torch parameter's twin,
//                          parameter_rref) and a DistributedOptimizer(SGD lr 0.01) step in
//                          the context; baselines as above (gradwire: W as an RRef<Tensor>
//                          made by rref::remote; PyTorch's DistributedOptimizer).
// Every rank process first calls gradwire::torch::use_gradwire_host_memory() (memory.h), as
// libtorch_bench.cc's do. Within a round the kinds alternate in blocks; the rank processes and the
// PyTorch peer run one after the other, kRounds times, and each keeps its best round's median.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/parallel.h"
#include "gradwire/torch/convert.h"
#include "gradwire/torch/dist_autograd.h"
#include "gradwire/torch/memory.h"
#include "gradwire/torch/value_convert.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
namespace da = dist_autograd;
namespace tda = gradwire::torch::dist_autograd;

constexpr int kWorld = 2;
constexpr int kThreads = 1;
constexpr int kPoolThreads = 8;
constexpr int64_t kN = 256;
constexpr double kLr = 0.01;
constexpr int kWarmup = 20;
constexpr int kSteps = 240;
constexpr int kBlocks = 4;
constexpr int kRounds = 3;

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("libtorch dist_autograd bench: " + what);
}

Tensor make_x() {
  Generator gen(1);
  Tensor x = randn({kN, kN}, &gen);
  x.set_requires_grad(true);
  return x;
}
Tensor make_weight() {
  Generator gen(2);
  Tensor w = randn({kN, kN}, &gen);
  w.set_requires_grad(true);
  return w;
}
// The same values as torch tensors (copies: each side owns its leaves).
at::Tensor torch_copy(const Tensor& t) {
  return gradwire::torch::to_torch(t.detach()).clone().requires_grad_(true);
}

// Rank 0's figures: the medians of the four kinds of step.
enum Kind : size_t { kGwAutograd, kTorchAutograd, kGwOptim, kTorchOptim, kCount };

// What w1 holds and serves: W as a gradwire tensor and as a torch tensor (the same values),
// and a torch parameter of its own for the optimizer steps.
struct Served {
  Tensor weight;
  at::Tensor torch_weight;
  at::Tensor torch_param;
};

void define(rpc::Registry& reg, Served& served) {
  reg.def("mm", [&served](const Tensor& x) { return matmul(x, served.weight); });
  reg.def("mm_torch", [&served](const at::Tensor& x) { return at::mm(x, served.torch_weight); });
  reg.def("make_weight", [] { return make_weight(); });
  reg.def("mm_rref",
          [](const rref::RRef<Tensor>& w, const Tensor& x) { return matmul(x, *w.local_value()); });
  // The torch parameter's twin's RRef, for a DistributedOptimizer.
  reg.def("torch_param_rref", [&served](const rpc::CallContext& call) {
    served.torch_param = torch_copy(make_weight());
    return tda::parameter_rref(*call.agent(), served.torch_param);
  });
  reg.def("mm_torch_param",
          [&served](const at::Tensor& x) { return at::mm(x, served.torch_param); });
}

// Rank 0: the four kinds of step, warmed up, checked (both x gradients agree), then timed
// in alternating blocks; their medians in Kind order.
std::vector<double> time_steps(rpc::RpcAgent& agent) {
  std::vector<double> out(kCount);
  const Tensor x = make_x();
  const at::Tensor tx = torch_copy(x);
  {
    rref::RRef<Tensor> w = rref::remote<Tensor>(agent, "w1", "make_weight");
    dist_optim::DistributedOptimizer opt(agent, optim::SGDOptions{.lr = kLr}, {w});
    rref::RRef<Tensor> tw = agent.rpc_sync<rref::RRef<Tensor>>("w1", "torch_param_rref");
    dist_optim::DistributedOptimizer topt(agent, optim::SGDOptions{.lr = kLr}, {tw});
    Tensor g;
    at::Tensor tg;
    auto gw_autograd = [&] {
      da::Context ctx(agent);
      Tensor y = agent.rpc_sync<Tensor>("w1", "mm", x);
      da::backward(agent, ctx.id(), {sum(y)});
      g = da::get_gradients(agent, ctx.id()).at(x);
    };
    auto torch_autograd = [&] {
      da::Context ctx(agent);
      at::Tensor y = agent.rpc_sync<at::Tensor>("w1", "mm_torch", tx);
      tda::backward(agent, ctx.id(), {y.sum()});
      tg = tda::get_gradients(agent, ctx.id()).at(tx);
    };
    auto gw_optim = [&] {
      da::Context ctx(agent);
      Tensor y = agent.rpc_sync<Tensor>("w1", "mm_rref", w, x);
      da::backward(agent, ctx.id(), {sum(y)});
      g = da::get_gradients(agent, ctx.id()).at(x);
      opt.step(ctx.id());
    };
    auto torch_optim = [&] {
      da::Context ctx(agent);
      at::Tensor y = agent.rpc_sync<at::Tensor>("w1", "mm_torch_param", tx);
      tda::backward(agent, ctx.id(), {y.sum()});
      tg = tda::get_gradients(agent, ctx.id()).at(tx);
      topt.step(ctx.id());
    };
    for (int i = 0; i < kWarmup; ++i) {
      gw_autograd();
      torch_autograd();
    }
    // Both sides computed x's gradient, 1 W^T, from the same values.
    expect(allclose(gradwire::torch::from_torch(tg), g, 1e-4, 1e-3),
           "the torch step's gradient of x differs from the gradwire step's");
    for (int i = 0; i < kWarmup; ++i) {
      gw_optim();
      torch_optim();
    }
    std::vector<double> times[kCount];
    const std::function<void()> steps[kCount] = {gw_autograd, torch_autograd, gw_optim,
                                                 torch_optim};
    for (int b = 0; b < kBlocks; ++b) {
      for (size_t k = 0; k < kCount; ++k) {
        for (int i = 0; i < kSteps / kBlocks; ++i)
          times[k].push_back(time_once(steps[k]));
      }
    }
    for (size_t k = 0; k < kCount; ++k)
      out[k] = median(times[k]);
  }
  return out;
}

std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank) {
  set_num_threads(kThreads);
  at::set_num_threads(kThreads);
  // As libtorch_bench.cc's ranks: LibTorch's CPU tensors in gradwire's host memory.
  gradwire::torch::use_gradwire_host_memory();
  Served served;
  if (rank == 1) {
    served.weight = make_weight();
    served.torch_weight = torch_copy(served.weight);
  }
  rpc::Registry reg;
  define(reg, served);
  rpc::AgentOptions options = rank_agent_options(reg);
  options.num_worker_threads = kPoolThreads;
  auto agent = rpc::make_tensorpipe_agent("w" + std::to_string(rank), rank, kWorld, store, options);
  std::vector<double> out(kCount);
  if (rank == 0) {
    out = time_steps(*agent);
    rref::wait_idle(*agent, 60s);
    store->set("rank0_idle", "1");
  } else {
    store->wait({"rank0_idle"}, 120s);
  }
  agent->shutdown();
  return out;
}

// Every round's best: our four kinds (seconds, Kind order) and PyTorch's two steps.
struct Rounds {
  std::vector<double> ours = std::vector<double>(kCount, std::numeric_limits<double>::infinity());
  double theirs_autograd = std::numeric_limits<double>::infinity();
  double theirs_optim = std::numeric_limits<double>::infinity();
  bool have_theirs = true;
  std::string why, version;
};

Rounds run_rounds() {
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  Rounds r;
  const std::string threads = std::to_string(kThreads);
  for (int round = 0; round < kRounds; ++round) {
    const std::vector<double> mine = run_rank_processes(
        server.port(), "libtorch_dist_autograd" + std::to_string(round), kWorld,
        [](std::shared_ptr<c10d::Store> store, int rank) {
          return rank_body(std::move(store), rank);
        },
        "libtorch dist_autograd");
    expect(mine.size() == kCount, "the ranks returned " + std::to_string(mine.size()) + " figures");
    for (size_t k = 0; k < kCount; ++k)
      r.ours[k] = std::min(r.ours[k], mine[k]);
    if (!r.have_theirs) continue;
    // What dist_autograd_peer.py prints: the autograd step, the optimizer step, a plain call.
    auto peer =
        run_pytorch_peer("dist_autograd_peer.py",
                         threads + " " + std::to_string(kWarmup) + " " + std::to_string(kSteps) +
                             " " + std::to_string(kBlocks) + " " + std::to_string(kN),
                         "OMP_NUM_THREADS=" + threads + " OPENBLAS_NUM_THREADS=" + threads, r.why);
    if (peer && peer->seconds.size() < 2) {
      r.why = "the peer printed " + std::to_string(peer->seconds.size()) + " figures";
      peer.reset();
    }
    if (!peer) {
      r.have_theirs = false;
      continue;
    }
    r.version = peer->torch_version;
    r.theirs_autograd = std::min(r.theirs_autograd, peer->seconds[0]);
    r.theirs_optim = std::min(r.theirs_optim, peer->seconds[1]);
  }
  return r;
}

// One figure: kind `torch_k` against kind `gw_k` and PyTorch's `theirs` seconds.
Figure make_figure(const Rounds& r, const std::string& metric, size_t torch_k, size_t gw_k,
                   double theirs, const std::string& step, const std::string& pytorch_what) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Figure f{metric, r.ours[torch_k] * 1e3, "ms", {}};
  f.params.push_back({"step", step});
  f.params.push_back({"shape",
                      "x 256x256 float32 (requires grad) on the trainer w0, W 256x256 float32 "
                      "(requires grad) on w1, y = x W"});
  f.params.push_back({"workers", "2 processes on 127.0.0.1 (TensorPipe agent, 8 pool threads)"});
  f.params.push_back({"threads_per_process", double(kThreads)});
  f.params.push_back({"statistic", "median of " + std::to_string(kSteps) + " steps (in " +
                                       std::to_string(kBlocks) +
                                       " blocks alternating with the other kinds) after " +
                                       std::to_string(kWarmup) + " warm-up, best of " +
                                       std::to_string(kRounds) + " rounds"});
  f.params.push_back({"gradwire_ms", r.ours[gw_k] * 1e3});
  f.params.push_back({"gradwire",
                      "the same step with gradwire tensors (dist_autograd.step_ms's or "
                      "dist_optim.step_ms's), same processes, same run"});
  f.params.push_back({"ratio_to_gradwire", r.ours[torch_k] / r.ours[gw_k]});
  f.params.push_back({"target_ratio_to_gradwire_max", 1.1});
  if (r.have_theirs) {
    f.params.push_back({"pytorch", "torch " + r.version + " " + pytorch_what});
    f.params.push_back({"pytorch_ms", theirs * 1e3});
    f.params.push_back({"ratio_to_pytorch", r.ours[torch_k] / theirs});
  } else {
    f.params.push_back({"pytorch", "unavailable"});
    f.params.push_back({"pytorch_reason", r.why});
    f.params.push_back({"pytorch_ms", nan});
    f.params.push_back({"ratio_to_pytorch", nan});
  }
  return f;
}

void measure(const std::function<void(const Figure&)>& emit) {
  const Rounds r = run_rounds();
  emit(make_figure(r, "libtorch.dist_autograd_step_ms", kTorchAutograd, kGwAutograd,
                   r.theirs_autograd,
                   "dist_autograd::Context; y = rpc_sync<at::Tensor>(\"w1\", \"mm_torch\", x) = "
                   "at::mm(x, W) on w1; gradwire::torch::dist_autograd::backward(sum(y)); "
                   "get_gradients(x); context released",
                   "dist_autograd.context + rpc_sync(mm) + backward + get_gradients, TensorPipe "
                   "agent"));
  emit(make_figure(r, "libtorch.dist_optim_step_ms", kTorchOptim, kGwOptim, r.theirs_optim,
                   "as libtorch.dist_autograd_step_ms with W a torch parameter on w1, plus "
                   "DistributedOptimizer(SGD lr 0.01).step(ctx) over parameter_rref(W)",
                   "dist_autograd + DistributedOptimizer(optim.SGD, [W_rref], lr=0.01), "
                   "TensorPipe agent"));
}

const Register libtorch_dist_autograd_bench({"libtorch.dist_autograd_step_ms",
                                             "libtorch.dist_optim_step_ms"},
                                            [](const auto& emit) { measure(emit); });

}  // namespace
}  // namespace gradwire::bench
