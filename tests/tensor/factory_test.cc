// Factories (factory.h): empty/zeros/ones/full in every dtype, empty_strided's exact
// storage, arange (integral and floating, negative steps, wrong signs), linspace, eye,
// rand/randn/randint/randperm (reproducible by seed, in range, with the right moments),
// from_blob's deleter, and tensor()/scalar_tensor().
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"

namespace gradwire {
namespace {

const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt32,   kInt64,   kUInt8,   kBool};
const std::vector<DType> kFloatDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

TEST(FactoryTest, EmptyGeometry) {
  for (DType dtype : kAllDTypes) {
    Tensor t = empty({2, 3, 4}, dtype);
    EXPECT_EQ(t.sizes(), (Shape{2, 3, 4}));
    EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
    EXPECT_EQ(t.dtype(), dtype);
    EXPECT_TRUE(t.device().is_cpu());
    EXPECT_TRUE(t.is_contiguous());
    EXPECT_EQ(t.storage_offset(), 0);
    EXPECT_EQ(t.storage().nbytes(), static_cast<size_t>(24 * element_size(dtype)));
  }
  Tensor s = empty({});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  Tensor z = empty({3, 0, 2});
  EXPECT_EQ(z.numel(), 0);
  EXPECT_EQ(z.strides(), (Shape{2, 2, 1}));
  expect_invalid([] { empty({2, -1}); }, "negative size");
}

// A zero among the sizes empties the tensor but does not excuse the other sizes: their
// strides would overflow int64.
TEST(FactoryTest, AnEmptyShapeWhoseStridesOverflowIsRefused) {
  const int64_t huge = int64_t{1} << 40;
  try {
    (void)empty({0, huge, huge});
    ADD_FAILURE() << "no InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("strides overflow int64"), std::string::npos) << e.what();
  }
  EXPECT_EQ(empty({0, huge}).numel(), 0);  // within int64: fine
  // Given strides that match sizes whose product passes int64, beside a zero: empty, and
  // contiguous, without overflowing on the way (found by fuzz_tensor_meta).
  const int64_t a = 48635065;
  const int64_t b = 294522818916191;
  const Tensor t = empty_strided({0, a, b}, {0, b, 1});
  EXPECT_EQ(t.numel(), 0);
  EXPECT_TRUE(t.is_contiguous());
}

TEST(FactoryTest, ZerosOnesFullEveryDType) {
  for (DType dtype : kAllDTypes) {
    EXPECT_EQ(values(zeros({2, 2}, dtype)), std::vector<double>(4, 0.0)) << dtype;
    EXPECT_EQ(values(ones({3}, dtype)), std::vector<double>(3, 1.0)) << dtype;
    const double seven = dtype == kBool ? 1.0 : 7.0;
    EXPECT_EQ(values(full({2}, 7, dtype)), std::vector<double>(2, seven)) << dtype;
  }
  // A float value into an integral tensor truncates; into float16 it rounds to nearest.
  EXPECT_EQ(values(full({1}, 2.75, kInt32)), std::vector<double>{2.0});
  EXPECT_EQ(values(full({1}, -2.75, kInt64)), std::vector<double>{-2.0});
  EXPECT_EQ(values(full({1}, 0.1, kFloat16)), std::vector<double>{0.0999755859375});
  EXPECT_EQ(values(full({1}, 0.0, kBool)), std::vector<double>{0.0});
  EXPECT_EQ(values(full({1}, 0.5, kBool)), std::vector<double>{1.0});
  // The *_like forms copy shape and dtype.
  Tensor proto = empty({2, 5}, kInt64);
  EXPECT_EQ(zeros_like(proto).dtype(), kInt64);
  EXPECT_EQ(ones_like(proto).sizes(), (Shape{2, 5}));
  EXPECT_EQ(values(full_like(proto, 3)), std::vector<double>(10, 3.0));
  EXPECT_EQ(empty_like(proto).sizes(), (Shape{2, 5}));
}

TEST(FactoryTest, EmptyStridedAllocatesExactSpan) {
  // Highest element (2, 1) sits at 2*1 + 1*3 = 5, so 6 elements.
  Tensor t = empty_strided({3, 2}, {1, 3}, kFloat32);
  EXPECT_EQ(t.strides(), (Shape{1, 3}));
  EXPECT_EQ(t.storage().nbytes(), 24u);
  EXPECT_FALSE(t.is_contiguous());
  Tensor expanded = empty_strided({4, 3}, {0, 1}, kInt64);
  EXPECT_EQ(expanded.storage().nbytes(), 24u);
  EXPECT_EQ(empty_strided({0, 3}, {3, 1}).storage().nbytes(), 0u);
  expect_invalid([] { empty_strided({3}, {1, 1}); }, "strides");
  expect_invalid([] { empty_strided({3}, {-1}); }, "negative stride");
}

TEST(FactoryTest, ArangeIntegral) {
  Tensor a = arange(5);
  EXPECT_EQ(a.dtype(), kInt64);
  EXPECT_EQ(a.to_vector<int64_t>(), (std::vector<int64_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(2, 11, 3).to_vector<int64_t>(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_EQ(arange(5, 0, -2).to_vector<int64_t>(), (std::vector<int64_t>{5, 3, 1}));
  EXPECT_EQ(arange(-3, 3, 2).to_vector<int64_t>(), (std::vector<int64_t>{-3, -1, 1}));
  EXPECT_EQ(arange(4, 4).numel(), 0);
  EXPECT_EQ(arange(0, 4, 1, kInt32).dtype(), kInt32);
  EXPECT_EQ(arange(0, 4, 1, kInt32).to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 2, 3}));
}

TEST(FactoryTest, ArangeFloating) {
  Tensor a = arange(1.0, 2.0, 0.25);
  EXPECT_EQ(a.dtype(), kFloat32);
  EXPECT_EQ(a.to_vector<float>(), (std::vector<float>{1.0f, 1.25f, 1.5f, 1.75f}));
  // ceil((1 - 0) / 0.3) = 4 points.
  Tensor b = arange(0.0, 1.0, 0.3, kFloat64);
  ASSERT_EQ(b.numel(), 4);
  const std::vector<double> bv = b.to_vector<double>();
  EXPECT_NEAR(bv[3], 0.9, 1e-12);
  EXPECT_EQ(arange(2.0, -1.0, -1.5).to_vector<float>(), (std::vector<float>{2.0f, 0.5f}));
  // An integral range in a floating dtype.
  EXPECT_EQ(arange(0, 3, 1, kFloat16).to_vector<float>(), (std::vector<float>{0, 1, 2}));
}

TEST(FactoryTest, ArangeErrors) {
  expect_invalid([] { arange(0, 5, 0); }, "step must be non-zero");
  expect_invalid([] { arange(0, 5, -1); }, "wrong sign");
  expect_invalid([] { arange(5, 0, 1); }, "wrong sign");
  expect_invalid([] { arange(0.0, 1.0, -0.1); }, "wrong sign");
  expect_invalid([] { arange(0.0, std::numeric_limits<double>::infinity(), 1.0); }, "finite");
}

TEST(FactoryTest, Linspace) {
  EXPECT_EQ(linspace(0, 1, 5, kFloat64).to_vector<double>(),
            (std::vector<double>{0, 0.25, 0.5, 0.75, 1}));
  EXPECT_EQ(linspace(3, -3, 3).to_vector<float>(), (std::vector<float>{3, 0, -3}));
  EXPECT_EQ(linspace(2, 9, 1).to_vector<float>(), (std::vector<float>{2}));
  EXPECT_EQ(linspace(2, 9, 0).numel(), 0);
  // The last point is exactly `end` even where accumulated steps would miss it.
  const std::vector<double> v = linspace(0, 0.7, 8, kFloat64).to_vector<double>();
  EXPECT_EQ(v.back(), 0.7);
  EXPECT_EQ(linspace(0, 4, 3, kInt32).to_vector<int32_t>(), (std::vector<int32_t>{0, 2, 4}));
  expect_invalid([] { linspace(0, 1, -1); }, "steps");
}

TEST(FactoryTest, Eye) {
  EXPECT_EQ(eye(3).to_vector<float>(), (std::vector<float>{1, 0, 0, 0, 1, 0, 0, 0, 1}));
  EXPECT_EQ(eye(2, kInt64).to_vector<int64_t>(), (std::vector<int64_t>{1, 0, 0, 1}));
  EXPECT_EQ(eye(2, kBool).to_vector<bool>(), (std::vector<bool>{true, false, false, true}));
  EXPECT_EQ(eye(0).numel(), 0);
  expect_invalid([] { eye(-1); }, "non-negative");
}

TEST(FactoryTest, RandIsReproducibleAndInRange) {
  Generator g1(42), g2(42), g3(43);
  const std::vector<float> a = rand({1000}, &g1).to_vector<float>();
  const std::vector<float> b = rand({1000}, &g2).to_vector<float>();
  const std::vector<float> c = rand({1000}, &g3).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Successive draws from one generator differ.
  EXPECT_NE(rand({1000}, &g1).to_vector<float>(), a);
  for (DType dtype : kFloatDTypes) {
    Generator g(7);
    const std::vector<double> v = rand({20000}, &g, dtype).to_vector<double>();
    for (double x : v) {
      ASSERT_GE(x, 0.0) << dtype;
      ASSERT_LT(x, 1.0) << dtype;
    }
  }
}

TEST(FactoryTest, RandMomentsOver100kSamples) {
  // Mean of U[0,1) is 1/2 with a standard error of 0.289/sqrt(1e5) ~ 0.0009: a tolerance
  // of 0.005 is over 5 standard errors. The variance 1/12 is checked to 0.003.
  Generator g(2024);
  const std::vector<double> v = rand({100000}, &g, kFloat64).to_vector<double>();
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double var = 0;
  for (double x : v)
    var += (x - mean) * (x - mean);
  var /= v.size();
  EXPECT_NEAR(mean, 0.5, 0.005);
  EXPECT_NEAR(var, 1.0 / 12.0, 0.003);
}

TEST(FactoryTest, RandnMomentsOver100kSamples) {
  // N(0,1): the standard error of the mean is 1/sqrt(1e5) ~ 0.0032 and of the variance
  // sqrt(2/1e5) ~ 0.0045, so tolerances of 0.02 and 0.03 are over 6 standard errors.
  Generator g(99);
  const std::vector<double> v = randn({100000}, &g, kFloat64).to_vector<double>();
  const double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  double var = 0;
  int64_t beyond_two_sigma = 0;
  for (double x : v) {
    var += (x - mean) * (x - mean);
    if (std::abs(x) > 2.0) ++beyond_two_sigma;
  }
  var /= v.size();
  EXPECT_NEAR(mean, 0.0, 0.02);
  EXPECT_NEAR(var, 1.0, 0.03);
  // P(|x| > 2) = 0.0455; its standard error over 1e5 samples is ~0.00066.
  EXPECT_NEAR(static_cast<double>(beyond_two_sigma) / v.size(), 0.0455, 0.004);
  // Odd counts use half of the last Box-Muller pair.
  Generator ga(5), gb(5);
  EXPECT_EQ(randn({7}, &ga).to_vector<float>(), randn({7}, &gb).to_vector<float>());
}

TEST(FactoryTest, RandRejectsIntegralDTypes) {
  expect_invalid([] { rand({2}, nullptr, kInt32); }, "floating");
  expect_invalid([] { randn({2}, nullptr, kBool); }, "floating");
}

TEST(FactoryTest, GeneratorStateRestoresTheStream) {
  Generator g(11);
  (void)rand({3}, &g);
  const Generator::State saved = g.state();
  const std::vector<float> first = randn({5}, &g).to_vector<float>();
  g.set_state(saved);
  EXPECT_EQ(randn({5}, &g).to_vector<float>(), first);
  g.set_seed(11);
  EXPECT_EQ(g.state().offset, 0u);
}

TEST(FactoryTest, RandintBounds) {
  Generator g(3);
  const std::vector<int64_t> v = randint(-3, 4, {100000}, &g).to_vector<int64_t>();
  std::vector<int64_t> counts(7, 0);
  for (int64_t x : v) {
    ASSERT_GE(x, -3);
    ASSERT_LT(x, 4);
    ++counts[static_cast<size_t>(x + 3)];
  }
  // Each of the 7 values is expected 14286 times (sd ~ 111).
  for (int64_t c : counts)
    EXPECT_NEAR(static_cast<double>(c), 100000.0 / 7, 800);
  EXPECT_EQ(randint(0, 10, {2}, &g, kInt32).dtype(), kInt32);
  Generator big(1);
  for (int64_t x : randint(INT64_MIN / 2, INT64_MAX / 2, {100}, &big).to_vector<int64_t>()) {
    EXPECT_GE(x, INT64_MIN / 2);
    EXPECT_LT(x, INT64_MAX / 2);
  }
  expect_invalid([] { randint(5, 5, {1}); }, "below high");
}

TEST(FactoryTest, RandpermIsAPermutation) {
  Generator g(8);
  std::vector<int64_t> p = randperm(1000, &g).to_vector<int64_t>();
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> expected(1000);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(sorted, expected);
  EXPECT_NE(p, expected);  // 1/1000! chance of a false failure
  Generator g2(8);
  EXPECT_EQ(randperm(1000, &g2).to_vector<int64_t>(), p);
  EXPECT_EQ(randperm(0).numel(), 0);
  EXPECT_EQ(randperm(1).to_vector<int64_t>(), std::vector<int64_t>{0});
  expect_invalid([] { randperm(-2); }, "non-negative");
}

TEST(FactoryTest, FromBlobDeleterRunsOnceAfterLastView) {
  int calls = 0;
  auto* data = new float[6]{0, 1, 2, 3, 4, 5};
  Tensor t = from_blob(data, {2, 3}, kFloat32, [&](void* p) {
    ++calls;
    delete[] static_cast<float*>(p);
  });
  EXPECT_EQ(t.data_ptr(), static_cast<void*>(data));
  Tensor v = t.transpose(0, 1);
  Tensor s = v.select(0, 2);
  t = Tensor();
  v = Tensor();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{2, 5}));
  s = Tensor();
  EXPECT_EQ(calls, 1);
}

TEST(FactoryTest, FromBlobStridedAndErrors) {
  std::vector<int32_t> data = {0, 1, 2, 3, 4, 5};
  Tensor t = from_blob(data.data(), {3, 2}, {1, 3}, kInt32);
  EXPECT_EQ(t.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(t.storage().nbytes(), 24u);
  data[4] = 40;  // borrowed, not copied
  EXPECT_EQ(t.at({1, 1}), 40.0);
  expect_invalid([] { from_blob(nullptr, {2}, kFloat32); }, "null data");
  EXPECT_EQ(from_blob(nullptr, {0}, kFloat32).numel(), 0);
  expect_invalid([&] { from_blob(data.data(), {2}, {-1}, kInt32); }, "negative stride");
  expect_invalid([&] { from_blob(data.data(), {2, 2}, {1}, kInt32); }, "strides");
}

TEST(FactoryTest, TensorFromValues) {
  Tensor t = tensor<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.dtype(), kInt32);
  EXPECT_EQ(t.sizes(), (Shape{2, 3}));
  EXPECT_EQ(t.at({1, 0}), 4.0);
  EXPECT_EQ(tensor<bool>({true, false}).to_vector<bool>(), (std::vector<bool>{true, false}));
  EXPECT_EQ(tensor<Half>({Half(1.5f)}).dtype(), kFloat16);
  expect_invalid([] { tensor<float>({1, 2, 3}, {2, 2}); }, "do not fill");
}

TEST(FactoryTest, ScalarTensor) {
  EXPECT_EQ(scalar_tensor(3).dtype(), kInt64);
  EXPECT_EQ(scalar_tensor(2.5).dtype(), kFloat32);
  EXPECT_EQ(scalar_tensor(true).dtype(), kBool);
  Tensor s = scalar_tensor(2.5, kFloat64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item<double>(), 2.5);
}

}  // namespace
}  // namespace gradwire
