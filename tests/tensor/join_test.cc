// Joining and splitting (cat, stack, split, split_with_sizes, chunk) and the flat buffers
// of tensor lists (flatten_dense_tensors / unflatten_dense_tensors), checked element by
// element against index arithmetic written here, on every dtype, with non-contiguous
// inputs, PyTorch's edge cases (legacy empty tensors, ceil-sized chunks) and the errors.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt32,   kInt64,   kUInt8,   kBool};

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::vector<double> seq(int64_t n, double start, DType t) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = t == kBool ? static_cast<double>((i + 1) % 2) : start + i;
  return v;
}

TEST(JoinTest, CatEveryDTypeAlongEachDim) {
  for (DType t : kAllDTypes) {
    auto av = seq(6, 1, t), bv = seq(9, 20, t);
    Tensor a = tensor<double>(av, {2, 3}).to(t);
    // dim 0: [2, 3] + [3, 3] -> [5, 3], rows of a then rows of b.
    Tensor b0 = tensor<double>(bv, {3, 3}).to(t);
    Tensor c0 = cat({a, b0}, 0);
    EXPECT_EQ(c0.dtype(), t);
    EXPECT_EQ(c0.sizes(), Shape({5, 3}));
    std::vector<double> want0 = av;
    want0.insert(want0.end(), bv.begin(), bv.end());
    EXPECT_EQ(c0.to_vector<double>(), want0) << dtype_name(t);
    // dim 1 (as -1): [2, 3] + [2, 4] -> [2, 7].
    auto cv = seq(8, 40, t);
    Tensor b1 = tensor<double>(cv, {2, 4}).to(t);
    auto got = cat({a, b1}, -1).to_vector<double>();
    ASSERT_EQ(got.size(), 14u);
    for (int i = 0; i < 2; ++i) {
      for (int j = 0; j < 3; ++j)
        EXPECT_EQ(got[i * 7 + j], av[i * 3 + j]);
      for (int j = 0; j < 4; ++j)
        EXPECT_EQ(got[i * 7 + 3 + j], cv[i * 4 + j]);
    }
  }
}

TEST(JoinTest, CatViewsPromotionAndLegacyEmpty) {
  auto v = seq(6, 1, kFloat64);
  Tensor base = tensor<double>(v, {2, 3});
  Tensor t = base.t();                          // [3, 2]: t[i][j] = v[j*3 + i]
  Tensor c = cat({t, t.slice(0, 0, 3, 2)}, 0);  // [3, 2] + rows 0 and 2 -> [5, 2]
  auto got = c.to_vector<double>();
  std::vector<double> want;
  for (int i : {0, 1, 2, 0, 2})
    for (int j = 0; j < 2; ++j)
      want.push_back(v[j * 3 + i]);
  EXPECT_EQ(got, want);
  // An expanded input.
  Tensor e = cat({base.select(0, 0).unsqueeze(0).expand({2, 3}), base}, 0);
  EXPECT_EQ(e.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3, 1, 2, 3, 4, 5, 6}));
  // Mixed dtypes promote: int32 with float32 is float32; uint8 with int64 is int64.
  Tensor p = cat({tensor<int32_t>({1, 2}), tensor<float>({0.5f})});
  EXPECT_EQ(p.dtype(), kFloat32);
  EXPECT_EQ(p.to_vector<double>(), (std::vector<double>{1, 2, 0.5}));
  EXPECT_EQ(cat({tensor<uint8_t>({200}), tensor<int64_t>({-1})}).dtype(), kInt64);
  // Legacy 1-d empty tensors are skipped whatever the other shapes.
  Tensor l = cat({zeros({0}), base, zeros({0})}, 1);
  EXPECT_EQ(l.sizes(), Shape({2, 3}));
  EXPECT_EQ(l.to_vector<double>(), v);
  EXPECT_EQ(cat({zeros({0}), zeros({0})}).sizes(), Shape({0}));
  // Non-legacy empty pieces take part in the shape check and contribute nothing.
  EXPECT_EQ(cat({zeros({0, 3}), base}, 0).sizes(), Shape({2, 3}));
}

TEST(JoinTest, CatErrors) {
  expect_invalid([] { cat({}); }, "cat: expected a non-empty list");
  expect_invalid(
      [] {
        cat({zeros({2, 3}), zeros({3, 4})}, 0);
      },
      "cat: sizes must match except in dim 0: tensor 0 has shape [2, 3] and tensor 1 "
      "has shape [3, 4]");
  expect_invalid([] { cat({zeros({2, 3}), zeros({2, 3, 1})}, 0); }, "[2, 3, 1]");
  expect_invalid([] { cat({zeros({2, 3}), zeros({2, 3})}, 2); }, "cat: dim 2");
  expect_invalid(
      [] {
        cat({scalar_tensor(1.0), scalar_tensor(2.0)});
      },
      "cat: zero-dimensional tensor");
  expect_invalid([] { cat({zeros({2}), Tensor()}); }, "cat: tensor 1 is undefined");
}

TEST(JoinTest, StackAtEveryPosition) {
  auto av = seq(6, 1, kInt64), bv = seq(6, 11, kInt64);
  Tensor a = tensor<double>(av, {2, 3}).to(kInt64);
  Tensor b = tensor<double>(bv, {2, 3}).to(kInt64).t().contiguous().t();  // same values, strided
  const std::vector<double>* src[2] = {&av, &bv};
  for (int64_t dim : {0, 1, 2, -1, -3}) {
    Tensor s = stack({a, b}, dim);
    const int64_t d = dim < 0 ? dim + 3 : dim;
    Shape want_shape{2, 3};
    want_shape.insert(want_shape.begin() + d, 2);
    EXPECT_EQ(s.sizes(), want_shape) << dim;
    auto got = s.to_vector<double>();
    // Element [k, i, j] of the stacked order (k = which tensor), moved to position d.
    Shape idx(3);
    for (int64_t flat = 0; flat < 12; ++flat) {
      int64_t rem = flat;
      for (int64_t q = 2; q >= 0; --q) {
        idx[q] = rem % want_shape[q];
        rem /= want_shape[q];
      }
      int64_t k = idx[d];
      Shape ij;
      for (int64_t q = 0; q < 3; ++q)
        if (q != d) ij.push_back(idx[q]);
      EXPECT_EQ(got[flat], (*src[k])[ij[0] * 3 + ij[1]]) << "dim " << dim << " flat " << flat;
    }
  }
  expect_invalid(
      [&] {
        stack({a, zeros({3, 2}, kInt64)});
      },
      "stack: expected tensors of one shape, got [2, 3] (tensor 0) and [3, 2]");
  expect_invalid([&] { stack({a, b}, 3); }, "stack: dim 3");
  expect_invalid([] { stack({}); }, "stack: expected a non-empty list");
}

TEST(JoinTest, SplitGivesAliasingViews) {
  Tensor x = tensor<double>(seq(14, 0, kFloat64), {7, 2});
  auto parts = split(x, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].sizes(), Shape({3, 2}));
  EXPECT_EQ(parts[2].sizes(), Shape({1, 2}));
  EXPECT_EQ(parts[1].to_vector<double>(), (std::vector<double>{6, 7, 8, 9, 10, 11}));
  EXPECT_EQ(parts[2].to_vector<double>(), (std::vector<double>{12, 13}));
  parts[1].fill_(-1);
  EXPECT_EQ(x.at({3, 0}), -1.0);
  EXPECT_EQ(x.at({5, 1}), -1.0);
  EXPECT_EQ(x.at({6, 0}), 12.0);
  // Along dim 1 of a transposed view: pieces are views of the base.
  Tensor base = tensor<double>(seq(10, 0, kFloat64), {5, 2});
  auto cols = split(base.t(), 2, 1);  // base.t() is [2, 5]
  ASSERT_EQ(cols.size(), 3u);
  EXPECT_EQ(cols[2].sizes(), Shape({2, 1}));
  EXPECT_EQ(cols[1].to_vector<double>(), (std::vector<double>{4, 6, 5, 7}));
  EXPECT_TRUE(cols[1].storage().is_same(base.storage()));
  // A split size larger than the dim gives the whole tensor; an empty dim one empty piece.
  EXPECT_EQ(split(x, 10).size(), 1u);
  EXPECT_EQ(split(zeros({0, 2}), 3).size(), 1u);
  expect_invalid([&] { split(x, 0); }, "split: split_size must be positive");
  expect_invalid([&] { split(x, 2, 2); }, "split: dim 2");
  expect_invalid([] { split(scalar_tensor(1.0), 1); }, "split: expected a tensor with at least 1");
}

TEST(JoinTest, SplitWithSizes) {
  Tensor x = tensor<double>(seq(12, 0, kFloat64), {2, 6});
  auto parts = split_with_sizes(x, {1, 0, 3, 2}, 1);
  ASSERT_EQ(parts.size(), 4u);
  EXPECT_EQ(parts[0].to_vector<double>(), (std::vector<double>{0, 6}));
  EXPECT_EQ(parts[1].sizes(), Shape({2, 0}));
  EXPECT_EQ(parts[2].to_vector<double>(), (std::vector<double>{1, 2, 3, 7, 8, 9}));
  EXPECT_EQ(parts[3].to_vector<double>(), (std::vector<double>{4, 5, 10, 11}));
  expect_invalid(
      [&] {
        split_with_sizes(x, {2, 3}, 1);
      },
      "split_with_sizes: sizes [2, 3] add up to 5 but dim 1 of shape [2, 6] has size 6");
  expect_invalid([&] { split_with_sizes(x, {7, -1}, 1); }, "split_with_sizes: negative size -1");
}

TEST(JoinTest, ChunkIsCeilSized) {
  auto sizes_of = [](const std::vector<Tensor>& parts, int64_t dim) {
    Shape s;
    for (const Tensor& p : parts)
      s.push_back(p.size(dim));
    return s;
  };
  // ceil(5 / 3) = 2 -> 2, 2, 1; ceil(6 / 4) = 2 -> only 3 chunks; ceil(2 / 5) = 1 -> 2.
  EXPECT_EQ(sizes_of(chunk(zeros({5}), 3), 0), Shape({2, 2, 1}));
  EXPECT_EQ(sizes_of(chunk(zeros({6}), 4), 0), Shape({2, 2, 2}));
  EXPECT_EQ(sizes_of(chunk(zeros({2}), 5), 0), Shape({1, 1}));
  EXPECT_EQ(sizes_of(chunk(zeros({3, 7}), 2, -1), 1), Shape({4, 3}));
  // An empty dim still gives `chunks` empty pieces.
  EXPECT_EQ(sizes_of(chunk(zeros({0, 2}), 3), 0), Shape({0, 0, 0}));
  Tensor x = tensor<double>(seq(5, 0, kFloat64));
  auto c = chunk(x, 2);
  EXPECT_EQ(c[1].to_vector<double>(), (std::vector<double>{3, 4}));
  EXPECT_TRUE(c[1].storage().is_same(x.storage()));
  expect_invalid([&] { chunk(x, 0); }, "chunk: chunks must be positive, got 0");
  expect_invalid([&] { chunk(x, 2, 1); }, "chunk: dim 1");
}

TEST(JoinTest, FlattenUnflattenRoundTripEveryDType) {
  for (DType t : kAllDTypes) {
    auto av = seq(6, 1, t), bv = seq(4, 10, t);
    Tensor a = tensor<double>(av, {2, 3}).to(t);
    Tensor b = tensor<double>(bv, {2, 2}).to(t).t();  // non-contiguous: b[i][j] = bv[j*2 + i]
    Tensor s = scalar_tensor(t == kBool ? 1 : 42, t);
    Tensor e = empty({0, 5}, t);
    Tensor flat = flatten_dense_tensors({a, b, s, e});
    EXPECT_EQ(flat.dtype(), t);
    EXPECT_EQ(flat.sizes(), Shape({11}));
    std::vector<double> want = av;
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        want.push_back(bv[j * 2 + i]);
    want.push_back(t == kBool ? 1 : 42);
    EXPECT_EQ(flat.to_vector<double>(), want) << dtype_name(t);

    auto views = unflatten_dense_tensors(flat, {a, b, s, e});
    ASSERT_EQ(views.size(), 4u);
    EXPECT_EQ(views[0].sizes(), a.sizes());
    EXPECT_EQ(views[1].sizes(), b.sizes());
    EXPECT_EQ(views[2].dim(), 0);
    EXPECT_EQ(views[3].sizes(), e.sizes());
    EXPECT_EQ(views[0].to_vector<double>(), av);
    EXPECT_EQ(views[1].to_vector<double>(), b.to_vector<double>());
    for (const Tensor& v : views)
      EXPECT_TRUE(v.storage().is_same(flat.storage()));
  }
}

TEST(JoinTest, UnflattenedViewsAliasFlat) {
  Tensor a = zeros({2, 2}), b = zeros({3});
  Tensor flat = tensor<float>({1, 2, 3, 4, 5, 6, 7});
  auto views = unflatten_dense_tensors(flat, {a, b});
  flat.fill_(9);
  EXPECT_EQ(views[0].at({1, 1}), 9.0);
  views[1].fill_(-2);
  EXPECT_EQ(flat.at({4}), -2.0);
  EXPECT_EQ(flat.at({3}), 9.0);
  // A strided flat buffer still gives views (no copy).
  Tensor wide = tensor<float>({1, 0, 2, 0, 3, 0, 4, 0});
  auto sv = unflatten_dense_tensors(wide.slice(0, 0, 8, 2), {a});
  EXPECT_EQ(sv[0].to_vector<float>(), (std::vector<float>{1, 2, 3, 4}));
  sv[0].fill_(5);
  EXPECT_EQ(wide.at({2}), 5.0);
  EXPECT_EQ(wide.at({3}), 0.0);
  EXPECT_TRUE(unflatten_dense_tensors(zeros({0}), {}).empty());
}

TEST(JoinTest, FlattenUnflattenErrors) {
  expect_invalid([] { flatten_dense_tensors({}); }, "flatten_dense_tensors: expected a non-empty");
  expect_invalid(
      [] {
        flatten_dense_tensors({zeros({2}), zeros({2}, kFloat64)});
      },
      "flatten_dense_tensors: expected one dtype, got float32 (tensor 0) and float64");
  Tensor flat = zeros({5});
  expect_invalid(
      [&] {
        unflatten_dense_tensors(flat, {zeros({2, 2})});
      },
      "unflatten_dense_tensors: the tensors hold 4 elements but flat of shape [5] has 5");
  expect_invalid([&] { unflatten_dense_tensors(flat, {zeros({5}, kInt64)}); },
                 "unflatten_dense_tensors: tensor 0 is int64 on cpu but flat is float32");
  expect_invalid(
      [] {
        unflatten_dense_tensors(zeros({2, 2}), {zeros({4})});
      },
      "unflatten_dense_tensors: flat must be 1-d");
}

}  // namespace
}  // namespace gradwire
