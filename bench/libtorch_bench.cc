// libtorch/ figures: the LibTorch bridge (gradwire::torch; built only where the bridge is).
// Ranks and workers are processes on this machine meeting through a TCPStore served here
// (ranks.h); every process uses kThreads intra-op thread (at::set_num_threads and
// gradwire::set_num_threads), as the ddp/ figures do, and first calls
// gradwire::torch::use_gradwire_host_memory() (memory.h), as docs/libtorch.md tells a LibTorch
// program to: LibTorch's CPU tensors of 64 KiB and more then come from gradwire's host block
// cache. Diagnostics measure the same steps with LibTorch's default allocator.
//
//   libtorch.ddp_step_ms    one data-parallel step of a LibTorch 784-1024-1024-1024-10 ReLU
//                           MLP (torch::nn::Sequential of Linear/ReLU, float32, batch 64 per
//                           rank): gradients reset to none (grads_to_none, as gradwire's
//                           zero_grad() does), gradwire::torch::DistributedDataParallel
//                           forward, cross-entropy, LibTorch backward (gradwire's Reducer
//                           all-reducing the buckets while it goes on), torch::optim::SGD
//                           (lr 0.01) step; 2 ranks over the shared-memory group
//                           (ProcessGroupShm), bucket_cap_mb 25. Baselines in the same run:
//                           gradwire's own DDP step of the same MLP in gradwire's nn (the
//                           ddp.step_ms model) in the same rank processes, in blocks
//                           alternating with the LibTorch step (params.gradwire_ms), and
//                           PyTorch 1.13's DistributedDataParallel over gloo on the same
//                           model and batch (bench/pytorch/ddp_peer.py, params.pytorch_ms).
//                           Diagnostics in the same blocks: each library's one-process step
//                           (no DDP: torch_plain_ms, gradwire_plain_ms), and the LibTorch DDP
//                           step under no_sync() (torch_no_sync_ms), with static_graph
//                           (torch_static_graph_ms) and with LibTorch's default CPU
//                           allocator (torch_ddp_torch_memory_ms), and the page faults per
//                           timed step of each variant in rank 0's process
//                           (params.*_faults_per_step).
//                           Without PyTorch's python the figure is printed with "pytorch":
//                           "unavailable: skipped" and the reason.
//   libtorch.rpc_tensor_us  rpc_sync "echo" of one float32 torch tensor (at::Tensor argument
//                           and result, ValueConverter<at::Tensor>) between two agents, at
//                           4 KiB and 4 MiB, median round trip; baseline: the same echo of a
//                           gradwire Tensor of the same size, in blocks alternating with it in
//                           the same processes (params.gradwire_us); diagnostics in the same
//                           blocks: the torch echo of an at::Tensor viewing gradwire-allocated
//                           memory (to_torch; params.torch_view_us), the torch echo of a
//                           tensor from LibTorch's default allocator (params.torch_memory_us),
//                           and the gradwire echo of a gradwire Tensor viewing that memory
//                           (from_torch; params.gradwire_torch_memory_us). The pairs that
//                           send the same memory tell the bridge's cost apart from the memory's:
//                           a large tensor is copied out of the sender's memory by the receiver
//                           (process_vm_readv), which costs more per byte over torch's 4 KiB
//                           pages than over the 2 MiB transparent huge pages gradwire's host
//                           allocator asks for (GRADWIRE_HOST_HUGE_PAGES, storage.h).
// Rounds: the rank processes and the PyTorch peer run one after the other kRounds times; each
// side keeps its best round's median, so that drift on a shared machine favours none.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/ddp/ddp.h"
#include "gradwire/nn/nn.h"
#include "gradwire/optim/optim.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/parallel.h"
#include "gradwire/torch/bridge.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
namespace tnn = ::torch::nn;

constexpr int kWorld = 2;
constexpr int kThreads = 1;  // intra-op threads per process, every side
constexpr int64_t kBatch = 64;
constexpr double kBucketMb = 25;
constexpr int kWarmup = 10;
constexpr int kBlockRounds = 6;  // rounds of alternating blocks in one run of the ranks
constexpr int kBlock = 8;        // timed steps per block
constexpr int kPeerSteps = 40;   // timed steps of the PyTorch peer
constexpr int kRounds = 2;
const std::vector<int64_t> kSizes = {784, 1024, 1024, 1024, 10};

// The step variants timed in the DDP ranks, in the order of their figures.
enum Variant : size_t {
  kTorchDdp,
  kGradwireDdp,
  kTorchPlain,
  kGradwirePlain,
  kTorchNoSync,
  kTorchStatic,
  kTorchDdpTorchMemory,  // kTorchDdp with LibTorch's default CPU allocator
  kVariants
};

void use_threads() {
  at::set_num_threads(kThreads);
  set_num_threads(kThreads);
}

// The LibTorch MLP: Linear/ReLU layers of kSizes, LibTorch's default initialisation.
tnn::Sequential torch_mlp() {
  ::torch::manual_seed(0);
  tnn::Sequential net;
  for (size_t i = 0; i + 1 < kSizes.size(); ++i) {
    net->push_back(tnn::Linear(kSizes[i], kSizes[i + 1]));
    if (i + 2 < kSizes.size()) net->push_back(tnn::ReLU());
  }
  return net;
}

std::shared_ptr<nn::MLP> gradwire_mlp() {
  Generator gen(0);
  return std::make_shared<nn::MLP>(nn::MLPOptions{.sizes = kSizes, .generator = &gen});
}

// A LibTorch optimizer's gradients reset to none (undefined), so that the backward's
// gradients become grad() without an accumulation into zeros: what gradwire's zero_grad()
// does by default (and PyTorch's since 2.0); LibTorch 1.13's zero_grad() zeroes in place.
void grads_to_none(::torch::optim::Optimizer& opt) {
  for (auto& group : opt.param_groups())
    for (at::Tensor& p : group.params())
      p.mutable_grad().reset();
}

// This process's minor page faults so far (every thread's).
double minor_faults() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_minflt);
}

// Medians of every variant's step times, then every variant's mean page faults per timed
// step: after kWarmup untimed steps of each, kBlockRounds rounds in which each variant runs
// a block of kBlock timed steps, the ranks starting every block together (a barrier).
std::vector<double> alternate_blocks(const std::vector<std::function<void()>>& steps,
                                     c10d::ProcessGroup& group) {
  for (const auto& step : steps)
    for (int i = 0; i < kWarmup; ++i)
      step();
  std::vector<std::vector<double>> times(steps.size());
  std::vector<double> faults(steps.size(), 0.0);
  for (int round = 0; round < kBlockRounds; ++round) {
    for (size_t v = 0; v < steps.size(); ++v) {
      group.barrier().wait();
      const double before = minor_faults();
      for (int i = 0; i < kBlock; ++i)
        times[v].push_back(time_once(steps[v]));
      faults[v] += minor_faults() - before;
    }
  }
  std::vector<double> out;
  for (auto& t : times)
    out.push_back(median(std::move(t)));
  for (double f : faults)
    out.push_back(f / (kBlockRounds * kBlock));
  return out;
}

// One run of the DDP ranks: rank 0's median step of every Variant, its page faults per step
// of every Variant, then the LibTorch DDP's bucket count and the model's parameter count.
std::vector<double> ddp_rank_body(std::shared_ptr<c10d::Store> store, int rank) {
  use_threads();
  // LibTorch's CPU tensors in gradwire's host memory, as a LibTorch program using gradwire
  // should run (memory.h); the *_torch_memory diagnostics switch back around their steps.
  torch::use_gradwire_host_memory();
  std::shared_ptr<c10d::ProcessGroup> group = c10d::ProcessGroupShm::create(
      store, rank, kWorld, {.timeout = 120s, .debug_level = c10d::DebugLevel::kOff},
      {.gloo = {.host = "127.0.0.1"}});
  Generator gen(1 + static_cast<uint64_t>(rank));
  const Tensor x = randn({kBatch, kSizes.front()}, &gen);
  const Tensor y = randint(0, kSizes.back(), {kBatch}, &gen);
  const at::Tensor tx = torch::to_torch(x);  // the same batch, no copy
  const at::Tensor ty = torch::to_torch(y);

  tnn::Sequential tnet = torch_mlp();
  torch::DistributedDataParallel tddp(tnet, group, {.bucket_cap_mb = kBucketMb});
  ::torch::optim::SGD topt(tnet->parameters(), ::torch::optim::SGDOptions(0.01));
  tnn::Sequential tstatic_net = torch_mlp();
  torch::DistributedDataParallel tstatic(tstatic_net, group,
                                         {.bucket_cap_mb = kBucketMb, .static_graph = true});
  ::torch::optim::SGD tstatic_opt(tstatic_net->parameters(), ::torch::optim::SGDOptions(0.01));
  tnn::Sequential tplain = torch_mlp();
  ::torch::optim::SGD tplain_opt(tplain->parameters(), ::torch::optim::SGDOptions(0.01));
  auto gnet = gradwire_mlp();
  ddp::DistributedDataParallel gddp(gnet, group, {.bucket_cap_mb = kBucketMb});
  optim::SGD gopt(gnet->parameters(), optim::SGDOptions{.lr = 0.01});
  auto gplain = gradwire_mlp();
  optim::SGD gplain_opt(gplain->parameters(), optim::SGDOptions{.lr = 0.01});

  std::vector<std::function<void()>> steps(kVariants);
  steps[kTorchDdp] = [&] {
    grads_to_none(topt);
    tnn::functional::cross_entropy(tddp.forward(tx), ty).backward();
    topt.step();
  };
  steps[kGradwireDdp] = [&] {
    gopt.zero_grad();
    nn::cross_entropy(gddp.forward(x), y).backward();
    gopt.step();
  };
  steps[kTorchPlain] = [&] {
    grads_to_none(tplain_opt);
    tnn::functional::cross_entropy(tplain->forward(tx), ty).backward();
    tplain_opt.step();
  };
  steps[kGradwirePlain] = [&] {
    gplain_opt.zero_grad();
    nn::cross_entropy((*gplain)(x), y).backward();
    gplain_opt.step();
  };
  steps[kTorchNoSync] = [&] {
    grads_to_none(topt);
    const torch::TorchNoSyncGuard guard = tddp.no_sync();
    tnn::functional::cross_entropy(tddp.forward(tx), ty).backward();
    topt.step();
  };
  steps[kTorchStatic] = [&] {
    grads_to_none(tstatic_opt);
    tnn::functional::cross_entropy(tstatic.forward(tx), ty).backward();
    tstatic_opt.step();
  };
  steps[kTorchDdpTorchMemory] = [&] {
    torch::use_torch_host_memory();
    steps[kTorchDdp]();
    torch::use_gradwire_host_memory();
  };
  std::vector<double> out = alternate_blocks(steps, *group);
  out.push_back(static_cast<double>(tddp.reducer().bucket_indices().size()));
  int64_t numel = 0;
  for (const at::Tensor& p : tnet->parameters())
    numel += p.numel();
  out.push_back(static_cast<double>(numel));
  group->barrier().wait();
  return out;
}

struct DdpResult {
  std::vector<double> ours;    // best round's median seconds per Variant
  std::vector<double> faults;  // page faults per step per Variant, mean over the rounds
  double buckets = 0;
  double numel = 0;
  std::optional<PeerTimings> theirs;  // the best round's, with its median first
  double theirs_s = std::numeric_limits<double>::infinity();
  std::string why;
};

DdpResult measure_ddp(c10d::TCPStoreServer& server) {
  DdpResult result;
  result.ours.assign(kVariants, std::numeric_limits<double>::infinity());
  result.faults.assign(kVariants, 0.0);
  const std::string n = std::to_string(kThreads);
  bool have_theirs = true;
  for (int r = 0; r < kRounds; ++r) {
    const std::vector<double> got = run_rank_processes(
        server.port(), "libtorch_ddp" + std::to_string(r), kWorld, ddp_rank_body, "libtorch ddp");
    if (got.size() != 2 * kVariants + 2)
      throw std::runtime_error("libtorch ddp bench: the ranks returned " +
                               std::to_string(got.size()) + " figures, expected " +
                               std::to_string(2 * kVariants + 2));
    for (size_t v = 0; v < kVariants; ++v) {
      result.ours[v] = std::min(result.ours[v], got[v]);
      result.faults[v] += got[kVariants + v] / kRounds;
    }
    result.buckets = got[2 * kVariants];
    result.numel = got[2 * kVariants + 1];
    if (!have_theirs) continue;
    auto peer =
        run_pytorch_peer("ddp_peer.py",
                         n + " " + std::to_string(kWarmup) + " " + std::to_string(kPeerSteps) +
                             " " + std::to_string(static_cast<int>(kBucketMb)),
                         "OMP_NUM_THREADS=" + n + " OPENBLAS_NUM_THREADS=" + n, result.why);
    if (!peer) {
      have_theirs = false;
      result.theirs.reset();
      continue;
    }
    const double m = median(peer->seconds);
    if (m < result.theirs_s) {
      result.theirs_s = m;
      result.theirs = std::move(peer);
    }
  }
  return result;
}

void emit_ddp(const DdpResult& d, const std::function<void(const Figure&)>& emit) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double torch_ms = d.ours[kTorchDdp] * 1e3;
  const double gradwire_ms = d.ours[kGradwireDdp] * 1e3;
  Figure f{"libtorch.ddp_step_ms", torch_ms, "ms", {}};
  Params& p = f.params;
  p.push_back({"model", "784-1024-1024-1024-10 ReLU MLP, torch::nn::Sequential of Linear/ReLU"});
  p.push_back({"parameters", d.numel});
  p.push_back({"batch_per_rank", double(kBatch)});
  p.push_back({"dtype", "float32"});
  p.push_back({"ranks", double(kWorld)});
  p.push_back({"backend", "shm (ProcessGroupShm, processes on one host)"});
  p.push_back({"step",
               "gradients reset to none (as gradwire's zero_grad) + "
               "gradwire::torch::DistributedDataParallel forward + cross_entropy + "
               "LibTorch backward (overlapped bucket all-reduce) + torch::optim::SGD(lr=0.01)"});
  p.push_back({"bucket_cap_mb", kBucketMb});
  p.push_back({"buckets", d.buckets});
  p.push_back({"threads_per_process", double(kThreads)});
  p.push_back({"blas_core", blas_core()});
  p.push_back({"statistic", "median of " + std::to_string(kBlockRounds * kBlock) +
                                " steps in blocks of " + std::to_string(kBlock) +
                                " alternating with the other variants, after " +
                                std::to_string(kWarmup) + " warm-up, best of " +
                                std::to_string(kRounds) + " rounds"});
  p.push_back({"gradwire",
               "gradwire's ddp::DistributedDataParallel on the same MLP in gradwire's nn, same "
               "batch, same rank processes, alternating blocks"});
  p.push_back({"gradwire_ms", gradwire_ms});
  p.push_back({"ratio_to_gradwire", torch_ms / gradwire_ms});
  p.push_back({"target_ratio_to_gradwire_max", 1.05});
  if (d.theirs) {
    p.push_back({"pytorch", "torch " + d.theirs->torch_version +
                                " DistributedDataParallel, gloo, bucket_cap_mb 25, median of " +
                                std::to_string(kPeerSteps) + " steps"});
    p.push_back({"pytorch_ms", d.theirs_s * 1e3});
    p.push_back({"ratio_to_pytorch", torch_ms / (d.theirs_s * 1e3)});
  } else {
    p.push_back({"pytorch", "unavailable: skipped"});
    p.push_back({"pytorch_reason", d.why});
    p.push_back({"pytorch_ms", nan});
    p.push_back({"ratio_to_pytorch", nan});
  }
  p.push_back({"target_ratio_to_pytorch_max", 1 / 1.3});
  p.push_back({"torch_plain_ms", d.ours[kTorchPlain] * 1e3});
  p.push_back({"gradwire_plain_ms", d.ours[kGradwirePlain] * 1e3});
  p.push_back({"torch_no_sync_ms", d.ours[kTorchNoSync] * 1e3});
  p.push_back({"torch_static_graph_ms", d.ours[kTorchStatic] * 1e3});
  p.push_back({"torch_host_memory",
               "gradwire::torch::use_gradwire_host_memory() in each rank process (LibTorch's CPU "
               "tensors of 64 KiB and more from gradwire's host block cache, memory.h), as "
               "docs/libtorch.md tells LibTorch programs to run"});
  p.push_back({"torch_ddp_torch_memory_ms", d.ours[kTorchDdpTorchMemory] * 1e3});
  p.push_back({"torch_ddp_torch_memory",
               "diagnostic, same blocks: the LibTorch DDP step with LibTorch's default CPU "
               "allocator (use_torch_host_memory() around the step)"});
  p.push_back({"ratio_to_gradwire_torch_memory", d.ours[kTorchDdpTorchMemory] * 1e3 / gradwire_ms});
  p.push_back({"variants",
               "diagnostic, same blocks: the LibTorch DDP step under no_sync() (hooks, no "
               "all-reduce; torch_no_sync_ms) and with static_graph (torch_static_graph_ms)"});
  p.push_back({"plain",
               "diagnostic: each library's one-process step (no DDP, no communication) of the "
               "same MLP, both ranks at once, in the same blocks"});
  // In the order of Variant.
  const char* const variant_names[kVariants] = {
      "torch_ddp",     "gradwire_ddp",       "torch_plain",           "gradwire_plain",
      "torch_no_sync", "torch_static_graph", "torch_ddp_torch_memory"};
  for (size_t v = 0; v < kVariants; ++v)
    p.push_back({std::string(variant_names[v]) + "_faults_per_step", d.faults[v]});
  p.push_back({"minor_faults",
               "diagnostic: rank 0's process's minor page faults per timed step of each variant "
               "(getrusage), mean over the rounds; in a steady state each is a page of memory "
               "that an allocator gave back to the kernel and took again"});
  emit(f);
}

// libtorch.rpc_tensor_us: payload sizes, and the calls per block for each.
const std::vector<std::pair<int64_t, int>> kRpcSizes = {{4 << 10, 200}, {4 << 20, 20}};
constexpr int kRpcBlocks = 8;  // blocks of each side, alternating

// Rank 0's medians, kRpcFigures per kRpcSizes entry (seconds): the torch echo, the gradwire
// echo, the torch echo of a torch tensor viewing gradwire-allocated memory (to_torch), the
// gradwire echo of a gradwire tensor viewing memory from LibTorch's default allocator
// (from_torch), and the torch echo of a tensor in that memory.
constexpr size_t kRpcFigures = 5;
std::vector<double> rpc_rank_body(std::shared_ptr<c10d::Store> store, int rank) {
  use_threads();
  // LibTorch's CPU tensors in gradwire's host memory, as a LibTorch program using gradwire
  // should run (memory.h); the *_torch_memory diagnostics switch back around their steps.
  torch::use_gradwire_host_memory();
  rpc::Registry reg;
  reg.def("echo", [](const Tensor& t) { return t; });
  reg.def("echo_torch", [](const at::Tensor& t) { return t; });
  rpc::AgentOptions options = rank_agent_options(reg);
  auto agent = rpc::make_tensorpipe_agent("w" + std::to_string(rank), rank, 2, store, options);
  std::vector<double> out;
  if (rank == 0) {
    for (const auto& [bytes, calls] : kRpcSizes) {
      const int64_t numel = bytes / 4;
      const at::Tensor tt = at::ones({numel}, at::kFloat);
      const Tensor gt = ones({numel});
      const at::Tensor tview = torch::to_torch(ones({numel}));
      torch::use_torch_host_memory();
      const at::Tensor tdefault = at::ones({numel}, at::kFloat);
      torch::use_gradwire_host_memory();
      auto echo_of = [&](const at::Tensor& sent) {
        return [&, sent] {
          if (agent->rpc_sync<at::Tensor>("w1", "echo_torch", sent).numel() != numel)
            throw std::runtime_error("libtorch rpc bench: echo_torch returned another size");
        };
      };
      const Tensor gview = torch::from_torch(tdefault);
      auto gradwire_echo_of = [&](const Tensor& sent) {
        return [&, sent] {
          if (agent->rpc_sync<Tensor>("w1", "echo", sent).numel() != numel)
            throw std::runtime_error("libtorch rpc bench: echo returned another size");
        };
      };
      const std::function<void()> echoes[kRpcFigures] = {echo_of(tt), gradwire_echo_of(gt),
                                                         echo_of(tview), gradwire_echo_of(gview),
                                                         echo_of(tdefault)};
      std::vector<double> times[kRpcFigures];
      for (int block = 0; block < kRpcBlocks; ++block)
        for (size_t k = 0; k < kRpcFigures; ++k)
          for (double t : time_calls(block == 0 ? calls : 2, calls, echoes[k]))
            times[k].push_back(t);
      for (auto& t : times)
        out.push_back(median(std::move(t)));
    }
  }
  agent->shutdown();
  return out;
}

void emit_rpc(const std::vector<double>& best, const std::function<void(const Figure&)>& emit) {
  for (size_t i = 0; i < kRpcSizes.size(); ++i) {
    const auto [bytes, calls] = kRpcSizes[i];
    const double torch_us = best[kRpcFigures * i] * 1e6;
    const double gradwire_us = best[kRpcFigures * i + 1] * 1e6;
    const double view_us = best[kRpcFigures * i + 2] * 1e6;
    const double gradwire_torch_memory_us = best[kRpcFigures * i + 3] * 1e6;
    const double torch_memory_us = best[kRpcFigures * i + 4] * 1e6;
    emit(Figure{"libtorch.rpc_tensor_us",
                torch_us,
                "us",
                {{"bytes", double(bytes)},
                 {"call", "echo(at::Tensor float32[" + std::to_string(bytes / 4) +
                              "]) -> at::Tensor, rpc_sync"},
                 {"workers", "2 processes on 127.0.0.1, TensorPipe agent"},
                 {"statistic", "median round trip of " + std::to_string(kRpcBlocks * calls) +
                                   " calls in " + std::to_string(kRpcBlocks) +
                                   " blocks alternating with the gradwire echo, best of " +
                                   std::to_string(kRounds) + " rounds"},
                 {"gradwire", "echo(Tensor float32, same size) -> Tensor, same processes"},
                 {"gradwire_us", gradwire_us},
                 {"ratio_to_gradwire", torch_us / gradwire_us},
                 {"target_ratio_to_gradwire_max", 1.1},
                 {"torch_view_us", view_us},
                 {"torch_view",
                  "diagnostic: the same torch echo of an at::Tensor viewing gradwire-allocated "
                  "memory (to_torch), in the same blocks"},
                 {"torch_host_memory",
                  "gradwire::torch::use_gradwire_host_memory() in both processes (the sent "
                  "torch tensor's memory from gradwire's host block cache, memory.h)"},
                 {"torch_memory_us", torch_memory_us},
                 {"torch_memory",
                  "diagnostic: the torch echo of a tensor from LibTorch's default CPU "
                  "allocator, in the same blocks"},
                 {"gradwire_torch_memory_us", gradwire_torch_memory_us},
                 {"gradwire_torch_memory",
                  "diagnostic: the gradwire echo of a Tensor viewing that default-allocated "
                  "memory (from_torch), in the same blocks"},
                 {"ratio_same_memory", torch_memory_us / gradwire_torch_memory_us},
                 {"same_memory",
                  "torch echo over gradwire echo of the same default-allocated memory: the "
                  "bridge's own cost, without the allocators' difference"}}});
  }
}

// Registered apart, so that --filter can run either figure alone.
const Register libtorch_ddp_bench({"libtorch.ddp_step_ms"}, [](const auto& emit) {
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  emit_ddp(measure_ddp(server), emit);
});

const Register libtorch_rpc_bench({"libtorch.rpc_tensor_us"}, [](const auto& emit) {
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  std::vector<double> best(kRpcFigures * kRpcSizes.size(), std::numeric_limits<double>::infinity());
  for (int r = 0; r < kRounds; ++r) {
    const std::vector<double> got = run_rank_processes(
        server.port(), "libtorch_rpc" + std::to_string(r), 2, rpc_rank_body, "libtorch rpc");
    if (got.size() != best.size())
      throw std::runtime_error("libtorch rpc bench: the workers returned " +
                               std::to_string(got.size()) + " figures");
    for (size_t i = 0; i < best.size(); ++i)
      best[i] = std::min(best[i], got[i]);
  }
  emit_rpc(best, emit);
});

}  // namespace
}  // namespace gradwire::bench
