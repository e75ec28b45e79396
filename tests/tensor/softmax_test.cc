// softmax, log_softmax and logsumexp against references computed in double here, along
// every dim of 2-d and 3-d inputs, for every floating dtype and integral inputs, on views,
// with logits large enough to overflow a naive exp, and through their error paths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

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

std::vector<double> uniform(int64_t n, uint64_t seed, double scale) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = (static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0) * scale;
  }
  return v;
}

enum class Fn { kSoftmax, kLogSoftmax, kLogSumExp };

// Reference along `dim` of a row-major [outer, len, inner] view of `shape`, in double,
// straight from the definitions (with the max subtracted, which is exact algebra).
std::vector<double> reference(Fn fn, const std::vector<double>& x, const Shape& shape,
                              int64_t dim) {
  int64_t outer = 1, inner = 1;
  const int64_t len = shape[dim];
  for (int64_t d = 0; d < dim; ++d)
    outer *= shape[d];
  for (size_t d = dim + 1; d < shape.size(); ++d)
    inner *= shape[d];
  std::vector<double> out(fn == Fn::kLogSumExp ? outer * inner : x.size());
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      auto at = [&](int64_t l) { return x[(o * len + l) * inner + i]; };
      double m = -kInf;
      for (int64_t l = 0; l < len; ++l)
        m = std::max(m, at(l));
      double s = 0;
      for (int64_t l = 0; l < len; ++l)
        s += std::exp(at(l) - m);
      if (fn == Fn::kLogSumExp) {
        out[o * inner + i] = m + std::log(s);
        continue;
      }
      for (int64_t l = 0; l < len; ++l) {
        out[(o * len + l) * inner + i] =
            fn == Fn::kSoftmax ? std::exp(at(l) - m) / s : at(l) - m - std::log(s);
      }
    }
  }
  return out;
}

void expect_close(const Tensor& t, const std::vector<double>& want, double tol,
                  const std::string& what) {
  auto got = t.to_vector<double>();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " at " << i;
  }
}

double tolerance(DType t) {
  switch (t) {
    case kFloat64:
      return 1e-13;
    case kFloat32:
      return 2e-6;
    case kFloat16:
      return 2e-3;
    default:
      return 1.6e-2;  // bfloat16: 8 significant bits, input and output both rounded
  }
}

TEST(SoftmaxTest, EveryDimEveryFloatingDType) {
  const Shape shape{3, 5, 4};
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    // Round the inputs to t first so the reference sees the values the op sees.
    Tensor x = tensor<double>(uniform(60, 1, 3.0), shape).to(t);
    auto xv = x.to_vector<double>();
    for (int64_t dim = 0; dim < 3; ++dim) {
      const std::string what = std::string(dtype_name(t)) + " dim " + std::to_string(dim);
      Tensor s = softmax(x, dim);
      EXPECT_EQ(s.dtype(), t);
      EXPECT_EQ(s.sizes(), shape);
      expect_close(s, reference(Fn::kSoftmax, xv, shape, dim), tolerance(t), "softmax " + what);
      expect_close(log_softmax(x, dim - 3), reference(Fn::kLogSoftmax, xv, shape, dim),
                   tolerance(t), "log_softmax " + what);
      Tensor l = logsumexp(x, dim);
      Shape kept = shape;
      kept.erase(kept.begin() + dim);
      EXPECT_EQ(l.sizes(), kept);
      expect_close(l, reference(Fn::kLogSumExp, xv, shape, dim), tolerance(t), "logsumexp " + what);
      Shape ones_at = shape;
      ones_at[dim] = 1;
      EXPECT_EQ(logsumexp(x, dim, /*keepdim=*/true).sizes(), ones_at);
    }
  }
}

TEST(SoftmaxTest, RowsSumToOne) {
  Tensor x = tensor<double>(uniform(8 * 33, 2, 10.0), {8, 33}).to(kFloat32);
  for (int64_t dim : {0, 1}) {
    Tensor s = softmax(x, dim);
    auto v = s.to_vector<double>();
    const int64_t other = dim == 0 ? 33 : 8, len = dim == 0 ? 8 : 33;
    for (int64_t o = 0; o < other; ++o) {
      double total = 0;
      for (int64_t l = 0; l < len; ++l) {
        const double p = dim == 1 ? v[o * 33 + l] : v[l * 33 + o];
        EXPECT_GE(p, 0.0);
        total += p;
      }
      EXPECT_NEAR(total, 1.0, 1e-6) << "dim " << dim << " slice " << o;
    }
  }
}

TEST(SoftmaxTest, LargeLogitsStayFinite) {
  // exp(1000) overflows and exp(-1000) underflows in any dtype: only the max-shifted
  // form gives the right answer.
  const double lse = 1000.0 + std::log1p(std::exp(-1.0));
  for (DType t : {kFloat32, kFloat64}) {
    Tensor x = tensor<double>({1000.0, -1000.0, 999.0}).to(t);
    auto s = softmax(x, 0).to_vector<double>();
    EXPECT_NEAR(s[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
    EXPECT_EQ(s[1], 0.0);
    EXPECT_NEAR(s[2], std::exp(-1.0) / (1.0 + std::exp(-1.0)), 1e-6);
    auto ls = log_softmax(x, 0).to_vector<double>();
    EXPECT_NEAR(ls[0], 1000.0 - lse, 1e-5);
    EXPECT_NEAR(ls[1], -1000.0 - lse, 1e-4);
    EXPECT_NEAR(ls[2], 999.0 - lse, 1e-5);
    EXPECT_NEAR(logsumexp(x, 0).item<double>(), lse, 1e-4);
    Tensor neg = tensor<double>({-1000.0, -1001.0}).to(t);
    EXPECT_NEAR(logsumexp(neg, 0).item<double>(), -1000.0 + std::log1p(std::exp(-1.0)), 1e-4);
  }
}

TEST(SoftmaxTest, LogSoftmaxIsLogOfSoftmax) {
  // Moderate logits: log(softmax) loses nothing, so both must agree closely.
  Tensor x = tensor<double>(uniform(6 * 9, 3, 4.0), {6, 9});
  auto s = softmax(x, 1).to_vector<double>();
  auto ls = log_softmax(x, 1).to_vector<double>();
  for (size_t i = 0; i < s.size(); ++i)
    EXPECT_NEAR(ls[i], std::log(s[i]), 1e-12);
}

TEST(SoftmaxTest, NonContiguousInputs) {
  auto v = uniform(20, 4, 2.0);
  Tensor base = tensor<double>(v, {4, 5});
  // Transposed: t[i][j] = v[j*5 + i], shape [5, 4].
  std::vector<double> tv(20);
  for (int i = 0; i < 5; ++i)
    for (int j = 0; j < 4; ++j)
      tv[i * 4 + j] = v[j * 5 + i];
  for (int64_t dim : {0, 1}) {
    expect_close(softmax(base.t(), dim), reference(Fn::kSoftmax, tv, {5, 4}, dim), 1e-13,
                 "softmax of transposed view");
    expect_close(logsumexp(base.t(), dim), reference(Fn::kLogSumExp, tv, {5, 4}, dim), 1e-13,
                 "logsumexp of transposed view");
  }
  // Expanded: one row repeated 3 times.
  std::vector<double> row(v.begin() + 5, v.begin() + 10), rep;
  for (int r = 0; r < 3; ++r)
    rep.insert(rep.end(), row.begin(), row.end());
  expect_close(log_softmax(base.select(0, 1).unsqueeze(0).expand({3, 5}), 1),
               reference(Fn::kLogSoftmax, rep, {3, 5}, 1), 1e-13, "log_softmax of expanded");
  // A step-2 slice along the softmax dim.
  std::vector<double> sl;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 5; j += 2)
      sl.push_back(v[i * 5 + j]);
  expect_close(softmax(base.slice(1, 0, 5, 2), 1), reference(Fn::kSoftmax, sl, {4, 3}, 1), 1e-13,
               "softmax of sliced");
}

TEST(SoftmaxTest, IntegralInputsGiveFloat32) {
  for (DType t : {kInt32, kInt64, kUInt8, kBool}) {
    std::vector<double> v =
        t == kBool ? std::vector<double>{0, 1, 1, 0} : std::vector<double>{1, 2, 3, 5};
    Tensor x = tensor<double>(v, {2, 2}).to(t);
    Tensor s = softmax(x, 1);
    EXPECT_EQ(s.dtype(), kFloat32) << dtype_name(t);
    expect_close(s, reference(Fn::kSoftmax, v, {2, 2}, 1), 1e-6, "softmax int");
    EXPECT_EQ(log_softmax(x, 0).dtype(), kFloat32);
    Tensor l = logsumexp(x, 0);
    EXPECT_EQ(l.dtype(), kFloat32);
    expect_close(l, reference(Fn::kLogSumExp, v, {2, 2}, 0), 1e-6, "logsumexp int");
  }
}

TEST(SoftmaxTest, InfinitiesNaNAndEmpty) {
  // logsumexp of all -inf is -inf; with a +inf it is +inf (no inf - inf).
  Tensor x = tensor<double>({-kInf, -kInf, 1.0, kInf}, {2, 2});
  auto l = logsumexp(x, 1).to_vector<double>();
  EXPECT_EQ(l[0], -kInf);
  EXPECT_EQ(l[1], kInf);
  // -inf logits get probability 0 next to finite ones.
  auto s = softmax(tensor<double>({-kInf, 0.0, 0.0}), 0).to_vector<double>();
  EXPECT_EQ(s[0], 0.0);
  EXPECT_DOUBLE_EQ(s[1], 0.5);
  // A nan poisons its own slice only.
  Tensor n = tensor<float>({1, NAN, 2, 3}, {2, 2});
  auto sn = softmax(n, 1).to_vector<double>();
  EXPECT_TRUE(std::isnan(sn[0]) && std::isnan(sn[1]));
  EXPECT_NEAR(sn[2] + sn[3], 1.0, 1e-6);
  // Empty dim: softmax is empty, logsumexp is -inf (log of an empty sum).
  EXPECT_EQ(softmax(zeros({2, 0}), 1).sizes(), Shape({2, 0}));
  auto le = logsumexp(zeros({2, 0}), 1).to_vector<double>();
  ASSERT_EQ(le.size(), 2u);
  EXPECT_EQ(le[0], -kInf);
  // A 0-dim tensor is one slice of one element.
  Tensor sc = scalar_tensor(3.5, kFloat64);
  EXPECT_EQ(softmax(sc, 0).item<double>(), 1.0);
  EXPECT_EQ(log_softmax(sc, -1).item<double>(), 0.0);
  EXPECT_EQ(logsumexp(sc, 0).item<double>(), 3.5);
}

TEST(SoftmaxTest, ErrorsNameTheOp) {
  Tensor x = zeros({2, 3});
  expect_invalid([&] { softmax(x, 2); }, "softmax: dim 2");
  expect_invalid([&] { log_softmax(x, -3); }, "log_softmax: dim -3");
  expect_invalid([&] { logsumexp(x, 5); }, "logsumexp: dim 5");
  expect_invalid([&] { softmax(Tensor(), 0); }, "softmax");
}

}  // namespace
}  // namespace gradwire
