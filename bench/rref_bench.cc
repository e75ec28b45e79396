// rref figures: two workers as two processes on this machine (they meet through a TCPStore
// served here), set up exactly as rpc_bench's, against PyTorch 1.13's TensorPipe agent
// doing the same (bench/pytorch/rref_peer.py), all in the same run:
//   rref.remote_to_here_us    p50 and p99 of rref::remote<Tensor>(agent, "w1", "make_small")
//                             then .to_here() of the 4-element float32 tensor it keeps on
//                             w1, the RRef dropped each time (its delete message is sent
//                             inside the timed iteration, its handling on w1 is not
//                             waited for); baselines: this run's own rpc_sync p50 of "add"
//                             on two 2-element float32 tensors between the same two
//                             processes (params.rpc_latency_us, the call rpc.latency_us
//                             times, in blocks alternating with the remote + to_here
//                             iterations), and PyTorch's rpc.remote(make_small) +
//                             to_here() (params.pytorch_us)
//   rref.proxy_calls_per_s    rref.rpc_async<int64_t>("add", 1) on one remote Counter
//                             (an atomic counter) with 64 calls in flight (a sliding
//                             window); baseline: PyTorch's rref.rpc_async().add(1) on a
//                             Counter made with rpc.remote, same window
// Rounds alternate with PyTorch's and each side keeps its best round, so that drift on a
// shared machine favours neither.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "gradwire/rref/rref.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;

constexpr int kWarmup = 200;
constexpr int kRemoteCalls = 2000;
constexpr int kRpcCalls = 2000;
constexpr int kBlocks = 8;  // the two latency loops alternate in blocks
constexpr int kProxyCalls = 10000;
constexpr int kWindow = 64;
constexpr int kRounds = 2;

// The remote object of rref.proxy_calls_per_s: its methods run concurrently on the
// owner's pool, so it is thread-safe by itself.
class Counter {
 public:
  explicit Counter(int64_t start) : value_(start) {}
  int64_t add(int64_t n) { return value_ += n; }
  int64_t get() const { return value_.load(); }

 private:
  std::atomic<int64_t> value_;
};

void expect(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("rref bench: ") + what);
}

// Rank 0's figures: remote + to_here p50 and p99, seconds per proxy call (as PyTorch's
// peer prints them), then the rpc_sync p50 of the same round.
std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank) {
  rpc::Registry reg;
  reg.def("add", [](const Tensor& a, const Tensor& b) { return add(a, b); });
  reg.def("make_small", [] { return tensor<float>({1.0f, 2.0f, 3.0f, 4.0f}, {4}); });
  reg.def_class<Counter>("Counter")
      .ctor<int64_t>()
      .method("add", &Counter::add)
      .method("get", &Counter::get);
  rpc::AgentOptions options = rank_agent_options(reg);
  auto agent = rpc::make_tensorpipe_agent("w" + std::to_string(rank), rank, 2, store, options);
  std::vector<double> out;
  if (rank == 0) {
    // The rpc baseline: the call rpc.latency_us times, between the same two processes,
    // timed in blocks that alternate with remote + to_here's so that drift favours neither.
    const Tensor a = tensor<float>({1.5f, -2.0f}, {2});
    const Tensor b = tensor<float>({0.25f, 4.0f}, {2});
    auto rpc_call = [&] { agent->rpc_sync<Tensor>("w1", "add", a, b); };
    // remote + to_here, the reference dropped at the end of each iteration.
    auto remote_to_here = [&] {
      rref::RRef<Tensor> r = rref::remote<Tensor>(*agent, "w1", "make_small");
      return r.to_here();
    };
    for (int i = 0; i < kWarmup; ++i) {
      rpc_call();
      remote_to_here();
    }
    std::vector<double> rpc_times;
    std::vector<double> times;
    rpc_times.reserve(kRpcCalls);
    times.reserve(kRemoteCalls);
    for (int block = 0; block < kBlocks; ++block) {
      for (int i = 0; i < kRpcCalls / kBlocks; ++i)
        rpc_times.push_back(time_once(rpc_call));
      for (int i = 0; i < kRemoteCalls / kBlocks; ++i)
        times.push_back(time_once([&] { remote_to_here(); }));
    }
    const Tensor got = remote_to_here();
    expect(got.numel() == 4 && sum(got).item<double>() == 10.0, "wrong value from to_here");
    out.push_back(median(times));
    out.push_back(percentile(times, 0.99));

    // Proxy calls on one remote Counter, 64 in flight.
    {
      rref::RRef<Counter> counter = rref::remote<Counter>(*agent, "w1", "Counter", int64_t{0});
      for (int i = 0; i < kWarmup; ++i)
        counter.rpc_sync<int64_t>("add", int64_t{1});
      const double per_call = seconds_per_windowed_call(
          kProxyCalls, kWindow, 60s, [&] { return counter.rpc_async<int64_t>("add", int64_t{1}); });
      expect(counter.rpc_sync<int64_t>("get") == kWarmup + kProxyCalls, "lost proxy calls");
      out.push_back(per_call);
    }
    out.push_back(median(rpc_times));
    rref::wait_idle(*agent, 60s);
    store->set("rank0_idle", "1");
  } else {
    // Every reference rank 0 dropped is gone here before the agents shut down.
    store->wait({"rank0_idle"}, 120s);
    expect(rref::wait_owned_values(*agent, 0, 60s), "references left on the owner");
  }
  agent->shutdown();
  return out;
}

const Register rref_bench(
    {"rref.remote_to_here_us", "rref.proxy_calls_per_s"}, [](const auto& emit) {
      c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
      constexpr size_t kTheirs = 3;  // p50, p99, seconds per proxy call
      const double inf = std::numeric_limits<double>::infinity();
      const double nan = std::numeric_limits<double>::quiet_NaN();
      std::vector<double> ours(kTheirs + 1, inf);
      std::vector<double> theirs(kTheirs, inf);
      std::string why;
      std::string version;
      bool have_theirs = true;
      const std::string args = std::to_string(kRemoteCalls) + " " + std::to_string(kProxyCalls);
      for (int r = 0; r < kRounds; ++r) {
        const std::vector<double> mine =
            run_rank_processes(server.port(), "rref" + std::to_string(r), 2, rank_body, "rref");
        expect(mine.size() == ours.size(), "rank 0 reported the wrong number of figures");
        for (size_t i = 0; i < ours.size(); ++i)
          ours[i] = std::min(ours[i], mine[i]);
        if (have_theirs) {
          auto peer = run_pytorch_peer("rref_peer.py", args, "", why);
          if (!peer || peer->seconds.size() != kTheirs) {
            if (peer) why = "the peer printed " + std::to_string(peer->seconds.size()) + " figures";
            have_theirs = false;
          } else {
            version = peer->torch_version;
            for (size_t i = 0; i < kTheirs; ++i)
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
      const double rpc_us = ours[kTheirs] * 1e6;
      const char* labels[] = {"p50", "p99"};
      for (size_t q = 0; q < 2; ++q) {
        const double us = ours[q] * 1e6;
        Figure f{"rref.remote_to_here_us",
                 us,
                 "us",
                 {{"statistic",
                   std::string(labels[q]) + " of " + std::to_string(kRemoteCalls) + " iterations"},
                  {"call",
                   "rref::remote<Tensor>(agent, \"w1\", \"make_small\") then to_here() of "
                   "Tensor float32[4], the RRef dropped"},
                  {"workers", "2 processes on 127.0.0.1"},
                  {"rpc_latency_us", rpc_us},
                  {"rpc_call", "p50 of rpc_sync add(Tensor float32[2], Tensor float32[2])"},
                  {"ratio_to_rpc", us / rpc_us}}};
        pytorch(f, "torch.distributed.rpc rpc.remote(make_small) + to_here(), TensorPipe agent",
                "pytorch_us", theirs[q] * 1e6);
        f.params.push_back({"pytorch_over_ours", have_theirs ? theirs[q] / ours[q] : nan});
        if (q == 0) {
          f.params.push_back({"target_pytorch_over_ours_min", 5.0});
          f.params.push_back({"target_ratio_to_rpc_max", 2.5});
        }
        emit(f);
      }
      Figure f{"rref.proxy_calls_per_s",
               1.0 / ours[2],
               "calls/s",
               {{"in_flight", double(kWindow)},
                {"calls", double(kProxyCalls)},
                {"call", "RRef<Counter>::rpc_async<int64_t>(\"add\", 1), Counter an atomic int64"},
                {"workers", "2 processes on 127.0.0.1"}}};
      pytorch(f, "torch.distributed.rpc rref.rpc_async().add(1) on rpc.remote(Counter)",
              "pytorch_calls_per_s", 1.0 / theirs[2]);
      f.params.push_back({"ratio", have_theirs ? theirs[2] / ours[2] : nan});
      f.params.push_back({"target_ratio_min", 5.0});
      emit(f);
    });

}  // namespace
}  // namespace gradwire::bench
