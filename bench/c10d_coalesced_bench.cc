// c10d.broadcast_coalesced_speedup: how much faster a model's state reaches every rank
// through ProcessGroup::broadcast_coalesced (tensors packed into buckets, one broadcast
// each) than through broadcast of the same list (one broadcast per tensor), as
// DistributedDataParallel does at construction. Two ranks as two processes on this
// machine, Gloo over 127.0.0.1; the baseline is measured in the same processes, the two
// calls alternating, and each figure is the median call.
//
// The list looks like a small network's parameters: 100 weights of 64 x 256 float32
// (64 KiB) each followed by its bias of 256 float32 (1 KiB), 6.5 MiB in all.

#include <chrono>
#include <string>
#include <vector>

#include "bench.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/tensor/factory.h"
#include "ranks.h"

namespace gradwire::bench {
namespace {

using namespace std::chrono_literals;
using c10d::ProcessGroupGloo;

constexpr int kWorld = 2;
constexpr int kLayers = 100;
constexpr int64_t kRows = 64;
constexpr int64_t kCols = 256;
constexpr int kCalls = 15;

std::vector<Tensor> model_state(int rank) {
  std::vector<Tensor> tensors;
  for (int i = 0; i < kLayers; ++i) {
    tensors.push_back(full({kRows, kCols}, Scalar(rank + i), kFloat32));
    tensors.push_back(full({kCols}, Scalar(rank - i), kFloat32));
  }
  return tensors;
}

// One rank: median seconds of broadcast_coalesced, then of broadcast of the list.
std::vector<double> rank_body(std::shared_ptr<c10d::Store> store, int rank) {
  auto group = ProcessGroupGloo::create(store, rank, kWorld,
                                        {.timeout = 120s, .debug_level = c10d::DebugLevel::kOff},
                                        {.host = "127.0.0.1"});
  std::vector<Tensor> tensors = model_state(rank);
  auto coalesced = [&] { group->broadcast_coalesced(tensors).wait(); };
  auto one_by_one = [&] { group->broadcast(tensors).wait(); };
  coalesced();
  one_by_one();
  std::vector<double> ours;
  std::vector<double> baseline;
  for (int i = 0; i < kCalls; ++i) {
    group->barrier().wait();
    ours.push_back(time_once(coalesced));
    group->barrier().wait();
    baseline.push_back(time_once(one_by_one));
  }
  group->barrier().wait();
  return {median(ours), median(baseline)};
}

const Register coalesced_bench({"c10d.broadcast_coalesced_speedup"}, [](const auto& emit) {
  c10d::TCPStoreServer server(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  const std::vector<double> seconds =
      run_rank_processes(server.port(), "coalesced", kWorld, rank_body, "c10d coalesced");
  const double bytes = kLayers * (kRows * kCols + kCols) * 4.0;
  emit(Figure{"c10d.broadcast_coalesced_speedup",
              seconds[1] / seconds[0],
              "x",
              {{"tensors", double(2 * kLayers)},
               {"bytes", bytes},
               {"dtype", "float32"},
               {"ranks", double(kWorld)},
               {"backend", "gloo (ProcessGroupGloo, processes on 127.0.0.1)"},
               {"bucket_bytes", double(c10d::kDefaultCoalescedBucketBytes)},
               {"coalesced_s", seconds[0]},
               {"baseline", "ProcessGroup::broadcast of the same list (one broadcast per tensor)"},
               {"baseline_s", seconds[1]},
               {"statistic", "median of " + std::to_string(kCalls) + " calls each, alternating"},
               {"target_ratio_min", 1.0}}});
});

}  // namespace
}  // namespace gradwire::bench
