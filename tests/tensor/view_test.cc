// Views and copies of Tensor (tensor.h): view/reshape (and when view must refuse),
// transpose, permute, slice with steps, select with negative indices, narrow, expand,
// squeeze/unsqueeze, flatten/unflatten, as_strided bounds, contiguous/clone, dtype
// conversions between every pair of dtypes on values worked out by hand, copy_ with
// broadcasting and overlapping views, and element access (item, at, to_vector, data).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"

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

// 0, 1, ..., n-1 as float32, written directly (no conversion involved).
Tensor iota(const Shape& shape) {
  Tensor t = empty(shape, kFloat32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    p[i] = static_cast<float>(i);
  return t;
}

// Elements in row-major order as doubles, read through the strides by at() (which goes
// through item(), not through the copy kernels under test).
std::vector<double> elements(const Tensor& t) {
  std::vector<double> out;
  if (t.numel() == 0) return out;
  Shape index(t.dim(), 0);
  for (int64_t n = 0; n < t.numel(); ++n) {
    out.push_back(t.at(index));
    for (int64_t d = t.dim() - 1; d >= 0; --d) {
      if (++index[d] < t.size(d)) break;
      index[d] = 0;
    }
  }
  return out;
}

// Writes values into a contiguous tensor of any dtype through its raw element type.
Tensor typed(const std::vector<double>& values, DType dtype) {
  Tensor t = empty({static_cast<int64_t>(values.size())}, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    void* p = static_cast<char*>(t.data_ptr()) + i * t.element_size();
    const double v = values[i];
    switch (dtype) {
      case kFloat32:
        *static_cast<float*>(p) = static_cast<float>(v);
        break;
      case kFloat64:
        *static_cast<double*>(p) = v;
        break;
      case kFloat16:
        *static_cast<Half*>(p) = Half(static_cast<float>(v));
        break;
      case kBFloat16:
        *static_cast<BFloat16*>(p) = BFloat16(static_cast<float>(v));
        break;
      case kInt32:
        *static_cast<int32_t*>(p) = static_cast<int32_t>(v);
        break;
      case kInt64:
        *static_cast<int64_t*>(p) = static_cast<int64_t>(v);
        break;
      case kUInt8:
        *static_cast<uint8_t*>(p) = static_cast<uint8_t>(v);
        break;
      case kBool:
        *static_cast<bool*>(p) = v != 0;
        break;
    }
  }
  return t;
}

// Reads a contiguous tensor's raw elements as doubles.
std::vector<double> raw(const Tensor& t) {
  std::vector<double> out;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const void* p = static_cast<const char*>(t.data_ptr()) + i * t.element_size();
    switch (t.dtype()) {
      case kFloat32:
        out.push_back(*static_cast<const float*>(p));
        break;
      case kFloat64:
        out.push_back(*static_cast<const double*>(p));
        break;
      case kFloat16:
        out.push_back(static_cast<float>(*static_cast<const Half*>(p)));
        break;
      case kBFloat16:
        out.push_back(static_cast<float>(*static_cast<const BFloat16*>(p)));
        break;
      case kInt32:
        out.push_back(*static_cast<const int32_t*>(p));
        break;
      case kInt64:
        out.push_back(static_cast<double>(*static_cast<const int64_t*>(p)));
        break;
      case kUInt8:
        out.push_back(*static_cast<const uint8_t*>(p));
        break;
      case kBool:
        out.push_back(*static_cast<const bool*>(p) ? 1.0 : 0.0);
        break;
    }
  }
  return out;
}

// ---------------------------------------------------------------- view / reshape

TEST(ViewTest, ViewSharesStorageAndInfersOneSize) {
  Tensor a = iota({12});
  Tensor v = a.view({3, 4});
  EXPECT_TRUE(v.storage().is_same(a.storage()));
  EXPECT_EQ(v.strides(), (Shape{4, 1}));
  EXPECT_EQ(a.view({-1, 6}).sizes(), (Shape{2, 6}));
  EXPECT_EQ(a.view({2, -1, 3}).sizes(), (Shape{2, 2, 3}));
  EXPECT_EQ(a.view({12, 1, 1}).sizes(), (Shape{12, 1, 1}));
  EXPECT_EQ(iota({}).view({1, 1}).sizes(), (Shape{1, 1}));
  EXPECT_EQ(iota({0, 3}).view({3, 0}).sizes(), (Shape{3, 0}));
  EXPECT_EQ(iota({0, 3}).view({3, -1}).sizes(), (Shape{3, 0}));
  // With a zero among the known sizes, -1 could be anything.
  expect_invalid([] { iota({0, 3}).view({0, -1}); }, "is invalid");
}

TEST(ViewTest, ViewErrors) {
  Tensor a = iota({12});
  expect_invalid([&] { a.view({5, -1}); }, "is invalid for a tensor of shape [12]");
  expect_invalid([&] { a.view({-1, -1}); }, "only one dimension can be -1");
  expect_invalid([&] { a.view({5, 2}); }, "is invalid");
  expect_invalid([&] { a.view({-2, 6}); }, "invalid size -2");
  Tensor t = a.view({3, 4}).t();
  expect_invalid([&] { t.view({12}); }, "without copying; use reshape()");
}

TEST(ViewTest, ViewOfPartlyContiguousLayout) {
  // [3, 2, 4] with strides [4, 12, 1]: the last dim is contiguous by itself, the first
  // two are not mergeable with it.
  Tensor t = iota({2, 3, 4}).transpose(0, 1);
  Tensor split = t.view({3, 2, 2, 2});
  EXPECT_EQ(split.strides(), (Shape{4, 12, 2, 1}));
  EXPECT_EQ(elements(split), elements(t));
  expect_invalid([&] { t.view({3, 8}); }, "cannot view");
  expect_invalid([&] { t.view({6, 4}); }, "cannot view");
}

TEST(ViewTest, ReshapeViewsWhenItCanAndCopiesOtherwise) {
  Tensor a = iota({3, 4});
  Tensor r = a.reshape({2, 6});
  EXPECT_TRUE(r.storage().is_same(a.storage()));
  Tensor t = a.t();
  Tensor c = t.reshape({12});
  EXPECT_FALSE(c.storage().is_same(a.storage()));
  EXPECT_EQ(elements(c), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_EQ(t.reshape({-1, 2}).sizes(), (Shape{6, 2}));
  expect_invalid([&] { a.reshape({7}); }, "reshape");
}

// ---------------------------------------------------------------- transpose / permute

TEST(ViewTest, TransposeAndPermute) {
  Tensor a = iota({2, 3, 4});
  Tensor t = a.transpose(0, 2);
  EXPECT_EQ(t.sizes(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 4, 12}));
  EXPECT_EQ(t.at({3, 1, 1}), a.at({1, 1, 3}));
  EXPECT_EQ(a.transpose(-1, -2).sizes(), (Shape{2, 4, 3}));
  Tensor p = a.permute({2, 0, 1});
  EXPECT_EQ(p.sizes(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Shape{1, 12, 4}));
  EXPECT_EQ(p.at({2, 1, 0}), a.at({1, 0, 2}));
  EXPECT_EQ(a.permute({-1, 0, 1}).sizes(), (Shape{4, 2, 3}));
  expect_invalid([&] { a.permute({0, 0, 1}); }, "repeated");
  expect_invalid([&] { a.permute({0, 1}); }, "permute");
  expect_invalid([&] { a.transpose(0, 3); }, "dim 3 is out of range");
  expect_invalid([&] { a.t(); }, "at most 2 dims");
  EXPECT_EQ(iota({5}).t().sizes(), (Shape{5}));
}

// ---------------------------------------------------------------- slice / select / narrow

TEST(ViewTest, SliceWithStepsAndClamping) {
  Tensor a = iota({10});
  EXPECT_EQ(elements(a.slice(0, 1, 8, 3)), (std::vector<double>{1, 4, 7}));
  EXPECT_EQ(elements(a.slice(0, -3, 100)), (std::vector<double>{7, 8, 9}));
  EXPECT_EQ(elements(a.slice(0, 0, -8)), (std::vector<double>{0, 1}));
  EXPECT_EQ(a.slice(0, 5, 2).numel(), 0);
  EXPECT_EQ(a.slice(0, -100, 2).numel(), 2);
  Tensor m = iota({4, 5});
  Tensor s = m.slice(1, 1, 5, 2);  // columns 1 and 3
  EXPECT_EQ(s.sizes(), (Shape{4, 2}));
  EXPECT_EQ(s.strides(), (Shape{5, 2}));
  EXPECT_EQ(s.storage_offset(), 1);
  EXPECT_EQ(elements(s.select(0, 2)), (std::vector<double>{11, 13}));
  expect_invalid([&] { a.slice(0, 0, 5, 0); }, "step must be positive");
  expect_invalid([&] { a.slice(1, 0, 5); }, "dim 1 is out of range");
}

TEST(ViewTest, SelectWithNegativeIndex) {
  Tensor m = iota({3, 4});
  EXPECT_EQ(elements(m.select(0, -1)), (std::vector<double>{8, 9, 10, 11}));
  EXPECT_EQ(elements(m.select(1, -4)), (std::vector<double>{0, 4, 8}));
  EXPECT_EQ(elements(m[1]), (std::vector<double>{4, 5, 6, 7}));
  EXPECT_EQ(m.select(0, 1).select(0, 2).dim(), 0);
  expect_invalid([&] { m.select(0, 3); }, "index 3 is out of range for dim 0 of size 3");
  expect_invalid([&] { m.select(1, -5); }, "index -5 is out of range");
  expect_invalid([&] { iota({}).select(0, 0); }, "0-dim");
}

TEST(ViewTest, Narrow) {
  Tensor m = iota({3, 4});
  Tensor n = m.narrow(1, 1, 2);
  EXPECT_EQ(n.sizes(), (Shape{3, 2}));
  EXPECT_EQ(elements(n), (std::vector<double>{1, 2, 5, 6, 9, 10}));
  EXPECT_EQ(elements(m.narrow(0, -1, 1)), (std::vector<double>{8, 9, 10, 11}));
  EXPECT_EQ(m.narrow(0, 3, 0).numel(), 0);
  expect_invalid([&] { m.narrow(0, 2, 2); }, "out of range for dim 0 of size 3");
  expect_invalid([&] { m.narrow(1, 0, -1); }, "narrow");
}

// ---------------------------------------------------------------- expand / squeeze

TEST(ViewTest, Expand) {
  Tensor c = iota({3, 1});
  Tensor e = c.expand({2, 3, 4});
  EXPECT_EQ(e.sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(e.strides(), (Shape{0, 1, 0}));
  EXPECT_TRUE(e.storage().is_same(c.storage()));
  EXPECT_EQ(e.at({1, 2, 3}), 2.0);
  EXPECT_EQ(c.expand({-1, 5}).sizes(), (Shape{3, 5}));
  EXPECT_EQ(c.expand_as(iota({7, 3, 2})).sizes(), (Shape{7, 3, 2}));
  EXPECT_FALSE(e.is_contiguous());
  expect_invalid([&] { iota({3, 2}).expand({3, 4}); }, "cannot expand shape [3, 2] to [3, 4]");
  expect_invalid([&] { c.expand({3}); }, "fewer dims");
  expect_invalid([&] { c.expand({-1, 3, 1}); }, "-1 is not allowed");
}

TEST(ViewTest, SqueezeUnsqueeze) {
  Tensor a = iota({1, 3, 1, 2});
  EXPECT_EQ(a.squeeze().sizes(), (Shape{3, 2}));
  EXPECT_EQ(a.squeeze(2).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(a.squeeze(-4).sizes(), (Shape{3, 1, 2}));
  EXPECT_EQ(a.squeeze(1).sizes(), (Shape{1, 3, 1, 2}));  // not size 1: unchanged
  EXPECT_EQ(elements(a.squeeze()), elements(a));
  Tensor b = iota({3, 2});
  EXPECT_EQ(b.unsqueeze(0).sizes(), (Shape{1, 3, 2}));
  EXPECT_EQ(b.unsqueeze(-1).sizes(), (Shape{3, 2, 1}));
  EXPECT_EQ(b.unsqueeze(1).sizes(), (Shape{3, 1, 2}));
  EXPECT_TRUE(b.unsqueeze(1).is_contiguous());
  EXPECT_EQ(iota({}).unsqueeze(0).sizes(), (Shape{1}));
  expect_invalid([&] { b.unsqueeze(4); }, "unsqueeze");
  expect_invalid([&] { b.squeeze(2); }, "squeeze");
}

TEST(ViewTest, FlattenUnflatten) {
  Tensor a = iota({2, 3, 4});
  EXPECT_EQ(a.flatten().sizes(), (Shape{24}));
  EXPECT_EQ(a.flatten(1).sizes(), (Shape{2, 12}));
  EXPECT_EQ(a.flatten(0, 1).sizes(), (Shape{6, 4}));
  EXPECT_EQ(iota({}).flatten().sizes(), (Shape{1}));
  // Flattening a transposed tensor must copy, and keep the logical order.
  EXPECT_EQ(elements(iota({2, 3}).t().flatten()), (std::vector<double>{0, 3, 1, 4, 2, 5}));
  expect_invalid([&] { a.flatten(2, 1); }, "after end_dim");
  Tensor f = a.flatten(1);
  EXPECT_EQ(f.unflatten(1, {3, -1}).sizes(), (Shape{2, 3, 4}));
  EXPECT_EQ(f.unflatten(-1, {2, 2, 3}).sizes(), (Shape{2, 2, 2, 3}));
  expect_invalid([&] { f.unflatten(1, {5, 2}); }, "unflatten");
}

// ---------------------------------------------------------------- as_strided

TEST(ViewTest, AsStridedBounds) {
  Tensor a = iota({6});
  Tensor w = a.as_strided({2, 2}, {1, 2}, 1);
  EXPECT_EQ(elements(w), (std::vector<double>{1, 3, 2, 4}));
  EXPECT_EQ(elements(a.as_strided({3}, {-1}, 2)), (std::vector<double>{2, 1, 0}));
  EXPECT_EQ(elements(a.as_strided({3, 3}, {1, 1})),
            (std::vector<double>{0, 1, 2, 1, 2, 3, 2, 3, 4}));
  EXPECT_EQ(a.as_strided({0}, {100}, 0).numel(), 0);
  expect_invalid([&] { a.as_strided({7}, {1}); }, "reach outside a storage of 6 float32");
  expect_invalid([&] { a.as_strided({2}, {5}, 2); }, "reach outside");
  expect_invalid([&] { a.as_strided({3}, {-1}, 1); }, "reach outside");
  expect_invalid([&] { a.as_strided({2}, {1}, -1); }, "negative storage offset");
  expect_invalid([&] { a.as_strided({2, 2}, {1}); }, "2 sizes but 1 strides");
  expect_invalid([&] { a.as_strided({-2}, {1}); }, "negative size");
}

// ---------------------------------------------------------------- copies

TEST(ViewTest, ContiguousAndClone) {
  Tensor a = iota({3, 4});
  EXPECT_TRUE(a.contiguous().is_same(a));
  Tensor t = a.t();
  Tensor c = t.contiguous();
  EXPECT_FALSE(c.storage().is_same(a.storage()));
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.strides(), (Shape{3, 1}));
  EXPECT_EQ(raw(c), elements(t));
  Tensor k = a.clone();
  EXPECT_FALSE(k.storage().is_same(a.storage()));
  EXPECT_EQ(raw(k), raw(a));
  k.select(0, 0).fill_(-1);
  EXPECT_EQ(a.at({0, 0}), 0.0);
  // Expanded tensors materialise every element.
  Tensor e = iota({1, 3}).expand({2, 3}).contiguous();
  EXPECT_EQ(raw(e), (std::vector<double>{0, 1, 2, 0, 1, 2}));
  EXPECT_EQ(e.storage().nbytes(), 24u);
  Tensor d = a.detach();
  EXPECT_TRUE(d.storage().is_same(a.storage()));
  EXPECT_FALSE(d.is_same(a));
}

TEST(ViewTest, ToDTypeEveryPair) {
  // Values exact in every dtype; worked out per category by hand.
  const std::vector<double> float_src = {0, 1, 2.5, 3, 200};
  const std::vector<double> int_src = {0, 1, 2, 3, 200};
  const std::vector<double> bool_src = {0, 1, 1, 0, 1};
  for (DType from : kAllDTypes) {
    const std::vector<double>& src = is_floating_point(from) ? float_src
                                     : from == kBool         ? bool_src
                                                             : int_src;
    const Tensor source = typed(src, from);
    ASSERT_EQ(raw(source), src) << from;
    for (DType to : kAllDTypes) {
      std::vector<double> expected;
      if (from == kBool) {
        expected = bool_src;
      } else if (to == kBool) {
        expected = {0, 1, 1, 1, 1};
      } else if (is_floating_point(from) && !is_floating_point(to)) {
        expected = {0, 1, 2, 3, 200};  // truncation toward zero
      } else {
        expected = src;
      }
      const Tensor out = source.to(to);
      EXPECT_EQ(out.dtype(), to);
      EXPECT_EQ(raw(out), expected) << from << " -> " << to;
      if (to == from) {
        EXPECT_TRUE(out.is_same(source));
      }
    }
  }
}

TEST(ViewTest, ToDTypeRoundingAndWrapping) {
  // float32(1/3) = 0x3EAAAAAB: float16 rounds to 0x3555, bfloat16 up to 0x3EAB.
  const Tensor third = typed({1.0 / 3.0}, kFloat32);
  EXPECT_EQ(third.to(kFloat16).data<Half>()[0].bits, 0x3555);
  EXPECT_EQ(third.to(kBFloat16).data<BFloat16>()[0].bits, 0x3EAB);
  // bfloat16 0x3EAB = 0.333984375 has 7 mantissa bits, exact in float16 as 0x3558.
  EXPECT_EQ(third.to(kBFloat16).to(kFloat16).data<Half>()[0].bits, 0x3558);
  // float16 overflow: 65504 is the largest finite value; 65520 rounds to infinity.
  EXPECT_EQ(typed({65504}, kFloat32).to(kFloat16).data<Half>()[0].bits, 0x7BFF);
  EXPECT_EQ(typed({65520}, kFloat32).to(kFloat16).data<Half>()[0].bits, 0x7C00);
  // int64 2^24 + 1 is not a float32: ties to even give 2^24.
  EXPECT_EQ(raw(typed({16777217}, kInt64).to(kFloat32)), std::vector<double>{16777216});
  EXPECT_EQ(raw(typed({0.1}, kFloat64).to(kFloat32)),
            std::vector<double>{static_cast<double>(0.1f)});
  // Integer narrowing wraps modulo 2^bits.
  EXPECT_EQ(raw(typed({300, -1}, kInt32).to(kUInt8)), (std::vector<double>{44, 255}));
  Tensor big = empty({1}, kInt64);
  big.data<int64_t>()[0] = (int64_t{1} << 32) + 5;
  EXPECT_EQ(raw(big.to(kInt32)), std::vector<double>{5});
  EXPECT_EQ(raw(typed({200}, kUInt8).to(kInt32)), std::vector<double>{200});
  // Negative floats truncate toward zero; nan is true as a bool.
  EXPECT_EQ(raw(typed({-2.5}, kFloat32).to(kInt32)), std::vector<double>{-2});
  EXPECT_EQ(raw(typed({std::nan("")}, kFloat64).to(kBool)), std::vector<double>{1});
  EXPECT_TRUE(std::isnan(raw(typed({std::nan("")}, kFloat32).to(kBFloat16))[0]));
}

TEST(ViewTest, ToDTypeOfStridedViews) {
  Tensor a = iota({3, 4});
  Tensor v = a.t().slice(0, 1, 4, 2);  // [2, 3]: columns 1 and 3
  Tensor d = v.to(kInt64);
  EXPECT_TRUE(d.is_contiguous());
  EXPECT_EQ(d.to_vector<int64_t>(), (std::vector<int64_t>{1, 5, 9, 3, 7, 11}));
  EXPECT_EQ(raw(iota({2}).expand({3, 2}).to(kFloat64)), (std::vector<double>{0, 1, 0, 1, 0, 1}));
}

TEST(ViewTest, CopyBroadcastsAndConverts) {
  Tensor dst = zeros({2, 3});
  dst.copy_(typed({1, 2, 3}, kInt64));
  EXPECT_EQ(raw(dst), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  dst.copy_(typed({7, 8}, kFloat64).view({2, 1}));
  EXPECT_EQ(raw(dst), (std::vector<double>{7, 7, 7, 8, 8, 8}));
  dst.copy_(typed({2.75}, kFloat32).view({}));
  EXPECT_EQ(raw(dst), std::vector<double>(6, 2.75));
  Tensor ints = zeros({3}, kInt32);
  ints.copy_(typed({1.9, -1.9, 2.5}, kFloat32));
  EXPECT_EQ(raw(ints), (std::vector<double>{1, -1, 2}));
  // Whole runs of one broadcast value (filled, not copied element by element): a scalar
  // expanded as a sum's gradient is, converted on the way, and a column repeated along rows.
  Tensor whole = typed({-3}, kInt64).view({}).expand({256, 256}).to(kFloat32);
  EXPECT_TRUE(whole.is_contiguous());
  EXPECT_EQ(raw(whole), std::vector<double>(256 * 256, -3.0));
  Tensor rows = iota({64}).view({64, 1}).expand({64, 100}).contiguous();
  std::vector<double> want;
  for (int i = 0; i < 64; ++i)
    want.insert(want.end(), 100, static_cast<double>(i));
  EXPECT_EQ(raw(rows), want);
  expect_invalid([&] { dst.copy_(iota({4})); }, "copy_");
  expect_invalid([&] { dst.copy_(iota({3, 3})); }, "copy_");
  expect_invalid([&] { dst.copy_(iota({2, 2, 3})); }, "copy_");
  expect_invalid([&] { dst.copy_(Tensor()); }, "undefined");
}

TEST(ViewTest, CopyIntoStridedViews) {
  Tensor base = zeros({3, 4});
  base.t().copy_(iota({4, 3}));  // base[i][j] = 3j + i
  EXPECT_EQ(raw(base), (std::vector<double>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11}));
  base.slice(1, 0, 4, 2).fill_(-1);
  EXPECT_EQ(raw(base.select(0, 2)), (std::vector<double>{-1, 5, -1, 11}));
}

TEST(ViewTest, CopyBetweenOverlappingViews) {
  // Shifting right by one: a naive forward copy would smear element 0 everywhere.
  Tensor x = iota({6});
  x.slice(0, 1, 6).copy_(x.slice(0, 0, 5));
  EXPECT_EQ(raw(x), (std::vector<double>{0, 0, 1, 2, 3, 4}));
  Tensor y = iota({6});
  y.slice(0, 0, 5).copy_(y.slice(0, 1, 6));
  EXPECT_EQ(raw(y), (std::vector<double>{1, 2, 3, 4, 5, 5}));
  // Transposing a square matrix in place through a view.
  Tensor m = iota({3, 3});
  m.copy_(m.t());
  EXPECT_EQ(raw(m), (std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
  // Copying a tensor onto itself is a no-op that still counts as a write.
  const uint64_t v = m.version();
  m.copy_(m);
  EXPECT_EQ(m.version(), v + 1);
  EXPECT_EQ(raw(m), (std::vector<double>{0, 3, 6, 1, 4, 7, 2, 5, 8}));
}

// ---------------------------------------------------------------- element access

TEST(ViewTest, ItemAtToVector) {
  EXPECT_EQ(typed({2.75}, kFloat32).item<float>(), 2.75f);
  EXPECT_EQ(typed({2.75}, kFloat32).item<int>(), 2);
  EXPECT_EQ(typed({200}, kUInt8).view({1, 1}).item<int64_t>(), 200);
  EXPECT_TRUE(typed({1}, kBool).item<bool>());
  EXPECT_EQ(typed({-3}, kInt64).item_scalar().kind(), Scalar::Kind::kInt);
  expect_invalid([] { iota({2}).item<float>(); }, "2 elements, expected 1");
  Tensor m = iota({3, 4});
  EXPECT_EQ(m.at({-1, -1}), 11.0);
  EXPECT_EQ(m.t().at({3, 2}), 11.0);
  expect_invalid([&] { m.at({1}); }, "at: index [1]");
  expect_invalid([&] { m.at({3, 0}); }, "out of range");
  EXPECT_EQ(m.select(1, 1).to_vector<int32_t>(), (std::vector<int32_t>{1, 5, 9}));
  EXPECT_EQ(typed({0, 2, 0}, kInt32).to_vector<bool>(), (std::vector<bool>{false, true, false}));
  EXPECT_EQ(*m.select(0, 1).data<float>(), 4.0f);
  expect_invalid([&] { m.data<double>(); }, "accessed as float64");
}

TEST(ViewTest, UndefinedTensorsAndDims) {
  Tensor u;
  EXPECT_FALSE(u.defined());
  expect_invalid([&] { (void)u.sizes(); }, "undefined");
  expect_invalid([&] { u.clone(); }, "undefined");
  Tensor m = iota({3, 4});
  EXPECT_EQ(m.size(-1), 4);
  EXPECT_EQ(m.stride(-2), 4);
  expect_invalid([&] { m.size(2); }, "dim 2 is out of range for a tensor of 2 dims");
  EXPECT_EQ(m.shape_string(), "[3, 4]");
  EXPECT_EQ(m.nbytes(), 48u);
}

}  // namespace
}  // namespace gradwire
