// rpc figures: two workers as two processes on this machine (they meet through a TCPStore
// served here), against PyTorch 1.13's TensorPipe agent doing the same calls
// (bench/pytorch/rpc_peer.py) and raw baselines, all in the same run:
//   rpc.latency_us         p50 and p99 of rpc_sync "add" on two 2-element float32
//                          tensors; baseline: a raw TCP_NODELAY ping-pong between the same
//                          two processes (params.tcp_pingpong_us), and PyTorch's
//                          rpc_sync(torch.add) (params.pytorch_us); diagnostic: the same
//                          ping-pong with one hand-off between threads on the echoing side
//                          (params.handoff_pingpong_us, bench/pingpong.h), the floor of a
//                          call served on a pool thread
//   rpc.latency_inline_us  the same with "add" registered Execution::kInline (run on the
//                          callee's I/O thread, no hand-off to its pool); same baselines
//   rpc.bandwidth_gbps     rpc_sync "sum" of one float32 tensor of 1, 16 and 64 MiB
//                          (one-way payload, a scalar back), bytes / median call; baseline:
//                          memcpy of the same size between warm buffers
//                          (params.memcpy_gbps), and PyTorch's rpc_sync(torch.sum)
//   rpc.async_calls_per_s  rpc_async "add" with 64 calls in flight (a sliding window)
//   rpc.latency_traced_us  p50 of rpc_sync "add" as rpc.latency_us, with gradwire::trace
//                          recording on both workers; baseline: the p50 with tracing off,
//                          measured in blocks that alternate with the traced ones in the
//                          same processes (params.untraced_us), and their ratio
// Rounds alternate with PyTorch's and each side keeps its best round, so that drift on a
// shared machine favours neither.

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "pingpong.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;

constexpr int kLatencyCalls = 2000;
constexpr int kPingPongs = 2000;
constexpr int kBandwidthCalls = 5;
constexpr int kAsyncCalls = 10000;
constexpr int kWindow = 64;
constexpr int kRounds = 2;
constexpr int kTraceBlocks = 4;  // alternating blocks of untraced and traced calls
const std::vector<int64_t> kBandwidthBytes = {1 << 20, 16 << 20, 64 << 20};

// Rank 0's figures, in the order of PyTorch's peer: p50, p99, bandwidth seconds per
// size, seconds per async call; then the ping-pong p50.
std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank) {
  rpc::Registry reg;
  reg.def("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  reg.def(
      "add_inline", [](const Tensor& a, const Tensor& b) { return add(a, b); },
      rpc::Execution::kInline);
  reg.def("sum", [](const Tensor& t) { return sum(t).item<double>(); });
  // rpc.latency_traced_us: the caller turns the callee's tracing on and off.
  reg.def("trace", [](int64_t on) {
    if (on != 0) {
      trace::start();
    } else {
      trace::stop();
      trace::clear();
    }
    return on;
  });
  // The raw ping-pong first, between the same two processes.
  std::thread echo;
  if (rank == 1) {
    const int listener = listen_for_echo(*store);
    echo = std::thread([listener] { serve_echo(listener); });
  }
  std::vector<double> pings;
  if (rank == 0) pings = ping_pong(*store, kPingPongs, 200);
  // Then the same with one hand-off between threads on rank 1 (serve_echo_handoff).
  std::thread handoff_echo;
  if (rank == 1) {
    echo.join();
    const int listener = listen_for_echo(*store, "echo_handoff_port");
    handoff_echo = std::thread([listener] { serve_echo_handoff(listener); });
  }
  std::vector<double> handoff_pings;
  if (rank == 0) handoff_pings = ping_pong(*store, kPingPongs, 200, "echo_handoff_port");
  if (rank == 1) handoff_echo.join();

  rpc::AgentOptions options = rank_agent_options(reg);
  auto agent = rpc::make_tensorpipe_agent("w" + std::to_string(rank), rank, 2, store, options);
  std::vector<double> out;
  if (rank == 0) {
    const Tensor a = tensor<float>({1.5f, -2.0f}, {2});
    const Tensor b = tensor<float>({0.25f, 4.0f}, {2});
    const std::vector<double> times =
        time_calls(200, kLatencyCalls, [&] { agent->rpc_sync<Tensor>("w1", "add", a, b); });
    out.push_back(median(times));
    out.push_back(percentile(times, 0.99));
    for (int64_t bytes : kBandwidthBytes) {
      const Tensor t = ones({bytes / 4});
      for (int i = 0; i < 2; ++i)
        agent->rpc_sync<double>("w1", "sum", t);
      std::vector<double> bw;
      for (int i = 0; i < kBandwidthCalls; ++i) {
        bw.push_back(time_once([&] {
          const double s = agent->rpc_sync<double>("w1", "sum", t);
          if (s != static_cast<double>(bytes / 4)) throw std::runtime_error("rpc bench: bad sum");
        }));
      }
      out.push_back(median(bw));
    }
    out.push_back(seconds_per_windowed_call(
        kAsyncCalls, kWindow, 60s, [&] { return agent->rpc_async<Tensor>("w1", "add", a, b); }));
    out.push_back(median(pings));
    // The same call, run on the callee's I/O thread (Execution::kInline).
    const std::vector<double> inline_times =
        time_calls(200, kLatencyCalls, [&] { agent->rpc_sync<Tensor>("w1", "add_inline", a, b); });
    out.push_back(median(inline_times));
    out.push_back(percentile(inline_times, 0.99));
    // Tracing off and on, in alternating blocks of the same call.
    std::vector<double> untraced;
    std::vector<double> traced;
    const int per_block = kLatencyCalls / kTraceBlocks;
    for (int block = 0; block < kTraceBlocks; ++block) {
      for (const double t :
           time_calls(20, per_block, [&] { agent->rpc_sync<Tensor>("w1", "add", a, b); }))
        untraced.push_back(t);
      agent->rpc_sync<int64_t>("w1", "trace", int64_t{1});
      trace::start();
      for (const double t :
           time_calls(20, per_block, [&] { agent->rpc_sync<Tensor>("w1", "add", a, b); }))
        traced.push_back(t);
      trace::stop();
      trace::clear();
      agent->rpc_sync<int64_t>("w1", "trace", int64_t{0});
    }
    out.push_back(median(untraced));
    out.push_back(median(traced));
    out.push_back(median(handoff_pings));
  }
  agent->shutdown();
  return out;
}

std::vector<double> run_ours(c10d::TCPStoreServer& server, int round) {
  return run_rank_processes(server.port(), "rpc" + std::to_string(round), 2, rank_body, "rpc");
}

double memcpy_seconds(int64_t bytes) {
  std::vector<char> from(static_cast<size_t>(bytes), 1);
  std::vector<char> to(static_cast<size_t>(bytes), 0);
  std::vector<double> times;
  for (int i = 0; i < 7; ++i) {
    times.push_back(time_once([&] { std::memcpy(to.data(), from.data(), to.size()); }));
  }
  if (to[static_cast<size_t>(bytes) - 1] != 1) throw std::runtime_error("memcpy baseline");
  return median(times);
}

const Register rpc_bench(
    {"rpc.latency_us", "rpc.latency_inline_us", "rpc.bandwidth_gbps", "rpc.async_calls_per_s",
     "rpc.latency_traced_us"},
    [](const auto& emit) {
      c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
      const size_t n = 2 + kBandwidthBytes.size() + 1;
      const double inf = std::numeric_limits<double>::infinity();
      const double nan = std::numeric_limits<double>::quiet_NaN();
      // ours: the figures of PyTorch's order, the ping-pong, the inline p50 and p99, the
      // untraced and traced p50, then the ping-pong with a hand-off.
      std::vector<double> ours(n + 6, inf);
      std::vector<double> theirs(n, inf);
      std::vector<double> memcpy_s(kBandwidthBytes.size(), inf);
      std::string why;
      std::string version;
      bool have_theirs = true;
      std::string sizes;
      for (int64_t b : kBandwidthBytes)
        sizes += (sizes.empty() ? "" : ",") + std::to_string(b);
      const std::string args = std::to_string(kLatencyCalls) + " " +
                               std::to_string(kBandwidthCalls) + " " + std::to_string(kAsyncCalls) +
                               " " + sizes;
      for (int r = 0; r < kRounds; ++r) {
        const std::vector<double> mine = run_ours(server, r);
        for (size_t i = 0; i < ours.size() && i < mine.size(); ++i)
          ours[i] = std::min(ours[i], mine[i]);
        for (size_t i = 0; i < kBandwidthBytes.size(); ++i)
          memcpy_s[i] = std::min(memcpy_s[i], memcpy_seconds(kBandwidthBytes[i]));
        if (have_theirs) {
          auto peer = run_pytorch_peer("rpc_peer.py", args, "", why);
          if (!peer || peer->seconds.size() != n) {
            if (peer) why = "the peer printed " + std::to_string(peer->seconds.size()) + " figures";
            have_theirs = false;
          } else {
            version = peer->torch_version;
            for (size_t i = 0; i < n; ++i)
              theirs[i] = std::min(theirs[i], peer->seconds[i]);
          }
        }
      }
      auto pytorch = [&](Figure& f, const std::string& what, const std::string& key, double value) {
        if (have_theirs) {
          f.params.push_back({"pytorch", what + " " + version});
          f.params.push_back({key, value});
        } else {
          f.params.push_back({"pytorch", "unavailable"});
          f.params.push_back({"pytorch_reason", why});
          f.params.push_back({key, nan});
        }
      };
      const double ping_us = ours[n] * 1e6;
      const double handoff_ping_us = ours[n + 5] * 1e6;
      const char* labels[] = {"p50", "p99"};
      // The default (the callee runs add on its pool), then rpc.latency_inline_us: the same
      // call registered with Execution::kInline (run on the callee's I/O thread).
      for (size_t variant = 0; variant < 2; ++variant) {
        for (size_t q = 0; q < 2; ++q) {
          const double seconds = variant == 0 ? ours[q] : ours[n + 1 + q];
          const double us = seconds * 1e6;
          Figure f{variant == 0 ? "rpc.latency_us" : "rpc.latency_inline_us",
                   us,
                   "us",
                   {{"statistic", std::string(labels[q]) + " of " + std::to_string(kLatencyCalls) +
                                      " rpc_sync calls"},
                    {"call", "add(Tensor float32[2], Tensor float32[2]) -> Tensor"},
                    {"execution", variant == 0 ? "pool" : "inline"},
                    {"workers", "2 processes on 127.0.0.1"},
                    {"tcp_pingpong_us", ping_us},
                    {"ratio_to_pingpong", us / ping_us},
                    {"handoff_pingpong_us", handoff_ping_us},
                    {"ratio_to_handoff_pingpong", us / handoff_ping_us},
                    {"handoff_pingpong",
                     "diagnostic: the same ping-pong with one hand-off between threads on the "
                     "echoing side (a polling reader wakes a writer waiting on a condition "
                     "variable), median: the floor of the pool path on this host"}}};
          pytorch(f, "torch.distributed.rpc rpc_sync(torch.add), TensorPipe agent", "pytorch_us",
                  theirs[q] * 1e6);
          f.params.push_back({"pytorch_over_ours", have_theirs ? theirs[q] / seconds : nan});
          if (q == 0) {
            f.params.push_back({"target_pytorch_over_ours_min", 5.0});
            f.params.push_back({"target_ratio_to_pingpong_max", 2.0});
          }
          emit(f);
        }
      }
      for (size_t i = 0; i < kBandwidthBytes.size(); ++i) {
        const double bytes = static_cast<double>(kBandwidthBytes[i]);
        const double gbps = bytes / ours[2 + i] / 1e9;
        const double memcpy_gbps = bytes / memcpy_s[i] / 1e9;
        Figure f{"rpc.bandwidth_gbps",
                 gbps,
                 "GB/s",
                 {{"bytes", bytes},
                  {"call", "sum(Tensor float32) -> double, one-way payload"},
                  {"statistic", "median of " + std::to_string(kBandwidthCalls) + " calls"},
                  {"memcpy_gbps", memcpy_gbps},
                  {"ratio_to_memcpy", gbps / memcpy_gbps}}};
        pytorch(f, "torch.distributed.rpc rpc_sync(torch.sum), TensorPipe agent", "pytorch_gbps",
                bytes / theirs[2 + i] / 1e9);
        if (i + 1 == kBandwidthBytes.size())
          f.params.push_back({"target_ratio_to_memcpy_min", 0.5});
        emit(f);
      }
      const size_t a = 2 + kBandwidthBytes.size();
      Figure f{"rpc.async_calls_per_s",
               1.0 / ours[a],
               "calls/s",
               {{"in_flight", double(kWindow)},
                {"calls", double(kAsyncCalls)},
                {"call", "add(Tensor float32[2], Tensor float32[2]) -> Tensor"}}};
      pytorch(f, "torch.distributed.rpc rpc_async(torch.add), TensorPipe agent",
              "pytorch_calls_per_s", 1.0 / theirs[a]);
      f.params.push_back({"ratio", have_theirs ? theirs[a] / ours[a] : nan});
      f.params.push_back({"target_ratio_min", 5.0});
      emit(f);
      const double untraced_us = ours[n + 3] * 1e6;
      const double traced_us = ours[n + 4] * 1e6;
      emit(Figure{
          "rpc.latency_traced_us",
          traced_us,
          "us",
          {{"statistic", "p50 of " + std::to_string(kLatencyCalls) +
                             " rpc_sync calls with tracing on, in " + std::to_string(kTraceBlocks) +
                             " blocks alternating with as many untraced ones"},
           {"call", "add(Tensor float32[2], Tensor float32[2]) -> Tensor"},
           {"tracing", "gradwire::trace on both workers (rpc.call, rpc.queue, rpc.serve)"},
           {"workers", "2 processes on 127.0.0.1"},
           {"untraced_us", untraced_us},
           {"ratio_traced_over_untraced", traced_us / untraced_us},
           {"target_ratio_max", 1.05}}});
    });

}  // namespace
}  // namespace gradwire::bench
