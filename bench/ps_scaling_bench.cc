// ps.samples_per_s_scaling: how parameter-server training scales with trainers and servers on
// this host. For every servers S in kServerCounts and trainers T in kTrainerCounts, S + T
// processes on this machine (they meet through a TCPStore served here):
//
// "ps0".."ps<S-1>" (ranks 0..S-1) each hold one slice of the ps.samples_per_s model, a
// 784-128-10 ReLU MLP: server s holds a dist_nn::RemoteModule<nn::MLP> 784-(128/S)-10, the
// hidden units s*128/S.. of the first layer and the matching columns of the second, so the
// model is the same whatever S (its output bias is the sum of the S slices' biases), and the
// parameters and the computation are split evenly. The module's forward runs on a copy of
// its parameters taken at its start (ForwardParameters::kSnapshot, as ps.samples_per_s's
// server does by hand). "trainer1".."trainer<T>" (ranks S..S+T-1) each take the S slices'
// references and their parameters, and one DistributedOptimizer(SGD lr 0.01) of their own
// over all of them: asynchronous private optimizers, PyTorch's design (no TrainerGroup; each
// server applies every trainer's update as it comes, one at a time). One step:
//   dist_autograd::Context ctx; the S slices' forward_async(x) at once, their outputs summed
//   into the logits; nn::cross_entropy; optimizer.backward_and_step(ctx, {loss}); loss.item()
// on a batch of 64 (each trainer cycles through kBatches batches of randn inputs and random
// labels of 10 classes).
//
// The window: after kWarmup steps each, the trainers meet at a barrier; the last one names a
// start time kStartMarginS ahead and all begin then; each steps until kWindowS have passed
// since the start and reports its steps and the end of its last one. The figure is the sum
// over the trainers of each one's samples over its part of the common window (steps x 64 /
// (its last step's end - the start)): every trainer runs throughout the window, so this is
// all trainers' samples per second while all of them are running. Each trainer checks that
// its loss went down (the mean over its last kBatches steps below that over its first
// kBatches warm-up steps); every server checks that only its own module's reference is left
// before the agents shut down.
//
// The bound the host allows (params.bound_samples_per_s; params.ratio_to_bound is the
// figure over it), from three floors measured in the same run:
// - the computation (local_step_ms): the same step in one process without RPC (the S slices'
//   forwards on copies of their parameters, cross-entropy, autograd backward, optim::SGD),
//   and the same while `cores` processes each compute it at once (local_step_together_ms:
//   what the host's cores give each of them when all are busy, the plain step both ranks
//   compute at once of the project's other floors);
// - the calls (calls_ms, calls_cpu_ms): two plain calls to every server, crossing as the step
//   does (x out and a 64x10 tensor back, all servers at once; then a 64x10 tensor out and an
//   integer back), with no autograd, no optimizer and no computation: the median pair, and
//   the CPU time a pair costs all the processes together (getrusage, user + system, the
//   trainer's and the servers'); measured by the one trainer of the (S, 1) run after its
//   window;
// - the updates (update_ms): optim::SGD's step over the model's parameters alone, one
//   process; a server applies the updates of its slice one at a time.
// Then: latency bound T x 64 / (local_step + calls_ms) (each trainer's steps one after the
// other, nothing shared); CPU bound cores x 64 / (local_step_together + calls_cpu) (every
// core busy with steps' work); update bound S x 64 / update_ms (the servers' serialised
// updates); bound = the least of the three (params.bound_by names it).
// Diagnostics: step_ms (median over the trainers of their median step), cpu_busy_fraction
// (all processes' CPU time over the window / (cores x window)), cpu_ms_per_step and its
// trainer_ and server_ parts (CPU time over the window per step) and cpu_per_step_over_floor
// (cpu_ms_per_step over local_step_together + calls_cpu: what a step costs beyond its
// computation and two plain calls), the busiest server's CPU as a fraction of one core
// (server_cpu_max_core_fraction), and scaling (the figure over the same S with one trainer).
//
// Threads: one intra-op thread per process (gradwire::set_num_threads(1)), kPoolThreads agent
// pool threads, the agent's polling defaults (transport_spin, transport_spin_awaiting) unless
// $GRADWIRE_BENCH_PS_SPIN_US sets both (0: no polling; params.transport_spin_us says which).
// One run per (S, T), kRounds rounds of the whole grid, each (S, T) keeping its best round,
// so that the grid stays short (about a minute on a 2-core host).
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/future.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_nn/remote_module.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/nn/loss.h"
#include "gradwire/nn/sequential.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/parallel.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
using rref::RRef;
using Host = dist_nn::ModuleHost<nn::MLP>;

constexpr int64_t kIn = 784, kHidden = 128, kOut = 10;
constexpr int64_t kBatch = 64;
constexpr double kLr = 0.01;
constexpr int kThreads = 1;  // intra-op threads per process
constexpr int kPoolThreads = 8;
constexpr int kBatches = 8;            // random batches each trainer cycles through
constexpr int kWarmup = 16;            // untimed steps per trainer
constexpr double kWindowS = 1.0;       // the timed window
constexpr double kStartMarginS = 0.1;  // from the barrier's end to the window's start
constexpr int kServerCounts[] = {1, 2, 4};
constexpr int kTrainerCounts[] = {1, 2, 4, 8, 16};
constexpr int kRounds = 2;
constexpr int kCallPairs = 300;   // plain-call pairs timed for the calls floor
constexpr int kLocalSteps = 120;  // one-process steps timed for the computation floor

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("ps scaling bench: " + what);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// This process's CPU time (user + system, all threads), seconds.
double process_cpu_s() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
         static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

// The CPUs this process may run on.
int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// Slice s of S: 784-(128/S)-10, seeded by s.
std::shared_ptr<nn::MLP> make_slice(int64_t hidden, int64_t seed) {
  Generator gen(static_cast<uint64_t>(seed));
  return std::make_shared<nn::MLP>(nn::MLPOptions{.sizes = {kIn, hidden, kOut}, .generator = &gen});
}

std::string seconds_text(double s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", s);
  return text;
}

// $GRADWIRE_BENCH_PS_SPIN_US: the transports' polling window (transport_spin and
// transport_spin_awaiting both) in every process of the grid, in [0, 1 s]; -1 when unset
// (the agent's defaults).
int64_t spin_override() {
  const char* text = std::getenv("GRADWIRE_BENCH_PS_SPIN_US");
  if (text == nullptr || *text == '\0') return -1;
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (*end != '\0' || v < 0 || v > 1'000'000) {
    throw std::invalid_argument(std::string("GRADWIRE_BENCH_PS_SPIN_US: expected microseconds "
                                            "in [0, 1000000], received '") +
                                text + "'");
  }
  return v;
}

std::string server_name(int s) {
  return "ps" + std::to_string(s);
}

void make_batches(int rank, std::vector<Tensor>& xs, std::vector<Tensor>& ys) {
  Generator gen(static_cast<uint64_t>(100 + rank));
  for (int b = 0; b < kBatches; ++b) {
    xs.push_back(randn({kBatch, kIn}, &gen));
    ys.push_back(randint(0, kOut, {kBatch}, &gen));
  }
}

// What rank 0 (ps0) returns, in this order.
enum Result : size_t {
  kRate,              // samples/s, summed over the trainers
  kStepS,             // median over the trainers of their median step
  kTotalSteps,        // all trainers' steps in the window
  kWindowWallS,       // the start to the last trainer's last step's end
  kTrainerCpuS,       // the trainers' CPU time over their windows, summed
  kServerCpuS,        // the servers' CPU time over the window, summed
  kServerCpuMaxCore,  // the busiest server's CPU time / the window
  kCallsS,            // (S, 1) only: the median plain-call pair; -1 otherwise
  kCallsCpuS,         // (S, 1) only: CPU time per pair, all processes; -1 otherwise
  kResults
};

std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank, int servers,
                              int trainers) {
  set_num_threads(kThreads);
  Future<RRef<Host>> slice_ref;  // set once this server has made its slice
  rpc::Registry reg;
  dist_nn::register_remote_module<nn::MLP>(reg, "Slice").ctor<int64_t, int64_t>(&make_slice);
  reg.def("slice", [slice_ref] { return slice_ref; });
  reg.def("ping", [] { return int64_t{0}; });
  reg.def("cpu_seconds", [] { return process_cpu_s(); });
  // The calls floor's two plain calls: what the step's crossings carry, nothing computed.
  reg.def("plain_forward", [](const Tensor& x) { return zeros({x.size(0), kOut}); });
  reg.def("plain_backward", [](const Tensor& g) { return g.size(0); });
  rpc::AgentOptions options = rank_agent_options(reg);
  options.num_worker_threads = kPoolThreads;
  if (const int64_t spin = spin_override(); spin >= 0) {
    options.transport_spin = std::chrono::microseconds(spin);
    options.transport_spin_awaiting = options.transport_spin;
  }
  const bool server = rank < servers;
  const int trainer = rank - servers + 1;
  const std::string name = server ? server_name(rank) : "trainer" + std::to_string(trainer);
  auto agent = rpc::make_tensorpipe_agent(name, rank, servers + trainers, store, options);
  std::vector<double> out;
  std::vector<std::string> span_keys;
  for (int k = 1; k <= trainers; ++k)
    span_keys.push_back("span" + std::to_string(k));
  if (server) {
    {
      dist_nn::RemoteModule<nn::MLP> slice(*agent, name, "Slice", kHidden / servers,
                                           int64_t{1 + rank});
      slice_ref.set_value(slice.module_rref());
      // Every connection to the trainers is made before they start, so that none is set up
      // inside the window.
      for (int k = 1; k <= trainers; ++k)
        expect(agent->rpc_sync<int64_t>("trainer" + std::to_string(k), "ping") == 0, "ping");
      store->set("connected" + std::to_string(rank), "1");
      const double start = std::stod(store->get_string("go", 120s));
      std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(start))));
      const double cpu0 = process_cpu_s();
      store->wait(span_keys, 120s);
      const double cpu = process_cpu_s() - cpu0, wall = now_s() - start;
      std::ostringstream os;
      os.precision(17);
      os << cpu << ' ' << wall;
      store->set("server" + std::to_string(rank), std::string_view(os.str()));
      if (rank == 0) {
        out.assign(kResults, -1.0);
        double rate = 0, total = 0, last_end = 0, trainer_cpu = 0;
        std::vector<double> steps;
        for (const std::string& key : span_keys) {
          std::istringstream is(store->get_string(key));
          double count = 0, begin = 0, end = 0, step = 0, tcpu = 0;
          is >> count >> begin >> end >> step >> tcpu;
          expect(count > 0 && end > begin, key + ": no step in the window");
          rate += count * kBatch / (end - begin);
          total += count;
          last_end = std::max(last_end, end - begin);
          steps.push_back(step);
          trainer_cpu += tcpu;
        }
        double server_cpu = 0, server_max = 0;
        for (int s = 0; s < servers; ++s) {
          std::istringstream is(store->get_string("server" + std::to_string(s), 120s));
          double c = 0, w = 0;
          is >> c >> w;
          server_cpu += c;
          server_max = std::max(server_max, c / w);
        }
        out[kRate] = rate;
        out[kStepS] = median(steps);
        out[kTotalSteps] = total;
        out[kWindowWallS] = last_end;
        out[kTrainerCpuS] = trainer_cpu;
        out[kServerCpuS] = server_cpu;
        out[kServerCpuMaxCore] = server_max;
        if (trainers == 1) {
          std::istringstream is(store->get_string("calls", 120s));
          is >> out[kCallsS] >> out[kCallsCpuS];
        }
      }
      std::vector<std::string> idle;
      for (int k = 1; k <= trainers; ++k)
        idle.push_back("idle" + std::to_string(k));
      store->wait(idle, 120s);
    }
    // Only the server's own reference to its slice (the one in slice_ref) is left.
    expect(rref::wait_owned_values(*agent, 1, 60s), name + ": references left");
  } else {
    std::vector<Tensor> xs, ys;
    make_batches(rank, xs, ys);
    std::vector<std::string> connected;
    for (int s = 0; s < servers; ++s)
      connected.push_back("connected" + std::to_string(s));
    store->wait(connected, 120s);
    {
      std::vector<dist_nn::RemoteModule<nn::MLP>> slices;
      std::vector<RRef<Tensor>> params;
      for (int s = 0; s < servers; ++s) {
        slices.emplace_back(agent->rpc_sync<RRef<Host>>(server_name(s), "slice"));
        for (auto& p : slices.back().remote_parameters())
          params.push_back(std::move(p));
      }
      dist_optim::DistributedOptimizer optimizer(*agent, optim::SGDOptions{.lr = kLr},
                                                 std::move(params));
      std::vector<Future<Tensor>> outs;
      auto step = [&](int i) {
        const size_t b = static_cast<size_t>(i % kBatches);
        Tensor loss;
        {
          dist_autograd::Context ctx(*agent);
          outs.clear();
          for (auto& slice : slices)
            outs.push_back(slice.forward_async(xs[b]));
          Tensor logits = outs[0].get(120s);
          for (size_t s = 1; s < outs.size(); ++s)
            logits = add(logits, outs[s].get(120s));
          loss = nn::cross_entropy(logits, ys[b]);
          optimizer.backward_and_step(ctx.id(), {loss});
        }
        return loss.item<double>();
      };
      double first_loss = 0;
      for (int i = 0; i < kWarmup; ++i) {
        const double loss = step(i);
        if (i < kBatches) first_loss += loss / kBatches;
      }
      if (store->add("ready", 1) == trainers) {
        std::ostringstream os;
        os.precision(17);
        os << now_s() + kStartMarginS;
        store->set("go", std::string_view(os.str()));
      }
      const double start = std::stod(store->get_string("go", 120s));
      std::this_thread::sleep_until(std::chrono::steady_clock::time_point(
          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
              std::chrono::duration<double>(start))));
      const double cpu0 = process_cpu_s();
      std::vector<double> times, losses;
      double end = start;
      for (int i = 0; end < start + kWindowS; ++i) {
        const double t0 = now_s();
        losses.push_back(step(i));
        end = now_s();
        times.push_back(end - t0);
      }
      const double cpu = process_cpu_s() - cpu0;
      expect(losses.size() >= static_cast<size_t>(kBatches),
             name + " made " + std::to_string(losses.size()) + " steps in the window, fewer than " +
                 std::to_string(kBatches));
      double last_loss = 0;
      for (size_t i = losses.size() - kBatches; i < losses.size(); ++i)
        last_loss += losses[i] / kBatches;
      expect(last_loss < first_loss, name + "'s loss did not go down (" +
                                         std::to_string(first_loss) + " -> " +
                                         std::to_string(last_loss) + ")");
      std::ostringstream os;
      os.precision(17);
      os << double(times.size()) << ' ' << start << ' ' << end << ' ' << median(times) << ' '
         << cpu;
      store->set("span" + std::to_string(trainer), std::string_view(os.str()));
      if (trainers == 1) {
        // The calls floor, after the window (the servers wait for this trainer's "idle").
        const Tensor x = xs[0], g = zeros({kBatch, kOut});
        std::vector<Future<Tensor>> fwd;
        std::vector<Future<int64_t>> bwd;
        auto pair = [&] {
          fwd.clear();
          bwd.clear();
          for (int s = 0; s < servers; ++s)
            fwd.push_back(agent->rpc_async<Tensor>(server_name(s), "plain_forward", x));
          for (auto& f : fwd)
            (void)f.get(120s);
          for (int s = 0; s < servers; ++s)
            bwd.push_back(agent->rpc_async<int64_t>(server_name(s), "plain_backward", g));
          for (auto& f : bwd)
            (void)f.get(120s);
        };
        auto servers_cpu = [&] {
          double total = 0;
          for (int s = 0; s < servers; ++s)
            total += agent->rpc_sync<double>(server_name(s), "cpu_seconds");
          return total;
        };
        for (int i = 0; i < 30; ++i)
          pair();
        const double server0 = servers_cpu(), self0 = process_cpu_s();
        const std::vector<double> pairs = time_calls(0, kCallPairs, pair);
        const double self1 = process_cpu_s(), server1 = servers_cpu();
        std::ostringstream calls;
        calls.precision(17);
        calls << median(pairs) << ' ' << ((self1 - self0) + (server1 - server0)) / kCallPairs;
        store->set("calls", std::string_view(calls.str()));
      }
    }
    rref::wait_idle(*agent, 60s);
    store->set("idle" + std::to_string(trainer), "1");
  }
  agent->shutdown();
  return out;
}

// The step's computation without RPC, `servers` slices in this process: the slices'
// forwards on copies of their parameters (as the servers' kSnapshot forwards), their outputs
// summed, cross-entropy, autograd backward, optim::SGD. Returns the median step and the
// median optim::SGD step alone, seconds.
std::pair<double, double> local_steps(int servers, int rank) {
  std::vector<std::shared_ptr<nn::MLP>> slices;
  std::vector<Tensor> params;
  for (int s = 0; s < servers; ++s) {
    slices.push_back(make_slice(kHidden / servers, 1 + s));
    for (const Tensor& p : slices.back()->parameters())
      params.push_back(p);
  }
  optim::SGD sgd(params, optim::SGDOptions{.lr = kLr});
  std::vector<Tensor> xs, ys;
  make_batches(rank, xs, ys);
  std::vector<double> updates;
  auto step = [&](int i) {
    const size_t b = static_cast<size_t>(i % kBatches);
    sgd.zero_grad();
    Tensor logits;
    for (const auto& slice : slices) {
      std::vector<Tensor> p;
      for (const Tensor& param : slice->parameters())
        p.push_back(param.clone());
      const Tensor h = relu(add(matmul(xs[b], p[0].transpose(0, 1)), p[1]));
      const Tensor y = add(matmul(h, p[2].transpose(0, 1)), p[3]);
      logits = logits.defined() ? add(logits, y) : y;
    }
    nn::cross_entropy(logits, ys[b]).backward();
    updates.push_back(time_once([&] { sgd.step(); }));
  };
  for (int i = 0; i < 20; ++i)
    step(i);
  updates.clear();
  std::vector<double> times;
  for (int i = 0; i < kLocalSteps; ++i)
    times.push_back(time_once([&] { step(i); }));
  return {median(times), median(updates)};
}

// The computation floors for `servers` slices: `cores` processes each run local_steps at
// once after a barrier (the median over them of their median step), then rank 0 alone.
// Rank 0 returns {alone step, together step, alone update}.
std::vector<double> local_body(std::shared_ptr<c10d::Store> store, int rank, int servers,
                               int cores) {
  set_num_threads(kThreads);
  (void)local_steps(servers, rank);  // warm: pages touched, caches filled
  if (store->add("ready", 1) == cores) store->set("go", "1");
  store->wait({"go"}, 120s);
  const double together = local_steps(servers, rank).first;
  std::ostringstream os;
  os.precision(17);
  os << together;
  store->set("together" + std::to_string(rank), std::string_view(os.str()));
  if (rank != 0) return {};
  std::vector<double> all;
  for (int r = 0; r < cores; ++r)
    all.push_back(std::stod(store->get_string("together" + std::to_string(r), 120s)));
  const auto [alone, update] = local_steps(servers, rank);
  return {alone, median(all), update};
}

const Register ps_scaling_bench({"ps.samples_per_s_scaling"}, [](const auto& emit) {
  constexpr size_t kS = std::size(kServerCounts), kT = std::size(kTrainerCounts);
  const int cores = usable_cores();
  (void)spin_override();  // a bad value is refused before any process starts
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  std::vector<std::vector<std::vector<double>>> best(
      kS, std::vector<std::vector<double>>(kT, std::vector<double>(kResults, -1.0)));
  std::vector<std::vector<double>> local(kS, std::vector<double>(3, -1.0));
  const double grid_start = now_s();
  for (int round = 0; round < kRounds; ++round) {
    for (size_t si = 0; si < kS; ++si) {
      const int servers = kServerCounts[si];
      const std::string tag = std::to_string(round) + "_" + std::to_string(servers);
      const std::vector<double> l = run_rank_processes(
          server.port(), "psscale_local" + tag, cores,
          [servers, cores](std::shared_ptr<c10d::Store> store, int rank) {
            return local_body(std::move(store), rank, servers, cores);
          },
          "ps scaling local");
      expect(l.size() == 3, "the local run returned " + std::to_string(l.size()) + " figures");
      // Each floor keeps its least over the rounds.
      for (size_t k = 0; k < 3; ++k)
        local[si][k] = local[si][k] < 0 ? l[k] : std::min(local[si][k], l[k]);
      for (size_t ti = 0; ti < kT; ++ti) {
        const int trainers = kTrainerCounts[ti];
        const std::vector<double> r = run_rank_processes(
            server.port(), "psscale" + tag + "_" + std::to_string(trainers), servers + trainers,
            [servers, trainers](std::shared_ptr<c10d::Store> store, int rank) {
              return rank_body(std::move(store), rank, servers, trainers);
            },
            "ps scaling");
        expect(r.size() == kResults,
               "the server returned " + std::to_string(r.size()) + " figures");
        std::vector<double>& b = best[si][ti];
        const double calls = b[kCallsS], calls_cpu = b[kCallsCpuS];
        if (r[kRate] > b[kRate]) b = r;
        // The calls floor keeps its least over the rounds, whichever round the rate took.
        if (calls >= 0) {
          b[kCallsS] = std::min(b[kCallsS], calls);
          b[kCallsCpuS] = std::min(b[kCallsCpuS], calls_cpu);
        }
      }
    }
  }
  const double grid_s = now_s() - grid_start;

  for (size_t si = 0; si < kS; ++si) {
    const int servers = kServerCounts[si];
    const double local_step = local[si][0], together = local[si][1], update = local[si][2];
    const double calls = best[si][0][kCallsS], calls_cpu = best[si][0][kCallsCpuS];
    const double one_trainer = best[si][0][kRate];
    for (size_t ti = 0; ti < kT; ++ti) {
      const int trainers = kTrainerCounts[ti];
      const std::vector<double>& r = best[si][ti];
      const double latency_bound = trainers * kBatch / (local_step + calls);
      const double cpu_bound = cores * kBatch / (together + calls_cpu);
      const double update_bound = servers * kBatch / update;
      const double bound = std::min({latency_bound, cpu_bound, update_bound});
      const char* bound_by = bound == latency_bound ? "latency"
                             : bound == cpu_bound   ? "cpu"
                                                    : "updates";
      const double window = r[kWindowWallS];
      Figure f{"ps.samples_per_s_scaling", r[kRate], "samples/s", {}};
      f.params.push_back({"servers", double(servers)});
      f.params.push_back({"trainers", double(trainers)});
      f.params.push_back({"processes", double(servers + trainers)});
      f.params.push_back({"cores", double(cores)});
      f.params.push_back(
          {"model",
           "784-128-10 ReLU MLP, float32, split over the servers: server s holds a "
           "dist_nn::RemoteModule<nn::MLP> 784-(128/S)-10 (its hidden units and their output "
           "columns; the logits are the sum of the S slices' outputs), forward on a copy of "
           "its parameters (kSnapshot)"});
      f.params.push_back({"batch", double(kBatch)});
      f.params.push_back(
          {"step",
           "dist_autograd::Context; the S slices' forward_async(x) at once, summed; "
           "nn::cross_entropy; DistributedOptimizer(SGD lr 0.01).backward_and_step(ctx, "
           "{loss}); loss.item()"});
      f.params.push_back(
          {"optimizer",
           "asynchronous private optimizers (PyTorch's design): one DistributedOptimizer per "
           "trainer over every slice, no TrainerGroup; each server applies every trainer's "
           "update as it arrives, one at a time"});
      f.params.push_back({"threads_per_process", double(kThreads)});
      f.params.push_back({"pool_threads", double(kPoolThreads)});
      f.params.push_back(
          {"statistic",
           "after " + std::to_string(kWarmup) +
               " warm-up steps per trainer and a barrier, all trainers start together and "
               "step for a window of " +
               seconds_text(kWindowS) +
               " s; the sum over the trainers of each one's samples / (its last step's end - "
               "the start); best of " +
               std::to_string(kRounds) + " rounds of the grid"});
      f.params.push_back({"window_s", window});
      f.params.push_back({"steps", r[kTotalSteps]});
      f.params.push_back({"step_ms", r[kStepS] * 1e3});
      f.params.push_back({"one_trainer_samples_per_s", one_trainer});
      f.params.push_back({"scaling", r[kRate] / one_trainer});
      f.params.push_back({"local_step_ms", local_step * 1e3});
      f.params.push_back({"local_step_together_ms", together * 1e3});
      f.params.push_back({"update_ms", update * 1e3});
      f.params.push_back({"calls_ms", calls * 1e3});
      f.params.push_back({"calls_cpu_ms", calls_cpu * 1e3});
      f.params.push_back({"latency_bound_samples_per_s", latency_bound});
      f.params.push_back({"cpu_bound_samples_per_s", cpu_bound});
      f.params.push_back({"update_bound_samples_per_s", update_bound});
      f.params.push_back({"bound_samples_per_s", bound});
      f.params.push_back({"bound_by", bound_by});
      f.params.push_back({"ratio_to_bound", r[kRate] / bound});
      f.params.push_back(
          {"bound",
           "the least of: latency, trainers x 64 / (local_step + calls) (each trainer's steps "
           "in turn); cpu, cores x 64 / (local_step_together + calls_cpu) (every core busy "
           "with steps' work); updates, servers x 64 / update (each server's updates one at a "
           "time). local_step: the step's computation in one process, no RPC; "
           "local_step_together: the same while `cores` processes compute it at once; calls: "
           "two plain calls to every server crossing as the step does (x out, 64x10 back; "
           "64x10 out, an integer back), no computation, median pair; calls_cpu: the CPU time "
           "a pair costs all processes together; update: optim::SGD's step alone"});
      const double busy = (r[kTrainerCpuS] + r[kServerCpuS]) / (cores * window);
      const double cpu_per_step = (r[kTrainerCpuS] + r[kServerCpuS]) / r[kTotalSteps];
      f.params.push_back({"cpu_ms_per_step", cpu_per_step * 1e3});
      f.params.push_back({"cpu_per_step_over_floor", cpu_per_step / (together + calls_cpu)});
      f.params.push_back(
          {"cpu",
           "getrusage (user + system, all threads) of every process over the window: "
           "cpu_busy_fraction, all of it / (cores x window); cpu_ms_per_step, all of it / the "
           "steps; cpu_per_step_over_floor, that over local_step_together + calls_cpu"});
      f.params.push_back({"cpu_busy_fraction", busy});
      f.params.push_back({"trainer_cpu_ms_per_step", r[kTrainerCpuS] * 1e3 / r[kTotalSteps]});
      f.params.push_back({"server_cpu_ms_per_step", r[kServerCpuS] * 1e3 / r[kTotalSteps]});
      f.params.push_back({"server_cpu_max_core_fraction", r[kServerCpuMaxCore]});
      const rpc::AgentOptions defaults;
      const int64_t spin = spin_override();
      f.params.push_back(
          {"transport_spin_us", double(spin >= 0 ? spin : defaults.transport_spin.count())});
      f.params.push_back({"transport_spin_awaiting_us",
                          double(spin >= 0 ? spin : defaults.transport_spin_awaiting.count())});
      f.params.push_back({"grid_s", grid_s});
      f.params.push_back({"blas_core", blas_core()});
      emit(f);
    }
  }
});

}  // namespace
}  // namespace gradwire::bench
