// dist_autograd/ and dist_optim/ figures: PyTorch's distributed-autograd tutorial pattern
// between two workers as two processes on this machine (they meet through a TCPStore served
// here), against PyTorch 1.13 doing the same (bench/pytorch/dist_autograd_peer.py) and
// against the same computation in one process, all in the same run. The trainer w0 holds
// x (256x256 float32, requires grad); w1 holds a weight W (256x256 float32, requires grad).
//   dist_autograd.step_ms  one step on w0: a dist_autograd::Context; y = rpc_sync "mm"(x)
//                          on w1, which returns matmul(x, W); loss = sum(y);
//                          dist_autograd::backward; get_gradients (x's gradient); the
//                          context released on both workers. Baselines: the same matmul,
//                          sum and autograd backward in one process with a local weight,
//                          x's gradient read and both gradients reset (params.local_ms);
//                          PyTorch's dist_autograd doing the same (params.pytorch_ms)
//   dist_optim.step_ms     the same with W owned by w1 behind an RRef<Tensor> (made by
//                          rref::remote<Tensor> "make_weight" on w1; the remote function
//                          "mm_rref"(w, x) multiplies by *w.local_value()), plus a
//                          DistributedOptimizer(SGD lr 0.01) step over that RRef inside the
//                          context. Baselines: the local step with optim::SGD over W
//                          (params.local_ms); PyTorch's DistributedOptimizer(optim.SGD)
//                          (params.pytorch_ms)
//   dist_autograd.step_ms_512  dist_autograd.step_ms with x and W 512x512 (1 MiB each, the
//                          scale of the figures issue 30 was filed with), 80 steps per
//                          round, same baselines
// Diagnostics: rpc_mm_ms, a plain rpc_sync of "mm" on a tensor that does not require grad
// (no context): the forward call's transfers and matmul without dist_autograd; in
// dist_autograd.step_ms and step_ms_512, rpc_bw_ms, a plain rpc_sync of "bw" that carries what
// the backward's crossing does (a one-element gradient out, made whole on w1 around the two
// products of the matmul's backward, x's gradient back), the three products timed alone in one
// process (local_mm_ms, local_bw_ms), and from them calls_floor_ms: local_ms plus what the two
// plain calls add to their products, the same two crossings the step makes; and the medians of the
// step's phases on w0 (forward_ms: context and forward call; backward_ms: sum and backward;
// get_gradients_ms; release_ms: the context's end, which releases it on w0 and sends its release to
// w1 without waiting for the answer). The agents keep their defaults otherwise: x, y and the
// gradient of x (256 KiB each, 1 MiB each in step_ms_512) are below direct_copy_min_bytes (tensors
// larger than 1 MiB are lent), so they go through the local transport's rings (the ring channel).
//
// Threads: every process uses kThreads intra-op threads (gradwire::set_num_threads in the
// ranks and for the local steps; torch.set_num_threads + OMP_NUM_THREADS +
// OPENBLAS_NUM_THREADS in the PyTorch ranks). Both agents have 8 pool threads.
//
// Within a run the two steps (and the plain call) alternate in blocks; our ranks, the
// PyTorch peer and the local steps then run one after the other, kRounds times, and each
// side keeps its best round's median, so that drift on a shared machine favours none.
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
#include "gradwire/tensor/zero_grad.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
namespace da = dist_autograd;

constexpr int kWorld = 2;
constexpr int kThreads = 1;  // intra-op threads per process, every side
constexpr int kPoolThreads = 8;
constexpr int64_t kN = 256;       // the side of x and W in dist_autograd.step_ms
constexpr int64_t kLargeN = 512;  // in dist_autograd.step_ms_512
constexpr int kLargeSteps = 80;
constexpr double kLr = 0.01;
constexpr int kWarmup = 20;  // untimed steps of each kind before the timed blocks
constexpr int kSteps = 240;  // timed steps of each kind per round (kLargeSteps for kLargeN)
constexpr int kBlocks = 4;   // the kinds alternate in blocks of kSteps / kBlocks
constexpr int kRounds = 3;

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("dist_autograd bench: " + what);
}

// x on the trainer and W on the other worker (and their local twins): fixed seeds.
Tensor make_x(int64_t n) {
  Generator gen(1);
  Tensor x = randn({n, n}, &gen);
  x.set_requires_grad(true);
  return x;
}
Tensor make_weight(int64_t n) {
  Generator gen(2);
  Tensor w = randn({n, n}, &gen);
  w.set_requires_grad(true);
  return w;
}

// d sum(x W) / dx = 1 W^T.
Tensor expected_grad_x(const Tensor& w, int64_t n) {
  return matmul(ones({n, n}), w.detach().transpose(0, 1));
}

// Rank 0's figures, in this order.
// kForward..kRelease: the phases of the timed dist_autograd steps (context + forward call,
// sum + backward, get_gradients, the context's release), each a median over those steps.
enum Figures : size_t {
  kAutograd,
  kOptim,
  kRpcMm,
  kForward,
  kBackward,
  kGetGradients,
  kRelease,
  kRpcBackward,
  kCount
};
// What the PyTorch peer prints: the first three.
constexpr size_t kPeerCount = kForward;

std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank, int64_t n, int steps) {
  set_num_threads(kThreads);
  Tensor weight;   // w1's weight for "mm"
  Tensor saved_x;  // w1's copy of x for "bw", as the matmul's backward node keeps it
  if (rank == 1) {
    weight = make_weight(n);
    saved_x = make_x(n).detach();
  }
  rpc::Registry reg;
  reg.def("mm", [&weight](const Tensor& x) { return matmul(x, weight); });
  // The matmul's backward without autograd: the gradient of sum(y) made whole from one
  // element, W's gradient x^T g (computed, dropped) and x's gradient g W^T returned.
  reg.def("bw", [&weight, &saved_x, n](const Tensor& g) {
    const Tensor whole = g.expand({n, n}).contiguous();
    const Tensor grad_w = matmul(saved_x.transpose(0, 1), whole);
    return matmul(whole, weight.detach().transpose(0, 1));
  });
  reg.def("make_weight", [n] { return make_weight(n); });
  reg.def("mm_rref",
          [](const rref::RRef<Tensor>& w, const Tensor& x) { return matmul(x, *w.local_value()); });
  rpc::AgentOptions options = rank_agent_options(reg);
  options.num_worker_threads = kPoolThreads;
  auto agent = rpc::make_tensorpipe_agent("w" + std::to_string(rank), rank, kWorld, store, options);
  std::vector<double> out(kCount);
  if (rank == 0) {
    const Tensor x = make_x(n);
    const Tensor x_plain = x.detach();
    int64_t optim_steps = 0;
    {
      rref::RRef<Tensor> w = rref::remote<Tensor>(*agent, "w1", "make_weight");
      dist_optim::DistributedOptimizer opt(*agent, optim::SGDOptions{.lr = kLr}, {w});
      std::vector<double> times[kCount];
      bool record_phases = false;
      auto autograd_step = [&] {
        using Clock = std::chrono::steady_clock;
        const Clock::time_point t0 = Clock::now();
        Clock::time_point t1, t2, t3;
        Tensor g;
        {
          da::Context ctx(*agent);
          Tensor y = agent->rpc_sync<Tensor>("w1", "mm", x);
          t1 = Clock::now();
          Tensor loss = sum(y);
          da::backward(*agent, ctx.id(), {loss});
          t2 = Clock::now();
          g = da::get_gradients(*agent, ctx.id()).at(x);
          t3 = Clock::now();
        }
        if (record_phases) {
          const Clock::time_point t4 = Clock::now();
          auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
          times[kForward].push_back(seconds(t1 - t0));
          times[kBackward].push_back(seconds(t2 - t1));
          times[kGetGradients].push_back(seconds(t3 - t2));
          times[kRelease].push_back(seconds(t4 - t3));
        }
        return g;
      };
      auto optim_step = [&] {
        da::Context ctx(*agent);
        Tensor y = agent->rpc_sync<Tensor>("w1", "mm_rref", w, x);
        Tensor loss = sum(y);
        da::backward(*agent, ctx.id(), {loss});
        Tensor g = da::get_gradients(*agent, ctx.id()).at(x);
        opt.step(ctx.id());
        ++optim_steps;
        return g;
      };
      auto rpc_mm = [&] { return agent->rpc_sync<Tensor>("w1", "mm", x_plain); };
      const Tensor one = ones({1, 1});
      auto rpc_bw = [&] { return agent->rpc_sync<Tensor>("w1", "bw", one); };
      const Tensor want = expected_grad_x(make_weight(n), n);
      for (int i = 0; i < kWarmup; ++i) {
        autograd_step();
        optim_step();
        rpc_mm();
        rpc_bw();
      }
      expect(allclose(autograd_step(), want, 1e-4, 1e-3), "wrong gradient of x");
      expect(allclose(rpc_bw(), want, 1e-4, 1e-3),
             "wrong gradient of x from the plain \"bw\" call");
      record_phases = true;
      for (int b = 0; b < kBlocks; ++b) {
        for (int i = 0; i < steps / kBlocks; ++i)
          times[kAutograd].push_back(time_once(autograd_step));
        for (int i = 0; i < steps / kBlocks; ++i)
          times[kOptim].push_back(time_once(optim_step));
        for (int i = 0; i < steps / kBlocks; ++i)
          times[kRpcMm].push_back(time_once(rpc_mm));
        for (int i = 0; i < steps / kBlocks; ++i)
          times[kRpcBackward].push_back(time_once(rpc_bw));
      }
      for (size_t k = 0; k < kCount; ++k)
        out[k] = median(times[k]);
      // grad W = x^T 1 whatever W is, so plain SGD moved W by -lr * steps * x^T 1.
      const Tensor moved =
          sub(make_weight(n).detach(), mul(matmul(x_plain.transpose(0, 1), ones({n, n})),
                                           kLr * static_cast<double>(optim_steps)));
      expect(allclose(w.to_here(), moved, 1e-4, 1e-2),
             "the remote weight is not where " + std::to_string(optim_steps) + " SGD steps put it");
    }
    rref::wait_idle(*agent, 60s);
    store->set("rank0_idle", "1");
  } else {
    store->wait({"rank0_idle"}, 120s);
    expect(rref::wait_owned_values(*agent, 0, 60s), "references left on the owner");
  }
  agent->shutdown();
  return out;
}

// The same two steps in this process with a local weight, and the products of the plain calls
// alone (median seconds of each).
struct LocalTimes {
  double autograd;
  double optim;
  double mm;  // matmul(x, W), what "mm" computes
  double bw;  // what "bw" computes: the gradient made whole, x^T g and g W^T
};
LocalTimes local_steps(int64_t n, int steps) {
  const int saved = get_num_threads();
  set_num_threads(kThreads);
  const Tensor x = make_x(n);
  const Tensor w = make_weight(n);
  optim::SGD sgd({w}, optim::SGDOptions{.lr = kLr});
  Tensor g;
  auto autograd_step = [&] {
    sum(matmul(x, w)).backward();
    g = x.grad();
    zero_grad({x, w});
  };
  auto optim_step = [&] {
    zero_grad({x});
    sgd.zero_grad();
    sum(matmul(x, w)).backward();
    g = x.grad();
    sgd.step();
  };
  const Tensor x_plain = x.detach();
  const Tensor w_plain = w.detach();
  const Tensor one = ones({1, 1});
  auto mm = [&] { g = matmul(x_plain, w_plain); };
  auto bw = [&] {
    const Tensor whole = one.expand({n, n}).contiguous();
    const Tensor grad_w = matmul(x_plain.transpose(0, 1), whole);
    g = matmul(whole, w_plain.transpose(0, 1));
  };
  const Tensor want = expected_grad_x(w, n);
  for (int i = 0; i < kWarmup; ++i) {
    mm();
    bw();
  }
  for (int i = 0; i < kWarmup; ++i)
    autograd_step();
  expect(allclose(g, want, 1e-4, 1e-3), "wrong local gradient of x");
  for (int i = 0; i < kWarmup; ++i)
    optim_step();
  std::vector<double> autograd_times, optim_times, mm_times, bw_times;
  for (int b = 0; b < kBlocks; ++b) {
    for (int i = 0; i < steps / kBlocks; ++i)
      autograd_times.push_back(time_once(autograd_step));
    for (int i = 0; i < steps / kBlocks; ++i)
      optim_times.push_back(time_once(optim_step));
    for (int i = 0; i < steps / kBlocks; ++i)
      mm_times.push_back(time_once(mm));
    for (int i = 0; i < steps / kBlocks; ++i)
      bw_times.push_back(time_once(bw));
  }
  set_num_threads(saved);
  return {median(autograd_times), median(optim_times), median(mm_times), median(bw_times)};
}

// Both steps with x and W of side n, `steps` timed steps of each kind per round; emits the
// autograd step's figure as `autograd_metric` and the optimizer step's as `optim_metric`
// (empty: not emitted).
void measure(int64_t n, int steps, const std::string& autograd_metric,
             const std::string& optim_metric, const std::function<void(const Figure&)>& emit) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  std::vector<double> ours(kCount, inf);
  std::vector<double> theirs(kPeerCount, inf);
  double local_autograd = inf, local_optim = inf, local_mm = inf, local_bw = inf;
  std::string why, version;
  bool have_theirs = true;
  const std::string threads = std::to_string(kThreads);
  for (int r = 0; r < kRounds; ++r) {
    const std::vector<double> mine = run_rank_processes(
        server.port(), "dist_autograd" + std::to_string(n) + "_" + std::to_string(r), kWorld,
        [n, steps](std::shared_ptr<c10d::Store> store, int rank) {
          return rank_body(std::move(store), rank, n, steps);
        },
        "dist_autograd");
    expect(mine.size() == kCount, "the ranks returned " + std::to_string(mine.size()) + " figures");
    // Each figure from its best round; the phases from the autograd step's best round.
    if (mine[kAutograd] < ours[kAutograd]) {
      for (size_t k = kForward; k < kCount; ++k)
        ours[k] = mine[k];
    }
    for (size_t k = 0; k < kForward; ++k)
      ours[k] = std::min(ours[k], mine[k]);
    if (have_theirs) {
      auto peer =
          run_pytorch_peer("dist_autograd_peer.py",
                           threads + " " + std::to_string(kWarmup) + " " + std::to_string(steps) +
                               " " + std::to_string(kBlocks) + " " + std::to_string(n),
                           "OMP_NUM_THREADS=" + threads + " OPENBLAS_NUM_THREADS=" + threads, why);
      if (peer && peer->seconds.size() != kPeerCount) {
        why = "the peer printed " + std::to_string(peer->seconds.size()) + " figures";
        peer.reset();
      }
      if (!peer) {
        have_theirs = false;
      } else {
        version = peer->torch_version;
        for (size_t k = 0; k < kPeerCount; ++k)
          theirs[k] = std::min(theirs[k], peer->seconds[k]);
      }
    }
    const LocalTimes local = local_steps(n, steps);
    local_autograd = std::min(local_autograd, local.autograd);
    local_optim = std::min(local_optim, local.optim);
    local_mm = std::min(local_mm, local.mm);
    local_bw = std::min(local_bw, local.bw);
  }

  const std::string statistic =
      "median of " + std::to_string(steps) + " steps (in " + std::to_string(kBlocks) +
      " blocks alternating with the other step and the plain call) after " +
      std::to_string(kWarmup) + " warm-up, best of " + std::to_string(kRounds) + " rounds";
  auto emit_figure = [&](const std::string& metric, size_t k, double local, const std::string& step,
                         const std::string& local_what, const std::string& pytorch_what) {
    const double ms = ours[k] * 1e3;
    const double local_ms = local * 1e3;
    Figure f{metric, ms, "ms", {}};
    f.params.push_back({"step", step});
    const std::string side = std::to_string(n) + "x" + std::to_string(n);
    f.params.push_back({"shape", "x " + side + " float32 (requires grad) on the trainer w0, W " +
                                     side + " float32 (requires grad) on w1, y = x W"});
    f.params.push_back({"workers", "2 processes on 127.0.0.1 (TensorPipe agent, 8 pool threads)"});
    f.params.push_back({"threads_per_process", double(kThreads)});
    f.params.push_back({"threads_how",
                        "gradwire::set_num_threads(1) in each process and for local_ms; "
                        "torch.set_num_threads(1) + OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1 in "
                        "the PyTorch processes"});
    f.params.push_back({"blas_core", blas_core()});
    f.params.push_back({"statistic", statistic});
    f.params.push_back({"local_ms", local_ms});
    f.params.push_back({"local", local_what});
    f.params.push_back({"ratio_to_local", ms / local_ms});
    if (have_theirs) {
      f.params.push_back({"pytorch", "torch " + version + " " + pytorch_what});
      f.params.push_back({"pytorch_ms", theirs[k] * 1e3});
      f.params.push_back({"ratio_to_pytorch", ours[k] / theirs[k]});
    } else {
      f.params.push_back({"pytorch", "unavailable"});
      f.params.push_back({"pytorch_reason", why});
      f.params.push_back({"pytorch_ms", nan});
      f.params.push_back({"ratio_to_pytorch", nan});
    }
    f.params.push_back({"rpc_mm_ms", ours[kRpcMm] * 1e3});
    f.params.push_back({"rpc_mm",
                        "diagnostic: plain rpc_sync \"mm\" of x without grad, no context (the "
                        "forward call alone), median"});
    f.params.push_back({"pytorch_rpc_mm_ms", have_theirs ? theirs[kRpcMm] * 1e3 : nan});
    if (k == kAutograd) {
      f.params.push_back({"forward_ms", ours[kForward] * 1e3});
      f.params.push_back({"backward_ms", ours[kBackward] * 1e3});
      f.params.push_back({"get_gradients_ms", ours[kGetGradients] * 1e3});
      f.params.push_back({"release_ms", ours[kRelease] * 1e3});
      const double floor_ms =
          local_ms + (ours[kRpcMm] - local_mm) * 1e3 + (ours[kRpcBackward] - local_bw) * 1e3;
      f.params.push_back({"rpc_bw_ms", ours[kRpcBackward] * 1e3});
      f.params.push_back({"local_mm_ms", local_mm * 1e3});
      f.params.push_back({"local_bw_ms", local_bw * 1e3});
      f.params.push_back({"calls_floor_ms", floor_ms});
      f.params.push_back({"calls_floor_ratio_to_local", floor_ms / local_ms});
      f.params.push_back({"calls_floor",
                          "diagnostic: local_ms + (rpc_mm_ms - local_mm_ms) + (rpc_bw_ms - "
                          "local_bw_ms): what two plain calls add, in this run, to the products "
                          "they carry; the step crosses between the workers the same way (x "
                          "out and y back around x W; a one-element gradient out and x's "
                          "gradient back around the matmul's backward), so what it takes above "
                          "this is dist_autograd's own cost"});
      f.params.push_back({"phases",
                          "diagnostic: medians of the timed steps' phases on w0 (context + "
                          "forward rpc_sync; sum + backward; get_gradients; the context's "
                          "end: released on w0, its release to w1 sent, not waited for)"});
    }
    if (k == kAutograd) {
      // Issue 30: at most 1.15x the same step in one process.
      f.params.push_back({"target_ratio_to_local_max", 1.15});
    } else {
      f.params.push_back({"target_ratio_to_pytorch_max", 0.5});
      f.params.push_back({"target_ratio_to_local_max", 1.5});
    }
    emit(f);
  };
  if (!autograd_metric.empty()) {
    emit_figure(autograd_metric, kAutograd, local_autograd,
                "dist_autograd::Context; y = rpc_sync(\"w1\", \"mm\", x) = matmul(x, W) on w1; "
                "loss = sum(y); dist_autograd::backward; get_gradients; context released",
                "matmul(x, W) with a local W, sum, autograd backward, x.grad read, both grads "
                "reset, one process, same threads, same run",
                "dist_autograd.context + rpc_sync(mm) + backward + get_gradients, TensorPipe "
                "agent");
  }
  if (optim_metric.empty()) return;
  emit_figure(optim_metric, kOptim, local_optim,
              "as dist_autograd.step_ms through rpc_sync(\"w1\", \"mm_rref\", W_rref, x) "
              "(matmul(x, *W_rref.local_value()) on w1), plus "
              "DistributedOptimizer(SGD lr 0.01).step(ctx) over W_rref in the context",
              "the local step plus optim::SGD(lr 0.01) over W (zero_grad, step), one "
              "process, same threads, same run",
              "dist_autograd + DistributedOptimizer(optim.SGD, [W_rref], lr=0.01), W_rref "
              "from rpc.remote, TensorPipe agent");
}

const Register dist_autograd_bench({"dist_autograd.step_ms", "dist_optim.step_ms"},
                                   [](const auto& emit) {
                                     measure(kN, kSteps, "dist_autograd.step_ms",
                                             "dist_optim.step_ms", emit);
                                   });
// The same step at the scale of the figures issue 30 was filed with (a one-process step
// many times the 256 one, where the distribution's fixed costs weigh less): x and W 512x512
// (1 MiB each, so x, y and x's gradient are the largest tensors that go through the rings
// between local peers rather than being lent).
const Register dist_autograd_large_bench({"dist_autograd.step_ms_512"}, [](const auto& emit) {
  measure(kLargeN, kLargeSteps, "dist_autograd.step_ms_512", "", emit);
});

}  // namespace
}  // namespace gradwire::bench
