// Sparse-rows tensors (tensor/sparse.h): construction and its checks, coalescing,
// densifying, the arithmetic that accepts them (sparse + sparse stays sparse, sparse +
// dense is dense, scalar scaling, zero_), the strided ops that must refuse one, and the
// in-place index_add_ the optimizers use to update only a gradient's rows. Expected values
// are worked out by hand or by loops over std::vector written here.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "support/error_text.h"

namespace gradwire {
namespace {

using test::error_text;

// 3 stored rows of a [6, 2] table: row 4 twice, row 1 once.
Tensor sample() {
  return sparse_rows(tensor<int64_t>({4, 1, 4}),
                     tensor<double>({1.0, 2.0, 3.0, 4.0, 5.0, 6.0}).view({3, 2}), {6, 2});
}

std::vector<double> dense_of_sample() {
  // row 1 = (3, 4); row 4 = (1 + 5, 2 + 6)
  return {0, 0, 3, 4, 0, 0, 0, 0, 6, 8, 0, 0};
}

TEST(SparseRows, MetadataAndParts) {
  const Tensor s = sample();
  EXPECT_TRUE(s.is_sparse());
  EXPECT_EQ(s.layout(), Layout::kSparseRows);
  EXPECT_EQ(s.sizes(), (Shape{6, 2}));
  EXPECT_EQ(s.dtype(), kFloat64);
  EXPECT_EQ(s.device(), Device::cpu());
  EXPECT_EQ(s.nnz(), 3);
  EXPECT_FALSE(s.is_coalesced());
  EXPECT_EQ(s.indices().to_vector<int64_t>(), (std::vector<int64_t>{4, 1, 4}));
  EXPECT_EQ(s.values().sizes(), (Shape{3, 2}));
  EXPECT_EQ(s.to_dense().to_vector<double>(), dense_of_sample());
  // Sorted unique rows are recognised as coalesced; int32 indices are accepted.
  const Tensor sorted = sparse_rows(tensor<int32_t>({0, 5}), ones({2, 2}, kFloat64), {6, 2});
  EXPECT_TRUE(sorted.is_coalesced());
  EXPECT_EQ(sorted.indices().dtype(), kInt64);
  EXPECT_FALSE(ones({2}).is_sparse());
  EXPECT_EQ(std::string(layout_name(Layout::kSparseRows)), "sparse_rows");
}

TEST(SparseRows, CoalesceSortsAndSumsDuplicates) {
  const Tensor c = sample().coalesce();
  EXPECT_TRUE(c.is_coalesced());
  EXPECT_EQ(c.indices().to_vector<int64_t>(), (std::vector<int64_t>{1, 4}));
  EXPECT_EQ(c.values().to_vector<double>(), (std::vector<double>{3, 4, 6, 8}));
  EXPECT_EQ(c.to_dense().to_vector<double>(), dense_of_sample());
  EXPECT_TRUE(c.coalesce().is_same(c));  // already coalesced: itself
  // Three dims: rows of [2, 2] blocks.
  const Tensor t3 = sparse_rows(tensor<int64_t>({2, 0, 2}), ones({3, 2, 2}), {3, 2, 2});
  const Tensor c3 = t3.coalesce();
  EXPECT_EQ(c3.indices().to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(c3.values().to_vector<float>(), (std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2}));
}

TEST(SparseRows, ConstructionChecksEveryPart) {
  const auto make = [](const Tensor& i, const Tensor& v, const Shape& s) {
    return [=] { (void)sparse_rows(i, v, s); };
  };
  EXPECT_NE(error_text<InvalidArgument>(make(tensor<int64_t>({0, 6}), ones({2, 2}), {6, 2}))
                .find("row index 6 (entry 1) is out of range for 6 rows"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>(make(tensor<int64_t>({-1}), ones({1, 2}), {6, 2}))
                .find("row index -1"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>(make(tensor<int64_t>({0, 1}), ones({3, 2}), {6, 2}))
                .find("values of shape [3, 2] do not fit 2 rows"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>(make(tensor<int64_t>({0}), ones({1, 3}), {6, 2}))
                .find("expected [1, 2]"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>(make(zeros({1, 1}, kInt64), ones({1, 2}), {6, 2}))
                .find("indices must be 1-d"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>(make(ones({1}), ones({1, 2}), {6, 2}))
                .find("indices must be int64"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>(make(tensor<int64_t>({0}), ones({1, 2}, kInt64), {6, 2}))
                .find("values must be floating point"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>(make(tensor<int64_t>({0}), ones({1, 2}), {}))
                .find("at least one dim"),
            std::string::npos);
}

TEST(SparseRows, StridedOpsRefuseWithAHint) {
  const Tensor s = sample();
  for (const auto& op : std::vector<std::function<void()>>{
           [&] { (void)s.data_ptr(); },
           [&] { (void)sum(s); },
           [&] { (void)s.view({12}); },
           [&] { (void)exp(s); },
           [&] { (void)s.contiguous().data_ptr(); },
           [&] {
             (void)matmul(s, ones({2, 2}, kFloat64));
           },
       }) {
    const std::string why = error_text<InvalidArgument>(op);
    EXPECT_NE(why.find("sparse-rows tensor of shape [6, 2] (3 rows stored)"), std::string::npos)
        << why;
    EXPECT_NE(why.find("to_dense()"), std::string::npos) << why;
  }
  EXPECT_NE(error_text<InvalidArgument>([] {
              (void)ones({2}).indices();
            }).find("indices: expected a sparse-rows tensor"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              (void)s.to(Device::cuda(0));
            }).find("sparse-rows tensors stay on the CPU"),
            std::string::npos);
}

TEST(SparseRows, SparsePlusSparseStaysSparse) {
  const Tensor a = sample();
  const Tensor b = sparse_rows(tensor<int64_t>({0, 1}), ones({2, 2}, kFloat64), {6, 2});
  const Tensor s = add(a, b, 2.0);
  ASSERT_TRUE(s.is_sparse());
  EXPECT_EQ(s.nnz(), 5);  // concatenated: no densifying, no merging
  std::vector<double> want = dense_of_sample();
  for (int i = 0; i < 4; ++i)
    want[static_cast<size_t>(i)] += 2.0;  // rows 0 and 1
  EXPECT_EQ(s.to_dense().to_vector<double>(), want);
  // In place on a sparse tensor replaces its parts: `a` itself is untouched.
  Tensor acc = a.clone();
  acc.add_(b);
  EXPECT_EQ(acc.nnz(), 5);
  EXPECT_EQ(a.nnz(), 3);
  EXPECT_EQ(sub(a, a).to_dense().to_vector<double>(), std::vector<double>(12, 0.0));
  // Adding nothing: the same rows, in a new tensor.
  const Tensor none = sparse_rows_zeros({6, 2}, kFloat64);
  EXPECT_EQ(none.nnz(), 0);
  EXPECT_EQ(add(a, none).nnz(), 3);
  EXPECT_EQ(add(none, a).to_dense().to_vector<double>(), dense_of_sample());
}

TEST(SparseRows, SparseAndDenseMixToDense) {
  const Tensor a = sample();
  const Tensor d = full({6, 2}, 1.0, kFloat64);
  std::vector<double> want = dense_of_sample();
  for (double& v : want)
    v += 1.0;
  const Tensor ad = add(a, d), da = add(d, a);
  EXPECT_FALSE(ad.is_sparse());
  EXPECT_EQ(ad.to_vector<double>(), want);
  EXPECT_EQ(da.to_vector<double>(), want);
  // dense.add_(sparse, alpha) touches only the stored rows.
  Tensor w = full({6, 2}, 1.0, kFloat64);
  const uint64_t version = w.version();
  w.add_(a, -0.5);
  EXPECT_GT(w.version(), version);
  std::vector<double> got = w.to_vector<double>(), expect(12, 1.0);
  for (size_t i = 0; i < 12; ++i)
    expect[i] -= 0.5 * dense_of_sample()[i];
  EXPECT_EQ(got, expect);
  Tensor s = a.clone();
  EXPECT_NE(
      error_text<InvalidArgument>([&] { s.add_(d); }).find("cannot take a dense one in place"),
      std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              (void)add(a, ones({6, 3}, kFloat64));
            }).find("shapes [6, 2] and [6, 3] differ"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              (void)add(a, ones({6, 2}));
            }).find("dtypes float64 and float32 differ"),
            std::string::npos);
}

TEST(SparseRows, ScalingZeroingCloningAndDetaching) {
  const Tensor a = sample();
  std::vector<double> doubled = dense_of_sample();
  for (double& v : doubled)
    v *= 2;
  EXPECT_EQ(mul(a, 2.0).to_dense().to_vector<double>(), doubled);
  EXPECT_EQ(div(mul(a, 4.0), 2.0).to_dense().to_vector<double>(), doubled);
  Tensor b = a.clone();
  b.mul_(2.0);
  EXPECT_EQ(b.to_dense().to_vector<double>(), doubled);
  EXPECT_EQ(a.to_dense().to_vector<double>(), dense_of_sample());  // the clone is its own
  Tensor shared = b.detach();
  b.zero_();
  EXPECT_EQ(b.nnz(), 0);
  EXPECT_EQ(shared.nnz(), 0);  // detach shares the parts, as a strided detach shares storage
  EXPECT_EQ(b.to_dense().to_vector<double>(), std::vector<double>(12, 0.0));
  const Tensor f = a.to(kFloat32);
  EXPECT_TRUE(f.is_sparse());
  EXPECT_EQ(f.dtype(), kFloat32);
  EXPECT_EQ(f.values().dtype(), kFloat32);
  EXPECT_NE(a.to_string().find("sparse_rows(size=[6, 2], nnz=3"), std::string::npos);
}

TEST(SparseRows, InPlaceIndexAddTouchesOnlyItsRows) {
  Tensor w = arange(0.0, 8.0, 1.0, kFloat64).view({4, 2});
  index_add_(w, 0, tensor<int64_t>({3, 0, 3}), ones({3, 2}, kFloat64), 0.5);
  EXPECT_EQ(w.to_vector<double>(), (std::vector<double>{0.5, 1.5, 2, 3, 4, 5, 7, 8}));
  // A non-contiguous destination is written through.
  Tensor base = zeros({2, 4}, kFloat64);
  Tensor t = base.transpose(0, 1);  // [4, 2] view
  index_add_(t, 0, tensor<int64_t>({1}), ones({1, 2}, kFloat64));
  EXPECT_EQ(base.to_vector<double>(), (std::vector<double>{0, 1, 0, 0, 0, 1, 0, 0}));
  EXPECT_NE(error_text<InvalidArgument>([&] {
              index_add_(w, 0, tensor<int64_t>({4}), ones({1, 2}, kFloat64));
            }).find("index 4 is out of range for dim 0 of size 4"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              index_add_(w, 0, tensor<int64_t>({1}), ones({2, 2}, kFloat64));
            }).find("index_add_: src of shape [2, 2] does not fit"),
            std::string::npos);
}

}  // namespace
}  // namespace gradwire
