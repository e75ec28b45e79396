// nn::Embedding and nn::EmbeddingBag with sparse = true: the same forward, and a weight
// gradient that holds only the looked-up rows yet equals (to_dense) the dense gradient of
// the same module with sparse = false, for Embedding and for EmbeddingBag's sum and mean
// modes, with repeated indices and an empty bag; zero_grad clears it.
#include <gtest/gtest.h>

#include <vector>

#include "gradwire/nn/embedding.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/generator.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

// The weight gradient of loss = sum(out * coef) for a sparse and a dense copy of a module.
template <typename M, typename Options, typename Forward>
std::pair<Tensor, Tensor> grads_of(Options options, Forward&& forward) {
  Generator g1(11), g2(11);
  options.generator = &g1;
  options.sparse = true;
  M sparse(options);
  options.generator = &g2;
  options.sparse = false;
  M dense(options);
  const Tensor out_s = forward(sparse), out_d = forward(dense);
  EXPECT_TRUE(equal(out_s, out_d));
  const Tensor coef =
      arange(1.0, 1.0 + static_cast<double>(out_s.numel()), 1.0, kFloat64).view(out_s.sizes());
  sum(mul(out_s, coef)).backward();
  sum(mul(out_d, coef)).backward();
  return {sparse.weight().grad(), dense.weight().grad()};
}

TEST(SparseEmbedding, EmbeddingGradientIsTheLookedUpRows) {
  const Tensor idx = tensor<int64_t>({7, 2, 7, 0, 9, 2}).view({2, 3});
  auto [gs, gd] = grads_of<nn::Embedding>(
      nn::EmbeddingOptions{.num_embeddings = 10, .embedding_dim = 4, .dtype = kFloat64},
      [&](nn::Embedding& m) { return m(idx); });
  ASSERT_TRUE(gs.is_sparse());
  EXPECT_FALSE(gd.is_sparse());
  EXPECT_EQ(gs.nnz(), 6);
  EXPECT_EQ(gs.coalesce().indices().to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 7, 9}));
  EXPECT_EQ(gs.to_dense().to_vector<double>(), gd.to_vector<double>());
}

TEST(SparseEmbedding, EmbeddingBagSumAndMeanMatchTheDenseGradient) {
  for (const nn::EmbeddingBagMode mode :
       {nn::EmbeddingBagMode::kSum, nn::EmbeddingBagMode::kMean}) {
    const Tensor input = tensor<int64_t>({1, 4, 4, 6, 1, 3});
    const Tensor offsets = tensor<int64_t>({0, 2, 2, 5});  // bag 1 is empty
    auto [gs, gd] = grads_of<nn::EmbeddingBag>(
        nn::EmbeddingBagOptions{
            .num_embeddings = 8, .embedding_dim = 3, .mode = mode, .dtype = kFloat64},
        [&](nn::EmbeddingBag& m) { return m.forward(input, offsets); });
    ASSERT_TRUE(gs.is_sparse());
    EXPECT_EQ(gs.nnz(), 6);
    const std::vector<double> s = gs.to_dense().to_vector<double>(), d = gd.to_vector<double>();
    ASSERT_EQ(s.size(), d.size());
    for (size_t i = 0; i < s.size(); ++i)
      EXPECT_NEAR(s[i], d[i], 1e-12) << "element " << i;
  }
}

TEST(SparseEmbedding, ZeroGradAndRepeatedStepsStaySparse) {
  nn::Embedding emb(
      nn::EmbeddingOptions{.num_embeddings = 1000, .embedding_dim = 8, .sparse = true});
  const Tensor idx = tensor<int64_t>({5, 999});
  sum(emb(idx)).backward();
  sum(emb(idx)).backward();
  ASSERT_TRUE(emb.weight().grad().is_sparse());
  EXPECT_EQ(emb.weight().grad().nnz(), 4);
  const Tensor c = emb.weight().grad().coalesce();
  EXPECT_EQ(c.values().to_vector<float>(), std::vector<float>(16, 2.0f));
  emb.zero_grad();
  EXPECT_FALSE(emb.weight().grad().defined());
}

}  // namespace
}  // namespace gradwire
