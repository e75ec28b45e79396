// The chaos suite: randomized fault schedules (schedule.h) over three or four workers that
// run the parameter-server pattern — servers made with rref::remote, references forked to
// third workers, method proxies, dist_autograd passes and DistributedOptimizer steps —
// while the fault injector drops, delays and cuts the n-th messages of every handler, calls
// run under short random timeouts, and in some schedules a worker that is not a trainer is
// killed with SIGKILL (those run the workers as processes, the others as threads).
//
// After every schedule the invariants are checked:
//   - every call and every pass ended with a value or a typed error (TimeoutError,
//     NetworkError, RemoteError, InvalidArgument, BusyError) within its deadline plus
//     kMargin;
//   - every pass that succeeded produced exact gradients, on the trainer and on the
//     server, against closed forms worked out here in float64. Each trainer scales the
//     server's output by a DDP-wrapped parameter s (a DistributedDataParallel head of one rank
//     per trainer, so that a pass another trainer never starts cannot hold a collective;
//     DdpInContext checks the averaging over ranks), with DDP options that vary by seed:
//     loss = sum((s * W x - t)^2), r = s * y - t: dL/ds = 2 r * y, dL/dW = (2 r * s) x^T,
//     dL/dx = W^T (2 r * s). Every forward returned W x for the W it used; a failed pass
//     leaves the trainer's context without gradients, and DDP never writes .grad();
//   - before shutdown (on_closed would drop everything), once the faults are cleared and the
//     trainers let go of their references, no surviving worker holds an owned value, a fork,
//     a user reference, a pending child, a protocol message, a dist_autograd context, a
//     pending call or a running handler; threads' agents then shut down gracefully.
//
// CI runs the seeds of kCiSeeds, one test each. Long runs: scripts/chaos.sh runs this binary
// with GRADWIRE_CHAOS_SEED=<seed> on ChaosRandom.* for random seeds and prints the failing
// ones, which join kCiSeeds once the bug each found is fixed.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "chaos/schedule.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"
#include "gradwire/ddp/distributed_data_parallel.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/nn/module.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/rpc/fault_injection.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/agents.h"
#include "support/eventually.h"
#include "support/harness.h"

namespace gradwire::chaos {
namespace {

using namespace std::chrono_literals;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using gradwire::testing::eventually;
using rpc::CallContext;
using rpc::CallOptions;
using rpc::RpcAgent;
using rref::RRef;
namespace da = dist_autograd;

constexpr int64_t kIn = 3;
constexpr int64_t kOut = 2;
// How late past its deadline an operation may end (scheduling on a loaded machine).
constexpr milliseconds kMargin{400};
// Bounds on the waits after the schedule: reaching them is a failure, never a pass.
constexpr milliseconds kSettle{10'000};
constexpr double kTolerance = 1e-12;

// ---- closed forms

std::vector<double> input_of(int64_t key) {
  std::vector<double> x(kIn);
  for (int64_t i = 0; i < kIn; ++i)
    x[static_cast<size_t>(i)] =
        0.25 * static_cast<double>(i + 1) + 0.01 * static_cast<double>(key) - 0.003 * i * key;
  return x;
}

std::vector<double> target_of(int64_t key) {
  std::vector<double> t(kOut);
  for (int64_t o = 0; o < kOut; ++o)
    t[static_cast<size_t>(o)] = 0.1 * static_cast<double>(o + 1) - 0.02 * static_cast<double>(key);
  return t;
}

std::vector<double> initial_weights(int64_t tag) {
  std::vector<double> w(kOut * kIn);
  for (int64_t j = 0; j < kOut * kIn; ++j)
    w[static_cast<size_t>(j)] = 0.1 * static_cast<double>(j + 1) * (j % 2 == 0 ? 1.0 : -1.0) +
                                0.05 * static_cast<double>(tag);
  return w;
}

Tensor column(const std::vector<double>& v) {
  return tensor(v, Shape{static_cast<int64_t>(v.size()), 1});
}

std::vector<double> values_of(const Tensor& t) {
  Tensor c = t.detach().to(kFloat64).contiguous();
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

// Element by element, within kTolerance (float64 sums of three terms may differ in their
// last bit from the order the kernels add them in).
void expect_close(const std::vector<double>& got, const std::vector<double>& want,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], kTolerance * (1.0 + std::fabs(want[i])))
        << what << ", element " << i;
}

// ---- what a killed worker does

struct KillPlan {
  int victim{-1};
  int at{0};
  std::atomic<int> served{0};
};

KillPlan& kill_plan() {
  static KillPlan plan;
  return plan;
}

// Every handler of the workload counts itself here; the victim dies serving its kill_at-th.
void served_one(const CallContext& ctx) {
  KillPlan& plan = kill_plan();
  if (plan.victim < 0 || ctx.agent()->worker_info().id != plan.victim) return;
  if (plan.served.fetch_add(1) + 1 == plan.at) ::kill(::getpid(), SIGKILL);
}

// ---- the workload's registered functions and class

// The parameters of every ParamServer of this process, by tag (the trainer's rank), for
// check_grad.
class ServerIndex {
 public:
  void put(int64_t tag, Tensor weight) GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    weights_[tag] = std::move(weight);
  }
  void erase(int64_t tag) GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    weights_.erase(tag);
  }
  std::optional<Tensor> get(int64_t tag) GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    auto it = weights_.find(tag);
    if (it == weights_.end()) return std::nullopt;
    return it->second;
  }

 private:
  Mutex mutex_;
  std::map<int64_t, Tensor> weights_ GRADWIRE_GUARDED_BY(mutex_);
};

ServerIndex& servers() {
  static ServerIndex index;
  return index;
}

// A parameter server holding W (kOut x kIn, float64). forward() uses a copy of W taken at
// its start (as hybrid_train does) and returns it with the result, so the trainer checks
// y = W x against the W that made it even when steps land concurrently.
class ParamServer {
 public:
  explicit ParamServer(int64_t tag)
      : tag_(tag), weight_(tensor(initial_weights(tag), Shape{kOut, kIn})) {
    weight_.set_requires_grad(true);
    servers().put(tag_, weight_);
  }
  ~ParamServer() { servers().erase(tag_); }
  ParamServer(const ParamServer&) = delete;
  ParamServer& operator=(const ParamServer&) = delete;

  std::vector<Tensor> forward(const CallContext& ctx, const Tensor& x) {
    served_one(ctx);
    Tensor w = weight_.clone();
    Tensor used = w.detach().clone();
    return {matmul(w, x), used};
  }
  RRef<Tensor> weight_rref(const CallContext& ctx) {
    served_one(ctx);
    return rref::make_local(*ctx.agent(), weight_);
  }

 private:
  int64_t tag_;
  Tensor weight_;
};

void define(rpc::Registry& reg) {
  reg.def_class<ParamServer>("ParamServer")
      .ctor<int64_t>()
      .method("forward", &ParamServer::forward)
      .method("weight_rref", &ParamServer::weight_rref);
  reg.def("make_input", [](const CallContext& ctx, int64_t key) {
    served_one(ctx);
    return column(input_of(key));
  });
  // A fork received from a trainer, read here.
  reg.def("sum_of", [](const CallContext& ctx, const RRef<Tensor>& r, int64_t timeout_ms) {
    served_one(ctx);
    double s = 0;
    for (double v : values_of(r.to_here(milliseconds(timeout_ms))))
      s += v;
    return s;
  });
  // The forward through a fork of the trainer's server: a nested call in the pass.
  reg.def("relay", [](const CallContext& ctx, const RRef<ParamServer>& ps, const Tensor& x,
                      int64_t timeout_ms) {
    served_one(ctx);
    return ps.rpc_sync<std::vector<Tensor>>("forward", CallOptions{milliseconds(timeout_ms)}, x);
  });
  // What the context holds on this worker for the server `tag`'s W: (error text, values).
  // Never faulted (the first fault rule passes it untouched): it checks, it is not checked.
  reg.def("check_grad", [](const CallContext& ctx, int64_t tag, int64_t context_id) {
    std::optional<Tensor> weight = servers().get(tag);
    if (!weight) return std::pair<std::string, std::vector<double>>{"no server", {}};
    try {
      const da::Gradients grads =
          da::get_gradients(*ctx.agent(), static_cast<uint64_t>(context_id));
      if (!grads.contains(*weight)) {
        return std::pair<std::string, std::vector<double>>{"no gradient for W", {}};
      }
      return std::pair<std::string, std::vector<double>>{"", values_of(grads.at(*weight))};
    } catch (const std::exception& e) {
      return std::pair<std::string, std::vector<double>>{e.what(), {}};
    }
  });
}

// ---- outcomes

// The outcomes of one worker's operations. attempt() checks the first invariant on each.
class Ledger {
 public:
  explicit Ledger(std::string who) : who_(std::move(who)) {}

  // Runs `fn`, which must end within `deadline` (+ kMargin) with a value or a typed error.
  // True when it returned.
  template <typename F>
  bool attempt(const std::string& what, milliseconds deadline, F&& fn) {
    const auto start = Clock::now();
    std::string error;
    try {
      fn();
    } catch (const TimeoutError& e) {
      error = "TimeoutError";
      note(what, error, e);
    } catch (const NetworkError& e) {
      error = "NetworkError";
      note(what, error, e);
    } catch (const RemoteError& e) {
      error = "RemoteError";
      note(what, error, e);
    } catch (const InvalidArgument& e) {
      error = "InvalidArgument";
      note(what, error, e);
    } catch (const BusyError& e) {
      error = "BusyError";
      note(what, error, e);
    } catch (const std::exception& e) {
      ADD_FAILURE() << who_ << ": " << what << " threw an untyped error: " << e.what();
      error = "untyped";
    }
    const auto took = std::chrono::duration_cast<milliseconds>(Clock::now() - start);
    EXPECT_LE(took, deadline + kMargin)
        << who_ << ": " << what << " took " << took.count() << " ms, deadline " << deadline.count()
        << " ms" << (error.empty() ? "" : " (" + error + ")");
    ++counts_[error.empty() ? "ok" : error];
    return error.empty();
  }
  void count(const std::string& what) { ++counts_[what]; }
  // Every error, in order: "remote make_input: TimeoutError: ...".
  const std::vector<std::string>& errors() const { return errors_; }
  std::string summary() const {
    std::ostringstream out;
    out << who_ << ":";
    for (const auto& [k, n] : counts_)
      out << " " << k << " " << n << ",";
    return out.str();
  }

 private:
  void note(const std::string& what, const std::string& type, const std::exception& e) {
    errors_.push_back(what + ": " + type + ": " + e.what());
  }

  std::string who_;
  std::map<std::string, int> counts_;
  std::vector<std::string> errors_;
};

std::string name_of(int rank) {
  return test::worker_name(rank);
}

// ---- the trainers' DDP head: z = s * y, s a parameter of DistributedDataParallel

class Head : public nn::Module {
 public:
  explicit Head(bool with_unused) : Module("Head") {
    std::vector<double> init(kOut);
    for (int64_t o = 0; o < kOut; ++o)
      init[static_cast<size_t>(o)] = 1.0 + 0.25 * static_cast<double>(o);
    s = register_parameter("s", tensor(init, Shape{kOut, 1}));
    if (with_unused) unused = register_parameter("unused", tensor(std::vector<double>{3.0}));
  }
  Tensor s, unused;
};

struct DdpHead {
  std::shared_ptr<Head> head;
  std::unique_ptr<ddp::DistributedDataParallel> model;
};

// The DDP options of seed `seed` (from the seed itself, not from the schedule's draws, so
// that a seed's faults do not depend on them).
ddp::DdpOptions ddp_options_of(uint64_t seed, bool& with_unused) {
  switch (seed % 4) {
    case 0:
      with_unused = false;
      return {};
    case 1:
      with_unused = false;
      return {.gradient_as_bucket_view = true};
    case 2:
      with_unused = true;
      return {.find_unused_parameters = true};
    default:
      with_unused = true;
      return {.static_graph = true};
  }
}

DdpHead make_head(const Schedule& s, int me) {
  bool with_unused = false;
  const ddp::DdpOptions options = ddp_options_of(s.seed, with_unused);
  DdpHead h;
  h.head = std::make_shared<Head>(with_unused);
  auto store = std::make_shared<c10d::HashStore>(10s);
  auto group = c10d::ProcessGroupGloo::create(
      store, 0, 1, {.timeout = 10s, .name = "chaos-head-" + name_of(me)}, {.host = "127.0.0.1"});
  h.model = std::make_unique<ddp::DistributedDataParallel>(h.head, group, options);
  return h;
}

// ---- a trainer

void run_round(const Schedule& s, const Round& r, int me, RpcAgent& agent,
               const RRef<ParamServer>& ps, dist_optim::DistributedOptimizer* opt, DdpHead& head,
               Ledger& ledger) {
  const CallOptions call{r.call_timeout};
  const int64_t half = std::max<int64_t>(1, r.call_timeout.count() / 2);
  const std::vector<double> x_values = input_of(r.key);
  const std::vector<double> t_values = target_of(r.key);

  // An input made on another worker, read here and by a third worker through a fork.
  {
    RRef<Tensor> xr;
    if (ledger.attempt("remote make_input", r.call_timeout, [&] {
          xr = rref::remote<Tensor>(agent, name_of(r.input_owner), "make_input", call, r.key);
        })) {
      std::vector<double> here;
      if (ledger.attempt("to_here", r.call_timeout,
                         [&] { here = values_of(xr.to_here(r.call_timeout)); })) {
        expect_close(here, x_values, "to_here of the input");
      }
      const int third = r.input_owner == 1 ? 2 : 1;
      double total = 0;
      if (ledger.attempt("sum_of a fork", r.call_timeout, [&] {
            total = agent.rpc_sync<double>(name_of(third), "sum_of", call, xr, half);
          })) {
        double want = 0;
        for (double v : x_values)
          want += v;
        EXPECT_NEAR(total, want, kTolerance) << "sum_of on w" << third;
      }
    }
  }

  // The forward and the pass, in a context.
  std::optional<da::Context> ctx;
  ctx.emplace(agent);
  const uint64_t id = ctx->id();
  Tensor x = column(x_values);
  x.set_requires_grad(true);
  std::vector<Tensor> out;
  const bool forwarded =
      ledger.attempt(r.relay ? "relayed forward" : "proxy forward", r.call_timeout, [&] {
        out = r.relay ? agent.rpc_sync<std::vector<Tensor>>("w2", "relay", call, ps, x, half)
                      : ps.rpc_sync<std::vector<Tensor>>("forward", call, x);
      });
  if (forwarded) {
    ASSERT_EQ(out.size(), 2u);
    const std::vector<double> y = values_of(out[0]);
    const std::vector<double> w = values_of(out[1]);
    ASSERT_EQ(y.size(), static_cast<size_t>(kOut));
    ASSERT_EQ(w.size(), static_cast<size_t>(kOut * kIn));
    const std::vector<double> scale = values_of(head.head->s);
    std::vector<double> wx(kOut, 0.0), grad_y(kOut), grad_s(kOut), grad_w(kOut * kIn),
        grad_x(kIn, 0.0);
    for (int64_t o = 0; o < kOut; ++o) {
      for (int64_t i = 0; i < kIn; ++i)
        wx[o] += w[o * kIn + i] * x_values[i];
      const double residual = scale[o] * y[o] - t_values[o];
      grad_s[o] = 2.0 * residual * y[o];
      grad_y[o] = 2.0 * residual * scale[o];
      for (int64_t i = 0; i < kIn; ++i) {
        grad_w[o * kIn + i] = grad_y[o] * x_values[i];
        grad_x[i] += w[o * kIn + i] * grad_y[o];
      }
    }
    expect_close(y, wx, "y = W x");
    std::vector<Tensor> z = head.model->forward_with(
        [&](nn::Module&) { return std::vector<Tensor>{mul(head.head->s, out[0])}; });
    const Tensor diff = sub(z[0], column(t_values));
    const Tensor loss = sum(mul(diff, diff));
    const bool passed = ledger.attempt("backward", r.pass_timeout, [&] {
      da::backward(agent, id, {loss}, da::BackwardOptions{.timeout = r.pass_timeout});
    });
    if (passed) {
      ledger.count("exact pass");
      const da::Gradients grads = da::get_gradients(agent, id);
      ASSERT_TRUE(grads.contains(x)) << "the trainer's leaf after a successful pass";
      expect_close(values_of(grads.at(x)), grad_x, "dL/dx on w" + std::to_string(me));
      ASSERT_TRUE(grads.contains(head.head->s)) << "the DDP parameter after a successful pass";
      expect_close(values_of(grads.at(head.head->s)), grad_s,
                   "dL/ds (DDP) on w" + std::to_string(me));
      if (head.head->unused.defined()) {
        EXPECT_FALSE(grads.contains(head.head->unused)) << "a DDP parameter no pass used";
      }
      EXPECT_FALSE(head.head->s.grad().defined()) << "DDP wrote .grad() under a context";
      std::pair<std::string, std::vector<double>> on_server;
      if (ledger.attempt("check_grad", s.rpc_timeout, [&] {
            on_server = agent.rpc_sync<std::pair<std::string, std::vector<double>>>(
                "w1", "check_grad", CallOptions{s.rpc_timeout}, int64_t{me},
                static_cast<int64_t>(id));
          })) {
        bool server_lost = false;
        if (on_server.first == "no server") {
          // The server goes with its trainer's reference when the connection between them
          // failed (both ends then release what the other held): its reference is dead.
          try {
            ps.rpc_sync<RRef<Tensor>>("weight_rref", CallOptions{s.rpc_timeout});
          } catch (const NetworkError&) {
            server_lost = true;
            ledger.count("server lost");
          } catch (const std::exception&) {
            // Not a loss: the expectation below reports it.
          }
        }
        if (!server_lost) {
          EXPECT_EQ(on_server.first, "") << "the server after a successful pass";
        }
        if (on_server.first.empty()) {
          expect_close(on_server.second, grad_w, "dL/dW on w1");
          ledger.count("server gradient checked");
        }
      }
      if (r.step && opt != nullptr) {
        ledger.attempt("optimizer step", s.rpc_timeout, [&] { opt->step(id); });
      }
    } else {
      // A failed pass leaves nothing for a step to use.
      EXPECT_THROW(da::get_gradients(agent, id), Error) << "after a failed pass";
    }
  }
  // The context's end releases it everywhere, bounded by rpc_timeout.
  const auto start = Clock::now();
  ctx.reset();
  EXPECT_LE(Clock::now() - start, s.rpc_timeout + kMargin) << "releasing a context";
}

void train(const Schedule& s, size_t index, RpcAgent& agent, Ledger& ledger) {
  const int me = s.trainers[index];
  const CallOptions setup{s.rpc_timeout};
  RRef<ParamServer> ps;
  if (ledger.attempt("remote ParamServer", s.rpc_timeout, [&] {
        ps = rref::remote<ParamServer>(agent, "w1", "ParamServer", setup, int64_t{me});
      })) {
    // Confirmation is bounded by the creating call's timeout.
    Future<void> created = ps.creation();
    ledger.attempt("server creation", s.rpc_timeout, [&] {
      if (!created.wait(s.rpc_timeout + kMargin)) ADD_FAILURE() << "creation never ended";
      created.value();
    });
  }
  std::optional<dist_optim::DistributedOptimizer> opt;
  if (ps.valid()) {
    RRef<Tensor> weight;
    if (ledger.attempt("weight_rref", s.rpc_timeout,
                       [&] { weight = ps.rpc_sync<RRef<Tensor>>("weight_rref", setup); })) {
      // Its construction makes a shard on w1 and waits for it at most rpc_timeout.
      ledger.attempt("optimizer", s.rpc_timeout, [&] {
        opt.emplace(agent, optim::SGDOptions{.lr = 0.05},
                    std::vector<RRef<Tensor>>{std::move(weight)});
      });
    }
    DdpHead head = make_head(s, me);
    for (const Round& r : s.rounds[index])
      run_round(s, r, me, agent, ps, opt ? &*opt : nullptr, head, ledger);
  }
}

// ---- phases after the rounds

// Waits until every survivor has set `phase`.
void barrier(c10d::Store& store, const Schedule& s, int rank, const std::string& phase) {
  store.set(phase + "/" + std::to_string(rank), "1");
  std::vector<std::string> keys;
  for (int r = 0; r < s.world; ++r) {
    if (r != s.victim) keys.push_back(phase + "/" + std::to_string(r));
  }
  store.wait(keys, 30s);
}

bool nothing_left(RpcAgent& agent) {
  const rref::RRefMetrics m = rref::metrics(agent);
  const rpc::AgentMetrics a = agent.metrics();
  return m.owned_values == 0 && m.shared_values == 0 && m.owned_forks == 0 &&
         m.user_references == 0 && m.pending_children == 0 && m.messages_in_flight == 0 &&
         da::num_contexts(agent) == 0 && a.pending_calls == 0 && a.running_handlers == 0;
}

// Arms the schedule's rules. check_grad is the suite's own probe: the first rule owns its
// messages and sends them untouched (a delay of 0).
void arm(rpc::FaultInjector& faults, const Schedule& s) {
  faults.add({.action = rpc::FaultAction::kDelay, .function = "check_grad", .count = -1});
  for (const rpc::FaultRule& rule : s.rules)
    faults.add(rule);
}

// The body of every worker: trainers train; then, with the faults cleared and every
// reference let go, each survivor must come to hold nothing, before any shuts down.
void run_worker(const Schedule& s, int rank, c10d::Store& store, RpcAgent& agent,
                rpc::FaultInjector& faults) {
  Ledger ledger(name_of(rank));
  for (size_t t = 0; t < s.trainers.size(); ++t) {
    if (s.trainers[t] == rank) train(s, t, agent, ledger);
  }
  if (s.trainers.front() == rank || (s.trainers.size() > 1 && s.trainers[1] == rank)) {
    std::printf("seed %llu %s\n", static_cast<unsigned long long>(s.seed),
                ledger.summary().c_str());
    if (std::getenv("GRADWIRE_CHAOS_VERBOSE") != nullptr) {
      for (const std::string& e : ledger.errors())
        std::printf("  %s %s\n", name_of(rank).c_str(), e.c_str());
    }
    std::fflush(stdout);
  }
  barrier(store, s, rank, "trained");
  faults.clear();
  try {
    rref::wait_idle(agent, kSettle);
  } catch (const std::exception& e) {
    ADD_FAILURE() << name_of(rank) << " never became idle: " << e.what();
  }
  barrier(store, s, rank, "idle");
  EXPECT_TRUE(rref::wait_owned_values(agent, 0, kSettle))
      << name_of(rank) << " still owns " << rref::metrics(agent).owned_values << " values";
  // The counters have no waits of their own: they are polled.
  if (!eventually([&] { return nothing_left(agent); }, kSettle)) {
    const rref::RRefMetrics m = rref::metrics(agent);
    const rpc::AgentMetrics a = agent.metrics();
    ADD_FAILURE() << name_of(rank) << " holds, " << kSettle.count()
                  << " ms after everything was let go: owned values " << m.owned_values
                  << ", shared values " << m.shared_values << ", owned forks " << m.owned_forks
                  << ", user references " << m.user_references << ", pending children "
                  << m.pending_children << ", rref messages in flight " << m.messages_in_flight
                  << ", dist_autograd contexts " << da::num_contexts(agent) << ", pending calls "
                  << a.pending_calls << ", running handlers " << a.running_handlers;
  }
  barrier(store, s, rank, "checked");
}

rpc::AgentOptions options_for(const Schedule& s, rpc::Registry& reg,
                              const std::shared_ptr<rpc::FaultInjector>& faults) {
  rpc::AgentOptions o = test::agent_options(reg);
  o.rpc_timeout = s.rpc_timeout;
  o.join_timeout = 5s;
  o.faults = faults;
  return o;
}

void run_schedule(uint64_t seed) {
  const Schedule s = make_schedule(seed);
  SCOPED_TRACE(s.describe());
  const auto start = Clock::now();
  rpc::Registry reg;
  define(reg);
  auto faults = std::make_shared<rpc::FaultInjector>();
  if (s.processes()) {
    kill_plan().victim = s.victim;
    kill_plan().at = s.kill_at;
    test::RankResults results = test::run_agent_processes(
        "chaos-" + std::to_string(seed), s.world, options_for(s, reg, faults),
        [&](int rank, c10d::Store& store, RpcAgent& agent) {
          // This process's copy of the injector, armed once its agent has started.
          arm(*faults, s);
          run_worker(s, rank, store, agent, *faults);
          // A survivor cannot know whether the victim died: no graceful shutdown waits for
          // it. Everything was checked before this.
          agent.shutdown(false);
        });
    for (const test::RankResult& r : results.ranks) {
      if (r.rank == s.victim && r.term_signal == SIGKILL) continue;
      EXPECT_TRUE(r.ok) << results.summary();
    }
  } else {
    test::Agents agents = test::start_agents(s.world, options_for(s, reg, faults));
    auto store = std::make_shared<c10d::HashStore>(30s);
    arm(*faults, s);
    test::RankResults results = test::run_ranks_as_threads(
        s.world,
        [&](int rank) { run_worker(s, rank, *store, *agents[static_cast<size_t>(rank)], *faults); },
        60s);
    EXPECT_ALL_RANKS_OK(results);
    test::shutdown_agents(agents);
  }
  std::printf("seed %llu: %.2f s\n", static_cast<unsigned long long>(seed),
              std::chrono::duration<double>(Clock::now() - start).count());
}

// ---- the seeds

// CI's schedules: every seed of 1-79, and the seeds long runs found, after them.
// A failing seed found by scripts/chaos.sh joins this list once the bug it found is fixed.
//
// What those seeds' schedules hold, beside every invariant above:
// - a cut that one worker sees and the other does not: both agree on the loss (a Lost
//   notice), neither keeps forks of values the other treats as lost, and a fork refused
//   because its owner was lost is settled with whoever minted it (1, 14, 15, 24, 38, 40,
//   54, 22, 39).
// - a Create that was dropped or cut: no proxy call waits on the owner for it past its
//   deadline holding the placeholder; a creator that gives its reference up, or is lost,
//   abandons what it was creating, and a Fetch that arrives after that is refused instead
//   of awaited (2, 25, 31, 48, 66; 24 under load).
// - a dropped Delete or ChildAccepted: settlements are sent again on timeout, and a second
//   copy is a no-op (59, 62, 67; 10, 13, 73, 76 under load).
// - a SIGKILL: no value forked to the killed worker and no handler outlives the run (5), and
//   no fork sent of a value whose owner died stays pending (2646191281925694804).
// - a reply carrying an owner's fork that a fault rule drops: it counts as not written, so
//   the fork is not counted for a caller that never got it (5020).
// - dist_autograd: a dropped Release (13, 17, 1561503560630265507); a failed pass, which
//   does not wait for its aborts past its deadline (3); a lost connection, which fails a
//   pass with a typed error (29); a nested call that times out and reaches its callee after
//   the Release from its caller, which leaves no context that nobody would release (5109);
//   a reply built after its context was released here, which does not go out cut off from
//   the pass, so no backward succeeds without the gradients that should come back through
//   it (4039521280250924948).
// - rref: a fork sent to a worker already lost here, whose death is not told again: it does
//   not stay pending for good (1314088954710638701).
constexpr uint64_t kCiSeeds[] = {
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    8,
    9,
    10,
    11,
    12,
    13,
    14,
    15,
    16,
    17,
    18,
    19,
    20,
    21,
    22,
    23,
    24,
    25,
    26,
    27,
    28,
    29,
    30,
    31,
    32,
    33,
    34,
    35,
    36,
    37,
    38,
    39,
    40,
    41,
    42,
    43,
    44,
    45,
    46,
    47,
    48,
    49,
    50,
    51,
    52,
    53,
    54,
    55,
    56,
    57,
    58,
    59,
    60,
    61,
    62,
    63,
    64,
    65,
    66,
    67,
    68,
    69,
    70,
    71,
    72,
    73,
    74,
    75,
    76,
    77,
    78,
    79,
    1561503560630265507,
    2646191281925694804,
};

class Chaos : public ::testing::TestWithParam<uint64_t> {};

TEST_P(Chaos, EveryCallEndsInTimeNothingIsLeftAndPassesAreExact) {
  run_schedule(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Seeds, Chaos, ::testing::ValuesIn(kCiSeeds),
                         [](const ::testing::TestParamInfo<uint64_t>& info) {
                           return "seed_" + std::to_string(info.param);
                         });

// One schedule of a seed given in GRADWIRE_CHAOS_SEED (scripts/chaos.sh); skipped without.
TEST(ChaosRandom, SeedFromTheEnvironment) {
  const char* text = std::getenv("GRADWIRE_CHAOS_SEED");
  if (text == nullptr || *text == '\0') GTEST_SKIP() << "GRADWIRE_CHAOS_SEED is not set";
  const uint64_t seed = std::strtoull(text, nullptr, 10);
  std::printf("%s", make_schedule(seed).describe().c_str());
  run_schedule(seed);
}

}  // namespace
}  // namespace gradwire::chaos
