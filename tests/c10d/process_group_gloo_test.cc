// ProcessGroupGloo: every collective and reduce op against closed forms, several tensors
// and dtypes (the GlooCollectives suite runs once more over ProcessGroupShm and once over
// HierarchicalProcessGroup, as a test parameter), coalesced broadcasts of mixed lists, subgroups,
// point-to-point ordering, argument errors that leave the ranks in step, failures (a rank that
// never arrives, a peer that goes away, timeouts on time, a mismatch under the debug mode) and
// verify_params_across_ranks, over ranks as threads (a shared HashStore) and ranks as
// forked processes (a FileStore), world sizes 1 to 4.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "c10d/c10d_test_util.h"
#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/process_group_shm.h"
#include "gradwire/c10d/verify_params.h"
#include "gradwire/core/error.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/harness.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using test::RankResults;

enum class Mode { kThreads, kProcesses };

std::string mode_name(Mode m) {
  return m == Mode::kThreads ? "Threads" : "Processes";
}

using Body = std::function<void(ProcessGroup& group, int rank)>;

// The backend a collective suite runs over. kHierarchical: a HierarchicalProcessGroup whose
// ranks play two hosts (even ranks on one, odd ranks on the other).
enum class Backend { kGloo, kShm, kHierarchical };

std::shared_ptr<ProcessGroup> make_group(Backend backend, std::shared_ptr<Store> store, int rank,
                                         int world, const ProcessGroupOptions& options) {
  const GlooOptions gloo{.host = "127.0.0.1"};
  if (backend == Backend::kShm) {
    return ProcessGroupShm::create(std::move(store), rank, world, options, {.gloo = gloo});
  }
  if (backend == Backend::kHierarchical) {
    std::vector<std::string> hosts;
    for (int r = 0; r < world; ++r)
      hosts.push_back(r % 2 == 0 ? "host-a" : "host-b");
    return HierarchicalProcessGroup::create(std::move(store), rank, world, std::move(hosts),
                                            options, {.gloo = gloo});
  }
  return ProcessGroupGloo::create(std::move(store), rank, world, options, gloo);
}

// Runs `body` on `world` ranks, each with its own group of `backend` (Gloo on 127.0.0.1).
RankResults run_group(Backend backend, Mode mode, int world, const Body& body,
                      ProcessGroupOptions options = {}) {
  if (options.timeout == kDefaultProcessGroupTimeout) options.timeout = 20s;
  if (!options.debug_level) options.debug_level = DebugLevel::kOff;
  if (mode == Mode::kThreads) {
    auto store = std::make_shared<HashStore>(20s);
    return test::run_ranks_as_threads(
        world,
        [&](int rank) {
          auto group = make_group(backend, store, rank, world, options);
          body(*group, rank);
        },
        60s);
  }
  test::TempDir dir;
  const std::string path = dir.path() + "/store";
  return test::run_ranks_as_processes(
      world,
      [&](int rank) {
        auto store = std::make_shared<FileStore>(
            FileStoreOptions{.path = path, .num_workers = world, .timeout = 20s});
        auto group = make_group(backend, store, rank, world, options);
        body(*group, rank);
      },
      60s);
}

RankResults run_group(Mode mode, int world, const Body& body, ProcessGroupOptions options = {}) {
  return run_group(Backend::kGloo, mode, world, body, std::move(options));
}

// rank r contributes (r + 1) * (i + 1) at index i.
Tensor contribution(int rank, int64_t n, DType dtype = kFloat32) {
  return arange(Scalar(1), Scalar(n + 1)).mul_(Scalar(rank + 1)).to(dtype);
}

int64_t factorial(int n) {
  return n <= 1 ? 1 : n * factorial(n - 1);
}

// Parameters: (backend, ranks as threads or processes, world size).
class GlooCollectives : public ::testing::TestWithParam<std::tuple<Backend, Mode, int>> {
 protected:
  Backend backend() const { return std::get<0>(GetParam()); }
  Mode mode() const { return std::get<1>(GetParam()); }
  int world() const { return std::get<2>(GetParam()); }
  RankResults run(const Body& body, ProcessGroupOptions options = {}) {
    return run_group(backend(), mode(), world(), body, std::move(options));
  }
};

TEST_P(GlooCollectives, AllReduceEveryOpMatchesClosedForms) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    constexpr int64_t n = 6;
    for (ReduceOp op :
         {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProduct, ReduceOp::kMin, ReduceOp::kMax}) {
      Tensor t = contribution(rank, n, kFloat64);
      group.all_reduce(t, {.op = op}).wait();
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
        EXPECT_DOUBLE_EQ(t.at({i}), expected) << reduce_op_name(op) << " index " << i;
      }
    }
  }));
}

TEST_P(GlooCollectives, AllReduceEveryDtype) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    const double sum_factor = w * (w + 1) / 2.0;
    for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8}) {
      Tensor t = contribution(rank, 5, dtype);
      group.all_reduce(t).wait();
      for (int64_t i = 0; i < 5; ++i)
        EXPECT_EQ(t.at({i}), (i + 1) * sum_factor) << dtype_name(dtype);
      Tensor m = contribution(rank, 5, dtype);
      group.all_reduce(m, {.op = ReduceOp::kMax}).wait();
      EXPECT_EQ(m.at({4}), 5.0 * w) << dtype_name(dtype);
    }
    // bool: sum and max are OR, product and min are AND. Only rank 0 holds true at index 0;
    // every rank holds true at index 1.
    Tensor flags = zeros({2}, kBool);
    if (rank == 0) flags.select(0, 0).fill_(Scalar(true));
    flags.select(0, 1).fill_(Scalar(true));
    Tensor any = flags.clone();
    Tensor all = flags.clone();
    group.all_reduce(any, {.op = ReduceOp::kSum}).wait();
    group.all_reduce(all, {.op = ReduceOp::kMin}).wait();
    EXPECT_EQ(any.at({0}), 1.0);
    EXPECT_EQ(any.at({1}), 1.0);
    EXPECT_EQ(all.at({0}), w == 1 ? 1.0 : 0.0);
    EXPECT_EQ(all.at({1}), 1.0);
  }));
}

TEST_P(GlooCollectives, AllReduceSeveralTensorsAndALargeOne) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    const double f = w * (w + 1) / 2.0;
    Tensor a = contribution(rank, 3).view({3, 1});
    Tensor b = contribution(rank, 4, kInt64);
    Tensor c = contribution(rank, 2, kFloat64);
    // 300,000 floats: above the bcube threshold, so the ring algorithm with segments.
    Tensor big = full({300'000}, Scalar(rank + 1), kFloat32);
    group.all_reduce({a, b, c, big}).wait();
    EXPECT_EQ(a.at({2, 0}), 3 * f);
    EXPECT_EQ(b.at({3}), 4 * f);
    EXPECT_EQ(c.at({1}), 2 * f);
    EXPECT_TRUE(allclose(big, full({300'000}, Scalar(f), kFloat32)));
  }));
}

TEST_P(GlooCollectives, BroadcastFromEveryRoot) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    for (int root = 0; root < w; ++root) {
      Tensor a = contribution(rank, 4);
      Tensor b = full({2, 3}, Scalar(rank * 10), kInt32);
      group.broadcast({a, b}, {.root = root}).wait();
      EXPECT_TRUE(equal(a, contribution(root, 4))) << "root " << root;
      EXPECT_TRUE(equal(b, full({2, 3}, Scalar(root * 10), kInt32))) << "root " << root;
    }
  }));
}

// Rank r's tensor k of a mixed list: small integers (exact in every dtype, bool included)
// that differ per rank and per tensor.
Tensor mixed_tensor(int rank, size_t k) {
  static const std::vector<std::pair<DType, Shape>> kinds = {
      {kFloat32, {3, 4}}, {kInt64, {5}},    {kFloat32, {7}},       {kFloat16, {2, 3}},
      {kBool, {9}},       {kFloat32, {0}},  {kFloat64, {2, 2, 2}}, {kUInt8, {6}},
      {kInt32, {4, 1}},   {kBFloat16, {5}}, {kFloat32, {40}},      {kInt64, {1}},
      {kFloat32, {}},     {kInt32, {33}}};
  const auto& [dtype, shape] = kinds[k % kinds.size()];
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  std::vector<int64_t> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    values[static_cast<size_t>(i)] =
        (i + 7 * rank + 3 * static_cast<int64_t>(k)) % (dtype == kBool ? 2 : 200);
  return tensor(values).to(dtype).reshape(shape);
}

TEST_P(GlooCollectives, BroadcastCoalescedMixedDtypesAndShapes) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    constexpr size_t kCount = 30;
    // 48 bytes: most buckets hold a few tensors, some tensors are larger than a bucket
    // and travel alone; then the default, one bucket per dtype.
    for (size_t bucket_bytes : {size_t{48}, kDefaultCoalescedBucketBytes}) {
      for (int root : {w - 1, 0}) {
        std::vector<Tensor> tensors;
        for (size_t k = 0; k < kCount; ++k)
          tensors.push_back(mixed_tensor(rank, k));
        Work work =
            group.broadcast_coalesced(tensors, {.root = root, .bucket_bytes = bucket_bytes});
        const std::vector<Tensor> outputs = work.result();
        ASSERT_EQ(outputs.size(), kCount);
        for (size_t k = 0; k < kCount; ++k) {
          const Tensor expected = mixed_tensor(root, k);
          EXPECT_EQ(tensors[k].dtype(), expected.dtype()) << "tensor " << k;
          EXPECT_EQ(tensors[k].sizes(), expected.sizes()) << "tensor " << k;
          EXPECT_TRUE(equal(tensors[k], expected))
              << "tensor " << k << " (" << dtype_name(expected.dtype()) << expected.shape_string()
              << "), root " << root << ", bucket_bytes " << bucket_bytes << ": got "
              << tensors[k].to_string();
          EXPECT_TRUE(equal(outputs[k], expected)) << "output " << k;
        }
      }
    }
  }));
}

TEST_P(GlooCollectives, ReduceToTheRootLeavesOthersUnchanged) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    const int root = w - 1;
    Tensor t = contribution(rank, 5);
    group.reduce(t, {.root = root, .op = ReduceOp::kSum}).wait();
    if (rank == root) {
      EXPECT_TRUE(equal(t, contribution(0, 5).mul_(Scalar(w * (w + 1) / 2))));
    } else {
      EXPECT_TRUE(equal(t, contribution(rank, 5)));
    }
    Tensor m = contribution(rank, 5);
    group.reduce(m, {.root = 0, .op = ReduceOp::kMin}).wait();
    if (rank == 0) {
      EXPECT_TRUE(equal(m, contribution(0, 5)));
    }
  }));
}

TEST_P(GlooCollectives, GatherScatterAndAllGather) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    std::vector<Tensor> outs;
    for (int r = 0; r < w; ++r)
      outs.push_back(zeros({2, 2}, kFloat32));
    group.all_gather(outs, contribution(rank, 4).view({2, 2})).wait();
    for (int r = 0; r < w; ++r)
      EXPECT_TRUE(equal(outs[static_cast<size_t>(r)], contribution(r, 4).view({2, 2})));

    const int root = w / 2;
    std::vector<Tensor> gathered;
    if (rank == root) {
      for (int r = 0; r < w; ++r)
        gathered.push_back(zeros({3}, kInt64));
    }
    group.gather(gathered, contribution(rank, 3, kInt64), {.root = root}).wait();
    for (int r = 0; r < static_cast<int>(gathered.size()); ++r)
      EXPECT_TRUE(equal(gathered[static_cast<size_t>(r)], contribution(r, 3, kInt64)));

    std::vector<Tensor> pieces;
    if (rank == root) {
      for (int r = 0; r < w; ++r)
        pieces.push_back(full({3}, Scalar(100 + r), kFloat64));
    }
    Tensor mine = zeros({3}, kFloat64);
    group.scatter(mine, pieces, {.root = root}).wait();
    EXPECT_TRUE(equal(mine, full({3}, Scalar(100 + rank), kFloat64)));
  }));
}

TEST_P(GlooCollectives, ReduceScatterRing) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    // Rank r's inputs[j] holds (r + 1) * (j + 1) * [1, 2, 3]; rank j receives
    // sum_r (r + 1) * (j + 1) * [1, 2, 3].
    std::vector<Tensor> inputs;
    for (int j = 0; j < w; ++j)
      inputs.push_back(contribution(rank, 3).mul_(Scalar(j + 1)));
    Tensor out = zeros({3}, kFloat32);
    group.reduce_scatter(out, inputs).wait();
    EXPECT_TRUE(equal(out, contribution(0, 3).mul_(Scalar((rank + 1) * w * (w + 1) / 2))));
    Tensor avg = zeros({3}, kFloat32);
    group.reduce_scatter(avg, inputs, {.op = ReduceOp::kAvg}).wait();
    EXPECT_TRUE(allclose(avg, contribution(0, 3).mul_(Scalar((rank + 1) * (w + 1) / 2.0))));
    Tensor mx = zeros({3}, kFloat32);
    group.reduce_scatter(mx, inputs, {.op = ReduceOp::kMax}).wait();
    EXPECT_TRUE(equal(mx, contribution(0, 3).mul_(Scalar((rank + 1) * w))));
  }));
}

TEST_P(GlooCollectives, AllToAllWithUnequalSizes) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    // Rank r sends j + 1 values of 10 * r + j to rank j.
    std::vector<Tensor> inputs;
    std::vector<Tensor> outputs;
    for (int j = 0; j < w; ++j) {
      inputs.push_back(full({j + 1}, Scalar(10 * rank + j), kInt32));
      outputs.push_back(zeros({rank + 1}, kInt32));
    }
    group.all_to_all(outputs, inputs).wait();
    for (int r = 0; r < w; ++r) {
      EXPECT_TRUE(
          equal(outputs[static_cast<size_t>(r)], full({rank + 1}, Scalar(10 * r + rank), kInt32)))
          << "from rank " << r;
    }
  }));
}

TEST_P(GlooCollectives, ManyOperationsInFlight) {
  const int w = world();
  EXPECT_ALL_RANKS_OK(run([w](ProcessGroup& group, int rank) {
    std::vector<Tensor> tensors;
    std::vector<Work> works;
    for (int k = 0; k < 24; ++k) {
      tensors.push_back(full({k + 1}, Scalar(rank + k), kFloat32));
      works.push_back(group.all_reduce(tensors.back()));
      if (k % 8 == 0) works.push_back(group.barrier());
    }
    for (const Work& work : works)
      work.wait();
    for (int k = 0; k < 24; ++k) {
      const double expected = w * (w - 1) / 2.0 + double(k) * w;
      EXPECT_TRUE(
          equal(tensors[static_cast<size_t>(k)], full({k + 1}, Scalar(expected), kFloat32)));
    }
  }));
}

std::string collective_name(const ::testing::TestParamInfo<std::tuple<Backend, Mode, int>>& info) {
  return mode_name(std::get<1>(info.param)) + "World" + std::to_string(std::get<2>(info.param));
}

INSTANTIATE_TEST_SUITE_P(Gloo, GlooCollectives,
                         ::testing::Combine(::testing::Values(Backend::kGloo),
                                            ::testing::Values(Mode::kThreads, Mode::kProcesses),
                                            ::testing::Values(1, 2, 3, 4)),
                         collective_name);
// The same suite over shared memory, and over shared memory within two played hosts with
// Gloo across.
INSTANTIATE_TEST_SUITE_P(Shm, GlooCollectives,
                         ::testing::Combine(::testing::Values(Backend::kShm),
                                            ::testing::Values(Mode::kThreads, Mode::kProcesses),
                                            ::testing::Values(1, 2, 3, 4)),
                         collective_name);
INSTANTIATE_TEST_SUITE_P(Hierarchical, GlooCollectives,
                         ::testing::Combine(::testing::Values(Backend::kHierarchical),
                                            ::testing::Values(Mode::kThreads, Mode::kProcesses),
                                            ::testing::Values(1, 2, 3, 4)),
                         collective_name);

// ---- point-to-point

TEST(GlooPointToPoint, MessagesWithOneTagArriveInOrder) {
  EXPECT_ALL_RANKS_OK(run_group(Mode::kProcesses, 2, [](ProcessGroup& group, int rank) {
    constexpr int kMessages = 6;
    if (rank == 0) {
      std::vector<Tensor> sent;
      std::vector<Work> works;
      for (int k = 0; k < kMessages; ++k) {
        sent.push_back(full({3}, Scalar(k), kInt64));
        works.push_back(group.send(sent.back(), 1, 7));
      }
      works.push_back(group.send(full({1}, Scalar(99), kInt64), 1, 8));
      for (const Work& w : works)
        w.wait();
    } else {
      // The other tag is received first: tags are independent channels.
      Tensor other = zeros({1}, kInt64);
      group.recv(other, 0, 8).wait();
      EXPECT_EQ(other.at({0}), 99.0);
      for (int k = 0; k < kMessages; ++k) {
        Tensor t = zeros({3}, kInt64);
        group.recv(t, 0, 7).wait();
        EXPECT_TRUE(equal(t, full({3}, Scalar(k), kInt64))) << "message " << k;
      }
    }
  }));
}

TEST(GlooPointToPoint, ReceiveFromAnySourceNamesTheSender) {
  EXPECT_ALL_RANKS_OK(run_group(Mode::kThreads, 3, [](ProcessGroup& group, int rank) {
    if (rank == 0) {
      std::vector<int> sources;
      for (int k = 0; k < 2; ++k) {
        Tensor t = zeros({1}, kInt32);
        Work w = group.recv_any_source(t, 3);
        w.wait();
        EXPECT_EQ(t.at({0}), 100.0 + w.source_rank());
        sources.push_back(w.source_rank());
      }
      std::sort(sources.begin(), sources.end());
      EXPECT_EQ(sources, (std::vector<int>{1, 2}));
    } else {
      group.send(full({1}, Scalar(100 + rank), kInt32), 0, 3).wait();
    }
  }));
}

TEST(GlooPointToPoint, FuturesCompleteWithTheOutputs) {
  auto pool = std::make_shared<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "cb"});
  EXPECT_ALL_RANKS_OK(run_group(Mode::kThreads, 2, [pool](ProcessGroup& group, int rank) {
    if (rank == 0) {
      group.send(full({4}, Scalar(2.5), kFloat32), 1).wait();
      return;
    }
    Tensor t = zeros({4}, kFloat32);
    Future<double> total = group.recv(t, 0).get_future().then(
        pool,
        [](Future<std::vector<Tensor>> done) { return sum(done.value()[0]).item<float>() * 1.0; });
    EXPECT_DOUBLE_EQ(total.get(10s), 10.0);
  }));
}

// ---- subgroups

TEST(GlooSubgroups, EvenAndOddRanksReduceSeparately) {
  EXPECT_ALL_RANKS_OK(run_group(Mode::kProcesses, 4, [](ProcessGroup& group, int rank) {
    auto evens = group.new_group({2, 0});
    auto odds = group.new_group({1, 3});
    auto& mine = rank % 2 == 0 ? evens : odds;
    ASSERT_NE(mine, nullptr);
    EXPECT_EQ(rank % 2 == 0 ? odds : evens, nullptr);
    EXPECT_EQ(mine->size(), 2);
    EXPECT_EQ(mine->rank(), rank / 2);
    EXPECT_EQ(mine->parent_ranks(),
              rank % 2 == 0 ? (std::vector<int>{0, 2}) : (std::vector<int>{1, 3}));
    Tensor t = full({3}, Scalar(rank), kInt32);
    mine->all_reduce(t).wait();
    EXPECT_TRUE(equal(t, full({3}, Scalar(rank % 2 == 0 ? 2 : 4), kInt32)));
    // The parent still works, numbered independently of the subgroups.
    Tensor all = full({1}, Scalar(1), kInt32);
    group.all_reduce(all).wait();
    EXPECT_EQ(all.at({0}), 4.0);
  }));
}

TEST(GlooSubgroups, BadListsAreRejected) {
  EXPECT_ALL_RANKS_OK(run_group(Mode::kThreads, 2, [](ProcessGroup& group, int rank) {
    EXPECT_THROW(group.new_group({}), InvalidArgument);
    EXPECT_THROW(group.new_group({0, 0}), InvalidArgument);
    try {
      group.new_group({0, 5});
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("rank 5 is outside"), std::string::npos) << e.what();
    }
  }));
  // Members called with different lists: the later one fails at once, naming both lists.
  EXPECT_ALL_RANKS_OK(run_group(Mode::kThreads, 2, [](ProcessGroup& group, int rank) {
    if (rank == 0) {
      auto alone = group.new_group({0});
      ASSERT_NE(alone, nullptr);
      EXPECT_EQ(alone->size(), 1);
      group.store()->set("made", std::string_view("1"));
      return;
    }
    group.store()->wait({"made"}, 10s);
    try {
      group.new_group({0, 1});
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("called with ranks [0, 1], but another member created "
                                           "subgroup 0 with ranks [0]"),
                std::string::npos)
          << e.what();
    }
  }));
}

// ---- argument errors

TEST(GlooErrors, BadArgumentsThrowAtTheCall) {
  EXPECT_ALL_RANKS_OK(run_group(Mode::kThreads, 2, [](ProcessGroup& group, int rank) {
    auto expect_message = [](const std::function<void()>& fn, const std::string& needle) {
      try {
        fn();
        ADD_FAILURE() << "expected InvalidArgument containing '" << needle << "'";
      } catch (const InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    };
    Tensor m = zeros({3, 4}, kFloat32);
    expect_message([&] { group.all_reduce(m.t()); }, "is not contiguous");
    expect_message([&] { group.all_reduce(Tensor()); }, "undefined tensor");
    expect_message([&] { group.all_reduce(zeros({2}, kInt32), {.op = ReduceOp::kAvg}); },
                   "avg needs floating-point");
    expect_message([&] { group.broadcast(m, {.root = 2}); }, "root 2 is outside");
    expect_message([&] { group.all_gather({zeros({12})}, m); }, "holds 1 tensors, expected 2");
    expect_message(
        [&] {
          group.all_gather({zeros({12}), zeros({11})}, m);
        },
        "outputs[1] is float32[11], expected 12 elements of float32");
    expect_message([&] { group.gather({zeros({1})}, zeros({1}), {.root = 1 - rank}); },
                   "only the root");
    expect_message([&] { group.send(m, rank); }, "is this rank itself");
    expect_message([&] { group.recv(m, 1 - rank, -1); }, "tag must be in");
    expect_message([&] { group.all_reduce(m, {.timeout = -1ms}); }, "must not be negative");
    // The group is still usable: nothing was sent.
    Tensor t = ones({2}, kFloat32);
    group.all_reduce(t).wait();
    EXPECT_EQ(t.at({0}), 2.0);
  }));
}

// A bad call takes no operation number: the rank that caught InvalidArgument and goes on
// stays in step with ranks that never made the bad call (with the number taken first, its
// next collective carried another tag than its peers' and waited for them until its
// deadline; under the debug mode it waited on keys of another number).
void expect_in_step_after_caught_errors(Mode mode, DebugLevel level) {
  EXPECT_ALL_RANKS_OK(run_group(
      mode, 3,
      [](ProcessGroup& group, int rank) {
        auto expect_invalid = [](const std::function<void()>& fn, const std::string& needle) {
          try {
            fn();
            ADD_FAILURE() << "expected InvalidArgument containing '" << needle << "'";
          } catch (const InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
          }
        };
        Tensor m = zeros({3, 4}, kFloat32);
        if (rank == 0) {
          // Unnumbered: the call never became a collective.
          expect_invalid([&] { group.all_reduce(m.t()); },
                         "all_reduce (group 'default', rank 0): tensors[0] (float32[4, 3]) is "
                         "not contiguous");
          expect_invalid([&] { group.all_gather({zeros({12})}, m); }, "holds 1 tensors");
        } else if (rank == 1) {
          expect_invalid([&] { group.broadcast(m, {.root = 7}); }, "root 7 is outside");
          expect_invalid([&] { group.broadcast_coalesced({m}, {.bucket_bytes = 0}); },
                         "bucket_bytes must be positive");
          expect_invalid(
              [&] {
                group.reduce_scatter(zeros({2}, kInt32),
                                     {zeros({2}, kInt32), zeros({2}, kInt32), zeros({2}, kInt32)},
                                     {.op = ReduceOp::kAvg});
              },
              "avg needs floating-point");
        }
        Tensor t = full({4}, Scalar(rank + 1), kFloat32);
        Work first = group.all_reduce(t);
        EXPECT_NE(first.description().find("all_reduce #1 "), std::string::npos)
            << first.description();
        first.wait();
        EXPECT_TRUE(equal(t, full({4}, Scalar(6), kFloat32)));
        if (rank == 2) {
          // A late bad call, after the others have moved on.
          expect_invalid([&] { group.all_reduce(Tensor()); }, "undefined tensor");
        }
        Tensor b = full({2}, Scalar(rank * 10), kInt64);
        group.broadcast(b, {.root = 2}).wait();
        EXPECT_TRUE(equal(b, full({2}, Scalar(20), kInt64)));
        std::vector<Tensor> outs{zeros({1}, kInt32), zeros({1}, kInt32), zeros({1}, kInt32)};
        Work gathered = group.all_gather(outs, full({1}, Scalar(rank), kInt32));
        EXPECT_NE(gathered.description().find("all_gather #3 "), std::string::npos)
            << gathered.description();
        gathered.wait();
        for (int r = 0; r < 3; ++r)
          EXPECT_EQ(outs[static_cast<size_t>(r)].at({0}), r);
      },
      ProcessGroupOptions{.timeout = 5s, .debug_level = level}));
}

TEST(GlooErrors, ARankThatCatchesInvalidArgumentStaysInStep) {
  expect_in_step_after_caught_errors(Mode::kThreads, DebugLevel::kOff);
  expect_in_step_after_caught_errors(Mode::kProcesses, DebugLevel::kOff);
}

TEST(GlooErrors, ARankThatCatchesInvalidArgumentStaysInStepUnderTheDebugMode) {
  expect_in_step_after_caught_errors(Mode::kThreads, DebugLevel::kDetail);
}

TEST(GlooErrors, UnknownBackendsAreNamed) {
  auto store = std::make_shared<HashStore>(5s);
  try {
    make_process_group("mpi", store, 0, 1);
    ADD_FAILURE() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown backend 'mpi'"), std::string::npos);
  }
  if (!is_nccl_available()) {
    EXPECT_THROW(make_process_group("nccl", store, 0, 1), InvalidArgument);
  }
  auto group = make_process_group("gloo", store, 0, 1);
  EXPECT_EQ(group->backend_name(), "gloo");
}

// ---- failures

TEST(GlooFailures, ARankThatNeverArrivesIsNamed) {
  EXPECT_ALL_RANKS_OK(run_group(
      Mode::kProcesses, 3,
      [](ProcessGroup& group, int rank) {
        if (rank == 2) {
          // Stays alive, but never joins the collective; leaves when the others are done.
          group.store()->wait({"done0", "done1"}, 20s);
          return;
        }
        Tensor t = ones({4}, kFloat32);
        const auto start = std::chrono::steady_clock::now();
        Work work = group.all_reduce(t);
        try {
          work.wait();
          ADD_FAILURE() << "expected a TimeoutError";
        } catch (const TimeoutError& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("all_reduce #1"), std::string::npos) << what;
          EXPECT_NE(what.find("ranks that did not reach it: [2]"), std::string::npos) << what;
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
        // Sticky: the next operation fails at once with the first error.
        Work next = group.barrier();
        EXPECT_TRUE(next.is_completed());
        EXPECT_THROW(next.wait(), TimeoutError);
        group.store()->set("done" + std::to_string(rank), std::string_view("1"));
      },
      ProcessGroupOptions{.timeout = 400ms}));
}

// Timeouts are told from other transport errors by the operation's own clock, not by
// Gloo's wording: a collective and a receive whose peer never comes fail with
// TimeoutError once their deadline has passed, and not much later.
TEST(GlooFailures, ACollectiveWhosePeerNeverJoinsTimesOut) {
  constexpr auto kTimeout = 200ms;
  EXPECT_ALL_RANKS_OK(run_group(
      Mode::kThreads, 2,
      [&](ProcessGroup& group, int rank) {
        if (rank == 1) {
          group.store()->wait({"done"}, 20s);  // alive, but never joins
          return;
        }
        Tensor t = ones({8}, kFloat32);
        const auto start = std::chrono::steady_clock::now();
        Work work = group.all_reduce(t);
        try {
          work.wait();
          ADD_FAILURE() << "expected TimeoutError";
        } catch (const TimeoutError& e) {
          EXPECT_NE(std::string(e.what()).find("all_reduce #1 (group 'default', rank 0) timed out "
                                               "after 200 ms"),
                    std::string::npos)
              << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << "expected TimeoutError, got " << e.what();
        }
        const auto elapsed = std::chrono::steady_clock::now() - start;
        EXPECT_GE(elapsed, kTimeout);
        // The deadline, plus at most the same again waiting to learn who did not come.
        EXPECT_LT(elapsed, 2s);
        group.store()->set("done", std::string_view("1"));
      },
      ProcessGroupOptions{.timeout = kTimeout}));
}

TEST(GlooFailures, AReceiveWhoseSenderNeverSendsTimesOut) {
  EXPECT_ALL_RANKS_OK(run_group(
      Mode::kThreads, 2,
      [](ProcessGroup& group, int rank) {
        if (rank == 1) {
          group.store()->wait({"done"}, 20s);
          return;
        }
        Tensor t = zeros({4}, kFloat32);
        const auto start = std::chrono::steady_clock::now();
        Work work = group.recv(t, 1, 3);
        EXPECT_THROW(work.wait(), TimeoutError);
        const auto elapsed = std::chrono::steady_clock::now() - start;
        EXPECT_GE(elapsed, 200ms);
        EXPECT_LT(elapsed, 2s);
        group.store()->set("done", std::string_view("1"));
      },
      ProcessGroupOptions{.timeout = 200ms}));
}

TEST(GlooFailures, APeerThatGoesAwayFailsPendingWork) {
  const RankResults results = run_group(
      Mode::kProcesses, 2,
      [](ProcessGroup& group, int rank) {
        if (rank == 1) {
          // Dies abruptly: its sockets close, nothing else is said.
          group.store()->wait({"ready"}, 20s);
          std::_Exit(0);
        }
        Tensor t = ones({4}, kFloat32);
        group.store()->set("ready", std::string_view("1"));
        const auto start = std::chrono::steady_clock::now();
        try {
          group.all_reduce(t).wait();
          ADD_FAILURE() << "expected NetworkError";
        } catch (const NetworkError& e) {
          // A lost connection long before the deadline is not a timeout.
          const std::string what = e.what();
          EXPECT_NE(what.find("all_reduce #1 (group 'default', rank 0) failed"), std::string::npos)
              << what;
          EXPECT_NE(what.find("ranks that did not reach it: [1]"), std::string::npos) << what;
        } catch (const std::exception& e) {
          ADD_FAILURE() << "expected NetworkError, got " << e.what();
        }
        EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
      },
      ProcessGroupOptions{.timeout = 8s});
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  // Rank 1 left without returning from its rank function, as intended.
  EXPECT_FALSE(results.ranks[1].ok);
}

// A rank killed outright while the others are inside a collective: each survivor gets a
// typed error naming it, within 2 s where its own connection to the dead rank drops, and
// within the timeout (plus the time to learn who is missing) where it was waiting only on
// another survivor; nobody hangs, and the survivors' groups are destroyed cleanly.
TEST(GlooFailures, ARankKilledMidCollectiveFailsEverySurvivorNamingIt) {
  constexpr auto kTimeout = 3s;
  const RankResults results = run_group(
      Mode::kProcesses, 3,
      [&](ProcessGroup& group, int rank) {
        Tensor t = ones({1 << 16}, kFloat32);
        group.all_reduce(t).wait();  // all three take part in the first one
        if (rank == 2) {
          group.store()->wait({"entered0", "entered1"}, 20s);
          ::kill(::getpid(), SIGKILL);
        }
        const auto start = std::chrono::steady_clock::now();
        Work work = group.all_reduce(t);
        group.store()->set("entered" + std::to_string(rank), std::string_view("1"));
        std::string what;
        bool timed_out = false;
        try {
          work.wait();
          ADD_FAILURE() << "rank " << rank << ": expected an error";
        } catch (const TimeoutError& e) {
          what = e.what();
          timed_out = true;
        } catch (const NetworkError& e) {
          what = e.what();
        }
        const auto elapsed = std::chrono::steady_clock::now() - start;
        EXPECT_NE(what.find("[2]"), std::string::npos) << "rank " << rank << ": " << what;
        EXPECT_LT(elapsed, timed_out ? kTimeout + 2s : 2s) << "rank " << rank << ": " << what;
      },
      ProcessGroupOptions{.timeout = kTimeout});
  EXPECT_TRUE(results.ranks[0].ok) << results.summary();
  EXPECT_TRUE(results.ranks[1].ok) << results.summary();
  EXPECT_EQ(results.ranks[2].term_signal, SIGKILL) << results.summary();
}

TEST(GlooFailures, CreationTimesOutNamingMissingRanks) {
  auto store = std::make_shared<HashStore>(5s);
  try {
    ProcessGroupGloo::create(store, 0, 3, {.timeout = 300ms, .debug_level = DebugLevel::kOff},
                             {.host = "127.0.0.1"});
    ADD_FAILURE() << "expected TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks [1, 2] did not join"), std::string::npos)
        << e.what();
  }
}

TEST(GlooFailures, WorkWaitTimesOutWithoutFailingTheGroup) {
  EXPECT_ALL_RANKS_OK(run_group(Mode::kThreads, 2, [](ProcessGroup& group, int rank) {
    if (rank == 0) {
      Tensor t = zeros({1}, kFloat32);
      Work pending = group.recv(t, 1, 5);
      try {
        pending.wait(50ms);
        ADD_FAILURE() << "expected TimeoutError";
      } catch (const TimeoutError& e) {
        EXPECT_NE(std::string(e.what()).find("did not complete within 50 ms"), std::string::npos)
            << e.what();
      }
      EXPECT_FALSE(pending.is_completed());
      group.store()->set("go", std::string_view("1"));
      pending.wait();
      EXPECT_EQ(t.at({0}), 5.0);
    } else {
      group.store()->wait({"go"}, 10s);
      group.send(full({1}, Scalar(5), kFloat32), 0, 5).wait();
    }
  }));
}

TEST(GlooFailures, MonitoredBarrierNamesEveryMissingRank) {
  // Every rank stays (its connections open) until ranks 0 and 1 have both timed out: a
  // rank that left earlier would close its connections under rank 1's wait, which then
  // fails with the closed connection instead of timing out.
  EXPECT_ALL_RANKS_OK(run_group(Mode::kProcesses, 4, [](ProcessGroup& group, int rank) {
    group.monitored_barrier(10s);  // everyone arrives
    const std::vector<std::string> reports = {"reported0", "reported1"};
    if (rank >= 2) {
      group.store()->wait(reports, 20s);
      return;
    }
    try {
      group.monitored_barrier(300ms);
      ADD_FAILURE() << "expected TimeoutError";
    } catch (const TimeoutError& e) {
      const std::string what = e.what();
      if (rank == 0) {
        EXPECT_NE(what.find("ranks [2, 3] did not arrive"), std::string::npos) << what;
      } else {
        EXPECT_NE(what.find("rank 0 did not release"), std::string::npos) << what;
      }
    }
    group.store()->set(reports[static_cast<size_t>(rank)], std::string_view("1"));
    group.store()->wait(reports, 20s);
  }));
}

// ---- verify_params_across_ranks

// The list every rank holds, before a rank changes its own.
std::vector<Tensor> model_like_tensors() {
  return {zeros({4, 3}, kFloat32), zeros({4}, kFloat32), zeros({5, 2, 2}, kFloat16),
          zeros({}, kInt64), zeros({0}, kFloat32)};
}

void expect_every_rank_throws(Mode mode, int world,
                              const std::function<void(std::vector<Tensor>&, int)>& change,
                              const std::vector<std::string>& needles) {
  EXPECT_ALL_RANKS_OK(run_group(
      mode, world,
      [&](ProcessGroup& group, int rank) {
        std::vector<Tensor> tensors = model_like_tensors();
        change(tensors, rank);
        try {
          verify_params_across_ranks(group, tensors);
          ADD_FAILURE() << "expected InvalidArgument";
        } catch (const InvalidArgument& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("verify_params_across_ranks (group 'default', rank " +
                              std::to_string(rank) + "): "),
                    std::string::npos)
              << what;
          for (const std::string& needle : needles)
            EXPECT_NE(what.find(needle), std::string::npos)
                << "missing '" << needle << "' in " << what;
        }
        // Every rank took part to the end: the group goes on.
        Tensor t = ones({1}, kInt32);
        group.all_reduce(t).wait();
        EXPECT_EQ(t.at({0}), world);
      },
      ProcessGroupOptions{.timeout = 10s}));
}

TEST(GlooVerifyParams, MatchingRanksPass) {
  for (Mode mode : {Mode::kThreads, Mode::kProcesses}) {
    for (int world : {1, 3}) {
      EXPECT_ALL_RANKS_OK(run_group(mode, world,
                                    [](ProcessGroup& group, int) {
                                      verify_params_across_ranks(group, model_like_tensors());
                                      verify_params_across_ranks(group, {});
                                      // Values are not compared, only dtypes and shapes.
                                      verify_params_across_ranks(
                                          group, {full({2}, Scalar(group.rank()), kFloat32)});
                                    }))
          << mode_name(mode) << " world " << world;
    }
  }
}

TEST(GlooVerifyParams, AShapeThatDiffersOnOneRankIsNamedOnEveryRank) {
  expect_every_rank_throws(
      Mode::kProcesses, 3,
      [](std::vector<Tensor>& t, int rank) {
        if (rank == 1) t[2] = zeros({5, 2, 3}, kFloat16);
      },
      {"tensors[2] on rank 1 is float16[5, 2, 3], expected float16[5, 2, 2] as on rank 0",
       "ranks whose tensors differ from rank 0's: [1]"});
}

TEST(GlooVerifyParams, DtypeOrderAndCountDifferencesAreNamed) {
  // A dtype, on two ranks with different first differences: the lowest rank is described.
  expect_every_rank_throws(Mode::kThreads, 3,
                           [](std::vector<Tensor>& t, int rank) {
                             if (rank == 2) t[0] = zeros({4, 3}, kFloat64);
                             if (rank == 1) t[3] = zeros({1}, kInt64);
                           },
                           {"tensors[3] on rank 1 is int64[1], expected int64[] as on rank 0",
                            "ranks whose tensors differ from rank 0's: [1, 2]"});
  // The same tensors in another order.
  expect_every_rank_throws(
      Mode::kThreads, 2,
      [](std::vector<Tensor>& t, int rank) {
        if (rank == 1) std::swap(t[0], t[1]);
      },
      {"tensors[0] on rank 1 is float32[4], expected float32[4, 3] as on rank 0"});
  // One tensor more, and one fewer.
  expect_every_rank_throws(Mode::kThreads, 3,
                           [](std::vector<Tensor>& t, int rank) {
                             if (rank == 1) t.push_back(zeros({2}, kFloat32));
                             if (rank == 2) t.pop_back();
                           },
                           {"rank 1 holds 6 tensors, expected 5 as on rank 0",
                            "ranks whose tensors differ from rank 0's: [1, 2]"});
  // Rank 0 itself is the odd one out: every other rank is named.
  expect_every_rank_throws(Mode::kThreads, 3,
                           [](std::vector<Tensor>& t, int rank) {
                             if (rank == 0) t[1] = zeros({4}, kBool);
                           },
                           {"tensors[1] on rank 1 is float32[4], expected bool[4] as on rank 0",
                            "ranks whose tensors differ from rank 0's: [1, 2]"});
}

TEST(GlooVerifyParams, AnUndefinedTensorFailsEveryRank) {
  expect_every_rank_throws(Mode::kThreads, 2, [](std::vector<Tensor>& t, int) { t[1] = Tensor(); },
                           {"tensors[1] is undefined (on every rank)"});
  expect_every_rank_throws(Mode::kThreads, 2,
                           [](std::vector<Tensor>& t, int rank) {
                             if (rank == 1) t[4] = Tensor();
                           },
                           {"tensors[4] on rank 1 is undefined, expected float32[0] as on rank 0"});
}

// ---- the debug mode

TEST(GlooDebugMode, MismatchedShapesRaiseOnEveryRank) {
  EXPECT_ALL_RANKS_OK(run_group(
      Mode::kThreads, 3,
      [](ProcessGroup& group, int rank) {
        Tensor t = ones({rank == 1 ? 5 : 4}, kFloat32);
        try {
          group.all_reduce(t).wait();
          ADD_FAILURE() << "expected InvalidArgument";
        } catch (const InvalidArgument& e) {
          const std::string what = e.what();
          EXPECT_NE(what.find("ranks [0, 2] called all_reduce(op=sum; float32[4])"),
                    std::string::npos)
              << what;
          EXPECT_NE(what.find("ranks [1] called all_reduce(op=sum; float32[5])"), std::string::npos)
              << what;
        }
        // Nothing was sent: matching calls go on working.
        Tensor ok = ones({4}, kFloat32);
        group.all_reduce(ok).wait();
        EXPECT_EQ(ok.at({0}), 3.0);
        // A different collective is a mismatch too.
        try {
          if (rank == 0) {
            group.barrier().wait();
          } else {
            group.broadcast(ok).wait();
          }
          ADD_FAILURE() << "expected InvalidArgument";
        } catch (const InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("ranks [0] called barrier()"), std::string::npos)
              << e.what();
        }
      },
      ProcessGroupOptions{.debug_level = DebugLevel::kDetail}));
}

TEST(GlooDebugMode, ARankThatNeverArrivesIsNamedBeforeAnythingIsSent) {
  EXPECT_ALL_RANKS_OK(run_group(
      Mode::kThreads, 2,
      [](ProcessGroup& group, int rank) {
        if (rank == 1) {
          group.store()->wait({"done"}, 20s);
          return;
        }
        try {
          group.all_reduce(ones({1}, kFloat32)).wait();
          ADD_FAILURE() << "expected TimeoutError";
        } catch (const TimeoutError& e) {
          EXPECT_NE(std::string(e.what()).find("ranks [1] did not reach this collective"),
                    std::string::npos)
              << e.what();
        }
        group.store()->set("done", std::string_view("1"));
      },
      ProcessGroupOptions{.timeout = 300ms, .debug_level = DebugLevel::kDetail}));
}

TEST(GlooDebugMode, LevelsParse) {
  EXPECT_EQ(parse_debug_level("DETAIL"), DebugLevel::kDetail);
  EXPECT_EQ(parse_debug_level("INFO"), DebugLevel::kInfo);
  EXPECT_EQ(parse_debug_level("OFF"), DebugLevel::kOff);
  EXPECT_THROW(parse_debug_level("VERBOSE"), InvalidArgument);
  EXPECT_EQ(parse_reduce_op("max"), ReduceOp::kMax);
  EXPECT_THROW(parse_reduce_op("mean"), InvalidArgument);
}

}  // namespace
}  // namespace gradwire::c10d
