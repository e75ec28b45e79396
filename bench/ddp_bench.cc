// ddp/ figures: one data-parallel training step of a 784-1024-1024-1024-10 ReLU MLP
// (float32, batch 64 per rank): zero_grad, DistributedDataParallel forward, cross-entropy,
// backward (the Reducer's bucketed all-reduce overlapped with the rest of backward), SGD
// step (lr 0.01). Two ranks as two processes over Gloo on 127.0.0.1 (they meet through a
// TCPStore served here); rank 0 times every step after a warm-up, the figure is the median.
//   ddp.step_ms             bucket_cap_mb 25 (the default on both sides), against
//                           PyTorch 1.13's DistributedDataParallel over gloo doing the same
//                           (bench/pytorch/ddp_peer.py, params.pytorch_ms) and against our
//                           own single-process step of the same model and batch
//                           (params.single_ms), all in the same run
//   ddp.step_ms_bucket_mb   the same step with bucket_cap_mb 1, 5 and 25, one figure each
//                           (the 25 figure is the ddp.step_ms measurement)
// Diagnostics in ddp.step_ms's params: no_sync_ms (the same step under no_sync(), both
// ranks computing at once without any all-reduce), allreduce_ms (one all_reduce of all the
// gradients at once, nothing else running) and cpu_ms_per_step (rank 0's process CPU time,
// every thread, per step).
//
// The same step over the shared-memory backend (ProcessGroupShm), in the same run:
//   ddp.step_ms with params.backend "shm": 2 ranks, bucket_cap_mb 25, against the same
//                           PyTorch and single-process figures (targets: <= 1.2x the
//                           single-process step, <= PyTorch / 1.3), and 4 ranks (no PyTorch
//                           figure: its peer runs two ranks). The 2-rank row also carries
//                           this host's floor for the ratio, alone_together_ms: two
//                           processes each running the single-process step at once, with no
//                           DDP and no communication (floor_ratio_to_single).
//
// Threads: every process uses kThreads intra-op threads (gradwire::set_num_threads here and
// in the ranks; torch.set_num_threads + OMP_NUM_THREADS + OPENBLAS_NUM_THREADS in the
// PyTorch peer): with two ranks on a small machine, one per rank keeps the ranks from
// fighting over cores. The single-process step runs in this process with the same count
// (restored afterwards), while no rank runs.
//
// Rounds: our ranks (every bucket size and the no_sync step), the PyTorch peer and the
// single-process step run one after the other, kRounds times; each side keeps its best round's
// median, so that drift on a shared machine favours none.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/ddp/ddp.h"
#include "gradwire/nn/nn.h"
#include "gradwire/optim/optim.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/parallel.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;

constexpr int kWorld = 2;
constexpr int kThreads = 1;  // intra-op threads per process, both sides
constexpr int64_t kBatch = 64;
constexpr int kWarmup = 10;
constexpr int kSteps = 40;  // timed steps per round and configuration
constexpr int kRounds = 3;
constexpr int kAllReduceCalls = 10;
constexpr double kMainBucketMb = 25;
const std::vector<double> kBucketMb = {1, 5, 25};
const std::vector<int64_t> kSizes = {784, 1024, 1024, 1024, 10};

double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec * 1e-6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

std::shared_ptr<nn::MLP> make_mlp() {
  Generator gen(0);
  return std::make_shared<nn::MLP>(nn::MLPOptions{.sizes = kSizes, .generator = &gen});
}

// Rank `rank`'s batch (the single-process step uses rank 0's).
std::pair<Tensor, Tensor> batch(int rank) {
  Generator gen(1 + static_cast<uint64_t>(rank));
  Tensor x = randn({kBatch, kSizes.front()}, &gen);
  Tensor y = randint(0, kSizes.back(), {kBatch}, &gen);
  return {x, y};
}

// How many values the model's parameters hold (every gradient together).
int64_t parameter_count(const nn::MLP& net) {
  int64_t numel = 0;
  for (const Tensor& p : net.parameters())
    numel += p.numel();
  return numel;
}

// Median seconds of kAllReduceCalls all_reduce calls of `numel` float32 values at once (every
// gradient in one call), after one untimed call and a barrier.
double median_all_reduce(c10d::ProcessGroup& group, int64_t numel, int rank) {
  Tensor flat = full({numel}, Scalar(rank + 1), kFloat32);
  group.all_reduce(flat).wait();
  group.barrier().wait();
  std::vector<double> times;
  for (int i = 0; i < kAllReduceCalls; ++i)
    times.push_back(time_once([&] { group.all_reduce(flat).wait(); }));
  return median(times);
}

// Median seconds of kSteps calls of `step` after kWarmup untimed ones; `sync` runs between
// the two (a barrier for the ranks). With `cpu`, also this process's CPU seconds (user +
// system, every thread) per timed step.
template <typename Step, typename Sync>
double median_step(Step&& step, Sync&& sync, double* cpu = nullptr) {
  for (int i = 0; i < kWarmup; ++i)
    step();
  sync();
  std::vector<double> times;
  times.reserve(kSteps);
  const double cpu_start = process_cpu_seconds();
  for (int i = 0; i < kSteps; ++i)
    times.push_back(time_once(step));
  if (cpu != nullptr) *cpu = (process_cpu_seconds() - cpu_start) / kSteps;
  return median(times);
}

// What one run of the ranks returns (rank 0's figures), in this order.
struct RankFigures {
  // Per bucket size, in kBucketMb order: median step seconds, buckets after the rebuild,
  // CPU seconds of the rank process per step.
  static constexpr size_t kPerBucketSize = 3;
  static size_t no_sync() { return kPerBucketSize * kBucketMb.size(); }  // median step, no_sync
  static size_t all_reduce() { return no_sync() + 1; }  // median all_reduce of every gradient
  static size_t numel() { return no_sync() + 2; }       // parameters
  static size_t count() { return no_sync() + 3; }
};

std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank, int round) {
  set_num_threads(kThreads);
  auto group = c10d::ProcessGroupGloo::create(
      store, rank, kWorld, {.timeout = 120s, .debug_level = c10d::DebugLevel::kOff},
      {.host = "127.0.0.1"});
  const std::pair<Tensor, Tensor> data = batch(rank);
  const Tensor& x = data.first;
  const Tensor& y = data.second;
  std::vector<double> out(RankFigures::count());
  auto barrier = [&] { group->barrier().wait(); };
  int64_t numel = 0;
  // Rotate the order from round to round so that no bucket size always runs first; the
  // no_sync step (-1) runs among them.
  const size_t configs = kBucketMb.size() + 1;
  for (size_t k = 0; k < configs; ++k) {
    const size_t i = (k + static_cast<size_t>(round)) % configs;
    const bool no_sync = i == kBucketMb.size();
    auto net = make_mlp();
    ddp::DistributedDataParallel model(net, group,
                                       {.bucket_cap_mb = no_sync ? kMainBucketMb : kBucketMb[i]});
    optim::SGD sgd(net->parameters(), optim::SGDOptions{.lr = 0.01});
    auto step = [&] {
      sgd.zero_grad();
      Tensor loss;
      if (no_sync) {
        const ddp::NoSyncGuard guard = model.no_sync();
        loss = nn::cross_entropy(model.forward(x), y);
      } else {
        loss = nn::cross_entropy(model.forward(x), y);
      }
      loss.backward();
      sgd.step();
    };
    if (no_sync) {
      out[RankFigures::no_sync()] = median_step(step, barrier);
      barrier();
      continue;
    }
    const size_t at = RankFigures::kPerBucketSize * i;
    out[at] = median_step(step, barrier, &out[at + 2]);
    out[at + 1] = static_cast<double>(model.reducer().bucket_indices().size());
    numel = parameter_count(*net);
  }
  out[RankFigures::all_reduce()] = median_all_reduce(*group, numel, rank);
  out[RankFigures::numel()] = static_cast<double>(numel);
  barrier();
  return out;
}

// What shm_rank_body returns: the median step, CPU seconds per step, the median all_reduce
// of every gradient at once, then (two ranks only, else -1) the A/B of ab_steps.
constexpr size_t kAbFigures = 7;
constexpr size_t kShmFigures = 3 + kAbFigures;
constexpr int kAbRounds = 8;
constexpr int kAbBlock = 8;

// Where a step's time goes over shared memory, as an A/B in the same processes: blocks of
// kAbBlock steps of each variant, alternating, kAbRounds times; medians into out[0..4]:
// the DDP step as measured (`step`), the same with gradient_as_bucket_view (no copies between
// gradients and buckets), the step under no_sync (no all-reduce), and a no_sync step followed
// by a barrier and one all_reduce of every gradient at once (nothing overlapped); out[4..5]:
// the barrier's part of that (the ranks waiting for each other) and the all_reduce's; out[6]:
// the one-process step (no DDP: a model of its own, plain autograd and SGD) in the same
// processes, both ranks at once, blocks started together by a barrier like the others.
template <typename Step>
void ab_steps(const std::shared_ptr<c10d::ProcessGroup>& group, ddp::DistributedDataParallel& model,
              Step& step, const std::pair<Tensor, Tensor>& data, double* out) {
  auto net = make_mlp();
  ddp::DistributedDataParallel view(
      net, group, {.bucket_cap_mb = kMainBucketMb, .gradient_as_bucket_view = true});
  optim::SGD view_sgd(net->parameters(), optim::SGDOptions{.lr = 0.01});
  auto view_step = [&] {
    view_sgd.zero_grad();
    nn::cross_entropy(view.forward(data.first), data.second).backward();
    view_sgd.step();
  };
  auto no_sync_step = [&] {
    const ddp::NoSyncGuard guard = model.no_sync();
    step();
  };
  Tensor flat = full({parameter_count(*net)}, Scalar(1), kFloat32);
  auto plain_net = make_mlp();
  optim::SGD plain_sgd(plain_net->parameters(), optim::SGDOptions{.lr = 0.01});
  auto plain_step = [&] {
    plain_sgd.zero_grad();
    nn::cross_entropy((*plain_net)(data.first), data.second).backward();
    plain_sgd.step();
  };
  std::vector<double> t[kAbFigures];
  auto then_all_reduce = [&] {
    no_sync_step();
    t[4].push_back(time_once([&] { group->barrier().wait(); }));
    t[5].push_back(time_once([&] { group->all_reduce(flat).wait(); }));
  };
  // Each variant with the t[] entry its step times go to.
  const std::vector<std::pair<std::function<void()>, size_t>> variants = {
      {step, 0}, {view_step, 1}, {no_sync_step, 2}, {then_all_reduce, 3}, {plain_step, 6}};
  for (auto& v : variants)
    v.first();
  for (int round = 0; round < kAbRounds; ++round) {
    for (const auto& [variant, at] : variants) {
      group->barrier().wait();
      for (int i = 0; i < kAbBlock; ++i)
        t[at].push_back(time_once(variant));
    }
  }
  for (size_t k = 0; k < kAbFigures; ++k)
    out[k] = median(t[k]);
}

// One run of `world` ranks over shared memory, bucket_cap_mb kMainBucketMb: rank 0's median
// step, CPU seconds per step and median all_reduce of every gradient at once, and the A/B.
std::vector<double> shm_rank_body(std::shared_ptr<c10d::Store> store, int rank, int world) {
  set_num_threads(kThreads);
  auto group = c10d::ProcessGroupShm::create(
      store, rank, world, {.timeout = 120s, .debug_level = c10d::DebugLevel::kOff},
      {.gloo = {.host = "127.0.0.1"}});
  const std::pair<Tensor, Tensor> data = batch(rank);
  auto barrier = [&] { group->barrier().wait(); };
  auto net = make_mlp();
  ddp::DistributedDataParallel model(net, group, {.bucket_cap_mb = kMainBucketMb});
  optim::SGD sgd(net->parameters(), optim::SGDOptions{.lr = 0.01});
  auto step = [&] {
    sgd.zero_grad();
    nn::cross_entropy(model.forward(data.first), data.second).backward();
    sgd.step();
  };
  std::vector<double> out(kShmFigures, -1.0);
  out[0] = median_step(step, barrier, &out[1]);
  if (world == kWorld) ab_steps(group, model, step, data, &out[3]);
  out[2] = median_all_reduce(*group, parameter_count(*net), rank);
  barrier();
  return out;
}

const std::vector<int> kShmWorlds = {2, 4};

// The median seconds of our one-process step (no DDP) of the model on `rank`'s batch, in the
// calling thread's intra-op setting; `sync` runs between the warm-up and the timed steps.
template <typename Sync>
double one_process_step(int rank, Sync&& sync) {
  auto net = make_mlp();
  optim::SGD sgd(net->parameters(), optim::SGDOptions{.lr = 0.01});
  const std::pair<Tensor, Tensor> data = batch(rank);
  auto step = [&] {
    sgd.zero_grad();
    nn::cross_entropy((*net)(data.first), data.second).backward();
    sgd.step();
  };
  return median_step(step, sync);
}

// The floor of ratio_to_single on this host: kWorld processes each running the one-process
// step (no DDP, no group, no communication) at the same time, kThreads threads each, started
// together through the store. Returns rank 0's median step.
std::vector<double> alone_together_body(std::shared_ptr<c10d::Store> store, int rank) {
  set_num_threads(kThreads);
  auto start_together = [&] {
    store->set("ready" + std::to_string(rank), std::string_view("1"));
    std::vector<std::string> keys;
    for (int r = 0; r < kWorld; ++r)
      keys.push_back("ready" + std::to_string(r));
    store->wait(keys);
  };
  return {one_process_step(rank, start_together)};
}

// Our single-process step of the same model on rank 0's batch, with kThreads threads.
double single_step() {
  const int saved = get_num_threads();
  set_num_threads(kThreads);
  const double seconds = one_process_step(0, [] {});
  set_num_threads(saved);
  return seconds;
}

const Register ddp_bench({"ddp.step_ms", "ddp.step_ms_bucket_mb"}, [](const auto& emit) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  std::vector<double> ours(kBucketMb.size(), inf);
  std::vector<double> buckets(kBucketMb.size(), nan);
  std::vector<double> cpu(kBucketMb.size(), nan);  // of the best round
  double no_sync = inf, allreduce = inf, numel = nan, single = inf, theirs = inf;
  double together = inf;  // alone_together_body's median step, best round
  std::string why, version;
  bool have_theirs = true;
  // Per kShmWorlds entry: best median step, its CPU per step, best all_reduce.
  std::vector<std::vector<double>> shm(kShmWorlds.size(), std::vector<double>(kShmFigures, -1.0));
  for (auto& figures : shm) {
    figures[0] = inf;
    figures[1] = nan;
    figures[2] = inf;
  }
  const std::string n = std::to_string(kThreads);
  for (int r = 0; r < kRounds; ++r) {
    const std::vector<double> mine = run_rank_processes(
        server.port(), "ddp" + std::to_string(r), kWorld,
        [r](std::shared_ptr<c10d::Store> store, int rank) { return rank_body(store, rank, r); },
        "ddp");
    if (mine.size() != RankFigures::count())
      throw std::runtime_error("ddp bench: the ranks returned " + std::to_string(mine.size()) +
                               " figures");
    for (size_t i = 0; i < kBucketMb.size(); ++i) {
      const size_t at = RankFigures::kPerBucketSize * i;
      if (mine[at] < ours[i]) {
        ours[i] = mine[at];
        cpu[i] = mine[at + 2];
      }
      buckets[i] = mine[at + 1];
    }
    for (size_t w = 0; w < kShmWorlds.size(); ++w) {
      const int world = kShmWorlds[w];
      const std::vector<double> got = run_rank_processes(
          server.port(), "ddp_shm" + std::to_string(world) + "_" + std::to_string(r), world,
          [world](std::shared_ptr<c10d::Store> store, int rank) {
            return shm_rank_body(store, rank, world);
          },
          "ddp shm");
      if (got.size() != kShmFigures)
        throw std::runtime_error("ddp bench: the shm ranks returned " + std::to_string(got.size()) +
                                 " figures");
      if (got[0] < shm[w][0]) {
        const double all_reduce = shm[w][2];
        shm[w] = got;  // the A/B of the best round with it
        shm[w][2] = all_reduce;
      }
      shm[w][2] = std::min(shm[w][2], got[2]);
    }
    no_sync = std::min(no_sync, mine[RankFigures::no_sync()]);
    allreduce = std::min(allreduce, mine[RankFigures::all_reduce()]);
    numel = mine[RankFigures::numel()];
    if (have_theirs) {
      auto peer =
          run_pytorch_peer("ddp_peer.py",
                           n + " " + std::to_string(kWarmup) + " " + std::to_string(kSteps) + " " +
                               std::to_string(static_cast<int>(kMainBucketMb)),
                           "OMP_NUM_THREADS=" + n + " OPENBLAS_NUM_THREADS=" + n, why);
      if (!peer) {
        have_theirs = false;
      } else {
        version = peer->torch_version;
        theirs = std::min(theirs, median(peer->seconds));
      }
    }
    single = std::min(single, single_step());
    const std::vector<double> pair = run_rank_processes(
        server.port(), "ddp_alone" + std::to_string(r), kWorld, alone_together_body, "ddp alone");
    if (pair.size() != 1)
      throw std::runtime_error("ddp bench: the one-process steps returned " +
                               std::to_string(pair.size()) + " figures");
    together = std::min(together, pair[0]);
  }

  const std::string statistic = "median of " + std::to_string(kSteps) + " steps after " +
                                std::to_string(kWarmup) + " warm-up, best of " +
                                std::to_string(kRounds) + " rounds";
  auto common = [&](Params& p) {
    p.push_back({"model", "784-1024-1024-1024-10 ReLU MLP"});
    p.push_back({"parameters", numel});
    p.push_back({"batch_per_rank", double(kBatch)});
    p.push_back({"dtype", "float32"});
    p.push_back({"ranks", double(kWorld)});
    p.push_back({"backend", "gloo (ProcessGroupGloo, processes on 127.0.0.1)"});
    p.push_back({"step",
                 "zero_grad + DDP forward + cross_entropy + backward (overlapped bucket "
                 "all-reduce) + SGD(lr=0.01)"});
    p.push_back({"first_bucket_mb", 1.0});
    p.push_back({"gradient_as_bucket_view", "false (both sides, the default)"});
    p.push_back({"threads_per_process", double(kThreads)});
    p.push_back({"threads_how",
                 "gradwire::set_num_threads(1) in each rank and for single_ms; "
                 "torch.set_num_threads(1) + OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1 in the "
                 "PyTorch ranks"});
    p.push_back({"blas_core", blas_core()});
    p.push_back({"statistic", statistic});
  };
  const size_t main_index = static_cast<size_t>(
      std::find(kBucketMb.begin(), kBucketMb.end(), kMainBucketMb) - kBucketMb.begin());
  const double ours_ms = ours[main_index] * 1e3;
  const double single_ms = single * 1e3;

  Figure f{"ddp.step_ms", ours_ms, "ms", {}};
  common(f.params);
  f.params.push_back({"bucket_cap_mb", kMainBucketMb});
  f.params.push_back({"buckets", buckets[main_index]});
  if (have_theirs) {
    f.params.push_back(
        {"pytorch", "torch " + version + " DistributedDataParallel, gloo, bucket_cap_mb 25"});
    f.params.push_back({"pytorch_ms", theirs * 1e3});
    f.params.push_back({"ratio_to_pytorch", ours_ms / (theirs * 1e3)});
  } else {
    f.params.push_back({"pytorch", "unavailable"});
    f.params.push_back({"pytorch_reason", why});
    f.params.push_back({"pytorch_ms", nan});
    f.params.push_back({"ratio_to_pytorch", nan});
  }
  f.params.push_back({"single_ms", single_ms});
  f.params.push_back({"single",
                      "our single-process step of the same model on one rank's batch (64), "
                      "no DDP, same threads, same run"});
  f.params.push_back({"ratio_to_single", ours_ms / single_ms});
  f.params.push_back({"cpu_ms_per_step", cpu[main_index] * 1e3});
  f.params.push_back({"cpu", "rank 0's process CPU time (user + system, all threads) per step"});
  f.params.push_back({"no_sync_ms", no_sync * 1e3});
  f.params.push_back({"no_sync",
                      "the same DDP step under no_sync(): both ranks computing at once, no "
                      "all-reduce"});
  f.params.push_back({"allreduce_ms", allreduce * 1e3});
  f.params.push_back(
      {"allreduce", "one all_reduce of every gradient at once (float32), alone, median of " +
                        std::to_string(kAllReduceCalls) + " calls"});
  f.params.push_back({"target_ratio_to_pytorch_max", 0.5});
  f.params.push_back({"target_ratio_to_single_max", 1.6});
  emit(f);

  for (size_t w = 0; w < kShmWorlds.size(); ++w) {
    const int world = kShmWorlds[w];
    const double shm_ms = shm[w][0] * 1e3;
    Figure g{"ddp.step_ms", shm_ms, "ms", {}};
    common(g.params);
    for (auto& [key, value] : g.params) {
      if (key == "ranks") value = double(world);
      if (key == "backend") value = std::string("shm (ProcessGroupShm, processes on one host)");
    }
    g.params.push_back({"bucket_cap_mb", kMainBucketMb});
    if (world == kWorld && have_theirs) {
      g.params.push_back(
          {"pytorch", "torch " + version + " DistributedDataParallel, gloo, bucket_cap_mb 25"});
      g.params.push_back({"pytorch_ms", theirs * 1e3});
      g.params.push_back({"ratio_to_pytorch", shm_ms / (theirs * 1e3)});
      g.params.push_back({"target_ratio_to_pytorch_max", 1 / 1.3});
    } else {
      g.params.push_back({"pytorch", have_theirs ? "not measured (the PyTorch peer runs two ranks)"
                                                 : "unavailable"});
      g.params.push_back({"pytorch_ms", nan});
      g.params.push_back({"ratio_to_pytorch", nan});
    }
    g.params.push_back({"single_ms", single_ms});
    g.params.push_back({"ratio_to_single", shm_ms / single_ms});
    if (world == kWorld) {
      g.params.push_back({"target_ratio_to_single_max", 1.2});
      g.params.push_back({"alone_together_ms", together * 1e3});
      g.params.push_back({"floor_ratio_to_single", together / single});
      g.params.push_back(
          {"alone_together",
           "this host's floor for ratio_to_single: " + std::to_string(kWorld) +
               " processes each running the one-process step (no DDP, no communication) at "
               "once, " +
               std::to_string(kThreads) +
               " thread each, rank 0's median, best of the rounds (floor_ratio_to_single: "
               "alone_together_ms / single_ms)"});
    }
    g.params.push_back({"gloo_ms", ours_ms});
    g.params.push_back({"ratio_to_gloo", shm_ms / ours_ms});
    g.params.push_back({"cpu_ms_per_step", shm[w][1] * 1e3});
    g.params.push_back({"allreduce_ms", shm[w][2] * 1e3});
    if (world == kWorld) {
      const char* names[kAbFigures] = {
          "ab_step_ms",    "ab_bucket_view_ms", "ab_no_sync_ms", "ab_no_sync_then_allreduce_ms",
          "ab_barrier_ms", "ab_allreduce_ms",   "ab_plain_ms"};
      for (size_t k = 0; k < kAbFigures; ++k)
        g.params.push_back({names[k], shm[w][3 + k] >= 0 ? shm[w][3 + k] * 1e3 : nan});
      // The step over the one-process step both ranks ran in the same processes, in blocks
      // alternating with it: what DDP adds, with the host's share (two ranks computing at
      // once, the moment's load) the same on both sides.
      const double ab_step = shm[w][3];                    // names[0]
      const double ab_plain = shm[w][3 + kAbFigures - 1];  // names[kAbFigures - 1]
      g.params.push_back({"ab_ratio_to_plain", ab_step / ab_plain});
      g.params.push_back(
          {"ab", "diagnostic, same processes, the best round's: " + std::to_string(kAbRounds) +
                     " rounds of alternating blocks of " + std::to_string(kAbBlock) +
                     " steps each, medians: the step as measured (ab_step_ms), with "
                     "gradient_as_bucket_view (ab_bucket_view_ms), under no_sync "
                     "(ab_no_sync_ms), and a no_sync step then a barrier (ab_barrier_ms: the "
                     "ranks waiting for each other) and one all_reduce of every gradient "
                     "(ab_allreduce_ms), nothing overlapped (ab_no_sync_then_allreduce_ms: the "
                     "three together); and the one-process step without DDP, both ranks at "
                     "once (ab_plain_ms; ab_ratio_to_plain: ab_step_ms over it)"});
    }
    emit(g);
  }

  for (size_t i = 0; i < kBucketMb.size(); ++i) {
    Figure b{"ddp.step_ms_bucket_mb", ours[i] * 1e3, "ms", {}};
    b.params.push_back({"bucket_cap_mb", kBucketMb[i]});
    b.params.push_back({"buckets", buckets[i]});
    common(b.params);
    b.params.push_back({"cpu_ms_per_step", cpu[i] * 1e3});
    b.params.push_back({"single_ms", single_ms});
    b.params.push_back({"ratio_to_single", ours[i] * 1e3 / single_ms});
    emit(b);
  }
});

}  // namespace
}  // namespace gradwire::bench
