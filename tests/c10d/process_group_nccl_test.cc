// ProcessGroupNCCL: every collective against closed forms (world sizes 1, 2 and 4, as far
// as the machine has GPUs), several tensors and dtypes in one call, point-to-point order,
// the stream semantics of Work::wait, futures, subgroups, options, and failures (a rank
// that never joins, an operation a peer skips, bad arguments).
//
// Every rank runs in a child process on its own GPU (cuda:<rank>), the ranks meeting
// through a FileStore. Two reasons: NCCL refuses two ranks of one communicator on one GPU,
// so ranks cannot share device 0; and this process must never initialise CUDA itself,
// because c10d_test forks ranks for other tests too, and the harness refuses to fork a
// process running CUDA's threads (nor could a child use CUDA its parent initialised). The
// GPUs are counted in a child process for the same reason. Tests that need more GPUs than
// the machine has, or any GPU, report themselves skipped; in a build without NCCL a single
// test does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/config.h"

#if GRADWIRE_HAS_NCCL

#include "c10d/c10d_test_util.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/process_group_nccl.h"
#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/harness.h"

#endif

namespace gradwire::c10d {
namespace {

#if !GRADWIRE_HAS_NCCL

TEST(NcclBackend, BuiltWithoutNccl) {
  GTEST_SKIP() << "built without NCCL";
}

#else

using namespace std::chrono_literals;
using test::RankResults;
using ::testing::HasSubstr;

// How many CUDA devices this machine has, asked once in a child process (see the file
// comment).
int gpu_count() {
  static const int count = [] {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) ::_exit(std::clamp(cuda_device_count(), 0, 100));
    int status = 0;
    if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 0;
    return WEXITSTATUS(status);
  }();
  return count;
}

#define SKIP_WITHOUT_GPUS(n)                                                       \
  do {                                                                             \
    if (gpu_count() < (n)) {                                                       \
      GTEST_SKIP() << "needs " << (n) << " CUDA device(s), found " << gpu_count(); \
    }                                                                              \
  } while (0)

Device gpu(int rank) {
  return Device::cuda(rank);
}

using Body = std::function<void(ProcessGroupNCCL& group, int rank)>;

// Runs `body` on `world` ranks: child processes, rank r on cuda:r, each with its own group.
RankResults run_group(int world, const Body& body, ProcessGroupOptions options = {},
                      NcclOptions nccl = {}) {
  if (options.timeout == kDefaultProcessGroupTimeout) options.timeout = 60s;
  if (!options.debug_level) options.debug_level = DebugLevel::kOff;
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  return test::run_ranks_as_processes(
      world,
      [&](int rank) {
        auto store = std::make_shared<FileStore>(
            FileStoreOptions{.path = path, .num_workers = world, .timeout = 60s});
        auto group = ProcessGroupNCCL::create(store, rank, world, options, nccl);
        body(*group, rank);
      },
      180s);
}

// Runs `body` in one child process: rank `rank` of a group of `world` whose other ranks
// never come, over a store of its own.
RankResults run_alone(int rank, int world, const Body& body, ProcessGroupOptions options) {
  if (!options.debug_level) options.debug_level = DebugLevel::kOff;
  return test::run_ranks_as_processes(
      1,
      [&](int) {
        auto store = std::make_shared<HashStore>(20s);
        auto group = ProcessGroupNCCL::create(store, rank, world, options);
        body(*group, rank);
      },
      120s);
}

// Rank r contributes (r + 1) * (i + 1) at index i, on its GPU.
Tensor contribution(int rank, int64_t n, DType dtype = kFloat32) {
  return arange(Scalar(1), Scalar(n + 1)).mul_(Scalar(rank + 1)).to(dtype).to(gpu(rank));
}

// The same values, computed on the host (a rank must not touch another rank's GPU).
std::vector<double> contribution_values(int rank, int64_t n) {
  std::vector<double> v;
  for (int64_t i = 0; i < n; ++i)
    v.push_back(static_cast<double>((rank + 1) * (i + 1)));
  return v;
}

Tensor filled(int rank, int64_t n, double value, DType dtype = kFloat32) {
  return full({n}, Scalar(value), TensorOptions(dtype).device(gpu(rank)));
}

// The elements of a device tensor, copied to the host by a copy on the legacy default
// stream: after Work::wait() it sees the operation's result.
std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

int64_t factorial(int n) {
  return n <= 1 ? 1 : n * factorial(n - 1);
}

// ---- collectives, against closed forms

class NcclCollectives : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPUS(world()); }
  int world() const { return GetParam(); }
  RankResults run(const Body& body) { return run_group(world(), body); }
};

TEST_P(NcclCollectives, AllReduceEveryOpMatchesClosedForms) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t n = 6;
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
      Tensor t = contribution(rank, n, kFloat64);
      group.all_reduce(t, {.op = op}).wait();
      const std::vector<double> got = values(t);
      for (int64_t i = 0; i < n; ++i) {
        const double x = static_cast<double>(i + 1);
        double expected = 0;
        switch (op) {
          case ReduceOp::kSum:
            expected = x * w * (w + 1) / 2;
            break;
          case ReduceOp::kAvg:
            expected = x * (w + 1) / 2;
            break;
          case ReduceOp::kProduct:
            expected = std::pow(x, w) * static_cast<double>(factorial(w));
            break;
          case ReduceOp::kMin:
            expected = x;
            break;
          case ReduceOp::kMax:
            expected = x * w;
            break;
        }
        EXPECT_DOUBLE_EQ(got[static_cast<size_t>(i)], expected)
            << reduce_op_name(op) << " index " << i;
      }
    }
  }));
}

TEST_P(NcclCollectives, AllReduceEveryDtype) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t n = 5;
    const double sum_factor = w * (w + 1) / 2.0;
    for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8}) {
      Tensor s = contribution(rank, n, dtype);
      Tensor m = contribution(rank, n, dtype);
      group.all_reduce(s).wait();
      group.all_reduce(m, {.op = ReduceOp::kMax}).wait();
      const std::vector<double> sums = values(s);
      const std::vector<double> maxima = values(m);
      for (int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<size_t>(i);
        EXPECT_EQ(sums[k], (i + 1) * sum_factor) << dtype_name(dtype) << " index " << i;
        EXPECT_EQ(maxima[k], (i + 1) * w) << dtype_name(dtype) << " index " << i;
      }
      if (is_floating_point(dtype)) {
        // (w + 1) / 2 for w in {1, 2, 4} needs no rounding in any of the float formats.
        Tensor a = contribution(rank, n, dtype);
        group.all_reduce(a, {.op = ReduceOp::kAvg}).wait();
        EXPECT_EQ(values(a)[4], 5.0 * (w + 1) / 2) << dtype_name(dtype);
      }
    }
    // bool: sum and max are OR, product and min are AND. Only rank 0 holds true at index
    // 0; every rank holds true at index 1; none at index 2.
    Tensor flags = zeros({3}, TensorOptions(kBool).device(gpu(rank)));
    if (rank == 0) flags.select(0, 0).fill_(Scalar(true));
    flags.select(0, 1).fill_(Scalar(true));
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kProduct, ReduceOp::kMin}) {
      Tensor t = flags.clone();
      group.all_reduce(t, {.op = op}).wait();
      const bool is_or = op == ReduceOp::kSum || op == ReduceOp::kMax;
      EXPECT_EQ(values(t), (std::vector<double>{is_or || w == 1 ? 1.0 : 0.0, 1.0, 0.0}))
          << reduce_op_name(op);
    }
  }));
}

TEST_P(NcclCollectives, AllReduceSeveralTensorsInOneCall) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t kLarge = int64_t{1} << 20;
    std::vector<Tensor> tensors = {
        contribution(rank, 3, kFloat32), contribution(rank, kLarge, kFloat64),
        contribution(rank, 4, kInt64), zeros({0}, TensorOptions(kFloat32).device(gpu(rank)))};
    group.all_reduce(tensors).wait();
    const double sum_factor = w * (w + 1) / 2.0;
    for (size_t k = 0; k < 3; ++k) {
      const std::vector<double> got = values(tensors[k]);
      size_t wrong = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        if (got[i] != static_cast<double>(i + 1) * sum_factor) ++wrong;
      }
      EXPECT_EQ(wrong, 0u) << "tensor " << k << " of " << got.size() << " elements";
    }
    EXPECT_EQ(tensors[3].numel(), 0);
  }));
}

TEST_P(NcclCollectives, BroadcastFromEveryRoot) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    for (int root = 0; root < w; ++root) {
      std::vector<Tensor> tensors = {contribution(rank, 4, kFloat32),
                                     contribution(rank, 7, kInt32)};
      group.broadcast(tensors, {.root = root}).wait();
      EXPECT_EQ(values(tensors[0]), contribution_values(root, 4)) << "root " << root;
      EXPECT_EQ(values(tensors[1]), contribution_values(root, 7)) << "root " << root;
    }
  }));
}

TEST_P(NcclCollectives, BroadcastCoalescedMixedDtypesAndShapes) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    // Rank r's tensor k holds (r + 1) * (i + 1) + k at index i: small integers, exact in
    // every dtype used.
    const std::vector<std::pair<DType, int64_t>> kinds = {
        {kFloat32, 12}, {kInt64, 5},   {kFloat32, 7},  {kFloat16, 6},  {kFloat32, 0},
        {kInt32, 3},    {kFloat64, 8}, {kBFloat16, 5}, {kFloat32, 40}, {kUInt8, 9}};
    auto make = [&](int r, size_t k) {
      const auto& [dtype, n] = kinds[k];
      return arange(Scalar(1), Scalar(n + 1))
          .mul_(Scalar(r + 1))
          .add_(Scalar(static_cast<int64_t>(k)))
          .to(dtype)
          .to(gpu(rank));
    };
    for (size_t bucket_bytes : {size_t{40}, kDefaultCoalescedBucketBytes}) {
      for (int root = 0; root < w; ++root) {
        std::vector<Tensor> tensors;
        for (size_t k = 0; k < kinds.size(); ++k)
          tensors.push_back(make(rank, k));
        group.broadcast_coalesced(tensors, {.root = root, .bucket_bytes = bucket_bytes}).wait();
        for (size_t k = 0; k < kinds.size(); ++k) {
          std::vector<double> expected;
          for (int64_t i = 0; i < kinds[k].second; ++i)
            expected.push_back(static_cast<double>((root + 1) * (i + 1) + static_cast<int64_t>(k)));
          EXPECT_EQ(tensors[k].dtype(), kinds[k].first) << "tensor " << k;
          EXPECT_EQ(values(tensors[k]), expected)
              << "tensor " << k << ", root " << root << ", bucket_bytes " << bucket_bytes;
        }
      }
    }
  }));
}

TEST_P(NcclCollectives, ReduceToTheRootLeavesOthersUnchanged) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t n = 5;
    for (int root = 0; root < w; ++root) {
      Tensor t = contribution(rank, n, kFloat64);
      group.reduce(t, {.root = root, .op = ReduceOp::kSum}).wait();
      const std::vector<double> got = values(t);
      for (int64_t i = 0; i < n; ++i) {
        const double x = static_cast<double>(i + 1);
        const double expected = rank == root ? x * w * (w + 1) / 2 : x * (rank + 1);
        EXPECT_EQ(got[static_cast<size_t>(i)], expected) << "root " << root << " index " << i;
      }
    }
  }));
}

TEST_P(NcclCollectives, AllGatherIntoSeparateTensorsOneBufferAndInPlace) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t n = 6;
    const TensorOptions on_gpu = TensorOptions(kFloat32).device(gpu(rank));
    auto expect_gathered = [&](const std::vector<Tensor>& outputs, const std::string& how) {
      for (int r = 0; r < w; ++r) {
        EXPECT_EQ(values(outputs[static_cast<size_t>(r)]), contribution_values(r, n))
            << how << ": piece of rank " << r;
      }
    };
    // Separate tensors: one broadcast per rank.
    std::vector<Tensor> separate;
    for (int r = 0; r < w; ++r)
      separate.push_back(full({n}, Scalar(-1), on_gpu));
    group.all_gather(separate, contribution(rank, n)).wait();
    expect_gathered(separate, "separate tensors");
    // Views of one flat tensor: a single ncclAllGather.
    Tensor flat = full({w * n}, Scalar(-1), on_gpu);
    std::vector<Tensor> pieces;
    for (int r = 0; r < w; ++r)
      pieces.push_back(flat.narrow(0, r * n, n));
    group.all_gather(pieces, contribution(rank, n)).wait();
    expect_gathered(pieces, "one buffer");
    // In place: the input is this rank's own piece of the output.
    Tensor in_place = full({w * n}, Scalar(-1), on_gpu);
    std::vector<Tensor> own;
    for (int r = 0; r < w; ++r)
      own.push_back(in_place.narrow(0, r * n, n));
    own[static_cast<size_t>(rank)].copy_(contribution(rank, n));
    group.all_gather(own, own[static_cast<size_t>(rank)]).wait();
    expect_gathered(own, "in place");
  }));
}

TEST_P(NcclCollectives, GatherAndScatterFromEveryRoot) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t n = 3;
    for (int root = 0; root < w; ++root) {
      std::vector<Tensor> outputs;
      if (rank == root) {
        for (int r = 0; r < w; ++r)
          outputs.push_back(filled(rank, n, -1));
      }
      group.gather(outputs, contribution(rank, n), {.root = root}).wait();
      for (int r = 0; r < static_cast<int>(outputs.size()); ++r) {
        EXPECT_EQ(values(outputs[static_cast<size_t>(r)]), contribution_values(r, n))
            << "gather to root " << root << ", piece of rank " << r;
      }

      std::vector<Tensor> inputs;
      if (rank == root) {
        for (int r = 0; r < w; ++r)
          inputs.push_back(filled(rank, n, 100.0 * root + r));
      }
      Tensor output = filled(rank, n, -1);
      group.scatter(output, inputs, {.root = root}).wait();
      EXPECT_EQ(values(output), std::vector<double>(n, 100.0 * root + rank))
          << "scatter from root " << root;
    }
  }));
}

TEST_P(NcclCollectives, ReduceScatterFromSeparateTensorsAndOneBuffer) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t n = 4;
    // Rank q puts (q + 1) * (j * n + i + 1) at index i of the piece for rank j, so rank r
    // receives (r * n + i + 1) * w * (w + 1) / 2 (sum) or (r * n + i + 1) * w (max).
    Tensor flat = contribution(rank, w * n, kFloat32);
    std::vector<Tensor> pieces;
    std::vector<Tensor> separate;
    for (int j = 0; j < w; ++j) {
      pieces.push_back(flat.narrow(0, j * n, n));
      separate.push_back(flat.narrow(0, j * n, n).clone());
    }
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      const double factor = op == ReduceOp::kSum ? w * (w + 1) / 2.0 : w;
      std::vector<double> expected;
      for (int64_t i = 0; i < n; ++i)
        expected.push_back(static_cast<double>(rank * n + i + 1) * factor);
      Tensor from_buffer = filled(rank, n, -1);
      group.reduce_scatter(from_buffer, pieces, {.op = op}).wait();
      EXPECT_EQ(values(from_buffer), expected) << "one buffer, " << reduce_op_name(op);
      Tensor from_separate = filled(rank, n, -1);
      group.reduce_scatter(from_separate, separate, {.op = op}).wait();
      EXPECT_EQ(values(from_separate), expected) << "separate tensors, " << reduce_op_name(op);
    }
  }));
}

TEST_P(NcclCollectives, AllToAllWithUnequalSizes) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    // Rank r sends size(r, j) copies of 100 r + j to rank j: every direction of every pair
    // has its own size, some of them empty.
    auto size_of = [](int src, int dst) { return static_cast<int64_t>((2 * src + dst + 1) % 4); };
    std::vector<Tensor> inputs;
    std::vector<Tensor> outputs;
    for (int j = 0; j < w; ++j) {
      inputs.push_back(filled(rank, size_of(rank, j), 100.0 * rank + j, kInt64));
      outputs.push_back(filled(rank, size_of(j, rank), -1, kInt64));
    }
    group.all_to_all(outputs, inputs).wait();
    for (int j = 0; j < w; ++j) {
      EXPECT_EQ(values(outputs[static_cast<size_t>(j)]),
                std::vector<double>(static_cast<size_t>(size_of(j, rank)), 100.0 * j + rank))
          << "from rank " << j;
    }
  }));
}

TEST_P(NcclCollectives, BarriersAndManyOperationsInFlight) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroupNCCL& group, int rank) {
    group.barrier().wait();
    constexpr int kOps = 40;
    std::vector<Tensor> tensors;
    std::vector<Work> works;
    for (int k = 0; k < kOps; ++k) {
      tensors.push_back(filled(rank, 1000, k + rank));
      works.push_back(group.all_reduce(tensors.back()));
    }
    // The last future completes once the GPU is done with every operation before it too.
    const Future<std::vector<Tensor>> last = works.back().get_future();
    ASSERT_TRUE(last.wait(60s));
    EXPECT_EQ(last.error(), nullptr);
    EXPECT_TRUE(works.back().is_completed());
    for (int k = 0; k < kOps; ++k) {
      works[static_cast<size_t>(k)].wait();
      const double expected = w * k + w * (w - 1) / 2.0;
      EXPECT_EQ(values(tensors[static_cast<size_t>(k)]), std::vector<double>(1000, expected))
          << "operation " << k;
    }
    Work barrier = group.barrier();
    barrier.wait(30s);
    // A barrier's wait blocks the host until it is done.
    EXPECT_TRUE(barrier.is_completed());
    EXPECT_TRUE(barrier.is_success());
  }));
}

INSTANTIATE_TEST_SUITE_P(Nccl, NcclCollectives, ::testing::Values(1, 2, 4),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return "World" + std::to_string(info.param);
                         });

// ---- streams and futures

TEST(NcclStreams, WaitOrdersTheDefaultStreamAfterTheOperation) {
  SKIP_WITHOUT_GPUS(1);
  EXPECT_ALL_RANKS_OK(run_group(1, [](ProcessGroupNCCL& group, int rank) {
    // Large enough that a copy not ordered after the operation would read stale data.
    constexpr int64_t n = int64_t{1} << 25;
    Tensor input = empty({n}, TensorOptions(kFloat32).device(gpu(rank)));
    Tensor output = empty({n}, TensorOptions(kFloat32).device(gpu(rank)));
    output.fill_(Scalar(-1));
    // A kernel on the legacy default stream writes the input just before the call.
    input.fill_(Scalar(7));
    Work work = group.all_gather({output}, input);
    work.wait();
    const std::vector<float> host = output.to_vector<float>();
    EXPECT_EQ(std::count(host.begin(), host.end(), 7.0f), n);
  }));
}

TEST(NcclStreams, WaitReturnsBeforeThePeerHasJoined) {
  SKIP_WITHOUT_GPUS(2);
  EXPECT_ALL_RANKS_OK(run_group(2, [](ProcessGroupNCCL& group, int rank) {
    constexpr int64_t n = 1024;
    // The same operation once first, so that NCCL has connected the ranks for it.
    Tensor warm = contribution(rank, n);
    group.all_reduce(warm).wait();
    EXPECT_EQ(values(warm)[0], 3.0);
    Tensor t = contribution(rank, n);
    if (rank == 0) {
      Work work = group.all_reduce(t);
      // Rank 1 has not started its part (it waits for the key below), yet wait() returns:
      // it only orders this rank's stream after the operation.
      work.wait();
      EXPECT_FALSE(work.is_completed());
      group.store()->set("rank0-waited", std::string_view("1"));
      // This copy runs after the operation, which finishes once rank 1 joins.
      const std::vector<double> got = values(t);
      EXPECT_EQ(got[0], 3.0);
      EXPECT_EQ(got[n - 1], 3.0 * n);
    } else {
      group.store()->wait({"rank0-waited"}, 60s);
      group.all_reduce(t).wait();
      EXPECT_EQ(values(t)[n - 1], 3.0 * n);
    }
  }));
}

TEST(NcclStreams, FuturesCompleteWithTheOutputsOnceTheGpuIsDone) {
  SKIP_WITHOUT_GPUS(1);
  EXPECT_ALL_RANKS_OK(run_group(1, [](ProcessGroupNCCL& group, int rank) {
    Tensor t = contribution(rank, 8);
    Work work = group.all_reduce(t, {.op = ReduceOp::kMax});
    const std::vector<Tensor> outputs = work.get_future().get(60s);
    ASSERT_EQ(outputs.size(), 1u);
    EXPECT_TRUE(work.is_completed());
    EXPECT_TRUE(work.is_success());
    // No wait(): the future completing means the GPU is done, so any stream sees it.
    EXPECT_EQ(values(outputs[0]), contribution_values(rank, 8));
  }));
}

TEST(NcclStreams, BlockingWaitAndAHighPriorityStream) {
  SKIP_WITHOUT_GPUS(1);
  EXPECT_ALL_RANKS_OK(run_group(
      1,
      [](ProcessGroupNCCL& group, int rank) {
        EXPECT_TRUE(group.nccl_options().blocking_wait);
        Tensor t = contribution(rank, 1 << 16);
        Work work = group.all_reduce(t);
        work.wait(30s);
        // blocking_wait: wait() returned after the GPU finished.
        EXPECT_TRUE(work.is_completed());
        EXPECT_EQ(values(t)[9], 10.0);
      },
      {}, NcclOptions{.high_priority_stream = true, .blocking_wait = true}));
}

TEST(NcclStreams, DestroyingTheGroupWaitsForOperationsInFlight) {
  SKIP_WITHOUT_GPUS(1);
  EXPECT_ALL_RANKS_OK(test::run_ranks_as_processes(
      1,
      [](int rank) {
        constexpr int64_t n = int64_t{1} << 24;
        Tensor input = full({n}, Scalar(5), TensorOptions(kFloat32).device(gpu(rank)));
        Tensor output = full({n}, Scalar(-1), TensorOptions(kFloat32).device(gpu(rank)));
        {
          auto group = ProcessGroupNCCL::create(std::make_shared<HashStore>(20s), rank, 1,
                                                {.debug_level = DebugLevel::kOff});
          // Neither waited for nor kept: the group holds the tensors until the GPU is done.
          group->all_gather({output}, input);
        }
        const std::vector<float> host = output.to_vector<float>();
        EXPECT_EQ(std::count(host.begin(), host.end(), 5.0f), n);
      },
      120s));
}

// ---- point-to-point

TEST(NcclPointToPoint, MessagesArriveInIssueOrderWhateverTheirTags) {
  SKIP_WITHOUT_GPUS(2);
  EXPECT_ALL_RANKS_OK(run_group(2, [](ProcessGroupNCCL& group, int rank) {
    constexpr int kMessages = 5;
    if (rank == 0) {
      std::vector<Work> works;
      for (int k = 0; k < kMessages; ++k)
        works.push_back(group.send(filled(rank, k + 1, 10.0 * k, kInt32), 1, k % 2 == 0 ? 3 : 8));
      for (const Work& w : works)
        w.wait();
      return;
    }
    for (int k = 0; k < kMessages; ++k) {
      Tensor t = filled(rank, k + 1, -1, kInt32);
      Work w = group.recv(t, 0, k % 2 == 0 ? 3 : 8);
      w.wait();
      EXPECT_EQ(w.source_rank(), 0);
      EXPECT_EQ(values(t), std::vector<double>(static_cast<size_t>(k + 1), 10.0 * k))
          << "message " << k;
    }
  }));
}

TEST(NcclPointToPoint, ReceivingFromAnySourceIsRefused) {
  SKIP_WITHOUT_GPUS(1);
  EXPECT_ALL_RANKS_OK(run_alone(0, 2,
                                [](ProcessGroupNCCL& group, int rank) {
                                  Tensor t = filled(rank, 2, 0);
                                  try {
                                    group.recv_any_source(t, 1);
                                    ADD_FAILURE() << "expected InvalidArgument";
                                  } catch (const InvalidArgument& e) {
                                    EXPECT_THAT(e.what(),
                                                HasSubstr("NCCL cannot receive from any source"));
                                  }
                                  // Nothing was sent or created: the group has not failed.
                                  EXPECT_EQ(group.error(), nullptr);
                                },
                                {.timeout = 5s}));
}

// ---- subgroups

TEST(NcclSubgroups, ASubgroupIsAnNcclGroupWithTheSameOptions) {
  SKIP_WITHOUT_GPUS(2);
  EXPECT_ALL_RANKS_OK(run_group(
      2,
      [](ProcessGroupNCCL& group, int rank) {
        auto both = group.new_group({0, 1});
        ASSERT_NE(both, nullptr);
        auto* nccl = dynamic_cast<ProcessGroupNCCL*>(both.get());
        ASSERT_NE(nccl, nullptr);
        EXPECT_EQ(nccl->backend_name(), "nccl");
        EXPECT_EQ(nccl->nccl_options().watchdog_interval, 250us);
        Tensor t = contribution(rank, 4);
        both->all_reduce(t).wait();
        EXPECT_EQ(values(t)[3], 12.0);

        auto second = group.new_group({1});
        EXPECT_EQ(second == nullptr, rank == 0);
        if (second != nullptr) {
          EXPECT_EQ(second->size(), 1);
          EXPECT_EQ(second->parent_ranks(), std::vector<int>{1});
          Tensor u = contribution(rank, 4);
          second->all_reduce(u).wait();
          EXPECT_EQ(values(u)[3], 8.0);
        }
        // The parent is unaffected by its subgroups.
        Tensor v = contribution(rank, 4);
        group.all_reduce(v).wait();
        EXPECT_EQ(values(v)[3], 12.0);
      },
      {}, NcclOptions{.watchdog_interval = 250us}));
}

// ---- bad arguments

TEST(NcclErrors, BadArgumentsThrowAtTheCall) {
  // No GPU needed: these are refused before anything touches CUDA.
  auto store = std::make_shared<HashStore>(5s);
  auto group = ProcessGroupNCCL::create(store, 0, 1, {.debug_level = DebugLevel::kOff});
  EXPECT_EQ(group->backend_name(), "nccl");
  try {
    group->all_reduce(ones({2}, kFloat32));
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    // Refused before it was numbered: the call never became collective #1.
    EXPECT_THAT(e.what(), HasSubstr("all_reduce (group 'default', rank 0)"));
    EXPECT_THAT(e.what(), HasSubstr("takes CUDA tensors"));
    EXPECT_THAT(e.what(), HasSubstr("cpu"));
  }
  EXPECT_THROW(ProcessGroupNCCL::create(store, 0, 1, {}, {.watchdog_interval = 0us}),
               InvalidArgument);
  EXPECT_TRUE(is_nccl_available());
  EXPECT_EQ(make_process_group("nccl", store, 0, 1)->backend_name(), "nccl");
}

TEST(NcclErrors, ATensorOnAnotherDeviceIsRefusedNamingBothDevices) {
  SKIP_WITHOUT_GPUS(2);
  EXPECT_ALL_RANKS_OK(run_group(1, [](ProcessGroupNCCL& group, int rank) {
    Tensor first = filled(0, 4, 1);
    group.all_reduce(first).wait();
    try {
      group.all_reduce(filled(1, 4, 1));
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("tensors[0] is on cuda:1"));
      EXPECT_THAT(e.what(), HasSubstr("uses cuda:0"));
    }
    // Two devices in one call are refused as well.
    EXPECT_THROW(group.all_reduce(std::vector<Tensor>{filled(0, 2, 1), filled(1, 2, 1)}),
                 InvalidArgument);
    // The group is still usable, and the refused calls took no numbers.
    Tensor again = filled(0, 4, 2);
    Work work = group.all_reduce(again);
    EXPECT_THAT(work.description(), HasSubstr("all_reduce #2 "));
    work.wait();
    EXPECT_EQ(values(again)[0], 2.0);
  }));
}

// ---- failures

TEST(NcclFailures, ARankThatNeverJoinsIsNamed) {
  SKIP_WITHOUT_GPUS(1);
  EXPECT_ALL_RANKS_OK(run_alone(0, 2,
                                [](ProcessGroupNCCL& group, int rank) {
                                  Tensor t = filled(rank, 4, 1);
                                  const auto start = std::chrono::steady_clock::now();
                                  Work work = group.all_reduce(t);
                                  std::string first;
                                  try {
                                    work.wait();
                                    ADD_FAILURE() << "expected a TimeoutError";
                                  } catch (const TimeoutError& e) {
                                    first = e.what();
                                    EXPECT_THAT(first, HasSubstr("all_reduce #1"));
                                    EXPECT_THAT(first, HasSubstr("ncclCommInitRankConfig"));
                                    EXPECT_THAT(first,
                                                HasSubstr("ranks that did not reach it: [1]"));
                                  }
                                  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
                                  // Sticky: the next operation fails at once with the first error.
                                  Work next = group.all_reduce(filled(rank, 4, 1));
                                  EXPECT_TRUE(next.is_completed());
                                  try {
                                    next.wait();
                                    ADD_FAILURE() << "expected the first error again";
                                  } catch (const TimeoutError& e) {
                                    EXPECT_EQ(std::string(e.what()), first);
                                  }
                                },
                                {.timeout = 1s}));
}

TEST(NcclFailures, ARankWhoseRankZeroNeverComesIsTold) {
  SKIP_WITHOUT_GPUS(1);
  EXPECT_ALL_RANKS_OK(
      run_alone(1, 2,
                [](ProcessGroupNCCL& group, int rank) {
                  // Rank 1 of 2 runs on cuda:0 here: this machine may have one GPU only.
                  Work work = group.all_reduce(filled(0, 4, 1));
                  try {
                    work.wait();
                    ADD_FAILURE() << "expected a TimeoutError";
                  } catch (const TimeoutError& e) {
                    EXPECT_THAT(e.what(), HasSubstr("rank 0 did not publish NCCL's unique id"));
                    EXPECT_THAT(e.what(), HasSubstr("ranks that did not reach it: [0]"));
                  }
                },
                {.timeout = 500ms}));
}

TEST(NcclFailures, AnOperationAPeerSkipsTimesOutAndAbortsTheGroup) {
  SKIP_WITHOUT_GPUS(2);
  EXPECT_ALL_RANKS_OK(run_group(2,
                                [](ProcessGroupNCCL& group, int rank) {
                                  group.barrier().wait();
                                  if (rank == 1) {
                                    // Never issues the all_reduce; leaves once rank 0 has seen it
                                    // fail.
                                    group.store()->wait({"rank0-done"}, 60s);
                                    return;
                                  }
                                  Tensor t = filled(rank, 16, 1);
                                  const auto start = std::chrono::steady_clock::now();
                                  Work work = group.all_reduce(t, {.timeout = 2s});
                                  const Future<std::vector<Tensor>> future = work.get_future();
                                  ASSERT_TRUE(future.wait(30s));
                                  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
                                  ASSERT_NE(future.error(), nullptr);
                                  try {
                                    work.wait();
                                    ADD_FAILURE() << "expected a TimeoutError";
                                  } catch (const TimeoutError& e) {
                                    EXPECT_THAT(e.what(), HasSubstr("all_reduce #2"));
                                    EXPECT_THAT(e.what(), HasSubstr("timed out after 2000 ms"));
                                    // Whether NCCL was still connecting the ranks for this
                                    // operation (the issuing call waits) or had launched it (the
                                    // watchdog waits), the deadline aborts the group.
                                    EXPECT_THAT(e.what(), HasSubstr("ncclAllReduce"));
                                    EXPECT_THAT(e.what(), HasSubstr("aborted"));
                                    EXPECT_THAT(e.what(),
                                                HasSubstr("ranks that did not reach it: [1]"));
                                  }
                                  EXPECT_FALSE(work.is_success());
                                  // Every later operation fails at once with that error.
                                  Work next = group.broadcast(filled(rank, 4, 1));
                                  EXPECT_TRUE(next.is_completed());
                                  EXPECT_THROW(next.wait(), TimeoutError);
                                  group.store()->set("rank0-done", std::string_view("1"));
                                },
                                {.timeout = 10s}));
}

#endif  // GRADWIRE_HAS_NCCL

}  // namespace
}  // namespace gradwire::c10d
