// Process-group figures: all_reduce bus bandwidth at 4 KiB .. 64 MiB and small-message
// latency, two ranks as two processes on this machine, against PyTorch 1.13's gloo
// backend doing the same (bench/pytorch/allreduce_peer.py) in the same run. Every figure
// comes twice: over ProcessGroupGloo (params.backend "gloo ...") and over ProcessGroupShm
// (params.backend "shm ..."), whose rows also carry the Gloo figure of the same run
// (gloo_gbps, ratio_to_gloo; target at least 4x at 16 and 64 MiB).
//
// Both sides: float32 sum, synchronous calls (issue, then wait), warm-up calls, a barrier,
// then every call timed on its own; the figure is the median call. Bus bandwidth is
// algorithm bandwidth (bytes / time) times 2(n-1)/n, which is 1 for two ranks.

#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/tensor/factory.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
using c10d::ProcessGroupGloo;

struct Size {
  int64_t bytes;
  int iters;
};

const std::vector<Size> kSizes = {{4 << 10, 2000}, {1 << 20, 100}, {16 << 20, 10}, {64 << 20, 4}};
constexpr int kWorld = 2;
constexpr int kRounds = 3;

std::string spec_text() {
  std::string s;
  for (const Size& size : kSizes)
    s += (s.empty() ? "" : ",") + std::to_string(size.bytes) + ":" + std::to_string(size.iters);
  return s;
}

enum class Backend { kGloo, kShm };

// One rank: median seconds per call for each size.
std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank, Backend backend) {
  const c10d::ProcessGroupOptions options{.timeout = 120s, .debug_level = c10d::DebugLevel::kOff};
  std::shared_ptr<c10d::ProcessGroup> group;
  if (backend == Backend::kShm) {
    group = c10d::ProcessGroupShm::create(store, rank, kWorld, options,
                                          {.gloo = {.host = "127.0.0.1"}});
  } else {
    group = ProcessGroupGloo::create(store, rank, kWorld, options, {.host = "127.0.0.1"});
  }
  std::vector<double> result;
  for (const Size& size : kSizes) {
    Tensor t = full({size.bytes / 4}, Scalar(rank + 1), kFloat32);
    for (int i = 0; i < std::max(3, size.iters / 10); ++i)
      group->all_reduce(t).wait();
    group->barrier().wait();
    std::vector<double> times;
    times.reserve(static_cast<size_t>(size.iters));
    for (int i = 0; i < size.iters; ++i) {
      times.push_back(time_once([&] { group->all_reduce(t).wait(); }));
    }
    result.push_back(median(times));
  }
  group->barrier().wait();
  return result;
}

// Forks the two ranks, which meet through a TCPStore served here, and returns rank 0's
// medians.
std::vector<double> run_ours(c10d::TCPStoreServer& server, int round, Backend backend) {
  const std::string name = backend == Backend::kShm ? "shm" : "gloo";
  return run_rank_processes(
      server.port(), "allreduce_" + name + std::to_string(round), kWorld,
      [backend](std::shared_ptr<c10d::Store> store, int rank) {
        return rank_body(std::move(store), rank, backend);
      },
      "c10d " + name);
}

const Register allreduce_bench(
    {"c10d.allreduce_busbw_gbps", "c10d.allreduce_latency_us"}, [](const auto& emit) {
      c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
      // Rounds alternate with PyTorch's, and each side keeps its best round per size, so
      // that drift on a shared machine favours neither.
      std::vector<double> ours(kSizes.size(), std::numeric_limits<double>::infinity());
      std::vector<double> shm(kSizes.size(), std::numeric_limits<double>::infinity());
      std::vector<double> theirs(kSizes.size(), std::numeric_limits<double>::infinity());
      std::string why;
      std::string version;
      bool have_theirs = true;
      for (int r = 0; r < kRounds; ++r) {
        const std::vector<double> mine = run_ours(server, r, Backend::kGloo);
        const std::vector<double> mine_shm = run_ours(server, r, Backend::kShm);
        for (size_t i = 0; i < kSizes.size(); ++i) {
          ours[i] = std::min(ours[i], mine[i]);
          shm[i] = std::min(shm[i], mine_shm[i]);
        }
        if (have_theirs) {
          auto peer = run_pytorch_peer("allreduce_peer.py", spec_text(), "", why);
          if (!peer || peer->seconds.size() != kSizes.size()) {
            if (peer) why = "the peer printed " + std::to_string(peer->seconds.size()) + " figures";
            have_theirs = false;
          } else {
            version = peer->torch_version;
            for (size_t i = 0; i < kSizes.size(); ++i)
              theirs[i] = std::min(theirs[i], peer->seconds[i]);
          }
        }
      }
      const double bus_factor = 2.0 * (kWorld - 1) / kWorld;
      const double nan = std::numeric_limits<double>::quiet_NaN();
      for (const Backend backend : {Backend::kGloo, Backend::kShm}) {
        const bool is_shm = backend == Backend::kShm;
        const std::vector<double>& secs = is_shm ? shm : ours;
        for (size_t i = 0; i < kSizes.size(); ++i) {
          const double bytes = static_cast<double>(kSizes[i].bytes);
          const double gbps = bytes / secs[i] * bus_factor / 1e9;
          const double gloo_gbps = bytes / ours[i] * bus_factor / 1e9;
          Figure f{"c10d.allreduce_busbw_gbps",
                   gbps,
                   "GB/s",
                   {{"bytes", bytes},
                    {"dtype", "float32"},
                    {"ranks", double(kWorld)},
                    {"backend", is_shm ? "shm (ProcessGroupShm, processes on one host)"
                                       : "gloo (ProcessGroupGloo, processes on 127.0.0.1)"},
                    {"calls", double(kSizes[i].iters)},
                    {"seconds_per_call", secs[i]}}};
          if (have_theirs) {
            const double their_gbps = bytes / theirs[i] * bus_factor / 1e9;
            f.params.push_back({"pytorch", "torch.distributed gloo all_reduce " + version});
            f.params.push_back({"pytorch_gbps", their_gbps});
            f.params.push_back({"ratio", gbps / their_gbps});
          } else {
            f.params.push_back({"pytorch", "unavailable"});
            f.params.push_back({"pytorch_reason", why});
            f.params.push_back({"pytorch_gbps", nan});
            f.params.push_back({"ratio", nan});
          }
          f.params.push_back({"target_ratio_min", 1.0});
          if (is_shm) {
            f.params.push_back({"gloo_gbps", gloo_gbps});
            f.params.push_back({"ratio_to_gloo", gbps / gloo_gbps});
            if (kSizes[i].bytes >= (16 << 20))
              f.params.push_back({"target_ratio_to_gloo_min", 4.0});
          }
          emit(f);
        }
        Figure lat{"c10d.allreduce_latency_us",
                   secs[0] * 1e6,
                   "us",
                   {{"bytes", static_cast<double>(kSizes[0].bytes)},
                    {"dtype", "float32"},
                    {"ranks", double(kWorld)},
                    {"backend", is_shm ? "shm" : "gloo"},
                    {"statistic", "median of " + std::to_string(kSizes[0].iters) + " calls"}}};
        if (have_theirs) {
          lat.params.push_back({"pytorch", "torch.distributed gloo all_reduce " + version});
          lat.params.push_back({"pytorch_us", theirs[0] * 1e6});
          lat.params.push_back({"ratio", theirs[0] / secs[0]});
        } else {
          lat.params.push_back({"pytorch", "unavailable"});
          lat.params.push_back({"pytorch_reason", why});
          lat.params.push_back({"pytorch_us", nan});
          lat.params.push_back({"ratio", nan});
        }
        lat.params.push_back({"target_ratio_min", 1.0});
        emit(lat);
      }
    });

}  // namespace
}  // namespace gradwire::bench
