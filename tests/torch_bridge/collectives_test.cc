// gradwire's collectives on torch tensors (collectives.h): every operation over the shared-
// memory group and over Gloo, with 2 ranks as processes, writing into the torch tensors the
// caller passed (the same memory: a view's neighbours stay untouched), against values
// worked out here by hand; torch's version counter records the writes; a tensor the bridge
// cannot share is refused naming the operation and the argument.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/torch/collectives.h"
#include "support/error_text.h"
#include "torch_bridge/torch_groups.h"
#include "torch_bridge/torch_test_util.h"

namespace gradwire::torch {
namespace {

using namespace std::chrono_literals;
using test::error_text;
using test_util::iota;
using test_util::values;

constexpr int kWorld = 2;

at::TensorOptions of(c10::ScalarType type) {
  return at::TensorOptions().dtype(type);
}

std::vector<double> filled(int64_t n, double value) {
  return std::vector<double>(static_cast<size_t>(n), value);
}

using Body = std::function<void(c10d::ProcessGroup& group, int rank)>;

// Runs `body` on kWorld ranks as processes, each with a group of the backend under test.
class TorchCollectives : public ::testing::TestWithParam<std::string> {
 protected:
  void run(const Body& body) {
    test_util::run_group_ranks(
        "torch-collectives", GetParam(), kWorld,
        [&](const std::shared_ptr<c10d::ProcessGroup>& group, int rank) { body(*group, rank); });
  }
};

TEST_P(TorchCollectives, AllReduceSumsAndAveragesInPlace) {
  run([](c10d::ProcessGroup& group, int rank) {
    at::Tensor t = at::arange(8, of(at::kFloat)) + 10 * rank;
    void* const data = t.data_ptr();
    all_reduce(group, t).wait();
    EXPECT_EQ(t.data_ptr(), data);
    std::vector<double> expected;
    for (int i = 0; i < 8; ++i)
      expected.push_back(2.0 * i + 10);  // i + (i + 10)
    EXPECT_EQ(values(t), expected);
    at::Tensor d = at::full({3}, 1.0 + rank, of(at::kDouble));
    all_reduce(group, d, {.op = c10d::ReduceOp::kAvg}).wait();
    EXPECT_EQ(values(d), filled(3, 1.5));  // (1 + 2) / 2
    // Several tensors of different dtypes in one call; max of the ranks' values.
    std::vector<at::Tensor> several = {at::full({2}, 5 - 3 * rank, of(at::kLong)),
                                       at::full({4}, rank, of(at::kInt))};
    all_reduce(group, several, {.op = c10d::ReduceOp::kMax}).wait();
    EXPECT_EQ(values(several[0]), filled(2, 5));
    EXPECT_EQ(values(several[1]), filled(4, 1));
  });
}

TEST_P(TorchCollectives, AllReduceOfAViewWritesOnlyTheView) {
  run([](c10d::ProcessGroup& group, int rank) {
    at::Tensor base = at::full({10}, 1.0 + rank, of(at::kFloat));
    at::Tensor view = base.narrow(0, 3, 4);  // storage offset 3
    all_reduce(group, view).wait();
    std::vector<double> expected = filled(10, 1.0 + rank);
    for (int i = 3; i < 7; ++i)
      expected[static_cast<size_t>(i)] = 3;  // 1 + 2
    EXPECT_EQ(values(base), expected);
  });
}

TEST_P(TorchCollectives, BroadcastCopiesTheRootsTensors) {
  run([](c10d::ProcessGroup& group, int rank) {
    at::Tensor t = at::full({5}, rank, of(at::kDouble));
    broadcast(group, t, {.root = 1}).wait();
    EXPECT_EQ(values(t), filled(5, 1));
    std::vector<at::Tensor> list = {at::arange(3, of(at::kFloat)) * (rank + 1),
                                    at::full({2, 2}, 7 * rank, of(at::kLong))};
    broadcast(group, list, {.root = 0}).wait();
    EXPECT_EQ(values(list[0]), iota(3));
    EXPECT_EQ(values(list[1]), filled(4, 0));
  });
}

TEST_P(TorchCollectives, BroadcastCoalescedCopiesMixedDtypesInSmallBuckets) {
  run([](c10d::ProcessGroup& group, int rank) {
    std::vector<at::Tensor> state = {
        at::arange(3, of(at::kFloat)) + 100 * rank, at::arange(2, of(at::kLong)) + 100 * rank,
        at::full({}, 0.25 * rank, of(at::kDouble)), at::arange(5, of(at::kFloat)) - rank};
    broadcast_coalesced(group, state, {.root = 1, .bucket_bytes = 16}).wait();
    EXPECT_EQ(values(state[0]), iota(3, 100));
    EXPECT_EQ(values(state[1]), iota(2, 100));
    EXPECT_EQ(values(state[2]), filled(1, 0.25));
    EXPECT_EQ(values(state[3]), iota(5, -1));
  });
}

TEST_P(TorchCollectives, ReduceCombinesIntoTheRootOnly) {
  run([](c10d::ProcessGroup& group, int rank) {
    at::Tensor t = at::arange(4, of(at::kDouble)) + rank;
    reduce(group, t, {.root = 1}).wait();
    if (rank == 1) {
      EXPECT_EQ(values(t), (std::vector<double>{1, 3, 5, 7}));  // i + (i + 1)
    } else {
      EXPECT_EQ(values(t), iota(4));
    }
  });
}

TEST_P(TorchCollectives, AllGatherFillsEveryRanksOutputs) {
  run([](c10d::ProcessGroup& group, int rank) {
    const at::Tensor input = at::full({3}, 2 * rank + 1, of(at::kFloat));
    std::vector<at::Tensor> outputs = {at::zeros({3}, of(at::kFloat)),
                                       at::zeros({3}, of(at::kFloat))};
    all_gather(group, outputs, input).wait();
    EXPECT_EQ(values(outputs[0]), filled(3, 1));
    EXPECT_EQ(values(outputs[1]), filled(3, 3));
  });
}

TEST_P(TorchCollectives, GatherFillsTheRootsOutputs) {
  run([](c10d::ProcessGroup& group, int rank) {
    const at::Tensor input = at::arange(2, of(at::kLong)) + 10 * rank;
    std::vector<at::Tensor> outputs;
    if (rank == 0) outputs = {at::zeros({2}, of(at::kLong)), at::zeros({2}, of(at::kLong))};
    gather(group, outputs, input, {.root = 0}).wait();
    if (rank == 0) {
      EXPECT_EQ(values(outputs[0]), iota(2));
      EXPECT_EQ(values(outputs[1]), iota(2, 10));
    }
  });
}

TEST_P(TorchCollectives, ScatterHandsEachRankItsPart) {
  run([](c10d::ProcessGroup& group, int rank) {
    at::Tensor output = at::zeros({2}, of(at::kDouble));
    std::vector<at::Tensor> inputs;
    if (rank == 1) {
      inputs = {at::full({2}, 7, of(at::kDouble)), at::full({2}, 17, of(at::kDouble))};
    }
    scatter(group, output, inputs, {.root = 1}).wait();
    EXPECT_EQ(values(output), filled(2, 10 * rank + 7));
  });
}

TEST_P(TorchCollectives, ReduceScatterCombinesEachRanksPart) {
  run([](c10d::ProcessGroup& group, int rank) {
    // Rank r's inputs[j] holds 10 r + j; rank j receives (0 + j) + (10 + j).
    std::vector<at::Tensor> inputs = {at::full({3}, 10 * rank + 0, of(at::kFloat)),
                                      at::full({3}, 10 * rank + 1, of(at::kFloat))};
    at::Tensor output = at::zeros({3}, of(at::kFloat));
    reduce_scatter(group, output, inputs).wait();
    EXPECT_EQ(values(output), filled(3, 10 + 2 * rank));
  });
}

TEST_P(TorchCollectives, AllToAllExchangesPartsOfDifferentSizes) {
  run([](c10d::ProcessGroup& group, int rank) {
    // Rank r sends rank j (r + 2 j + 1) elements holding 100 r + j.
    std::vector<at::Tensor> inputs, outputs;
    for (int j = 0; j < kWorld; ++j) {
      inputs.push_back(at::full({rank + 2 * j + 1}, 100 * rank + j, of(at::kLong)));
      outputs.push_back(at::zeros({j + 2 * rank + 1}, of(at::kLong)));
    }
    all_to_all(group, outputs, inputs).wait();
    for (int r = 0; r < kWorld; ++r) {
      EXPECT_EQ(values(outputs[static_cast<size_t>(r)]), filled(r + 2 * rank + 1, 100 * r + rank))
          << "from rank " << r;
    }
  });
}

TEST_P(TorchCollectives, SendRecvAndRecvFromAnySource) {
  run([](c10d::ProcessGroup& group, int rank) {
    if (rank == 0) {
      send(group, at::arange(5, of(at::kFloat)) * 3, 1, 3).wait();
      at::Tensor answer = at::zeros({2}, of(at::kInt));
      c10d::Work work = recv_any_source(group, answer, 4);
      work.wait();
      EXPECT_EQ(work.source_rank(), 1);
      EXPECT_EQ(values(answer), (std::vector<double>{-1, 1}));
    } else {
      at::Tensor got = at::zeros({5}, of(at::kFloat));
      recv(group, got, 0, 3).wait();
      EXPECT_EQ(values(got), (std::vector<double>{0, 3, 6, 9, 12}));
      send(group, at::tensor({-1, 1}, of(at::kInt)), 0, 4).wait();
    }
  });
}

// A torch graph that saved a tensor a collective then wrote refuses to run backward, as
// it would after any in-place op; the barrier lets both ranks finish together.
TEST_P(TorchCollectives, WritesBumpTorchsVersionCounterAndBarrierMeetsEveryRank) {
  run([](c10d::ProcessGroup& group, int rank) {
    const at::Tensor w = at::ones({3}, of(at::kDouble)).requires_grad_(true);
    at::Tensor x = at::full({3}, 1.0 + rank, of(at::kDouble));
    const at::Tensor y = (w * x).sum();  // saves x
    const int64_t before = x._version();
    all_reduce(group, x).wait();
    EXPECT_GT(x._version(), before);
    EXPECT_THROW(y.backward(), c10::Error);
    const at::Tensor input = at::ones({1});
    const int64_t input_before = input._version();
    std::vector<at::Tensor> outputs = {at::zeros({1}), at::zeros({1})};
    all_gather(group, outputs, input).wait();
    EXPECT_EQ(input._version(), input_before);  // only outputs are written
    barrier(group).wait();
  });
}

TEST_P(TorchCollectives, RefusalsNameTheOperationAndTheArgumentAndKeepRanksInStep) {
  run([](c10d::ProcessGroup& group, int rank) {
    std::string what =
        error_text<InvalidArgument>([&] { all_reduce(group, at::zeros({2}, of(at::kChar))); });
    EXPECT_NE(what.find("all_reduce: the tensor: from_torch: torch dtype torch.int8"),
              std::string::npos)
        << what;
    what = error_text<InvalidArgument>([&] {
      all_gather(group, {at::zeros({2}), at::zeros({2}, of(at::kShort))}, at::zeros({2}));
    });
    EXPECT_NE(what.find("all_gather: outputs[1]"), std::string::npos) << what;
    EXPECT_NE(what.find("torch.int16"), std::string::npos) << what;
    what = error_text<InvalidArgument>([&] { broadcast(group, at::zeros({3}).to_sparse()); });
    EXPECT_NE(what.find("broadcast: the tensor"), std::string::npos) << what;
    EXPECT_NE(what.find("layout Sparse"), std::string::npos) << what;
    // A non-contiguous tensor is refused by the group, as a gradwire tensor would be.
    what = error_text<InvalidArgument>([&] {
      all_reduce(group, at::zeros({3, 2}, of(at::kFloat)).t());
    });
    EXPECT_NE(what.find("contiguous"), std::string::npos) << what;
    // Nothing was numbered: the next collective matches on both ranks.
    at::Tensor t = at::full({2}, rank + 1.0, of(at::kFloat));
    all_reduce(group, t).wait();
    EXPECT_EQ(values(t), filled(2, 3));
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, TorchCollectives, ::testing::Values("shm", "gloo"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace gradwire::torch
