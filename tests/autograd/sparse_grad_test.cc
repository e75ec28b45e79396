// Sparse-rows gradients in the engine: embedding_rows(weight, index, sparse_grad = true)
// gives the table a sparse-rows gradient; the engine sums it with other gradients of the
// same leaf (sparse + dense is dense), a leaf's .grad accumulates sparse + sparse without
// densifying across passes, tensor hooks and leaf-gradient hooks see it, zero_grad clears
// it, and nothing can make a sparse tensor require grad. Expected values are the dense
// path's, computed by the same graph with sparse_grad = false.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "gradwire/tensor/zero_grad.h"
#include "support/error_text.h"

namespace gradwire {
namespace {

// A [5, 3] float64 table with distinct values.
Tensor table() {
  return arange(0.0, 15.0, 1.0, kFloat64).view({5, 3}).clone().set_requires_grad();
}

// loss = sum(w[idx] * coef) over rows idx = {3, 1, 3}: d/dw[r] = sum of coef rows landing on r.
Tensor loss_of(const Tensor& w, bool sparse) {
  const Tensor rows = embedding_rows(w, tensor<int64_t>({3, 1, 3}), sparse);
  const Tensor coef = arange(1.0, 10.0, 1.0, kFloat64).view({3, 3});
  return sum(mul(rows, coef));
}

const std::vector<double> kDenseGrad = {0, 0, 0, 4, 5, 6, 0, 0, 0, 1 + 7, 2 + 8, 3 + 9, 0, 0, 0};

TEST(SparseGrad, EmbeddingRowsGivesTheTableSparseRows) {
  Tensor w = table();
  loss_of(w, true).backward();
  const Tensor g = w.grad();
  ASSERT_TRUE(g.is_sparse());
  EXPECT_EQ(g.sizes(), (Shape{5, 3}));
  EXPECT_EQ(g.nnz(), 3);  // only the rows looked up, duplicates not yet summed
  EXPECT_EQ(g.indices().to_vector<int64_t>(), (std::vector<int64_t>{3, 1, 3}));
  EXPECT_EQ(g.to_dense().to_vector<double>(), kDenseGrad);
  // The same graph with a dense gradient gives the same numbers.
  Tensor wd = table();
  loss_of(wd, false).backward();
  EXPECT_FALSE(wd.grad().is_sparse());
  EXPECT_EQ(wd.grad().to_vector<double>(), kDenseGrad);
  EXPECT_EQ(loss_of(w, true).grad_fn()->next_edges().size(), 1u);
}

TEST(SparseGrad, LeafGradAccumulatesSparsePlusSparseWithoutDensifying) {
  Tensor w = table();
  loss_of(w, true).backward();
  loss_of(w, true).backward();
  const Tensor g = w.grad();
  ASSERT_TRUE(g.is_sparse());
  EXPECT_EQ(g.nnz(), 6);
  std::vector<double> twice = kDenseGrad;
  for (double& v : twice)
    v *= 2;
  EXPECT_EQ(g.to_dense().to_vector<double>(), twice);
}

TEST(SparseGrad, MixedWithADenseGradientBecomesDense) {
  // Within one pass: the same leaf also used densely; the engine's sum is dense.
  Tensor w = table();
  add(loss_of(w, true), sum(mul(w, 2.0))).backward();
  ASSERT_FALSE(w.grad().is_sparse());
  std::vector<double> want = kDenseGrad;
  for (double& v : want)
    v += 2.0;
  EXPECT_EQ(w.grad().to_vector<double>(), want);
  // Across passes: a dense .grad takes sparse rows in place; a sparse .grad plus a dense
  // gradient is replaced by the dense sum.
  Tensor a = table();
  sum(mul(a, 2.0)).backward();
  const Tensor before = a.grad();
  loss_of(a, true).backward();
  EXPECT_TRUE(a.grad().is_same(before));  // accumulated in place
  EXPECT_EQ(a.grad().to_vector<double>(), want);
  Tensor b = table();
  loss_of(b, true).backward();
  sum(mul(b, 2.0)).backward();
  ASSERT_FALSE(b.grad().is_sparse());
  EXPECT_EQ(b.grad().to_vector<double>(), want);
}

TEST(SparseGrad, HooksSeeTheSparseGradient) {
  Tensor w = table();
  bool tensor_hook_saw_sparse = false;
  int64_t rows_seen = -1;
  w.register_hook([&](const Tensor& g) {
    tensor_hook_saw_sparse = g.is_sparse();
    rows_seen = g.nnz();
    return mul(g, 3.0);  // a replacement: still sparse, scaled
  });
  bool post_saw_sparse = false;
  w.register_post_accumulate_grad_hook(
      [&](const Tensor& leaf) { post_saw_sparse = leaf.grad().is_sparse(); });
  loss_of(w, true).backward();
  EXPECT_TRUE(tensor_hook_saw_sparse);
  EXPECT_EQ(rows_seen, 3);
  EXPECT_TRUE(post_saw_sparse);
  std::vector<double> want = kDenseGrad;
  for (double& v : want)
    v *= 3;
  EXPECT_EQ(w.grad().to_dense().to_vector<double>(), want);
}

TEST(SparseGrad, ZeroGradClearsSparseGradients) {
  Tensor w = table();
  loss_of(w, true).backward();
  zero_grad({w}, /*set_to_none=*/false);
  ASSERT_TRUE(w.grad().is_sparse());
  EXPECT_EQ(w.grad().nnz(), 0);
  loss_of(w, true).backward();  // accumulates into the emptied gradient
  EXPECT_EQ(w.grad().nnz(), 3);
  EXPECT_EQ(w.grad().to_dense().to_vector<double>(), kDenseGrad);
  zero_grad({w});
  EXPECT_FALSE(w.grad().defined());
}

TEST(SparseGrad, GradOfTheTableIsSparse) {
  Tensor w = table();
  const std::vector<Tensor> g = autograd::grad({loss_of(w, true)}, {w});
  ASSERT_EQ(g.size(), 1u);
  ASSERT_TRUE(g[0].is_sparse());
  EXPECT_EQ(g[0].to_dense().to_vector<double>(), kDenseGrad);
  EXPECT_FALSE(w.grad().defined());
}

TEST(SparseGrad, ASparseTensorCannotRequireGrad) {
  Tensor s = sparse_rows(tensor<int64_t>({0}), ones({1, 3}), {5, 3});
  EXPECT_NE(test::error_text<InvalidArgument>([&] {
              s.set_requires_grad();
            }).find("sparse-rows tensor of shape [5, 3] cannot require gradients"),
            std::string::npos);
  EXPECT_FALSE(s.requires_grad());
}

}  // namespace
}  // namespace gradwire
