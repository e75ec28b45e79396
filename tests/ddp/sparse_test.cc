// DistributedDataParallel and sparse gradients: the weight of a sparse embedding cannot be
// all-reduced, so DDP refuses it at construction, naming it and how to exclude it, unless it
// is excluded (DdpOptions::params_to_ignore, or frozen). An excluded table is left alone
// entirely (not broadcast, not reduced: its sparse gradient stays the rank's own) while the
// rest of the model is averaged. A sparse gradient reaching a reduced parameter in backward
// by another way fails the pass, naming the parameter. Two ranks as threads over Gloo;
// float64.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/core/error.h"
#include "gradwire/ddp/ddp.h"
#include "gradwire/nn/nn.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "support/error_text.h"
#include "support/harness.h"

namespace gradwire::ddp {
namespace {

using namespace std::chrono_literals;
using c10d::ProcessGroup;

constexpr int kWorld = 2;
constexpr int64_t kRows = 12;
constexpr int64_t kDim = 4;

test::RankResults run_ranks(const std::function<void(std::shared_ptr<ProcessGroup>, int)>& body) {
  c10d::ProcessGroupOptions options;
  options.timeout = 20s;
  auto store = std::make_shared<c10d::HashStore>(20s);
  return test::run_ranks_as_threads(
      kWorld,
      [&](int rank) {
        body(c10d::ProcessGroupGloo::create(store, rank, kWorld, options, {.host = "127.0.0.1"}),
             rank);
      },
      60s);
}

// A sparse embedding table feeding a dense head: the shape of a recommender.
class Recommender : public nn::Module {
 public:
  explicit Recommender(bool bag = false, uint64_t seed = 5) : nn::Module("Recommender") {
    Generator gen(seed);
    if (bag) {
      bag_ = register_module("bag", std::make_shared<nn::EmbeddingBag>(nn::EmbeddingBagOptions{
                                        kRows, kDim, nn::EmbeddingBagMode::kSum, kFloat64, &gen,
                                        /*sparse=*/true}));
    } else {
      emb_ = register_module(
          "emb", std::make_shared<nn::Embedding>(nn::EmbeddingOptions{.num_embeddings = kRows,
                                                                      .embedding_dim = kDim,
                                                                      .dtype = kFloat64,
                                                                      .generator = &gen,
                                                                      .sparse = true}));
    }
    head_ = register_module(
        "head", std::make_shared<nn::Linear>(nn::LinearOptions{
                    .in_features = kDim, .out_features = 1, .dtype = kFloat64, .generator = &gen}));
  }
  // sum of the head's outputs over the looked-up rows, squared.
  Tensor loss(const Tensor& idx) {
    Tensor out = head_->forward(emb_->forward(idx));
    return sum(mul(out, out));
  }
  std::shared_ptr<nn::Embedding> emb_;
  std::shared_ptr<nn::EmbeddingBag> bag_;
  std::shared_ptr<nn::Linear> head_;
};

// Each rank's batch of row numbers.
Tensor batch_of(int rank) {
  return rank == 0 ? tensor<int64_t>({1, 5, 1}) : tensor<int64_t>({7, 0});
}

TEST(SparseDdp, ASparseEmbeddingIsRefusedNamingItAndHowToExcludeIt) {
  auto results = run_ranks([](std::shared_ptr<ProcessGroup> group, int) {
    const std::string emb = test::error_text<InvalidArgument>(
        [&] { DistributedDataParallel model(std::make_shared<Recommender>(), group); });
    EXPECT_NE(emb.find("parameter 'emb.weight'"), std::string::npos) << emb;
    EXPECT_NE(emb.find("nn::Embedding submodule 'emb'"), std::string::npos) << emb;
    EXPECT_NE(emb.find("params_to_ignore = {\"emb.weight\"}"), std::string::npos) << emb;
    const std::string bag = test::error_text<InvalidArgument>(
        [&] { DistributedDataParallel model(std::make_shared<Recommender>(/*bag=*/true), group); });
    EXPECT_NE(bag.find("parameter 'bag.weight'"), std::string::npos) << bag;
    EXPECT_NE(bag.find("nn::EmbeddingBag submodule 'bag'"), std::string::npos) << bag;
    // The module itself an embedding: its weight is "weight".
    auto table = std::make_shared<nn::Embedding>(nn::EmbeddingOptions{
        .num_embeddings = kRows, .embedding_dim = kDim, .dtype = kFloat64, .sparse = true});
    const std::string root =
        test::error_text<InvalidArgument>([&] { DistributedDataParallel model(table, group); });
    EXPECT_NE(root.find("parameter 'weight'"), std::string::npos) << root;
    // A name that is neither a parameter nor a buffer is a mistake, named.
    const std::string unknown = test::error_text<InvalidArgument>([&] {
      DistributedDataParallel model(std::make_shared<Recommender>(), group,
                                    {.params_to_ignore = {"emb.weight", "emb.wieght"}});
    });
    EXPECT_NE(unknown.find("params_to_ignore names 'emb.wieght'"), std::string::npos) << unknown;
  });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(SparseDdp, AnExcludedTableStaysTheRanksOwnWhileTheRestIsAveraged) {
  // The local gradients of each rank's batch, on an undistributed copy: the references.
  std::vector<Tensor> head_grads;
  std::vector<Tensor> table_grads;
  for (int r = 0; r < kWorld; ++r) {
    Recommender local;
    local.loss(batch_of(r)).backward();
    head_grads.push_back(local.head_->weight().grad());
    table_grads.push_back(local.emb_->weight().grad());
  }
  const Tensor head_average = mul(add(head_grads[0], head_grads[1]), 0.5);

  auto results = run_ranks([&](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = std::make_shared<Recommender>();
    // Rank 1's row 3 (looked up by no batch) differs from rank 0's: an ignored parameter
    // is not broadcast.
    if (rank == 1) net->emb_->weight().detach().select(0, 3).fill_(Scalar(42.0));
    const Tensor own_row = net->emb_->weight().detach().select(0, 3).clone();
    DistributedDataParallel model(net, group, {.params_to_ignore = {"emb.weight"}});
    ASSERT_EQ(model.reducer().parameters().size(), 2u);  // head.weight, head.bias
    const std::vector<Tensor> outs = model.forward_with(
        [&](nn::Module&) { return std::vector<Tensor>{net->loss(batch_of(rank))}; });
    outs[0].backward();
    // The head: the ranks' average.
    const std::vector<double> head = net->head_->weight().grad().to_vector<double>();
    const std::vector<double> want = head_average.to_vector<double>();
    ASSERT_EQ(head.size(), want.size());
    for (size_t i = 0; i < head.size(); ++i)
      EXPECT_NEAR(head[i], want[i], 1e-12) << "head.weight element " << i;
    // The table: this rank's own sparse rows, never averaged nor densified.
    const Tensor g = net->emb_->weight().grad();
    ASSERT_TRUE(g.is_sparse());
    EXPECT_EQ(g.nnz(), batch_of(rank).numel());
    const std::vector<double> got = g.to_dense().to_vector<double>();
    const std::vector<double> local =
        table_grads[static_cast<size_t>(rank)].to_dense().to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_NEAR(got[i], local[i], 1e-12) << "emb.weight element " << i;
    EXPECT_EQ(net->emb_->weight().detach().select(0, 3).to_vector<double>(),
              own_row.to_vector<double>());
    if (rank == 1) {
      EXPECT_EQ(own_row.to_vector<double>(), std::vector<double>(kDim, 42.0));
    }
  });
  EXPECT_ALL_RANKS_OK(results);
}

TEST(SparseDdp, AFrozenSparseTableIsAccepted) {
  auto results = run_ranks([](std::shared_ptr<ProcessGroup> group, int) {
    auto net = std::make_shared<Recommender>();
    Tensor table = net->emb_->weight();  // a handle on the module's weight
    table.set_requires_grad(false);
    DistributedDataParallel model(net, group);
    EXPECT_EQ(model.reducer().parameters().size(), 2u);
  });
  EXPECT_ALL_RANKS_OK(results);
}

// A table looked up with a sparse gradient by hand, not through an nn::Embedding: DDP cannot
// see it coming at construction, and refuses it when its gradient arrives.
class HandMadeTable : public nn::Module {
 public:
  HandMadeTable() : nn::Module("HandMadeTable") {
    table_ = register_parameter("table", ones({kRows, kDim}, kFloat64));
  }
  Tensor table_;
};

TEST(SparseDdp, ASparseGradientReachingAReducedParameterFailsThePassNamingIt) {
  auto results = run_ranks([](std::shared_ptr<ProcessGroup> group, int rank) {
    auto net = std::make_shared<HandMadeTable>();
    DistributedDataParallel model(net, group);
    const std::vector<Tensor> outs = model.forward_with([&](nn::Module&) {
      return std::vector<Tensor>{sum(embedding_rows(net->table_, batch_of(rank), true))};
    });
    const std::string text = test::error_text<InvalidArgument>([&] { outs[0].backward(); });
    EXPECT_NE(text.find("parameter 'table' received a sparse-rows gradient"), std::string::npos)
        << text;
    EXPECT_NE(text.find("params_to_ignore = {\"table\"}"), std::string::npos) << text;
  });
  EXPECT_ALL_RANKS_OK(results);
}

}  // namespace
}  // namespace gradwire::ddp
