// ps figures: PyTorch's RPC parameter-server tutorial pattern, as examples/parameter_server
// does it, with processes on this machine (they meet through a TCPStore served here),
// against PyTorch 1.13 doing the same (bench/pytorch/ps_peer.py), all in the same run.
//
// "ps" (rank 0) holds a ParameterServer object: a 784-128-10 ReLU MLP (nn::MLP). Trainers
// "trainer1".."trainerT" (ranks 1..T) each get an RRef to it (rpc_sync "parameter_server"
// on ps, which returns rref::make_local of the object), its parameters' RRefs (the
// "parameter_rrefs" method) and a DistributedOptimizer(SGD lr 0.01) over them. Each trainer
// cycles through kBatches random batches of 64 (randn inputs, random labels of 10
// classes); one step:
//   dist_autograd::Context ctx; logits = ps.rpc_sync<Tensor>("forward", x);
//   loss = nn::cross_entropy(logits, y); optimizer.backward_and_step(ctx, {loss})
//   (dist_autograd's backward; the server, whose part ends last, steps as it ends, without a
//   round trip of its own); loss.item()
// The server's forward computes with a copy of the parameters taken at its start (the
// gradient reaches the parameters through the copy; docs/parameter-server.md explains why
// an asynchronous server needs it), on both sides.
//   ps.samples_per_s           one trainer: samples per second over kSteps timed steps
//                              after kWarmup; baseline: PyTorch's rpc.remote /
//                              RRef.rpc_sync().forward / dist_autograd /
//                              DistributedOptimizer(optim.SGD) doing the same
//                              (params.pytorch_samples_per_s)
//   ps.samples_per_s_trainers  1, 2 and 4 trainers against the one server, each trainer
//                              kSteps timed steps after kWarmup and a barrier: all
//                              trainers' samples over the window from the first start to
//                              the last end; PyTorch's for the same counts
//   ps.samples_per_s_traced    one trainer's samples per second with gradwire::trace recording
//                              in both processes; baseline: the same steps with tracing off,
//                              in blocks of kBlockSteps that alternate with the traced ones in
//                              the same processes (params.untraced_samples_per_s), and their
//                              ratio. The cost of tracing compiled in but off is estimated as
//                              (events recorded per traced step, both processes) x (a
//                              disabled span's cost, measured here) / the untraced step
//                              (params.off_cost_fraction): no build without tracing exists
//                              to compare with.
// Diagnostics in params: the trainers' median step and the medians of its phases
// (forward_ms, backward_ms, release_ms), the median step with backward() then step() in
// the same processes (separate_step_ms, separate_optimizer_ms), PyTorch's median step
// (pytorch_step_ms), and the same step in one process without RPC (local_step_ms: the
// computation both sides share).
// Each trainer checks that its loss went down (the mean over its last kBatches timed
// steps below that over its first kBatches warm-up steps); the server checks, before the
// agents shut down, that every reference the trainers held is gone. The server opens its
// connections to the trainers (a "ping" each) before they start (see rank_body).
//
// Threads: every process uses kThreads intra-op threads (gradwire::set_num_threads;
// torch.set_num_threads + OMP_NUM_THREADS + OPENBLAS_NUM_THREADS in the PyTorch
// processes). Every agent has kPoolThreads pool threads, on both sides.
//
// Rounds: our configurations and the PyTorch peer (all three counts) run one after the
// other, kRounds times, and each side keeps its best round per count, so that drift on a
// shared machine favours neither.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/future.h"
#include "gradwire/core/trace.h"
#include "gradwire/dist_autograd/dist_autograd.h"
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

constexpr int64_t kIn = 784, kHidden = 128, kOut = 10;
constexpr int64_t kBatch = 64;
constexpr double kLr = 0.01;
constexpr int kThreads = 1;  // intra-op threads per process, every side
constexpr int kPoolThreads = 8;
constexpr int kBatches = 8;  // random batches each trainer cycles through
constexpr int kWarmup = 20;  // untimed steps per trainer
constexpr int kSteps = 300;  // timed steps per trainer
constexpr int kTrainerCounts[] = {1, 2, 4};
constexpr int kRounds = 3;
constexpr int kTraceBlocks = 8;  // ps.samples_per_s_traced: traced blocks (as many untraced)
constexpr int kBlockSteps = 30;  // steps per block

void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("ps bench: " + what);
}

// The model behind the server's RRef. Forwards from several trainers run concurrently on
// the pool threads while the optimizer updates the parameters in place; each forward works
// on a copy of them (as examples/parameter_server does).
class ParameterServer {
 public:
  explicit ParameterServer(uint64_t seed)
      : gen_(seed), net_(nn::MLPOptions{.sizes = {kIn, kHidden, kOut}, .generator = &gen_}) {}

  Tensor forward(const Tensor& x) {
    std::vector<Tensor> p;
    for (const Tensor& param : net_.parameters())
      p.push_back(param.clone());
    const Tensor h = relu(add(matmul(x, p[0].transpose(0, 1)), p[1]));
    return add(matmul(h, p[2].transpose(0, 1)), p[3]);
  }

  std::vector<Tensor> parameters() const { return net_.parameters(); }

  std::vector<RRef<Tensor>> parameter_rrefs(const rpc::CallContext& ctx) {
    std::vector<RRef<Tensor>> refs;
    for (const Tensor& p : net_.parameters())
      refs.push_back(rref::make_local(*ctx.agent(), p));
    return refs;
  }

 private:
  Generator gen_;
  nn::MLP net_;
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// What rank 0 (the server) returns, in this order: the window (from the first trainer's
// timed start to the last one's end; steady_clock is CLOCK_MONOTONIC, one clock for every
// process here), then the trainers' median step and the medians of its phases (kForward:
// context + forward call; kBackward: cross-entropy + backward; kOptimizer: the optimizer
// step; kRelease: the context's end), each the median over the trainers of their medians.
// The timed steps use DistributedOptimizer::backward_and_step (kBackward covers it); after the
// window a single trainer runs kAbBlocks blocks of kAbBlockSteps steps, alternating
// backward_and_step (kFusedAb: their median step) with backward() then step() (kSeparateStep:
// their median step; kOptimizer: their step() phase): the A/B of the two in one process
// (not measured with more trainers).
enum Figures : size_t {
  kWindow,
  kStep,
  kForward,
  kBackward,
  kOptimizer,
  kRelease,
  kSeparateStep,
  kFusedAb,
  kCount
};
// The A/B after the window: blocks of kAbBlockSteps steps, fused and separate alternating.
constexpr int kAbBlocks = 12;
constexpr int kAbBlockSteps = 25;

std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank, int trainers) {
  set_num_threads(kThreads);
  const int world = 1 + trainers;
  Future<RRef<ParameterServer>> server_ref;  // set once the server's agent is up
  rpc::Registry reg;
  reg.def_class<ParameterServer>("ParameterServer")
      .method("forward", &ParameterServer::forward)
      .method("parameter_rrefs", &ParameterServer::parameter_rrefs);
  reg.def("parameter_server", [server_ref] { return server_ref; });
  reg.def("ping", [] { return int64_t{0}; });
  rpc::AgentOptions options = rank_agent_options(reg);
  options.num_worker_threads = kPoolThreads;
  const std::string name = rank == 0 ? "ps" : "trainer" + std::to_string(rank);
  auto agent = rpc::make_tensorpipe_agent(name, rank, world, store, options);
  std::vector<double> out;
  if (rank == 0) {
    server_ref.set_value(rref::make_local(*agent, std::make_shared<ParameterServer>(1)));
    // The server's connections to the trainers are made here, before the trainers start,
    // so that no connection is set up inside a timed window. (They were first made here to
    // avoid an agent deadlock on a first connection made while requests arrived on others,
    // fixed in the agent since: connect() runs with no lock held, and rpc's first-contact
    // stress test covers it.)
    for (int k = 1; k <= trainers; ++k)
      expect(agent->rpc_sync<int64_t>("trainer" + std::to_string(k), "ping") == 0, "ping");
    store->set("connected", "1");
    std::vector<std::string> keys;
    for (int k = 1; k <= trainers; ++k)
      keys.push_back("span" + std::to_string(k));
    store->wait(keys, 120s);
    double first = std::numeric_limits<double>::infinity(), last = 0;
    std::vector<double> medians[kCount];
    for (const std::string& key : keys) {
      std::istringstream is(store->get_string(key));
      double start = 0, end = 0;
      is >> start >> end;
      first = std::min(first, start);
      last = std::max(last, end);
      for (size_t k = kStep; k < kCount; ++k) {
        double v = 0;
        is >> v;
        if (v >= 0) medians[k].push_back(v);
      }
    }
    out.assign(kCount, 0);
    out[kWindow] = last - first;
    for (size_t k = kStep; k < kCount; ++k)
      out[k] = medians[k].empty() ? -1.0 : median(medians[k]);  // -1: not measured
    keys.clear();
    for (int k = 1; k <= trainers; ++k)
      keys.push_back("idle" + std::to_string(k));
    store->wait(keys, 120s);
    // Only the server's own reference to its object is left.
    expect(rref::wait_owned_values(*agent, 1, 60s), "references left on the server");
  } else {
    Generator gen(static_cast<uint64_t>(100 + rank));
    std::vector<Tensor> xs, ys;
    for (int b = 0; b < kBatches; ++b) {
      xs.push_back(randn({kBatch, kIn}, &gen));
      ys.push_back(randint(0, kOut, {kBatch}, &gen));
    }
    store->wait({"connected"}, 120s);
    {
      auto ps = agent->rpc_sync<RRef<ParameterServer>>("ps", "parameter_server");
      dist_optim::DistributedOptimizer optimizer(
          *agent, optim::SGDOptions{.lr = kLr},
          ps.rpc_sync<std::vector<RRef<Tensor>>>("parameter_rrefs"));
      std::vector<double> times[kCount];
      bool record = false;  // the window
      bool ab = false;      // the A/B after it
      // fused: backward_and_step (the timed window); else backward() then step().
      auto step = [&](int i, bool fused) {
        const size_t b = static_cast<size_t>(i % kBatches);
        const double t0 = now_s();
        double t1 = 0, t2 = 0, t3 = 0;
        Tensor loss;
        {
          dist_autograd::Context ctx(*agent);
          const Tensor logits = ps.rpc_sync<Tensor>("forward", xs[b]);
          t1 = now_s();
          loss = nn::cross_entropy(logits, ys[b]);
          if (fused) {
            optimizer.backward_and_step(ctx.id(), {loss});
            t2 = t3 = now_s();
          } else {
            dist_autograd::backward(*agent, ctx.id(), {loss});
            t2 = now_s();
            optimizer.step(ctx.id());
            t3 = now_s();
          }
        }
        const double value = loss.item<double>();
        const double t4 = now_s();
        if (record) {
          times[kStep].push_back(t4 - t0);
          times[kForward].push_back(t1 - t0);
          times[kBackward].push_back(t2 - t1);
          times[kRelease].push_back(t4 - t3);
        } else if (ab && fused) {
          times[kFusedAb].push_back(t4 - t0);
        } else if (ab) {
          times[kSeparateStep].push_back(t4 - t0);
          times[kOptimizer].push_back(t3 - t2);
        }
        return value;
      };
      double first_loss = 0, last_loss = 0;
      for (int i = 0; i < kWarmup; ++i) {
        const double loss = step(i, /*fused=*/i % 2 == 0);
        if (i < kBatches) first_loss += loss / kBatches;
      }
      if (store->add("ready", 1) == trainers) store->set("go", "1");
      store->wait({"go"}, 120s);
      record = true;
      const double start = now_s();
      for (int i = 0; i < kSteps; ++i) {
        const double loss = step(i, /*fused=*/true);
        if (i >= kSteps - kBatches) last_loss += loss / kBatches;
      }
      const double end = now_s();
      // With one trainer only: with more, the trainers end their windows at different times,
      // and steps after a window meet less contention than those inside it.
      record = false;
      ab = true;
      for (int block = 0; trainers == 1 && block < kAbBlocks; ++block) {
        for (int i = 0; i < kAbBlockSteps; ++i)
          (void)step(i, /*fused=*/block % 2 == 0);
      }
      expect(last_loss < first_loss, name + "'s loss did not go down (" +
                                         std::to_string(first_loss) + " -> " +
                                         std::to_string(last_loss) + ")");
      std::ostringstream os;
      os.precision(17);
      os << start << ' ' << end;
      for (size_t k = kStep; k < kCount; ++k)
        os << ' ' << (times[k].empty() ? -1.0 : median(times[k]));  // -1: not measured
      store->set("span" + std::to_string(rank), std::string_view(os.str()));
    }
    rref::wait_idle(*agent, 60s);
    store->set("idle" + std::to_string(rank), "1");
  }
  agent->shutdown();
  return out;
}

// The same step in this process, no RPC: the server's forward (with its copy of the
// parameters), cross-entropy, autograd backward, optim::SGD; median seconds of kSteps
// after kWarmup, same threads.
double local_step_seconds() {
  const int saved = get_num_threads();
  set_num_threads(kThreads);
  ParameterServer server(1);
  optim::SGD sgd(server.parameters(), optim::SGDOptions{.lr = kLr});
  Generator gen(101);
  std::vector<Tensor> xs, ys;
  for (int b = 0; b < kBatches; ++b) {
    xs.push_back(randn({kBatch, kIn}, &gen));
    ys.push_back(randint(0, kOut, {kBatch}, &gen));
  }
  auto step = [&](int i) {
    const size_t b = static_cast<size_t>(i % kBatches);
    sgd.zero_grad();
    const Tensor loss = nn::cross_entropy(server.forward(xs[b]), ys[b]);
    loss.backward();
    sgd.step();
    return loss.item<double>();
  };
  for (int i = 0; i < kWarmup; ++i)
    step(i);
  std::vector<double> times;
  for (int i = 0; i < kSteps; ++i)
    times.push_back(time_once([&] { step(i); }));
  set_num_threads(saved);
  return median(times);
}

// Complete events ("ph":"X") this process recorded, counted in the file trace::write makes.
int64_t recorded_spans() {
  const auto path = std::filesystem::temp_directory_path() /
                    ("gradwire-ps-bench-" + std::to_string(::getpid()) + ".trace.json");
  trace::write(path.string());
  std::ifstream in(path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::error_code ec;
  std::filesystem::remove(path, ec);
  int64_t n = 0;
  for (size_t at = text.find("\"ph\":\"X\""); at != std::string::npos;
       at = text.find("\"ph\":\"X\"", at + 1))
    ++n;
  return n;
}

// Nanoseconds a span costs while tracing is off (what every recording site pays).
double disabled_span_ns() {
  trace::stop();
  constexpr int kSpans = 2'000'000;
  const double t0 = now_s();
  for (int i = 0; i < kSpans; ++i) {
    trace::Span span("bench.off", "bench", trace::Arg("i", i));
  }
  return (now_s() - t0) * 1e9 / kSpans;
}

// ps.samples_per_s_traced: ps (rank 0) and one trainer; the trainer alternates untraced and
// traced blocks, turning the server's tracing on and off with it ("trace", which returns the
// spans the server recorded in the block). Rank 0 returns the trainer's figures: seconds
// untraced, seconds traced, spans per traced step, the disabled span's ns.
std::vector<double> traced_body(std::shared_ptr<c10d::Store> store, int rank) {
  set_num_threads(kThreads);
  Future<RRef<ParameterServer>> server_ref;
  rpc::Registry reg;
  reg.def_class<ParameterServer>("ParameterServer")
      .method("forward", &ParameterServer::forward)
      .method("parameter_rrefs", &ParameterServer::parameter_rrefs);
  reg.def("parameter_server", [server_ref] { return server_ref; });
  reg.def("ping", [] { return int64_t{0}; });
  reg.def("trace", [](int64_t on) {
    if (on != 0) {
      trace::clear();
      trace::start();
      return int64_t{0};
    }
    trace::stop();
    const int64_t spans = recorded_spans();
    trace::clear();
    return spans;
  });
  rpc::AgentOptions options = rank_agent_options(reg);
  options.num_worker_threads = kPoolThreads;
  auto agent = rpc::make_tensorpipe_agent(rank == 0 ? "ps" : "trainer1", rank, 2, store, options);
  std::vector<double> out;
  if (rank == 0) {
    server_ref.set_value(rref::make_local(*agent, std::make_shared<ParameterServer>(1)));
    expect(agent->rpc_sync<int64_t>("trainer1", "ping") == 0, "ping");
    store->set("connected", "1");
    std::istringstream is(store->get_string("traced_figures", 300s));
    double v = 0;
    while (is >> v)
      out.push_back(v);
    expect(rref::wait_owned_values(*agent, 1, 60s), "references left on the server");
  } else {
    Generator gen(101);
    std::vector<Tensor> xs, ys;
    for (int b = 0; b < kBatches; ++b) {
      xs.push_back(randn({kBatch, kIn}, &gen));
      ys.push_back(randint(0, kOut, {kBatch}, &gen));
    }
    store->wait({"connected"}, 120s);
    double seconds[2] = {0, 0};
    std::vector<double> pair_ratios;  // each traced block's rate over the untraced one before it
    double last_untraced = 0;
    int64_t spans = 0;
    {
      auto ps = agent->rpc_sync<RRef<ParameterServer>>("ps", "parameter_server");
      dist_optim::DistributedOptimizer optimizer(
          *agent, optim::SGDOptions{.lr = kLr},
          ps.rpc_sync<std::vector<RRef<Tensor>>>("parameter_rrefs"));
      auto step = [&](int i) {
        const size_t b = static_cast<size_t>(i % kBatches);
        Tensor loss;
        {
          dist_autograd::Context ctx(*agent);
          const Tensor logits = ps.rpc_sync<Tensor>("forward", xs[b]);
          loss = nn::cross_entropy(logits, ys[b]);
          optimizer.backward_and_step(ctx.id(), {loss});
        }
        return loss.item<double>();
      };
      for (int i = 0; i < kWarmup; ++i)
        step(i);
      // A traced warm-up too: every thread's ring is made (and its pages touched) before
      // the timed blocks, which then measure recording, not the rings' first allocation.
      agent->rpc_sync<int64_t>("ps", "trace", int64_t{1});
      trace::start();
      for (int i = 0; i < kWarmup; ++i)
        step(i);
      trace::stop();
      trace::clear();
      agent->rpc_sync<int64_t>("ps", "trace", int64_t{0});
      for (int block = 0; block < 2 * kTraceBlocks; ++block) {
        const int on = block % 2;
        if (on) {
          agent->rpc_sync<int64_t>("ps", "trace", int64_t{1});
          trace::clear();
          trace::start();
        }
        const double t0 = now_s();
        for (int i = 0; i < kBlockSteps; ++i)
          step(i);
        const double took = now_s() - t0;
        seconds[on] += took;
        if (on) {
          pair_ratios.push_back(last_untraced / took);
        } else {
          last_untraced = took;
        }
        if (on) {
          trace::stop();
          spans += recorded_spans();
          trace::clear();
          spans += agent->rpc_sync<int64_t>("ps", "trace", int64_t{0});
        }
      }
    }
    const double span_ns = disabled_span_ns();
    std::ostringstream os;
    os.precision(17);
    os << seconds[0] << ' ' << seconds[1] << ' '
       << static_cast<double>(spans) / (kTraceBlocks * kBlockSteps) << ' ' << span_ns << ' '
       << median(pair_ratios);
    rref::wait_idle(*agent, 60s);
    store->set("traced_figures", std::string_view(os.str()));
  }
  agent->shutdown();
  return out;
}

const Register ps_traced_bench({"ps.samples_per_s_traced"}, [](const auto& emit) {
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  const std::vector<double> r =
      run_rank_processes(server.port(), "ps_traced", 2, traced_body, "ps traced");
  expect(r.size() == 5, "the server returned " + std::to_string(r.size()) + " traced figures");
  const double samples = static_cast<double>(kTraceBlocks) * kBlockSteps * kBatch;
  const double untraced = samples / r[0];
  const double traced = samples / r[1];
  const double untraced_step_ns = r[0] * 1e9 / (kTraceBlocks * kBlockSteps);
  Figure f{"ps.samples_per_s_traced", traced, "samples/s", {}};
  f.params.push_back({"trainers", 1.0});
  f.params.push_back({"untraced_samples_per_s", untraced});
  f.params.push_back({"ratio", r[4]});
  f.params.push_back({"ratio_of_totals", traced / untraced});
  f.params.push_back({"on_cost_fraction", 1.0 - r[4]});
  f.params.push_back({"spans_per_step", r[2]});
  f.params.push_back({"disabled_span_ns", r[3]});
  f.params.push_back({"off_cost_fraction", r[2] * r[3] / untraced_step_ns});
  f.params.push_back(
      {"statistic", "one trainer, the ps.samples_per_s step; " + std::to_string(kTraceBlocks) +
                        " traced and as many untraced blocks of " + std::to_string(kBlockSteps) +
                        " steps, alternating in the same two processes; tracing on in both "
                        "(trace::start, the server's by an rpc between blocks); ratio: the "
                        "median over the pairs of a traced block's rate over the untraced "
                        "block's before it (drift on a shared machine cancels out)"});
  f.params.push_back({"off_cost",
                      "estimate: spans recorded per traced step (trainer and server) x a "
                      "disabled span's ns (measured in the trainer) / the untraced step"});
  f.params.push_back({"target_ratio_min", 0.95});
  f.params.push_back({"target_off_cost_fraction_max", 0.005});
  emit(f);
});

const Register ps_bench({"ps.samples_per_s", "ps.samples_per_s_trainers"}, [](const auto& emit) {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  constexpr size_t kCounts = std::size(kTrainerCounts);
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  std::vector<std::vector<double>> ours(kCounts, std::vector<double>(kCount, inf));
  std::vector<double> theirs(kCounts, inf), theirs_step(kCounts, inf);
  double local_step = inf;
  std::string why, version, counts;
  for (size_t c = 0; c < kCounts; ++c)
    counts += (c ? "," : "") + std::to_string(kTrainerCounts[c]);
  bool have_theirs = true;
  const std::string n = std::to_string(kThreads);
  for (int r = 0; r < kRounds; ++r) {
    for (size_t c = 0; c < kCounts; ++c) {
      const int trainers = kTrainerCounts[c];
      const std::vector<double> mine = run_rank_processes(
          server.port(), "ps" + std::to_string(r) + "_" + std::to_string(trainers), 1 + trainers,
          [trainers](std::shared_ptr<c10d::Store> store, int rank) {
            return rank_body(std::move(store), rank, trainers);
          },
          "ps");
      expect(mine.size() == kCount,
             "the server returned " + std::to_string(mine.size()) + " figures");
      if (mine[kWindow] < ours[c][kWindow]) ours[c] = mine;  // the figures of the best round
    }
    local_step = std::min(local_step, local_step_seconds());
    if (have_theirs) {
      auto peer = run_pytorch_peer("ps_peer.py",
                                   n + " " + std::to_string(kPoolThreads) + " " +
                                       std::to_string(kWarmup) + " " + std::to_string(kSteps) +
                                       " " + std::to_string(kBatches) + " " + counts,
                                   "OMP_NUM_THREADS=" + n + " OPENBLAS_NUM_THREADS=" + n, why);
      if (peer && peer->seconds.size() != 2 * kCounts) {
        why = "the peer printed " + std::to_string(peer->seconds.size()) + " figures";
        peer.reset();
      }
      if (!peer) {
        have_theirs = false;
      } else {
        version = peer->torch_version;
        // Each count's window and median step, from its best round.
        for (size_t c = 0; c < kCounts; ++c) {
          if (peer->seconds[c] < theirs[c]) {
            theirs[c] = peer->seconds[c];
            theirs_step[c] = peer->seconds[kCounts + c];
          }
        }
      }
    }
  }

  auto rate = [](double seconds, int trainers) {
    return static_cast<double>(trainers) * kSteps * kBatch / seconds;
  };
  auto figure = [&](const std::string& metric, size_t c) {
    const int trainers = kTrainerCounts[c];
    const std::vector<double>& mine = ours[c];
    const double ours_rate = rate(mine[kWindow], trainers);
    const double theirs_rate = have_theirs ? rate(theirs[c], trainers) : nan;
    Figure f{metric, ours_rate, "samples/s", {}};
    f.params.push_back({"trainers", double(trainers)});
    f.params.push_back({"model", "784-128-10 ReLU MLP (nn::MLP / nn.Linear), float32, on ps"});
    f.params.push_back({"batch", double(kBatch)});
    f.params.push_back(
        {"step",
         "dist_autograd::Context; logits = ps_rref.rpc_sync<Tensor>(\"forward\", x) (the "
         "server's forward on a copy of its parameters); nn::cross_entropy; "
         "DistributedOptimizer(SGD lr 0.01).backward_and_step(ctx, {loss}) (dist_autograd's "
         "backward, the server stepped as its part ends); loss.item()"});
    f.params.push_back({"workers", std::to_string(1 + trainers) + " processes on 127.0.0.1: ps + " +
                                       std::to_string(trainers) +
                                       " trainer(s) (TensorPipe agent, 8 pool threads each)"});
    f.params.push_back({"threads_per_process", double(kThreads)});
    f.params.push_back({"threads_how",
                        "gradwire::set_num_threads(1) in each process; torch.set_num_threads(1) + "
                        "OMP_NUM_THREADS=OPENBLAS_NUM_THREADS=1 in the PyTorch processes"});
    f.params.push_back({"blas_core", blas_core()});
    f.params.push_back({"statistic",
                        "all trainers' samples over the window from the first "
                        "trainer's start to the last one's end, " +
                            std::to_string(kSteps) + " timed steps per trainer after " +
                            std::to_string(kWarmup) + " warm-up and a barrier, best of " +
                            std::to_string(kRounds) + " rounds"});
    f.params.push_back({"step_ms", mine[kStep] * 1e3});
    f.params.push_back({"forward_ms", mine[kForward] * 1e3});
    f.params.push_back({"backward_ms", mine[kBackward] * 1e3});
    f.params.push_back({"release_ms", mine[kRelease] * 1e3});
    f.params.push_back({"phases",
                        "diagnostic: the trainers' median step and the medians of its phases "
                        "(context + forward call; cross-entropy + backward_and_step; the "
                        "context's end), median over the trainers, same round"});
    const bool separate = mine[kSeparateStep] >= 0;
    f.params.push_back({"separate_step_ms", separate ? mine[kSeparateStep] * 1e3 : nan});
    f.params.push_back({"separate_optimizer_ms", separate ? mine[kOptimizer] * 1e3 : nan});
    f.params.push_back({"fused_ab_step_ms", separate ? mine[kFusedAb] * 1e3 : nan});
    f.params.push_back(
        {"separate_over_fused", separate ? mine[kSeparateStep] / mine[kFusedAb] : nan});
    f.params.push_back(
        {"separate",
         "diagnostic, one trainer only: after the window, " + std::to_string(kAbBlocks) +
             " alternating blocks of " + std::to_string(kAbBlockSteps) +
             " steps, backward_and_step (fused_ab_step_ms) against dist_autograd::backward "
             "then DistributedOptimizer::step (PyTorch's shape; separate_step_ms, its step() "
             "phase separate_optimizer_ms), medians"});
    f.params.push_back({"pytorch_step_ms", have_theirs ? theirs_step[c] * 1e3 : nan});
    f.params.push_back({"local_step_ms", local_step * 1e3});
    f.params.push_back({"local_step",
                        "diagnostic: the same step in one process without RPC (the server's "
                        "forward, cross-entropy, autograd backward, optim::SGD), median ms, "
                        "same threads, best of the rounds"});
    if (have_theirs) {
      f.params.push_back(
          {"pytorch", "torch " + version +
                          " rpc.remote(get_parameter_server) + "
                          "ps_rref.rpc_sync().forward + dist_autograd + "
                          "DistributedOptimizer(optim.SGD, lr=0.01), TensorPipe agent"});
    } else {
      f.params.push_back({"pytorch", "unavailable"});
      f.params.push_back({"pytorch_reason", why});
    }
    f.params.push_back({"pytorch_samples_per_s", theirs_rate});
    f.params.push_back({"ratio", ours_rate / theirs_rate});
    return f;
  };
  Figure headline = figure("ps.samples_per_s", 0);
  headline.params.push_back({"target_ratio_min", 3.0});
  emit(headline);
  for (size_t c = 0; c < kCounts; ++c)
    emit(figure("ps.samples_per_s_trainers", c));
});

}  // namespace
}  // namespace gradwire::bench
