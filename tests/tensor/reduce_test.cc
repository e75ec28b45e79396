// Reductions checked against plain loops over std::vector written here: sum, mean, prod,
// amax/amin, max/min (with indices), argmax/argmin and norm, over every dtype each accepts,
// over dim subsets with and without keepdim, on transposed, sliced and expanded views, and
// through their error paths.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt32,   kInt64,   kUInt8,   kBool};
const std::vector<DType> kFloatDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Small deterministic integers in [0, mod): exact in every dtype (mod 2 for bool).
std::vector<double> small_ints(int64_t n, int mod, uint32_t seed = 1) {
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<double>((s >> 16) % static_cast<uint32_t>(mod));
  }
  return v;
}

// Uniform doubles in [-1, 1) from an LCG.
std::vector<double> uniform(int64_t n, uint32_t seed = 7) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }
  return v;
}

Tensor make(const std::vector<double>& v, const Shape& shape, DType t) {
  return tensor<double>(v, shape).to(t);
}

// The reference reduction: combine(acc, value) over the reduced dims of a row-major
// `shape`, in index order.
struct Ref {
  std::vector<double> values;
  Shape shape;
};

Ref reference(const std::vector<double>& x, const Shape& shape, const std::vector<bool>& reduced,
              bool keepdim, double init, const std::function<double(double, double)>& combine) {
  Ref r;
  Shape kept_sizes;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (!reduced[d]) {
      r.shape.push_back(shape[d]);
      kept_sizes.push_back(shape[d]);
    } else if (keepdim) {
      r.shape.push_back(1);
    }
  }
  int64_t out_n = 1;
  for (int64_t s : kept_sizes)
    out_n *= s;
  r.values.assign(static_cast<size_t>(out_n), init);
  Shape idx(shape.size(), 0);
  for (size_t flat = 0; flat < x.size(); ++flat) {
    int64_t o = 0;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (!reduced[d]) o = o * shape[d] + idx[d];
    }
    r.values[o] = combine(r.values[o], x[flat]);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
      if (++idx[d] < shape[d]) break;
      idx[d] = 0;
    }
  }
  return r;
}

double ref_add(double a, double b) {
  return a + b;
}
double ref_mul(double a, double b) {
  return a * b;
}
double ref_max(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b);
}
double ref_min(double a, double b) {
  return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b);
}

void expect_values(const Tensor& t, const Ref& ref, double rel_tol, const std::string& what) {
  ASSERT_EQ(t.sizes(), ref.shape) << what;
  std::vector<double> got = t.to_vector<double>();
  ASSERT_EQ(got.size(), ref.values.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    const double want = ref.values[i];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i;
    } else {
      EXPECT_NEAR(got[i], want, rel_tol * std::max(1.0, std::fabs(want))) << what << " at " << i;
    }
  }
}

std::vector<bool> mask_of(size_t ndim, const Shape& dims) {
  std::vector<bool> m(ndim, dims.empty());
  for (int64_t d : dims)
    m[d < 0 ? d + static_cast<int64_t>(ndim) : d] = true;
  return m;
}

// ---------------------------------------------------------------- sum

TEST(ReduceTest, SumEveryDTypeAllDims) {
  const Shape shape{3, 4, 5};
  for (DType t : kAllDTypes) {
    auto v = small_ints(60, t == kBool ? 2 : 5);
    Tensor x = make(v, shape, t);
    Tensor s = sum(x);
    const DType want = is_integral(t, true) ? kInt64 : t;
    EXPECT_EQ(s.dtype(), want) << dtype_name(t);
    EXPECT_EQ(s.dim(), 0);
    double ref = 0;
    for (double e : v)
      ref += e;
    EXPECT_EQ(s.item<double>(), ref) << dtype_name(t);
  }
}

TEST(ReduceTest, SumOverDimSubsetsEveryDType) {
  const Shape shape{3, 4, 5};
  const std::vector<Shape> dim_sets = {{0}, {1}, {-1}, {0, 2}, {2, 0}, {0, 1, 2}};
  for (DType t : kAllDTypes) {
    auto v = small_ints(60, t == kBool ? 2 : 7, 3);
    Tensor x = make(v, shape, t);
    for (const Shape& dims : dim_sets) {
      for (bool keepdim : {false, true}) {
        Ref ref = reference(v, shape, mask_of(3, dims), keepdim, 0.0, ref_add);
        expect_values(sum(x, dims, keepdim), ref, 0,
                      std::string("sum ") + std::string(dtype_name(t)) + " dims " +
                          shape_to_string(dims) + (keepdim ? " keepdim" : ""));
      }
    }
  }
}

TEST(ReduceTest, SumOfNonContiguousViews) {
  // base [4, 6] float64 with values v[i*6 + j].
  auto v = uniform(24);
  Tensor base = tensor<double>(v, {4, 6});

  // Transposed: t[i][j] = v[j*6 + i], shape [6, 4]; sum over dim 1.
  {
    Tensor t = base.transpose(0, 1);
    std::vector<double> want(6, 0.0);
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 4; ++j)
        want[i] += v[j * 6 + i];
    auto got = sum(t, {1}).to_vector<double>();
    for (int i = 0; i < 6; ++i)
      EXPECT_NEAR(got[i], want[i], 1e-12);
  }
  // Sliced with a step: s[i][j] = v[i*6 + 2j + 1], shape [4, 3]; sum over dim 0.
  {
    Tensor s = base.slice(1, 1, 6, 2);
    std::vector<double> want(3, 0.0);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 3; ++j)
        want[j] += v[i * 6 + 2 * j + 1];
    auto got = sum(s, {0}).to_vector<double>();
    for (int j = 0; j < 3; ++j)
      EXPECT_NEAR(got[j], want[j], 1e-12);
  }
  // Expanded: row 2 of base repeated 5 times, shape [5, 6]; the total is 5 * row sum.
  {
    Tensor e = base.select(0, 2).unsqueeze(0).expand({5, 6});
    double row = 0;
    for (int j = 0; j < 6; ++j)
      row += v[2 * 6 + j];
    EXPECT_NEAR(sum(e).item<double>(), 5 * row, 1e-12);
    auto cols = sum(e, {0}).to_vector<double>();
    for (int j = 0; j < 6; ++j)
      EXPECT_NEAR(cols[j], 5 * v[2 * 6 + j], 1e-12);
  }
}

TEST(ReduceTest, SumFloat32IsPairwise) {
  // One million 0.1f: a left-to-right float sum drifts by about 1%; blocked pairwise
  // summation stays within a few float ulps of the double sum of the same float values.
  const int64_t n = 1 << 20;
  Tensor x = full({n}, 0.1f, kFloat32);
  const double want = static_cast<double>(0.1f) * static_cast<double>(n);
  const double got = sum(x).item<double>();
  EXPECT_NEAR(got, want, 1e-6 * want);
}

TEST(ReduceTest, LeadingDimReductionsOfContiguousInputs) {
  // Reducing dim 0 of a contiguous tensor reads it down the columns; the column sums are
  // pairwise too: 2^16 rows of 0.1f stay within a few ulps of the double sum.
  const int64_t rows = 1 << 16;
  Tensor x = full({rows, 3}, 0.1f, kFloat32);
  const double want = static_cast<double>(0.1f) * static_cast<double>(rows);
  for (double v : sum(x, {0}).to_vector<double>())
    EXPECT_NEAR(v, want, 1e-6 * want);
  // nan in the last row of a column, and in the first row of another.
  Tensor y = tensor<double>({kNaN, 1, 2, 3, 4, 5, 6, 7, kNaN}, {3, 3});
  auto mx = amax(y, {0}).to_vector<double>();
  EXPECT_TRUE(std::isnan(mx[0]));
  EXPECT_EQ(mx[1], 7.0);
  EXPECT_TRUE(std::isnan(mx[2]));
  auto mn = amin(y, {0}, true);
  EXPECT_EQ(mn.sizes(), Shape({1, 3}));
  EXPECT_EQ(mn.to_vector<double>()[1], 1.0);
  // Two leading dims of a 3-d tensor, with a half mean accumulated in float.
  auto v = small_ints(2 * 3 * 4, 9, 41);
  Ref ref = reference(v, {2, 3, 4}, {true, true, false}, false, 0.0, ref_add);
  Tensor h = make(v, {2, 3, 4}, kFloat16);
  expect_values(sum(h, {0, 1}), ref, 0, "half sum over two leading dims");
  for (auto& r : ref.values)
    r /= 6.0;
  expect_values(mean(h, {1, 0}), ref, 1e-3, "half mean over two leading dims");
  // Integer sums wrap instead of overflowing into undefined behaviour.
  Tensor big = tensor<int64_t>({INT64_MAX, 1, 1, 1}, {2, 2});
  EXPECT_EQ(sum(big, {0}).to_vector<int64_t>(), (std::vector<int64_t>{INT64_MIN, 2}));
}

TEST(ReduceTest, HalfSumsAccumulateInFloat) {
  // Accumulating in half would stall at 2048 (bfloat16: at 256); the float accumulator
  // reaches the exact totals, which both formats represent.
  Tensor h = ones({4096}, kFloat16);
  Tensor hs = sum(h);
  EXPECT_EQ(hs.dtype(), kFloat16);
  EXPECT_EQ(hs.item<double>(), 4096.0);
  Tensor b = ones({1024}, kBFloat16);
  Tensor bs = sum(b);
  EXPECT_EQ(bs.dtype(), kBFloat16);
  EXPECT_EQ(bs.item<double>(), 1024.0);
}

TEST(ReduceTest, SumDTypeOptionConvertsBeforeAccumulating) {
  // 2^24 + 1 + 1 is not representable step by step in float, but is in double.
  Tensor x = tensor<float>({16777216.0f, 1.0f, 1.0f});
  Tensor d = sum(x, kFloat64);
  EXPECT_EQ(d.dtype(), kFloat64);
  EXPECT_EQ(d.item<double>(), 16777218.0);
  Tensor i = tensor<int32_t>({2000000000, 2000000000});
  Tensor si = sum(i);
  EXPECT_EQ(si.dtype(), kInt64);
  EXPECT_EQ(si.item<int64_t>(), 4000000000LL);
  Tensor sf = sum(i, {0}, false, kFloat32);
  EXPECT_EQ(sf.dtype(), kFloat32);
  EXPECT_EQ(sf.item<double>(), 4e9);
}

TEST(ReduceTest, SumOfEmptyIsZero) {
  Tensor e = zeros({0, 3});
  EXPECT_EQ(sum(e).item<double>(), 0.0);
  Tensor s0 = sum(e, {0});
  EXPECT_EQ(s0.sizes(), Shape({3}));
  for (double v : s0.to_vector<double>())
    EXPECT_EQ(v, 0.0);
  EXPECT_EQ(sum(e, {1}).sizes(), Shape({0}));
  EXPECT_EQ(sum(e, {1}, true).sizes(), Shape({0, 1}));
}

TEST(ReduceTest, ScalarTensorReductions) {
  Tensor s = scalar_tensor(2.5, kFloat64);
  EXPECT_EQ(sum(s).item<double>(), 2.5);
  EXPECT_EQ(sum(s, {0}).dim(), 0);
  EXPECT_EQ(amax(s, {-1}).item<double>(), 2.5);
  auto [v, i] = max(s, 0);
  EXPECT_EQ(v.item<double>(), 2.5);
  EXPECT_EQ(i.item<int64_t>(), 0);
}

// ---------------------------------------------------------------- mean

TEST(ReduceTest, MeanFloatingDTypes) {
  const Shape shape{4, 3, 5};
  for (DType t : kFloatDTypes) {
    // Multiples of 1/8 in [-4, 4): exact in every floating dtype.
    auto v = small_ints(60, 64, 11);
    for (auto& e : v)
      e = e / 8.0 - 4.0;
    Tensor x = make(v, shape, t);
    const double tol = (t == kFloat16 || t == kBFloat16) ? 1e-2 : 1e-6;
    for (const Shape& dims : std::vector<Shape>{{}, {1}, {0, 2}}) {
      for (bool keepdim : {false, true}) {
        Ref ref = reference(v, shape, mask_of(3, dims), keepdim, 0.0, ref_add);
        const double count = 60.0 / static_cast<double>(ref.values.size());
        for (auto& r : ref.values)
          r /= count;
        Tensor m = dims.empty() && !keepdim ? mean(x) : mean(x, dims, keepdim);
        EXPECT_EQ(m.dtype(), t);
        expect_values(m, ref, tol, std::string("mean ") + std::string(dtype_name(t)));
      }
    }
  }
}

TEST(ReduceTest, MeanOfTransposedViewAndEmpty) {
  auto v = uniform(12, 5);
  Tensor t = tensor<double>(v, {3, 4}).t();  // t[i][j] = v[j*4 + i], shape [4, 3]
  auto got = mean(t, {1}).to_vector<double>();
  for (int i = 0; i < 4; ++i) {
    const double want = (v[i] + v[4 + i] + v[8 + i]) / 3.0;
    EXPECT_NEAR(got[i], want, 1e-12);
  }
  EXPECT_TRUE(std::isnan(mean(zeros({0})).item<double>()));
}

TEST(ReduceTest, MeanRejectsIntegral) {
  for (DType t : {kInt32, kInt64, kUInt8, kBool}) {
    Tensor x = zeros({3}, t);
    expect_invalid([&] { mean(x); }, "mean");
    expect_invalid([&] { mean(x); }, "got " + std::string(dtype_name(t)));
    expect_invalid([&] { mean(x, {0}); }, "pass a floating tensor");
  }
}

// ---------------------------------------------------------------- prod

TEST(ReduceTest, ProdEveryDType) {
  const Shape shape{3, 4};
  for (DType t : kAllDTypes) {
    auto v = small_ints(12, t == kBool ? 2 : 4, 17);
    for (auto& e : v)
      e += (t == kBool ? 0 : 1);  // 1..4, so products stay exact
    Tensor x = make(v, shape, t);
    for (int64_t dim : {0, 1, -1}) {
      for (bool keepdim : {false, true}) {
        Ref ref = reference(v, shape, mask_of(2, {dim}), keepdim, 1.0, ref_mul);
        Tensor p = prod(x, dim, keepdim);
        EXPECT_EQ(p.dtype(), is_integral(t, true) ? kInt64 : t);
        expect_values(p, ref, 0, "prod " + std::string(dtype_name(t)));
      }
    }
  }
  Tensor empty_dim = zeros({2, 0});
  auto p = prod(empty_dim, 1).to_vector<double>();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0], 1.0);
  EXPECT_EQ(p[1], 1.0);
}

// ---------------------------------------------------------------- amax / amin / max / min

TEST(ReduceTest, AmaxAminEveryDType) {
  const Shape shape{2, 3, 4};
  for (DType t : kAllDTypes) {
    auto v = small_ints(24, t == kBool ? 2 : 9, 23);
    Tensor x = make(v, shape, t);
    for (const Shape& dims : std::vector<Shape>{{}, {0}, {2}, {0, 2}}) {
      for (bool keepdim : {false, true}) {
        Ref rmax = reference(v, shape, mask_of(3, dims), keepdim, -kInf, ref_max);
        Ref rmin = reference(v, shape, mask_of(3, dims), keepdim, kInf, ref_min);
        Tensor a = amax(x, dims, keepdim);
        EXPECT_EQ(a.dtype(), t);
        expect_values(a, rmax, 0, "amax " + std::string(dtype_name(t)));
        expect_values(amin(x, dims, keepdim), rmin, 0, "amin " + std::string(dtype_name(t)));
      }
    }
    EXPECT_EQ(max(x).item<double>(), *std::max_element(v.begin(), v.end()));
    EXPECT_EQ(min(x).item<double>(), *std::min_element(v.begin(), v.end()));
  }
}

TEST(ReduceTest, MaxMinPropagateNaN) {
  for (DType t : kFloatDTypes) {
    Tensor x = make({1, kNaN, 3, -2, 5, 0}, {2, 3}, t);
    EXPECT_TRUE(std::isnan(max(x).item<double>())) << dtype_name(t);
    EXPECT_TRUE(std::isnan(min(x).item<double>())) << dtype_name(t);
    auto rows = amax(x, {1}).to_vector<double>();
    EXPECT_TRUE(std::isnan(rows[0]));
    EXPECT_EQ(rows[1], 5.0);
    auto cols = amin(x, {0}).to_vector<double>();
    EXPECT_EQ(cols[0], -2.0);
    EXPECT_TRUE(std::isnan(cols[1]));
    EXPECT_EQ(cols[2], 0.0);
    // A nan in the first position must survive too.
    Tensor first = make({kNaN, 1, 2}, {3}, t);
    EXPECT_TRUE(std::isnan(max(first).item<double>()));
  }
}

TEST(ReduceTest, MaxMinWithIndicesTiesAndNaN) {
  // Row 0 has its max 7 twice (first at 1) and min 1 twice (first at 0).
  Tensor x = tensor<double>({1, 7, 3, 7, 1, 4, 2, 9, 0, 9, 5, 0}, {2, 6});
  auto [mv, mi] = max(x, 1);
  EXPECT_EQ(mv.to_vector<double>(), (std::vector<double>{7, 9}));
  EXPECT_EQ(mi.dtype(), kInt64);
  EXPECT_EQ(mi.to_vector<int64_t>(), (std::vector<int64_t>{1, 1}));
  auto [nv, ni] = min(x, -1, /*keepdim=*/true);
  EXPECT_EQ(nv.sizes(), Shape({2, 1}));
  EXPECT_EQ(ni.sizes(), Shape({2, 1}));
  EXPECT_EQ(nv.to_vector<double>(), (std::vector<double>{1, 0}));
  EXPECT_EQ(ni.to_vector<int64_t>(), (std::vector<int64_t>{0, 2}));
  auto [cv, ci] = max(x, 0);
  EXPECT_EQ(ci.to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 0, 1, 1, 0}));

  Tensor n = tensor<float>({1, NAN, 3, NAN});
  auto [v, i] = max(n, 0);
  EXPECT_TRUE(std::isnan(v.item<double>()));
  EXPECT_EQ(i.item<int64_t>(), 1);
  EXPECT_EQ(argmin(n, 0).item<int64_t>(), 1);
}

TEST(ReduceTest, ArgmaxArgminEveryDType) {
  const Shape shape{3, 5};
  for (DType t : kAllDTypes) {
    auto v = small_ints(15, t == kBool ? 2 : 4, 29);
    Tensor x = make(v, shape, t);
    // Reference: first index of the extreme along dim 1, and of the flattened tensor.
    std::vector<int64_t> want_max(3), want_min(3);
    for (int r = 0; r < 3; ++r) {
      for (int c = 1; c < 5; ++c) {
        if (v[r * 5 + c] > v[r * 5 + want_max[r]]) want_max[r] = c;
        if (v[r * 5 + c] < v[r * 5 + want_min[r]]) want_min[r] = c;
      }
    }
    int64_t flat_max = 0, flat_min = 0;
    for (int i = 1; i < 15; ++i) {
      if (v[i] > v[flat_max]) flat_max = i;
      if (v[i] < v[flat_min]) flat_min = i;
    }
    EXPECT_EQ(argmax(x, 1).to_vector<int64_t>(), want_max) << dtype_name(t);
    EXPECT_EQ(argmin(x, 1).to_vector<int64_t>(), want_min) << dtype_name(t);
    EXPECT_EQ(argmax(x, 1, true).sizes(), Shape({3, 1}));
    Tensor fm = argmax(x);
    EXPECT_EQ(fm.dim(), 0);
    EXPECT_EQ(fm.item<int64_t>(), flat_max) << dtype_name(t);
    EXPECT_EQ(argmin(x).item<int64_t>(), flat_min) << dtype_name(t);
  }
}

TEST(ReduceTest, ArgmaxOfTransposedView) {
  auto v = uniform(20, 31);
  Tensor t = tensor<double>(v, {4, 5}).t();  // t[i][j] = v[j*5 + i], shape [5, 4]
  auto got = argmax(t, 1).to_vector<int64_t>();
  for (int i = 0; i < 5; ++i) {
    int64_t best = 0;
    for (int j = 1; j < 4; ++j) {
      if (v[j * 5 + i] > v[best * 5 + i]) best = j;
    }
    EXPECT_EQ(got[i], best);
  }
  // Flattened argmax indexes the view's row-major order, not the storage's.
  int64_t best = 0;
  for (int k = 1; k < 20; ++k) {
    if (v[(k % 4) * 5 + k / 4] > v[(best % 4) * 5 + best / 4]) best = k;
  }
  EXPECT_EQ(argmax(t).item<int64_t>(), best);
}

TEST(ReduceTest, EmptyExtremesAreErrors) {
  Tensor e = zeros({0, 3});
  expect_invalid([&] { max(e); }, "max");
  expect_invalid([&] { min(e); }, "min");
  expect_invalid([&] { argmax(e); }, "argmax");
  expect_invalid([&] { argmin(e); }, "argmin");
  expect_invalid([&] { amax(e, {0}); }, "amax");
  expect_invalid([&] { amin(e, {0}); }, "[0, 3]");
  expect_invalid([&] { max(e, 0); }, "max");
  // Reducing the non-empty dim of an empty tensor is fine and gives an empty result.
  EXPECT_EQ(amax(e, {1}).sizes(), Shape({0}));
  EXPECT_EQ(argmax(e, 1).sizes(), Shape({0}));
}

// ---------------------------------------------------------------- norm

TEST(ReduceTest, NormFloatingDTypes) {
  for (DType t : kFloatDTypes) {
    auto v = small_ints(50, 16, 37);
    for (auto& e : v)
      e = e / 4.0 - 2.0;
    Tensor x = make(v, {5, 10}, t);
    double ss = 0;
    for (double e : v)
      ss += e * e;
    const double tol = (t == kFloat16 || t == kBFloat16) ? 1e-2 : 1e-6;
    Tensor n = norm(x);
    EXPECT_EQ(n.dtype(), t);
    EXPECT_EQ(n.dim(), 0);
    EXPECT_NEAR(n.item<double>(), std::sqrt(ss), tol * std::sqrt(ss)) << dtype_name(t);
    // A transposed view has the same norm.
    EXPECT_NEAR(norm(x.t()).item<double>(), std::sqrt(ss), tol * std::sqrt(ss));
  }
}

TEST(ReduceTest, NormDoesNotOverflow) {
  // Squares of 1e30 overflow float32 and squares of 1e200 overflow float64.
  Tensor f = full({4}, 1e30, kFloat32);
  EXPECT_NEAR(norm(f).item<double>(), 2e30, 2e30 * 1e-6);
  Tensor d = full({4}, 1e200, kFloat64);
  EXPECT_NEAR(norm(d).item<double>(), 2e200, 2e200 * 1e-12);
  Tensor tiny = full({4}, 1e-200, kFloat64);
  EXPECT_NEAR(norm(tiny).item<double>(), 2e-200, 2e-200 * 1e-12);
  EXPECT_EQ(norm(zeros({0})).item<double>(), 0.0);
  EXPECT_TRUE(std::isnan(norm(tensor<double>({1.0, kNaN})).item<double>()));
}

TEST(ReduceTest, NormRejectsIntegral) {
  expect_invalid([] { norm(zeros({3}, kInt64)); }, "norm");
}

// ---------------------------------------------------------------- errors

TEST(ReduceTest, BadDimsNameTheOp) {
  Tensor x = zeros({2, 3});
  expect_invalid([&] { sum(x, {2}); }, "sum");
  expect_invalid([&] { sum(x, {-3}); }, "sum: dim -3");
  expect_invalid([&] { sum(x, {1, -1}); }, "more than once");
  expect_invalid([&] { amax(x, {5}); }, "amax");
  expect_invalid([&] { prod(x, 2); }, "prod");
  expect_invalid([&] { max(x, 3); }, "max");
  expect_invalid([&] { argmin(x, -4); }, "argmin");
  expect_invalid([&] { mean(x, {7}); }, "mean");
  expect_invalid([&] { sum(Tensor()); }, "sum");
}

}  // namespace
}  // namespace gradwire
