// Indexing ops (index_select, gather, scatter_add(_), index_add, masked_fill, one_hot)
// against loops over std::vector written here, for every dtype each accepts, int64 and
// int32 indices, non-contiguous inputs, and every error path (bad shapes, dtypes and
// out-of-range indices, whose messages must name the op, the index and the size).
#include <gtest/gtest.h>

#include <cmath>
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
const std::vector<DType> kNumericDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                           kInt32,   kInt64,   kUInt8};

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Small integers (exact in every dtype; 0/1 for bool), as doubles.
std::vector<double> values(int64_t n, DType t, uint32_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<double>((s >> 16) % (t == kBool ? 2u : 50u));
  }
  return v;
}

Tensor index_tensor(const std::vector<int64_t>& idx, const Shape& shape, DType t) {
  return tensor<int64_t>(idx, shape).to(t);
}

TEST(IndexTest, IndexSelectEveryDTypeAndDim) {
  const Shape shape{4, 3, 5};
  for (DType t : kAllDTypes) {
    auto v = values(60, t, 1);
    Tensor x = tensor<double>(v, shape).to(t);
    for (DType it : {kInt64, kInt32}) {
      // dim 1 with a repeated index.
      Tensor r = index_select(x, 1, index_tensor({2, 0, 2}, {3}, it));
      EXPECT_EQ(r.dtype(), t);
      EXPECT_EQ(r.sizes(), Shape({4, 3, 5}));
      const int64_t pick[3] = {2, 0, 2};
      auto got = r.to_vector<double>();
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 3; ++j)
          for (int k = 0; k < 5; ++k)
            EXPECT_EQ(got[(i * 3 + j) * 5 + k], v[(i * 3 + pick[j]) * 5 + k]) << dtype_name(t);
      // dim 0 (rows, as an embedding lookup) and the last dim.
      auto r0 = index_select(x, 0, index_tensor({3, 1}, {2}, it)).to_vector<double>();
      for (int j = 0; j < 15; ++j) {
        EXPECT_EQ(r0[j], v[3 * 15 + j]);
        EXPECT_EQ(r0[15 + j], v[1 * 15 + j]);
      }
      auto r2 = index_select(x, -1, index_tensor({4}, {1}, it)).to_vector<double>();
      ASSERT_EQ(r2.size(), 12u);
      for (int i = 0; i < 12; ++i)
        EXPECT_EQ(r2[i], v[i * 5 + 4]);
    }
  }
}

TEST(IndexTest, IndexSelectViewsAndEmpty) {
  auto v = values(12, kFloat64, 2);
  Tensor t = tensor<double>(v, {3, 4}).t();  // t[i][j] = v[j*4 + i], shape [4, 3]
  auto r = index_select(t, 0, tensor<int64_t>({3, 0})).to_vector<double>();
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(r[j], v[j * 4 + 3]);
    EXPECT_EQ(r[3 + j], v[j * 4 + 0]);
  }
  EXPECT_EQ(index_select(t, 1, tensor<int64_t>(std::vector<int64_t>{})).sizes(), Shape({4, 0}));
  // A 0-dim index selects one slice and keeps the dim (size 1).
  EXPECT_EQ(index_select(t, 0, scalar_tensor(2, kInt64)).sizes(), Shape({1, 3}));
}

TEST(IndexTest, IndexSelectErrors) {
  Tensor x = zeros({3, 2});
  expect_invalid(
      [&] {
        index_select(x, 0, tensor<int64_t>({0, 3}));
      },
      "index_select: index 3 is out of range for dim 0 of size 3");
  expect_invalid([&] { index_select(x, 0, tensor<int32_t>({-1})); }, "index -1");
  expect_invalid([&] { index_select(x, 0, tensor<float>({0})); }, "index_select: dtype float32");
  expect_invalid(
      [&] {
        index_select(x, 0, zeros({1, 1}, kInt64));
      },
      "index_select: index must be 1-d");
  expect_invalid([&] { index_select(x, 2, tensor<int64_t>({0})); }, "index_select: dim 2");
}

TEST(IndexTest, CudaTensorsAreRejected) {
  if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device";
  Tensor x = zeros({3}, Device::cuda(0));
  expect_invalid([&] { index_select(x, 0, tensor<int64_t>({0})); },
                 "index_select: CUDA tensors are not supported; move to cpu first");
  expect_invalid([&] { masked_fill(x, zeros({3}, kBool), 1); }, "masked_fill: CUDA tensors");
}

TEST(IndexTest, GatherEveryDType) {
  // input [3, 4]; index [2, 3] is smaller than the input in dim 0 and 1.
  const std::vector<int64_t> idx1 = {3, 0, 3, 1, 2, 0};  // gather along dim 1
  const std::vector<int64_t> idx0 = {2, 0, 1, 1, 2, 0};  // gather along dim 0
  for (DType t : kAllDTypes) {
    auto v = values(12, t, 3);
    Tensor x = tensor<double>(v, {3, 4}).to(t);
    for (DType it : {kInt64, kInt32}) {
      Tensor g1 = gather(x, 1, index_tensor(idx1, {2, 3}, it));
      EXPECT_EQ(g1.dtype(), t);
      EXPECT_EQ(g1.sizes(), Shape({2, 3}));
      auto a = g1.to_vector<double>();
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
          EXPECT_EQ(a[i * 3 + j], v[i * 4 + idx1[i * 3 + j]]);
      auto b = gather(x, 0, index_tensor(idx0, {2, 3}, it)).to_vector<double>();
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 3; ++j)
          EXPECT_EQ(b[i * 3 + j], v[idx0[i * 3 + j] * 4 + j]);
    }
  }
}

TEST(IndexTest, GatherFromViewsWithStridedIndex) {
  auto v = values(24, kFloat64, 4);
  Tensor base = tensor<double>(v, {4, 6});
  Tensor t = base.t();  // [6, 4]: t[i][j] = v[j*6 + i]
  // Index [6, 2] taken as the transpose of a [2, 6] tensor.
  std::vector<int64_t> raw = {0, 1, 2, 3, 0, 1, 3, 3, 2, 1, 0, 0};  // [2, 6]
  Tensor idx = tensor<int64_t>(raw, {2, 6}).t();                    // idx[i][j] = raw[j*6 + i]
  auto g = gather(t, 1, idx).to_vector<double>();
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 2; ++j)
      EXPECT_EQ(g[i * 2 + j], v[raw[j * 6 + i] * 6 + i]);
  // Expanded input (stride 0): every row is the same.
  Tensor row = base.select(0, 1).unsqueeze(0).expand({3, 6});
  auto ge = gather(row, 1, tensor<int64_t>({5, 0, 2}, {3, 1})).to_vector<double>();
  EXPECT_EQ(ge, (std::vector<double>{v[6 + 5], v[6 + 0], v[6 + 2]}));
}

TEST(IndexTest, GatherErrors) {
  Tensor x = zeros({3, 4});
  expect_invalid(
      [&] {
        gather(x, 1, tensor<int64_t>({0, 4}, {1, 2}));
      },
      "gather: index 4 is out of range for dim 1 of size 4");
  expect_invalid(
      [&] {
        gather(x, 1, zeros({4, 1}, kInt64));
      },
      "gather: index of shape [4, 1] is larger than the input of shape [3, 4] at dim 0");
  expect_invalid([&] { gather(x, 0, zeros({3}, kInt64)); }, "gather: index of shape [3]");
  expect_invalid([&] { gather(x, 0, zeros({1, 1}, kFloat64)); }, "gather: dtype float64");
}

TEST(IndexTest, ScatterAddEveryNumericDType) {
  // a [3, 4]; index/src [2, 4] along dim 0 with duplicates; index narrower than src.
  const std::vector<int64_t> idx = {0, 2, 2, 1, 0, 2, 1, 1};
  for (DType t : kNumericDTypes) {
    auto av = values(12, t, 5), sv = values(10, t, 6);
    for (auto& x : sv)
      x = std::fmod(x, 5.0);  // keep uint8 sums below 256
    Tensor a = tensor<double>(av, {3, 4}).to(t);
    Tensor src = tensor<double>(sv, {2, 5}).to(t);
    for (DType it : {kInt64, kInt32}) {
      std::vector<double> want = av;
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 4; ++j)
          want[idx[i * 4 + j] * 4 + j] += sv[i * 5 + j];
      Tensor out = scatter_add(a, 0, index_tensor(idx, {2, 4}, it), src);
      EXPECT_EQ(out.dtype(), t);
      EXPECT_EQ(out.to_vector<double>(), want) << dtype_name(t);
      EXPECT_EQ(a.to_vector<double>(), av) << "scatter_add must not modify its input";
      // In place along dim 1.
      Tensor b = tensor<double>(av, {3, 4}).to(t);
      const uint64_t version = b.version();
      std::vector<double> want1 = av;
      const std::vector<int64_t> idx1 = {3, 3, 0, 1, 0, 2};  // [3, 2]
      for (int i = 0; i < 3; ++i)
        for (int j = 0; j < 2; ++j)
          want1[i * 4 + idx1[i * 2 + j]] += sv[i * 2 + j];
      Tensor src1 = tensor<double>(sv, {5, 2}).to(t);
      Tensor& r = scatter_add_(b, 1, index_tensor(idx1, {3, 2}, it), src1);
      EXPECT_TRUE(r.is_same(b));
      EXPECT_GT(b.version(), version);
      EXPECT_EQ(b.to_vector<double>(), want1) << dtype_name(t);
    }
  }
}

TEST(IndexTest, ScatterAddIntoTransposedView) {
  auto v = values(6, kFloat64, 7);
  Tensor base = tensor<double>(v, {2, 3});
  Tensor t = base.t();  // [3, 2], t[i][j] = base[j][i]
  scatter_add_(t, 0, tensor<int64_t>({2, 0}, {1, 2}), tensor<double>({10.0, 20.0}, {1, 2}));
  // t[2][0] += 10 is base[0][2]; t[0][1] += 20 is base[1][0]: written through the view.
  std::vector<double> want = v;
  want[0 * 3 + 2] += 10;
  want[1 * 3 + 0] += 20;
  EXPECT_EQ(base.to_vector<double>(), want);
}

TEST(IndexTest, ScatterAddErrors) {
  Tensor a = zeros({3, 4});
  expect_invalid(
      [&] {
        scatter_add(a, 0, tensor<int64_t>({3}, {1, 1}), ones({1, 1}));
      },
      "scatter_add_: index 3 is out of range for dim 0 of size 3");
  expect_invalid(
      [&] {
        scatter_add(a, 0, zeros({2, 2}, kInt64), ones({1, 2}));
      },
      "larger than src of shape [1, 2]");
  expect_invalid(
      [&] {
        scatter_add(a, 0, zeros({2, 5}, kInt64), ones({2, 5}));
      },
      "larger than the input of shape [3, 4] at dim 1");
  expect_invalid([&] { scatter_add(a, 0, zeros({2}, kInt64), ones({2})); }, "as many dims");
  expect_invalid([&] { scatter_add(zeros({2}, kBool), 0, zeros({1}, kInt64), ones({1}, kBool)); },
                 "scatter_add_: dtype bool");
  Tensor ai = zeros({3}, kInt64);
  expect_invalid([&] { scatter_add_(ai, 0, zeros({1}, kInt64), ones({1})); },
                 "src of dtype float32 cannot be added into a int64 tensor");
}

TEST(IndexTest, IndexAddEveryNumericDType) {
  const std::vector<int64_t> idx = {2, 0, 2};
  for (DType t : kNumericDTypes) {
    auto av = values(12, t, 8), sv = values(9, t, 9);
    for (auto& x : sv)
      x = std::fmod(x, 5.0);
    Tensor a = tensor<double>(av, {4, 3}).to(t);
    for (DType it : {kInt64, kInt32}) {
      // dim 0: rows of src [3, 3] added into rows of a, row 2 twice.
      std::vector<double> want = av;
      for (int k = 0; k < 3; ++k)
        for (int j = 0; j < 3; ++j)
          want[idx[k] * 3 + j] += sv[k * 3 + j];
      Tensor r = index_add(a, 0, index_tensor(idx, {3}, it), tensor<double>(sv, {3, 3}).to(t));
      EXPECT_EQ(r.dtype(), t);
      EXPECT_EQ(r.to_vector<double>(), want) << dtype_name(t);
      EXPECT_EQ(a.to_vector<double>(), av);
      // dim 1: columns of src [4, 3] (transposed view) added into columns of a.
      std::vector<double> sv12 = values(12, t, 10);
      for (auto& x : sv12)
        x = std::fmod(x, 5.0);
      Tensor src1 = tensor<double>(sv12, {3, 4}).to(t).t();  // src1[i][k] = sv12[k*4 + i]
      std::vector<double> want1 = av;
      for (int i = 0; i < 4; ++i)
        for (int k = 0; k < 3; ++k)
          want1[i * 3 + idx[k]] += sv12[k * 4 + i];
      EXPECT_EQ(index_add(a, 1, index_tensor(idx, {3}, it), src1).to_vector<double>(), want1)
          << dtype_name(t);
    }
  }
}

TEST(IndexTest, IndexAddErrors) {
  Tensor a = zeros({4, 3});
  expect_invalid(
      [&] {
        index_add(a, 0, tensor<int64_t>({4}), ones({1, 3}));
      },
      "index_add: index 4 is out of range for dim 0 of size 4");
  expect_invalid(
      [&] {
        index_add(a, 0, tensor<int64_t>({0, 1}), ones({1, 3}));
      },
      "index_add: src of shape [1, 3] does not fit input of shape [4, 3]");
  expect_invalid([&] { index_add(a, 0, tensor<int64_t>({0}), ones({1, 2})); }, "index_add");
  expect_invalid(
      [&] {
        index_add(a, 0, zeros({1, 1}, kInt64), ones({1, 3}));
      },
      "index_add: index must be 1-d");
}

TEST(IndexTest, MaskedFillEveryDTypeWithBroadcastMask) {
  const std::vector<bool> mask_row = {true, false, false, true};
  for (DType t : kAllDTypes) {
    auto v = values(12, t, 11);
    Tensor x = tensor<double>(v, {3, 4}).to(t);
    Tensor m = tensor<bool>(mask_row, {1, 4});
    const Scalar fill = t == kBool ? Scalar(true) : Scalar(7);
    Tensor r = masked_fill(x, m, fill);
    EXPECT_EQ(r.dtype(), t);
    auto got = r.to_vector<double>();
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 4; ++j)
        EXPECT_EQ(got[i * 4 + j], mask_row[j] ? (t == kBool ? 1.0 : 7.0) : v[i * 4 + j]);
    EXPECT_EQ(x.to_vector<double>(), v);
  }
  // Non-contiguous input, full mask, floating fill value.
  auto v = values(6, kFloat32, 12);
  Tensor t = tensor<double>(v, {2, 3}).to(kFloat32).t();  // [3, 2]
  Tensor m = tensor<bool>({true, false, false, false, false, true}, {3, 2});
  auto got = masked_fill(t, m, -0.5).to_vector<double>();
  EXPECT_EQ(got, (std::vector<double>{-0.5, v[3], v[1], v[4], v[2], -0.5}));
}

TEST(IndexTest, MaskedFillErrors) {
  Tensor x = zeros({2, 3});
  expect_invalid(
      [&] {
        masked_fill(x, zeros({2, 3}, kUInt8), 1);
      },
      "masked_fill: mask must be bool, got uint8");
  expect_invalid([&] { masked_fill(x, zeros({4}, kBool), 1); }, "masked_fill");
  expect_invalid(
      [&] {
        masked_fill(x, zeros({3, 2, 3}, kBool), 1);
      },
      "masked_fill: mask of shape [3, 2, 3] does not broadcast to the input's shape");
}

TEST(IndexTest, OneHot) {
  for (DType it : {kInt64, kInt32}) {
    const std::vector<int64_t> labels = {2, 0, 1, 2, 4, 0};
    Tensor r = one_hot(index_tensor(labels, {2, 3}, it), 5);
    EXPECT_EQ(r.dtype(), kFloat32);
    EXPECT_EQ(r.sizes(), Shape({2, 3, 5}));
    auto got = r.to_vector<double>();
    for (size_t i = 0; i < labels.size(); ++i)
      for (int64_t c = 0; c < 5; ++c)
        EXPECT_EQ(got[i * 5 + c], c == labels[i] ? 1.0 : 0.0);
    // -1 infers max + 1 classes.
    EXPECT_EQ(one_hot(index_tensor(labels, {6}, it), -1).sizes(), Shape({6, 5}));
  }
  // A strided label view.
  Tensor lab = tensor<int64_t>({1, 9, 0, 9}).slice(0, 0, 4, 2);  // {1, 0}
  EXPECT_EQ(one_hot(lab, 2).to_vector<double>(), (std::vector<double>{0, 1, 1, 0}));
  expect_invalid(
      [] {
        one_hot(tensor<int64_t>({0, 3}), 3);
      },
      "one_hot: label 3 is out of range for 3 classes");
  expect_invalid([] { one_hot(tensor<int64_t>({-1}), 3); }, "label -1");
  expect_invalid([] { one_hot(tensor<int64_t>({0}), 0); }, "one_hot: num_classes");
  expect_invalid([] { one_hot(tensor<float>({0}), 2); }, "one_hot: dtype float32");
  expect_invalid([] { one_hot(zeros({0}, kInt64), -1); }, "cannot infer num_classes");
}

}  // namespace
}  // namespace gradwire
