// rpc transport figures: worker processes on this machine (they meet through a TCPStore
// served here), each transport measured in the same run:
//   rpc.transport_latency_us   p50 of rpc_sync "add" on two 2-element float32 tensors between
//                              two processes, per transport: gradwire's local
//                              (shared-memory rings), unix and tcp, TensorPipe's shm and
//                              uv, and local with a secret set. Value: the best p50 of 5
//                              runs; params: the worst p50 (stability), the p99, a raw
//                              TCP_NODELAY ping-pong between the same processes and shm's
//                              p50 as baselines, and the latency distribution of the best
//                              run (cdf_percent_us: "percent:us ...").
//   rpc.transport_async_calls_per_s  rpc_async "add" with 64 calls in flight, per transport
//   rpc.idle_cpu_percent       CPU time of a connected, idle agent process over 2 s, as % of
//                              one core (the larger of the two processes), per transport
//   rpc.latency_workers_us     p50 of rpc_sync "add" to w0 from every other worker at once,
//                              with 3 and 5 worker processes (the parameter-server shape),
//                              over local and shm (the slowest caller's p50)
//   rpc.connect_us             a new connection through gradwire's tcp transport until
//                              TensorPipe's first frame is accepted, with and without a secret
//                              (median of 200), in this process
#include <sys/resource.h>

#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/listener.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <iterator>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/env.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "pingpong.h"
#include "ranks.h"
#include "transport/stream_transport.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;

constexpr int kCalls = 1000;
constexpr int kRuns = 5;
constexpr int kAsyncCalls = 5000;
constexpr int kWindow = 64;
constexpr int kPingPongs = 1000;
constexpr auto kIdle = 2s;
constexpr int kConnects = 200;
constexpr double kInf = std::numeric_limits<double>::infinity();

// One transport's figures over the runs: the best of each, the worst p50 too.
struct Results {
  double best_p50 = kInf;
  double worst_p50 = 0;
  double p99 = kInf;
  double async = kInf;
  double ping = kInf;
  double idle = 0;
  std::string runs;  // every run's p50, in order, whole microseconds
  std::string cdf;   // the quantiles of the run with the best p50 (kQuantiles), microseconds
};

// The latency distribution reported with each transport (the CDF that
// scripts/plot-bench.py draws).
constexpr double kQuantiles[] = {0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999};

struct Variant {
  std::string name;
  std::vector<std::string> transports;
  std::string secret;
};

const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"local", {"local", "tcp"}, ""},
      {"unix", {"unix", "tcp"}, ""},
      {"tcp", {"tcp"}, ""},
      {"shm", {"shm", "tcp"}, ""},
      {"uv", {"uv"}, ""},
      {"local+secret", {"local", "tcp"}, "a shared secret for the benchmark"},
  };
  return v;
}

double process_cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

rpc::AgentOptions options_for(rpc::Registry& reg, const Variant& v) {
  rpc::AgentOptions options = rank_agent_options(reg);
  options.transports = v.transports;
  options.secret = v.secret;
  options.num_worker_threads = 2;
  // The poll window to measure with (the agent's default unless set), in [0, 1 s].
  options.transport_spin = std::chrono::microseconds(
      env_int("GRADWIRE_BENCH_TRANSPORT_SPIN_US", options.transport_spin.count(), 0, 1'000'000));
  return options;
}

void register_add(rpc::Registry& reg) {
  reg.def("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
}

// A raw TCP ping-pong between the two processes (bench/pingpong.h): rank 0's p50.
double ping_pong_p50(c10d::Store& store, int rank) {
  if (rank == 1) {
    serve_echo(listen_for_echo(store));
    return 0;
  }
  return median(ping_pong(store, kPingPongs, 100));
}

// Rank 0's figures: p50, p99, seconds per async call, ping-pong p50, then the idle CPU
// (the larger of the two processes, as a fraction of a core), then the latency at each of
// kQuantiles.
std::vector<double> pair_body(const Variant& v, bool with_pingpong,
                              std::shared_ptr<c10d::Store> store, int rank) {
  rpc::Registry reg;
  register_add(reg);
  const double ping = with_pingpong ? ping_pong_p50(*store, rank) : 0;
  auto agent =
      rpc::make_tensorpipe_agent("w" + std::to_string(rank), rank, 2, store, options_for(reg, v));
  const Tensor a = tensor<float>({1.5f, -2.0f}, {2});
  const Tensor b = tensor<float>({0.25f, 4.0f}, {2});
  std::vector<double> out;
  std::vector<double> quantiles;
  if (rank == 0) {
    const std::vector<double> times =
        time_calls(200, kCalls, [&] { agent->rpc_sync<Tensor>("w1", "add", a, b); });
    for (const double q : kQuantiles)
      quantiles.push_back(percentile(times, q));
    out.push_back(median(times));
    out.push_back(percentile(times, 0.99));
    out.push_back(seconds_per_windowed_call(
        kAsyncCalls, kWindow, 60s, [&] { return agent->rpc_async<Tensor>("w1", "add", a, b); }));
    out.push_back(ping);
  } else {
    agent->rpc_sync<Tensor>("w0", "add", a, b);  // connected both ways
  }
  // Both connected and idle: each measures itself.
  store->set("idle_ready_" + std::to_string(rank), "1");
  store->get("idle_ready_" + std::to_string(1 - rank));
  const double cpu0 = process_cpu_seconds();
  const double wall = time_once([] { std::this_thread::sleep_for(kIdle); });
  const double idle = (process_cpu_seconds() - cpu0) / wall;
  if (rank == 1) store->set("idle_cpu_1", std::to_string(idle));
  if (rank == 0) out.push_back(std::max(idle, std::stod(store->get_string("idle_cpu_1"))));
  out.insert(out.end(), quantiles.begin(), quantiles.end());
  agent->shutdown();
  return out;
}

// Every worker but w0 calls w0 at once; rank 0 returns the slowest caller's p50.
std::vector<double> fan_in_body(const Variant& v, int world, std::shared_ptr<c10d::Store> store,
                                int rank) {
  rpc::Registry reg;
  register_add(reg);
  auto agent = rpc::make_tensorpipe_agent("w" + std::to_string(rank), rank, world, store,
                                          options_for(reg, v));
  std::vector<double> out;
  if (rank != 0) {
    const Tensor a = tensor<float>({1.5f, -2.0f}, {2});
    const Tensor b = tensor<float>({0.25f, 4.0f}, {2});
    const std::vector<double> times =
        time_calls(200, kCalls, [&] { agent->rpc_sync<Tensor>("w0", "add", a, b); });
    store->set("p50_" + std::to_string(rank), std::to_string(median(times)));
  } else {
    double worst = 0;
    for (int r = 1; r < world; ++r)
      worst = std::max(worst, std::stod(store->get_string("p50_" + std::to_string(r))));
    out.push_back(worst);
  }
  agent->shutdown();
  return out;
}

// Seconds from connect() through gradwire's tcp transport until the listener hands the
// connection over (the handshake plus TensorPipe's first frame), median of kConnects.
double connect_seconds(const std::string& secret) {
  namespace tp = tensorpipe;
  rpc::transport::StreamOptions o;
  o.secret = secret;
  o.name = "bench";
  auto server = rpc::transport::create_stream_context(o);
  auto client = rpc::transport::create_stream_context(o);
  auto listener = server->listen("127.0.0.1:0");
  if (!server->listen_error().empty()) throw std::runtime_error(server->listen_error());
  const std::string addr = listener->addr();
  tp::NopHolder<tp::Packet> hello;
  hello.getObject() = tp::SpontaneousConnection{"bench"};
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<double> times;
  for (int i = 0; i < kConnects + 20; ++i) {
    bool accepted = false;
    std::shared_ptr<tp::transport::Connection> in;
    listener->accept([&](const tp::Error& error, std::shared_ptr<tp::transport::Connection> c) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) in = std::move(c);
      accepted = true;
      cv.notify_all();
    });
    const double t = time_once([&] {
      auto out = client->connect(addr);
      out->write(hello, [](const tp::Error&) {});
      std::unique_lock<std::mutex> lock(mutex);
      if (!cv.wait_for(lock, 10s, [&] { return accepted; })) {
        throw std::runtime_error("transport bench: a connection was not accepted within 10 s");
      }
      out->close();
    });
    if (in == nullptr)
      throw std::runtime_error("transport bench: the listener refused a connection");
    in->close();
    if (i >= 20) times.push_back(t);
  }
  listener->close();
  client->close();
  server->close();
  client->join();
  server->join();
  return median(times);
}

const Register transport_bench(
    {"rpc.transport_latency_us", "rpc.transport_async_calls_per_s", "rpc.idle_cpu_percent",
     "rpc.latency_workers_us", "rpc.connect_us"},
    [](const auto& emit) {
      c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
      const double inf = std::numeric_limits<double>::infinity();
      std::vector<Results> results(variants().size());
      int tag = 0;
      // Runs alternate between transports so that drift on a shared machine favours none.
      for (int run = 0; run < kRuns; ++run) {
        for (size_t i = 0; i < variants().size(); ++i) {
          const Variant& v = variants()[i];
          const std::vector<double> r = run_rank_processes(
              server.port(), "transport" + std::to_string(tag++), 2,
              [&v](std::shared_ptr<c10d::Store> store, int rank) {
                return pair_body(v, true, std::move(store), rank);
              },
              "rpc transport " + v.name);
          Results& res = results[i];
          if (r[0] < res.best_p50) {
            res.cdf.clear();
            for (size_t q = 0; q < std::size(kQuantiles); ++q) {
              char item[64];
              std::snprintf(item, sizeof item, "%s%g:%.2f", q == 0 ? "" : " ", kQuantiles[q] * 100,
                            r[5 + q] * 1e6);
              res.cdf += item;
            }
          }
          res.best_p50 = std::min(res.best_p50, r[0]);
          res.worst_p50 = std::max(res.worst_p50, r[0]);
          res.runs += (res.runs.empty() ? "" : " ") + std::to_string(std::lround(r[0] * 1e6));
          res.p99 = std::min(res.p99, r[1]);
          res.async = std::min(res.async, r[2]);
          res.ping = std::min(res.ping, r[3]);
          // Idle CPU is measured in the first two runs only (2 s each).
          if (run < 2) res.idle = std::max(res.idle, r[4]);
        }
      }
      double shm_p50 = inf;
      double tcp_ping = inf;
      for (size_t i = 0; i < variants().size(); ++i) {
        if (variants()[i].name == "shm") shm_p50 = results[i].best_p50;
        tcp_ping = std::min(tcp_ping, results[i].ping);
      }
      for (size_t i = 0; i < variants().size(); ++i) {
        const Variant& v = variants()[i];
        const Results& res = results[i];
        std::string list;
        for (const auto& t : v.transports)
          list += (list.empty() ? "" : ",") + t;
        const bool ours = v.name.rfind("local", 0) == 0 || v.name == "tcp" || v.name == "unix";
        Figure f{"rpc.transport_latency_us",
                 res.best_p50 * 1e6,
                 "us",
                 {{"transport", v.name},
                  {"agent_transports", list},
                  {"secret", v.secret.empty() ? "none" : "set"},
                  {"statistic", "best p50 of " + std::to_string(kRuns) + " runs of " +
                                    std::to_string(kCalls) + " rpc_sync calls"},
                  {"worst_p50_us", res.worst_p50 * 1e6},
                  {"p50_per_run_us", res.runs},
                  {"stability_worst_over_best", res.worst_p50 / res.best_p50},
                  {"p99_us", res.p99 * 1e6},
                  {"cdf_percent_us", res.cdf},
                  {"call", "add(Tensor float32[2], Tensor float32[2]) -> Tensor"},
                  {"tcp_pingpong_us", tcp_ping * 1e6},
                  {"ratio_to_pingpong", res.best_p50 / tcp_ping},
                  {"shm_p50_us", shm_p50 * 1e6},
                  {"ratio_to_shm", res.best_p50 / shm_p50}}};
        if (v.name == "local") {
          f.params.push_back({"target_ratio_to_pingpong_max", 2.5});
          f.params.push_back({"target_ratio_to_shm_max", 1.1});
        }
        if (ours) f.params.push_back({"target_stability_max", 1.3});
        emit(f);
      }
      for (size_t i = 0; i < variants().size(); ++i) {
        const Variant& v = variants()[i];
        emit(Figure{"rpc.transport_async_calls_per_s",
                    1.0 / results[i].async,
                    "calls/s",
                    {{"transport", v.name},
                     {"in_flight", double(kWindow)},
                     {"calls", double(kAsyncCalls)},
                     {"statistic", "best of " + std::to_string(kRuns) + " runs"}}});
      }
      for (size_t i = 0; i < variants().size(); ++i) {
        const Variant& v = variants()[i];
        Figure f{"rpc.idle_cpu_percent",
                 results[i].idle * 100,
                 "% of a core",
                 {{"transport", v.name},
                  {"idle_seconds", std::chrono::duration<double>(kIdle).count()},
                  {"statistic",
                   "the busier of two connected, idle agent processes, worst of 2 "
                   "runs (process CPU time)"}}};
        const bool ours = v.name.rfind("local", 0) == 0 || v.name == "tcp" || v.name == "unix";
        if (ours) f.params.push_back({"target_max", 1.0});
        emit(f);
      }
      for (const char* name : {"local", "shm"}) {
        const Variant* v = nullptr;
        for (const auto& candidate : variants()) {
          if (candidate.name == name) v = &candidate;
        }
        for (int world : {3, 5}) {
          double best = inf;
          for (int run = 0; run < 2; ++run) {
            const std::vector<double> r = run_rank_processes(
                server.port(), "transport" + std::to_string(tag++), world,
                [v, world](std::shared_ptr<c10d::Store> store, int rank) {
                  return fan_in_body(*v, world, std::move(store), rank);
                },
                std::string("rpc fan-in ") + name);
            best = std::min(best, r[0]);
          }
          emit(Figure{"rpc.latency_workers_us",
                      best * 1e6,
                      "us",
                      {{"transport", name},
                       {"workers", double(world)},
                       {"shape", "every worker calls w0 (the server) at once"},
                       {"statistic", "the slowest caller's p50 of " + std::to_string(kCalls) +
                                         " rpc_sync calls, best of 2 runs"},
                       {"call", "add(Tensor float32[2], Tensor float32[2]) -> Tensor"}}});
        }
      }
      const double plain = connect_seconds("");
      const double authed = connect_seconds("a shared secret for the benchmark");
      emit(Figure{"rpc.connect_us",
                  plain * 1e6,
                  "us",
                  {{"secret", "none"},
                   {"what", "connect, gradwire handshake, TensorPipe's first frame accepted"},
                   {"statistic", "median of " + std::to_string(kConnects)}}});
      emit(Figure{"rpc.connect_us",
                  authed * 1e6,
                  "us",
                  {{"secret", "set"},
                   {"what",
                    "connect, gradwire handshake with HMAC-SHA256 challenge-response, "
                    "TensorPipe's first frame accepted"},
                   {"statistic", "median of " + std::to_string(kConnects)},
                   {"without_secret_us", plain * 1e6},
                   {"ratio_to_without", authed / plain}}});
    });

}  // namespace
}  // namespace gradwire::bench
