// Elementwise ops: binary arithmetic, comparisons, logical ops, where, clamp, unary math,
// pow, in-place methods, operators, add_out/mul_out, promotion and broadcasting rules,
// allclose and equal.
//
// Expected values are computed here with plain loops over std::vector (broadcasting by
// index arithmetic written in this file) or closed forms. Tolerances: results of one
// IEEE operation (add, mul, div, ...) must match exactly, computed here in the same
// precision; library math (exp, log, tanh, pow) is compared with std:: in double to a
// relative 1e-6 for float32, 1e-12 for float64, and the format's half-ulp (2^-11 for
// float16, 2^-8 for bfloat16) for the 16-bit floats.
#include <gtest/gtest.h>

#include <bit>
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
const std::vector<DType> kNumericDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                           kInt32,   kInt64,   kUInt8};
const std::vector<DType> kFloatDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};

Tensor make(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return tensor<double>(v, shape).to(dtype);
}
Tensor make(const std::vector<double>& v, DType dtype = kFloat64) {
  return make(v, Shape{static_cast<int64_t>(v.size())}, dtype);
}

std::vector<double> values(const Tensor& t) {
  return t.to_vector<double>();
}

// The value a dtype stores for v: rounding for the floats, wrapping for the integers.
double stored(DType t, double v) {
  switch (t) {
    case kFloat32:
      return static_cast<float>(v);
    case kFloat64:
      return v;
    case kFloat16:
      return static_cast<float>(Half(static_cast<float>(v)));
    case kBFloat16:
      return static_cast<float>(BFloat16(static_cast<float>(v)));
    case kInt32:
      return static_cast<int32_t>(static_cast<uint32_t>(static_cast<int64_t>(v)));
    case kInt64:
      return v;
    case kUInt8:
      return static_cast<uint8_t>(static_cast<int64_t>(v) & 0xFF);
    case kBool:
      return v != 0 ? 1 : 0;
  }
  return v;
}

// NumPy broadcasting of two row-major value lists, out[i] = f(a[ia], b[ib]).
std::vector<double> ref_broadcast(const Shape& sa, const std::vector<double>& a, const Shape& sb,
                                  const std::vector<double>& b,
                                  const std::function<double(double, double)>& f,
                                  Shape* out_shape = nullptr) {
  const size_t n = std::max(sa.size(), sb.size());
  Shape pa(n - sa.size(), 1), pb(n - sb.size(), 1), so(n);
  pa.insert(pa.end(), sa.begin(), sa.end());
  pb.insert(pb.end(), sb.begin(), sb.end());
  int64_t total = 1;
  for (size_t d = 0; d < n; ++d) {
    so[d] = std::max(pa[d], pb[d]);
    total *= so[d];
  }
  std::vector<double> out;
  for (int64_t flat = 0; flat < total; ++flat) {
    int64_t rem = flat, ia = 0, ib = 0, stride_a = 1, stride_b = 1;
    for (int64_t d = static_cast<int64_t>(n) - 1; d >= 0; --d) {
      const int64_t i = rem % so[d];
      rem /= so[d];
      ia += (pa[d] == 1 ? 0 : i) * stride_a;
      ib += (pb[d] == 1 ? 0 : i) * stride_b;
      stride_a *= pa[d];
      stride_b *= pb[d];
    }
    out.push_back(f(a[ia], b[ib]));
  }
  if (out_shape) *out_shape = so;
  return out;
}

// Checks that `fn` throws InvalidArgument whose message contains every given piece.
template <typename Fn>
void expect_invalid(Fn&& fn, const std::vector<std::string>& pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgument containing '" << pieces.front() << "'";
  } catch (const InvalidArgument& e) {
    for (const std::string& p : pieces) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    }
  }
}

void expect_values(const Tensor& t, const std::vector<double>& expected, double rel_tol = 0,
                   const std::string& what = "") {
  const std::vector<double> got = values(t);
  ASSERT_EQ(got.size(), expected.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(expected[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " element " << i;
    } else if (rel_tol == 0 || std::isinf(expected[i])) {
      EXPECT_EQ(got[i], expected[i]) << what << " element " << i;
    } else {
      EXPECT_NEAR(got[i], expected[i], rel_tol * std::max(1.0, std::abs(expected[i])))
          << what << " element " << i;
    }
  }
}

// ---------------------------------------------------------------- promotion and shapes

TEST(ElementwisePromotion, ResultTypeOfTensors) {
  auto t = [](DType d) { return zeros({2}, d); };
  auto s = [](DType d) { return zeros({}, d); };
  EXPECT_EQ(result_type(t(kInt32), t(kInt64)), kInt64);
  EXPECT_EQ(result_type(t(kUInt8), t(kBool)), kUInt8);
  EXPECT_EQ(result_type(t(kFloat16), t(kBFloat16)), kFloat32);
  EXPECT_EQ(result_type(t(kInt64), t(kFloat16)), kFloat16);
  EXPECT_EQ(result_type(t(kFloat32), t(kFloat64)), kFloat64);
  // A 0-dim tensor only lifts the category.
  EXPECT_EQ(result_type(t(kInt64), s(kFloat32)), kFloat32);
  EXPECT_EQ(result_type(t(kInt32), s(kFloat64)), kFloat64);
  EXPECT_EQ(result_type(t(kFloat16), s(kFloat64)), kFloat16);
  EXPECT_EQ(result_type(t(kInt32), s(kInt64)), kInt32);
  EXPECT_EQ(result_type(s(kInt32), s(kInt64)), kInt64);
  EXPECT_EQ(result_type(t(kBool), s(kInt32)), kInt32);
}

TEST(ElementwisePromotion, ResultTypeWithScalars) {
  EXPECT_EQ(result_type(zeros({2}, kInt32), 5), kInt32);
  EXPECT_EQ(result_type(zeros({2}, kInt32), 2.5), kFloat32);
  EXPECT_EQ(result_type(zeros({2}, kFloat16), 2.5), kFloat16);
  EXPECT_EQ(result_type(zeros({2}, kBool), 1), kInt64);
  EXPECT_EQ(result_type(zeros({2}, kBool), true), kBool);
  EXPECT_EQ(result_type(zeros({2}, kUInt8), 300), kUInt8);
  EXPECT_EQ(result_type(zeros({2}, kFloat64), 1), kFloat64);
}

TEST(ElementwisePromotion, OpResultDtypes) {
  const Tensor i32 = make({1, 2}, kInt32), u8 = make({1, 2}, kUInt8), b = make({1, 0}, kBool);
  EXPECT_EQ(add(i32, u8).dtype(), kInt32);
  EXPECT_EQ(add(i32, 2.5).dtype(), kFloat32);
  EXPECT_EQ(div(i32, i32).dtype(), kFloat32);
  EXPECT_EQ(div(b, b).dtype(), kFloat32);
  EXPECT_EQ(div(make({1}, kFloat64), 2).dtype(), kFloat64);
  EXPECT_EQ(eq(i32, 2.5).dtype(), kBool);
  EXPECT_EQ(add(b, b).dtype(), kBool);
  EXPECT_EQ(mul(b, 3).dtype(), kInt64);
  EXPECT_EQ(exp(i32).dtype(), kFloat32);
  EXPECT_EQ(sqrt(b).dtype(), kFloat32);
  EXPECT_EQ(exp(make({1}, kBFloat16)).dtype(), kBFloat16);
  EXPECT_EQ(square(b).dtype(), kInt64);
  EXPECT_EQ(sign(b).dtype(), kBool);
  EXPECT_EQ(abs(u8).dtype(), kUInt8);
  EXPECT_EQ(pow(i32, 2).dtype(), kInt32);
  EXPECT_EQ(pow(i32, 0.5).dtype(), kFloat32);
  EXPECT_EQ(clamp(i32, 0, 1).dtype(), kInt32);
  EXPECT_EQ(clamp(i32, 0.5, std::nullopt).dtype(), kFloat32);
  EXPECT_EQ(logical_and(i32, make({0.5, 0}, kFloat16)).dtype(), kBool);
  EXPECT_EQ(where(b, i32, make({1, 2}, kFloat64)).dtype(), kFloat64);
  EXPECT_EQ(where(b, i32, 2.5).dtype(), kFloat32);
}

TEST(ElementwiseShapes, BroadcastShapes) {
  EXPECT_EQ(broadcast_shapes({2, 3}, {3}), (Shape{2, 3}));
  EXPECT_EQ(broadcast_shapes({4, 1}, {1, 5}), (Shape{4, 5}));
  EXPECT_EQ(broadcast_shapes({}, {2}), (Shape{2}));
  EXPECT_EQ(broadcast_shapes({}, {}), (Shape{}));
  EXPECT_EQ(broadcast_shapes({0, 1}, {3}), (Shape{0, 3}));
  EXPECT_EQ(broadcast_shapes({2, 1, 3}, {4, 1}), (Shape{2, 4, 3}));
  expect_invalid(
      [] {
        broadcast_shapes({2, 3}, {4}, "add");
      },
      {"add: shapes [2, 3] and [4] do not broadcast"});
  expect_invalid([] { broadcast_shapes({0}, {2}); }, {"broadcast", "[0]", "[2]"});
}

TEST(ElementwiseShapes, OpsReportShapesThatDoNotBroadcast) {
  const Tensor a = zeros({2, 3}), b = zeros({4});
  expect_invalid([&] { add(a, b); }, {"add", "[2, 3]", "[4]"});
  expect_invalid([&] { mul(a, b); }, {"mul", "[2, 3]", "[4]"});
  expect_invalid([&] { lt(a, b); }, {"lt", "[2, 3]", "[4]"});
  expect_invalid([&] { maximum(a, b); }, {"maximum", "[2, 3]", "[4]"});
  expect_invalid([&] { where(zeros({2, 3}, kBool), a, b); }, {"where", "[2, 3]", "[4]"});
}

// ---------------------------------------------------------------- binary arithmetic

TEST(ElementwiseBinary, ArithmeticForEveryNumericDtypeWithBroadcast) {
  const Shape sa{2, 3, 1}, sb{4};
  const std::vector<double> a = {1, 2, 3, 4, 5, 6}, b = {0, 1, 2, 7};
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor A = make(a, sa, dt), B = make(b, sb, dt);
    Shape shape;
    auto ref = [&](const std::function<double(double, double)>& f) {
      std::vector<double> r = ref_broadcast(sa, a, sb, b, f, &shape);
      for (double& v : r)
        v = stored(dt, v);
      return r;
    };
    const std::vector<std::pair<Tensor, std::vector<double>>> cases = {
        {add(A, B), ref([](double x, double y) { return x + y; })},
        {add(A, B, 3), ref([](double x, double y) { return x + 3 * y; })},
        {sub(A, B), ref([](double x, double y) { return x - y; })},
        {sub(A, B, 2), ref([](double x, double y) { return x - 2 * y; })},
        {mul(A, B), ref([](double x, double y) { return x * y; })},
        {maximum(A, B), ref([](double x, double y) { return std::max(x, y); })},
        {minimum(A, B), ref([](double x, double y) { return std::min(x, y); })},
        {pow(A, B), ref([](double x, double y) { return std::pow(x, y); })},
    };
    for (const auto& [got, want] : cases) {
      EXPECT_EQ(got.dtype(), dt);
      EXPECT_EQ(got.sizes(), (Shape{2, 3, 4}));
      EXPECT_TRUE(got.is_contiguous());
      expect_values(got, want);
    }
  }
}

TEST(ElementwiseBinary, BoolArithmetic) {
  const Tensor a = make({0, 0, 1, 1}, kBool), b = make({0, 1, 0, 1}, kBool);
  expect_values(add(a, b), {0, 1, 1, 1});
  expect_values(mul(a, b), {0, 0, 0, 1});
  expect_values(maximum(a, b), {0, 1, 1, 1});
  expect_values(minimum(a, b), {0, 0, 0, 1});
  expect_values(add(a, 2), {2, 2, 3, 3});  // int64 result
  expect_invalid([&] { sub(a, b); }, {"sub", "bool"});
  expect_invalid([&] { pow(a, b); }, {"pow", "bool"});
}

TEST(ElementwiseBinary, DivisionIsTrueDivision) {
  // Integral operands divide as float32, so 7 / 2 is 3.5 and x / 0 is inf or nan.
  for (DType dt : {kInt32, kInt64, kUInt8}) {
    const Tensor q = div(make({7, 0, 5, 9}, dt), make({2, 0, 0, 4}, dt));
    EXPECT_EQ(q.dtype(), kFloat32);
    const double inf = std::numeric_limits<double>::infinity();
    expect_values(q, {3.5, std::nan(""), inf, 2.25});
  }
  expect_values(div(make({-3}, kInt32), 0), {-std::numeric_limits<double>::infinity()});
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const std::vector<double> a = {1, -7.5, 10, 0.1}, b = {3, 2, -4, 0.7};
    std::vector<double> want;
    for (size_t i = 0; i < a.size(); ++i) {
      if (dt == kFloat64) {
        want.push_back(a[i] / b[i]);
      } else {
        const float x = static_cast<float>(stored(dt, a[i])),
                    y = static_cast<float>(stored(dt, b[i]));
        want.push_back(stored(dt, x / y));
      }
    }
    expect_values(div(make(a, {4}, dt), make(b, {4}, dt)), want);
  }
}

TEST(ElementwiseBinary, SixteenBitFloatsRoundOnceToNearestEven) {
  // 1 + 2^-11 lies halfway between 1 and the next float16 1 + 2^-10: ties go to the even 1.
  const double ulp = std::ldexp(1.0, -10);
  EXPECT_EQ(add(make({1}, kFloat16), make({ulp / 2}, kFloat16)).item<double>(), 1.0);
  // 1 + 3 * 2^-11 lies halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(add(make({1 + ulp}, kFloat16), make({ulp / 2}, kFloat16)).item<double>(), 1 + 2 * ulp);
  // bfloat16 keeps 8 significant bits: 1 + 2^-8 ties to 1; 1 + 3 * 2^-8 to 1 + 2^-6.
  const double bulp = std::ldexp(1.0, -7);
  EXPECT_EQ(add(make({1}, kBFloat16), make({bulp / 2}, kBFloat16)).item<double>(), 1.0);
  EXPECT_EQ(add(make({1 + bulp}, kBFloat16), make({bulp / 2}, kBFloat16)).item<double>(),
            1 + 2 * bulp);
  // 65504 is float16's largest finite value; doubling overflows to inf.
  EXPECT_TRUE(std::isinf(mul(make({65504}, kFloat16), 2).item<double>()));
}

TEST(ElementwiseBinary, IntegerArithmeticWraps) {
  const int32_t max32 = std::numeric_limits<int32_t>::max();
  const Tensor a = tensor<int32_t>({max32, std::numeric_limits<int32_t>::min(), 65536});
  EXPECT_EQ(add(a, 1).to_vector<int32_t>(),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), -max32, 65537}));
  EXPECT_EQ(sub(a, 1).to_vector<int32_t>(), (std::vector<int32_t>{max32 - 1, max32, 65535}));
  // 65536^2 = 2^32 wraps to 0.
  EXPECT_EQ(mul(a, a).to_vector<int32_t>()[2], 0);
  const Tensor u = tensor<uint8_t>({250, 3});
  EXPECT_EQ(add(u, tensor<uint8_t>({10, 4})).to_vector<uint8_t>(), (std::vector<uint8_t>{4, 7}));
  EXPECT_EQ(sub(tensor<uint8_t>({3}), tensor<uint8_t>({5})).to_vector<uint8_t>()[0], 254);
}

TEST(ElementwiseBinary, MaximumMinimumPropagateNan) {
  const double nan = std::nan("");
  const Tensor a = make({nan, 1, 5, -2}), b = make({0, nan, 3, -1});
  expect_values(maximum(a, b), {nan, nan, 5, -1});
  expect_values(minimum(a, b), {nan, nan, 3, -2});
}

TEST(ElementwiseBinary, NonContiguousInputs) {
  // A transposed view against a strided slice, and an expanded row.
  std::vector<double> av(12), bv(24);
  for (int i = 0; i < 12; ++i)
    av[i] = i;  // [3, 4]
  for (int i = 0; i < 24; ++i)
    bv[i] = 100 + i;  // [4, 6]
  for (DType dt : {kFloat32, kInt64, kFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor at = make(av, {3, 4}, dt).t();                // [4, 3]
    const Tensor bs = make(bv, {4, 6}, dt).slice(1, 0, 6, 2);  // [4, 3]
    ASSERT_FALSE(at.is_contiguous());
    ASSERT_FALSE(bs.is_contiguous());
    std::vector<double> want;
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j)
        want.push_back(stored(dt, av[j * 4 + i] + bv[i * 6 + 2 * j]));
    }
    expect_values(add(at, bs), want);
    const Tensor row = make({1, 2, 3}, {1, 3}, dt).expand({4, 3});
    want.clear();
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 3; ++j)
        want.push_back(stored(dt, av[j * 4 + i] * (j + 1)));
    }
    expect_values(mul(at, row), want);
  }
}

TEST(ElementwiseBinary, ContiguousScalarAndStridedLoopsAgree) {
  // 37 elements: the vectorised loops' bodies plus a remainder.
  std::vector<double> x(37), y(37);
  for (int i = 0; i < 37; ++i) {
    x[i] = 0.25 * i - 3;
    y[i] = 1.5 - 0.125 * i;
  }
  for (DType dt : {kFloat32, kFloat64, kInt32, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor X = make(x, {37}, dt), Y = make(y, {37}, dt);
    const std::vector<double> xs = values(X), ys = values(Y);
    std::vector<double> vv, vs, sv, strided;
    for (int i = 0; i < 37; ++i) {
      vv.push_back(stored(dt, xs[i] + ys[i]));
      vs.push_back(stored(dt, xs[i] - 2));
      sv.push_back(stored(dt, 2 - xs[i]));
    }
    expect_values(add(X, Y), vv, 0, "contiguous");
    expect_values(sub(X, 2), vs, 0, "scalar right");
    expect_values(2 - X, sv, 0, "scalar left");
    // Every other element of a 74-long buffer.
    std::vector<double> wide(74, 0);
    for (int i = 0; i < 37; ++i)
      wide[2 * i] = xs[i];
    const Tensor Xs = make(wide, {74}, dt).slice(0, 0, 74, 2);
    expect_values(add(Xs, Y), vv, 0, "strided");
  }
}

TEST(ElementwiseBinary, AlphaMustMatchResultCategory) {
  expect_invalid([] { add(make({1}, kInt64), make({1}, kInt64), 0.5); }, {"add", "alpha"});
  expect_invalid([] { sub(make({1}, kInt32), make({1}, kInt32), 1.5); }, {"sub", "alpha"});
  expect_invalid([] { add(make({1}), make({1}), true); }, {"add", "bool alpha"});
  expect_values(add(make({1, 2}), make({3, 4}), 0.5), {2.5, 4});
}

TEST(ElementwiseBinary, UndefinedArgumentsNameTheOp) {
  const Tensor a = zeros({2});
  expect_invalid([&] { add(a, Tensor()); }, {"add", "undefined"});
  expect_invalid([&] { mul(Tensor(), 2); }, {"mul", "undefined"});
  expect_invalid([&] { exp(Tensor()); }, {"exp", "undefined"});
  expect_invalid([&] { where(Tensor(), a, a); }, {"where", "undefined"});
  expect_invalid(
      [&] {
        Tensor u;
        u.add_(1);
      },
      {"add_", "undefined"});
}

TEST(ElementwiseBinary, ZeroSizedTensors) {
  const Tensor a = zeros({0, 3}), b = ones({3});
  const Tensor c = add(a, b);
  EXPECT_EQ(c.sizes(), (Shape{0, 3}));
  EXPECT_EQ(c.numel(), 0);
  EXPECT_EQ(lt(a, b).dtype(), kBool);
}

// ---------------------------------------------------------------- pow

TEST(ElementwisePow, IntegerPowerBySquaring) {
  const Tensor base = tensor<int64_t>({3, -2, 0, 7, 1});
  const Tensor e = tensor<int64_t>({20, 5, 0, 3, 62});
  // Closed forms: 3^20, (-2)^5, 0^0 = 1, 7^3, 1^62.
  EXPECT_EQ(pow(base, e).to_vector<int64_t>(),
            (std::vector<int64_t>{3486784401LL, -32, 1, 343, 1}));
  // int32 wraps: 3^21 = 10460353203 = 2 * 2^32 + 1870418611.
  EXPECT_EQ(pow(tensor<int32_t>({3}), 21).to_vector<int32_t>()[0], 1870418611);
  // uint8: 2^9 = 512 wraps to 0; 3^5 = 243.
  EXPECT_EQ(pow(tensor<uint8_t>({2, 3}), 9).to_vector<uint8_t>()[0], 0);
  EXPECT_EQ(pow(tensor<uint8_t>({2, 3}), tensor<uint8_t>({8, 5})).to_vector<uint8_t>(),
            (std::vector<uint8_t>{0, 243}));
}

TEST(ElementwisePow, NegativeIntegerExponents) {
  // Tensor exponents follow PyTorch: 1 and -1 stay units, other bases give 0.
  EXPECT_EQ(pow(tensor<int64_t>({1, -1, -1, 2, -3}), tensor<int64_t>({-5, -3, -4, -1, -2}))
                .to_vector<int64_t>(),
            (std::vector<int64_t>{1, -1, 1, 0, 0}));
  // Scalar exponents are refused outright.
  expect_invalid([] { pow(tensor<int32_t>({2}), -1); },
                 {"pow", "integers to negative integer powers are not allowed", "int32"});
  expect_invalid(
      [] {
        Tensor t = tensor<int64_t>({2});
        t.pow_(-2);
      },
      {"pow_", "negative integer powers"});
  // A floating exponent makes the result float32.
  expect_values(pow(tensor<int32_t>({4, 2}), -0.5), {0.5, 1 / std::sqrt(2.0)}, 1e-7);
}

TEST(ElementwisePow, FloatingPowers) {
  const std::vector<double> x = {0.5, 2, 3, 10, 0};
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor X = make(x, {5}, dt);
    const std::vector<double> xs = values(X);
    std::vector<double> sq, p15, pt;
    const std::vector<double> e = {3, -1, 0.5, 2, 2};
    for (size_t i = 0; i < xs.size(); ++i) {
      sq.push_back(stored(dt, xs[i] * xs[i]));
      p15.push_back(std::pow(xs[i], 1.5));
      pt.push_back(std::pow(xs[i], e[i]));
    }
    const double tol = dt == kFloat64   ? 1e-12
                       : dt == kFloat32 ? 1e-6
                       : dt == kFloat16 ? 1e-3
                                        : 8e-3;
    expect_values(pow(X, 2), sq, 0, "x^2 exact");
    expect_values(pow(X, 1.5), p15, tol, "x^1.5");
    expect_values(pow(X, make(e, {5}, dt)), pt, tol, "x^e");
    EXPECT_EQ(pow(X, 2).dtype(), dt);
  }
  EXPECT_TRUE(std::isnan(pow(make({-2.0}), 0.5).item<double>()));
}

// ---------------------------------------------------------------- comparisons and logic

TEST(ElementwiseCompare, AllComparisonsEveryDtype) {
  const Shape sa{3, 1}, sb{2};
  const std::vector<double> a = {0, 1, 2}, b = {1, 2};
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    std::vector<double> as = a, bs = b;
    for (double& v : as)
      v = stored(dt, v);
    for (double& v : bs)
      v = stored(dt, v);
    const Tensor A = make(a, sa, dt), B = make(b, sb, dt);
    auto ref = [&](const std::function<bool(double, double)>& f) {
      return ref_broadcast(sa, as, sb, bs, [&](double x, double y) { return f(x, y) ? 1.0 : 0.0; });
    };
    const std::vector<std::pair<Tensor, std::vector<double>>> cases = {
        {eq(A, B), ref([](double x, double y) { return x == y; })},
        {ne(A, B), ref([](double x, double y) { return x != y; })},
        {lt(A, B), ref([](double x, double y) { return x < y; })},
        {le(A, B), ref([](double x, double y) { return x <= y; })},
        {gt(A, B), ref([](double x, double y) { return x > y; })},
        {ge(A, B), ref([](double x, double y) { return x >= y; })},
    };
    for (const auto& [got, want] : cases) {
      EXPECT_EQ(got.dtype(), kBool);
      EXPECT_EQ(got.sizes(), (Shape{3, 2}));
      expect_values(got, want);
    }
  }
}

TEST(ElementwiseCompare, ComparesInThePromotedDtype) {
  // int32 against 2.5 compares as float32 (no truncation of 2.5 to 2).
  const Tensor i = tensor<int32_t>({2, 3});
  expect_values(eq(i, 2.5), {0, 0});
  expect_values(lt(i, 2.5), {1, 0});
  expect_values(ge(i, 3), {0, 1});
  // Against a float64 tensor, int64 values beyond 2^24 stay distinct.
  const Tensor big = tensor<int64_t>({16777217});
  expect_values(eq(big, make({16777216.0})), {0});
  // nan compares unequal to everything, itself included.
  const double nan = std::nan("");
  const Tensor x = make({nan, 1});
  expect_values(eq(x, x), {0, 1});
  expect_values(ne(x, x), {1, 0});
  expect_values(lt(x, 2.0), {0, 1});
  expect_values(ge(x, 1.0), {0, 1});
  expect_values(le(x, 1.0), {0, 1});
  expect_values(gt(x, 0.0), {0, 1});
}

TEST(ElementwiseCompare, LogicalOpsTakeAnyDtype) {
  const double nan = std::nan("");
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor a = make({0, 1, 0, 1}, dt), b = make({0, 0, 1, 1}, dt);
    expect_values(logical_and(a, b), {0, 0, 0, 1});
    expect_values(logical_or(a, b), {0, 1, 1, 1});
    expect_values(logical_not(a), {1, 0, 1, 0});
    EXPECT_EQ(logical_not(a).dtype(), kBool);
  }
  // nan and tiny values are true; mixed dtypes broadcast.
  const Tensor f = make({nan, 1e-300, 0}, {3, 1}, kFloat64);
  const Tensor g = make({2, 0}, kInt32);
  expect_values(logical_not(f), {0, 0, 1});
  expect_values(logical_and(f, g), {1, 0, 1, 0, 0, 0});
  expect_values(logical_or(f, g), {1, 1, 1, 1, 1, 0});
}

// ---------------------------------------------------------------- where and clamp

TEST(ElementwiseWhere, SelectsWithBroadcastingAndPromotion) {
  const Tensor cond = make({1, 0, 1}, {3, 1}, kBool);  // [3, 1]
  const Tensor a = tensor<int32_t>({10, 20});          // [2]
  const Tensor b = make({-1.5}, {1, 1}, kFloat64);     // [1, 1]
  const Tensor w = where(cond, a, b);
  EXPECT_EQ(w.dtype(), kFloat64);
  EXPECT_EQ(w.sizes(), (Shape{3, 2}));
  expect_values(w, {10, 20, -1.5, -1.5, 10, 20});
  const Tensor ws = where(cond, a, 7);
  EXPECT_EQ(ws.dtype(), kInt32);
  expect_values(ws, {10, 20, 7, 7, 10, 20});
  for (DType dt : kAllDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor c = make({1, 1, 0, 0}, kBool).view({2, 2}).t();  // non-contiguous cond
    const Tensor x = make({1, 1, 1, 1}, {2, 2}, dt), y = make({0, 0, 0, 0}, {2, 2}, dt);
    const Tensor r = where(c, x, y);
    EXPECT_EQ(r.dtype(), dt);
    expect_values(r, {1, 0, 1, 0});
  }
}

// A contiguous condition with one or both sides a scalar (ReLU's backward is
// where(out > 0, g, 0)), over runs longer than a vector, in every dtype.
TEST(ElementwiseWhere, ScalarSidesOverContiguousRuns) {
  std::vector<double> bits, values, kept, flipped;
  for (int i = 0; i < 37; ++i) {
    bits.push_back(i % 3 == 0 ? 1 : 0);
    values.push_back(i % 7 + 1);
    kept.push_back(i % 3 == 0 ? i % 7 + 1 : 0);
    flipped.push_back(i % 3 == 0 ? 5 : i % 7 + 1);
  }
  std::vector<double> both;
  for (double b : bits)
    both.push_back(b != 0 ? 5 : 0);
  const Tensor cond = make(bits, kBool);
  for (DType dt : kAllDTypes) {
    if (dt == kBool) continue;
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor v = make(values, dt);
    const Tensor five = make({5}, Shape{}, dt), zero = make({0}, Shape{}, dt);
    expect_values(where(cond, v, 0), kept);
    expect_values(where(cond, five, v), flipped);
    expect_values(where(cond, five, zero), both);
  }
}

// Long runs (the vectorized loops and their tails), every contiguous path (two tensors, a
// scalar on either side, two scalars), elements of 1, 2, 4 and 8 bytes; a selection moves
// bits unchanged (NaN payloads and -0.0 included).
TEST(ElementwiseWhere, LongRunsSelectEveryElementBitForBit) {
  constexpr int kN = 1001;
  std::vector<double> bits, xs, ys;
  for (int i = 0; i < kN; ++i) {
    bits.push_back((i * 7) % 5 < 2 ? 1 : 0);
    xs.push_back(i % 11 + 1);
    ys.push_back(-(i % 13) - 1);
  }
  const Tensor cond = make(bits, kBool);
  for (DType dt : {kUInt8, kFloat16, kInt32, kFloat32, kInt64, kFloat64}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor x = make(xs, dt), y = make(ys, dt);
    const Tensor three = make({3}, Shape{}, dt), four = make({4}, Shape{}, dt);
    const std::vector<double> xv = values(x), yv = values(y);
    std::vector<double> both, x_three, four_y, three_four;
    for (int i = 0; i < kN; ++i) {
      const bool c = bits[static_cast<size_t>(i)] != 0;
      both.push_back(c ? xv[static_cast<size_t>(i)] : yv[static_cast<size_t>(i)]);
      x_three.push_back(c ? xv[static_cast<size_t>(i)] : 3);
      four_y.push_back(c ? 4 : yv[static_cast<size_t>(i)]);
      three_four.push_back(c ? 3 : 4);
    }
    EXPECT_EQ(values(where(cond, x, y)), both);
    EXPECT_EQ(values(where(cond, x, three)), x_three);
    EXPECT_EQ(values(where(cond, four, y)), four_y);
    EXPECT_EQ(values(where(cond, three, four)), three_four);
  }
  // Bits: a NaN with a payload and -0.0 come through as they were.
  std::vector<float> a(kN), b(kN);
  const float payload_nan = std::bit_cast<float>(uint32_t{0x7fc01234});
  for (int i = 0; i < kN; ++i) {
    a[static_cast<size_t>(i)] = i % 2 == 0 ? payload_nan : -0.0f;
    b[static_cast<size_t>(i)] = static_cast<float>(i);
  }
  const Tensor fa = tensor<float>(a, {kN}), fb = tensor<float>(b, {kN});
  const Tensor out = where(cond, fa, fb);
  const Tensor out_scalar = where(cond, fa, 0.0);
  const std::vector<float> o = out.to_vector<float>();
  const std::vector<float> os = out_scalar.to_vector<float>();
  for (int i = 0; i < kN; ++i) {
    const auto k = static_cast<size_t>(i);
    const uint32_t want = std::bit_cast<uint32_t>(bits[k] != 0 ? a[k] : b[k]);
    const uint32_t want_scalar = std::bit_cast<uint32_t>(bits[k] != 0 ? a[k] : 0.0f);
    ASSERT_EQ(std::bit_cast<uint32_t>(o[k]), want) << "element " << i;
    ASSERT_EQ(std::bit_cast<uint32_t>(os[k]), want_scalar) << "element " << i;
  }
}

TEST(ElementwiseWhere, Errors) {
  const Tensor a = zeros({2});
  expect_invalid(
      [&] {
        where(make({1, 0}, kUInt8), a, a);
      },
      {"where", "condition must be a bool tensor", "uint8"});
  expect_invalid(
      [&] {
        where(make({1, 0}, kBool), a, zeros({3}));
      },
      {"where", "[2]", "[3]", "do not broadcast"});
}

TEST(ElementwiseClamp, FloatsIntsAndNan) {
  const double nan = std::nan("");
  const Tensor x = make({-3, -0.5, 0.25, 2, nan});
  expect_values(clamp(x, -1.0, 1.0), {-1, -0.5, 0.25, 1, nan});
  expect_values(clamp(x, std::nullopt, 0.0), {-3, -0.5, 0, 0, nan});
  expect_values(clamp(x, 0.0, std::nullopt), {0, 0, 0.25, 2, nan});
  // min > max gives max everywhere, as PyTorch.
  expect_values(clamp(x, 2.0, 1.0), {1, 1, 1, 1, nan});
  const Tensor i = tensor<int64_t>({-5, 0, 5, 9});
  const Tensor ci = clamp(i, -1, 6);
  EXPECT_EQ(ci.dtype(), kInt64);
  EXPECT_EQ(ci.to_vector<int64_t>(), (std::vector<int64_t>{-1, 0, 5, 6}));
  // A floating bound makes an integral input float32.
  const Tensor cf = clamp(i, 0.5, std::nullopt);
  EXPECT_EQ(cf.dtype(), kFloat32);
  expect_values(cf, {0.5, 0.5, 5, 9});
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    expect_values(clamp(make({0, 3, 7, 10}, {2, 2}, dt).t(), 2, 8), {2, 7, 3, 8});
  }
  expect_invalid([&] { clamp(x, std::nullopt, std::nullopt); }, {"clamp", "min", "max"});
  expect_invalid([] { clamp(make({1}, kBool), false, true); }, {"clamp", "bool"});
}

// ---------------------------------------------------------------- unary

TEST(ElementwiseUnary, FloatFunctionsEveryFloatDtype) {
  const std::vector<double> x = {0.5, 1, 2.5, 4, 0.125};
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const double tol = dt == kFloat64   ? 1e-12
                       : dt == kFloat32 ? 1e-6
                       : dt == kFloat16 ? std::ldexp(1.0, -10)
                                        : std::ldexp(1.0, -7);
    const Tensor X = make(x, {5}, dt);
    const std::vector<double> xs = values(X);
    auto map = [&](double (*f)(double)) {
      std::vector<double> r;
      for (double v : xs)
        r.push_back(f(v));
      return r;
    };
    expect_values(exp(X), map([](double v) { return std::exp(v); }), tol, "exp");
    expect_values(log(X), map([](double v) { return std::log(v); }), tol, "log");
    expect_values(sqrt(X), map([](double v) { return std::sqrt(v); }), tol, "sqrt");
    expect_values(rsqrt(X), map([](double v) { return 1 / std::sqrt(v); }), tol, "rsqrt");
    expect_values(tanh(X), map([](double v) { return std::tanh(v); }), tol, "tanh");
    expect_values(reciprocal(X), map([](double v) { return 1 / v; }), tol, "reciprocal");
    expect_values(sigmoid(X), map([](double v) { return 1 / (1 + std::exp(-v)); }), tol, "sigmoid");
    EXPECT_EQ(exp(X).dtype(), dt);
  }
}

TEST(ElementwiseUnary, FloatFunctionsOfIntegersGiveFloat32) {
  for (DType dt : {kInt32, kInt64, kUInt8, kBool}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const Tensor X = make({1, 0}, dt);
    const Tensor e = exp(X);
    EXPECT_EQ(e.dtype(), kFloat32);
    expect_values(e, {std::exp(1.0), 1}, 1e-6);
    expect_values(sqrt(X), {1, 0});
    expect_values(reciprocal(X), {1, std::numeric_limits<double>::infinity()});
    expect_values(log(X), {0, -std::numeric_limits<double>::infinity()});
    expect_values(sigmoid(X), {1 / (1 + std::exp(-1.0)), 0.5}, 1e-6);
  }
  expect_values(tanh(tensor<int32_t>({-1, 3})), {std::tanh(-1.0), std::tanh(3.0)}, 1e-6);
  expect_values(rsqrt(tensor<int64_t>({4})), {0.5});
}

TEST(ElementwiseUnary, SigmoidIsStableForLargeMagnitudes) {
  const Tensor x = make({-1000, -100, -30, 0, 30, 100, 1000});
  const std::vector<double> got = values(sigmoid(x));
  // Closed forms: sigmoid(-t) = e^-t / (1 + e^-t), sigmoid(t) = 1 / (1 + e^-t).
  EXPECT_EQ(got[0], 0.0);
  EXPECT_NEAR(got[1], std::exp(-100.0), 1e-12 * std::exp(-100.0));
  EXPECT_NEAR(got[2], std::exp(-30.0) / (1 + std::exp(-30.0)), 1e-12 * std::exp(-30.0));
  EXPECT_EQ(got[3], 0.5);
  EXPECT_NEAR(got[4], 1 / (1 + std::exp(-30.0)), 1e-15);
  EXPECT_EQ(got[5], 1.0);
  EXPECT_EQ(got[6], 1.0);
  // float32: e^-100 ~ 3.7e-44 is a float32 subnormal, still positive and finite.
  const std::vector<double> f = values(sigmoid(make({-100, -88, 88, 1e30}, {4}, kFloat32)));
  EXPECT_GT(f[0], 0.0);
  EXPECT_NEAR(f[0], std::exp(-100.0), 1e-45);
  EXPECT_NEAR(f[1], std::exp(-88.0), 1e-6 * std::exp(-88.0));
  EXPECT_EQ(f[2], 1.0);
  EXPECT_EQ(f[3], 1.0);
  EXPECT_TRUE(std::isnan(sigmoid(make({std::nan("")})).item<double>()));
  // float16: e^-10 ~ 4.5e-5 is subnormal there (spacing 2^-24 ~ 6e-8).
  const Tensor h = sigmoid(make({-10, 10}, {2}, kFloat16));
  EXPECT_NEAR(h.to_vector<double>()[0], std::exp(-10.0) / (1 + std::exp(-10.0)), 6e-8);
  EXPECT_EQ(h.to_vector<double>()[1], 1.0);
}

TEST(ElementwiseUnary, AbsNegReluSignSquareEveryDtype) {
  for (DType dt : kNumericDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    const std::vector<double> x = dt == kUInt8 ? std::vector<double>{253, 0, 2, 255, 5}
                                               : std::vector<double>{-3, 0, 2, -1, 5};
    const Tensor X = make(x, {5}, dt);
    const std::vector<double> xs = values(X);
    std::vector<double> ab, ng, re, sg, sq;
    for (double v : xs) {
      ab.push_back(std::abs(v));
      ng.push_back(stored(dt, -v));
      re.push_back(v < 0 ? 0 : v);
      sg.push_back(v > 0 ? 1 : v < 0 ? -1 : 0);
      sq.push_back(stored(dt, v * v));
    }
    expect_values(abs(X), ab, 0, "abs");
    expect_values(neg(X), ng, 0, "neg");
    expect_values(-X, ng, 0, "operator-");
    expect_values(relu(X), re, 0, "relu");
    expect_values(sign(X), sg, 0, "sign");
    expect_values(square(X), sq, 0, "square");
    for (const Tensor& t : {abs(X), neg(X), relu(X), sign(X), square(X)})
      EXPECT_EQ(t.dtype(), dt);
    // Through a non-contiguous view: the first column of a [5, 2] buffer.
    std::vector<double> pairs;
    for (double v : x)
      pairs.insert(pairs.end(), {v, 9});
    const Tensor col = make(pairs, {5, 2}, dt).select(1, 0);
    expect_values(abs(col), ab, 0, "abs strided");
  }
}

TEST(ElementwiseUnary, SpecialValues) {
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  expect_values(relu(make({nan, -inf, inf})), {nan, 0, inf});
  expect_values(sign(make({nan, -0.0, -inf, inf})), {nan, 0, -1, 1});
  expect_values(abs(make({-inf, -0.0})), {inf, 0});
  // abs and neg of the lowest int32 wrap to itself, as PyTorch.
  const int32_t lowest = std::numeric_limits<int32_t>::min();
  EXPECT_EQ(abs(tensor<int32_t>({lowest})).to_vector<int32_t>()[0], lowest);
  EXPECT_EQ(neg(tensor<int32_t>({lowest})).to_vector<int32_t>()[0], lowest);
  EXPECT_TRUE(std::isnan(log(make({-1.0})).item<double>()));
  EXPECT_TRUE(std::isnan(sqrt(make({-1.0}, {1}, kFloat16)).item<double>()));
}

TEST(ElementwiseUnary, BoolRules) {
  const Tensor b = make({1, 0}, kBool);
  expect_invalid([&] { neg(b); }, {"neg", "bool", "logical_not"});
  expect_invalid([&] { -b; }, {"neg", "bool"});
  expect_invalid([&] { abs(b); }, {"abs", "bool"});
  expect_invalid([&] { relu(b); }, {"relu", "bool"});
  expect_values(sign(b), {1, 0});
  expect_values(square(b), {1, 0});
}

// ---------------------------------------------------------------- in-place methods

TEST(ElementwiseInPlace, ArithmeticWritesSelfAndBumpsVersion) {
  for (DType dt : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, dt);
    const void* data = a.data_ptr();
    const Tensor row = make({1, 0, 2}, {3}, dt);
    uint64_t v = a.version();
    a.add_(row);
    EXPECT_GT(a.version(), v);
    expect_values(a, {2, 2, 5, 5, 5, 8});
    v = a.version();
    a.sub_(row, 2);
    EXPECT_GT(a.version(), v);
    expect_values(a, {0, 2, 1, 3, 5, 4});
    a.mul_(row);
    expect_values(a, {0, 0, 2, 3, 0, 8});
    a.add_(3);
    expect_values(a, {3, 3, 5, 6, 3, 11});
    a.sub_(1);
    expect_values(a, {2, 2, 4, 5, 2, 10});
    a.mul_(2);
    expect_values(a, {4, 4, 8, 10, 4, 20});
    a.clamp_(5, 10);
    expect_values(a, {5, 5, 8, 10, 5, 10});
    a.pow_(2);
    expect_values(a, {stored(dt, 25), stored(dt, 25), stored(dt, 64), stored(dt, 100),
                      stored(dt, 25), stored(dt, 100)});
    EXPECT_EQ(a.data_ptr(), data);  // in place: same memory, same dtype
    EXPECT_EQ(a.dtype(), dt);
  }
}

TEST(ElementwiseInPlace, DivNegReluFloats) {
  for (DType dt : kFloatDTypes) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor a = make({-4, 2, 8}, {3}, dt);
    a.div_(make({2, -4, 8}, {3}, dt));
    expect_values(a, {-2, -0.5, 1});
    a.div_(0.5);
    expect_values(a, {-4, -1, 2});
    a.neg_();
    expect_values(a, {4, 1, -2});
    a.relu_();
    expect_values(a, {4, 1, 0});
  }
}

TEST(ElementwiseInPlace, ResultMustCastToSelf) {
  Tensor i = tensor<int32_t>({1, 2});
  expect_invalid([&] { i.div_(2); },
                 {"div_: result type float32 can't be cast to the desired output type int32"});
  expect_invalid([&] { i.add_(make({1, 2}, kFloat32)); }, {"add_", "float32", "int32"});
  expect_invalid([&] { i.add_(0.5); }, {"add_", "float32", "int32"});
  expect_invalid([&] { i.clamp_(0.5, std::nullopt); }, {"clamp_", "float32", "int32"});
  expect_invalid([&] { i.pow_(0.5); }, {"pow_", "float32", "int32"});
  Tensor b = make({1, 0}, kBool);
  expect_invalid([&] { b.add_(tensor<int64_t>({1, 1})); }, {"add_", "int64", "bool"});
  expect_invalid([&] { b.neg_(); }, {"neg_", "bool"});
  expect_invalid([&] { b.relu_(); }, {"relu_", "bool"});
  expect_invalid([&] { b.sub_(b); }, {"sub_", "bool"});
  EXPECT_EQ(i.to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));  // untouched
  // A wider result may be written into a narrower floating or integral self.
  Tensor f = make({1, 2}, kFloat32);
  f.add_(make({0.1, 0.2}, kFloat64));
  expect_values(f, {static_cast<float>(1 + 0.1), static_cast<float>(2 + 0.2)});
  Tensor u = tensor<uint8_t>({1, 2});
  u.add_(tensor<int64_t>({255, 1}));  // computed in int64, wrapped into uint8
  EXPECT_EQ(u.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 3}));
  Tensor h = make({1, 2}, kFloat16);
  h.mul_(tensor<int32_t>({3, 4}));
  expect_values(h, {3, 8});
}

TEST(ElementwiseInPlace, OtherMustBroadcastToSelf) {
  Tensor a = zeros({3});
  expect_invalid([&] { a.add_(zeros({2, 3})); }, {"add_", "[2, 3]", "[3]"});
  expect_invalid([&] { a.mul_(zeros({4})); }, {"mul_", "[4]", "[3]"});
  Tensor e = zeros({1}).expand({3});
  expect_invalid([&] { e.add_(1); }, {"add_", "expanded"});
}

TEST(ElementwiseInPlace, NonContiguousSelfWritesThroughTheView) {
  for (DType dt : {kFloat32, kInt64, kBFloat16}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    Tensor base = make({0, 1, 2, 3, 4, 5}, {2, 3}, dt);
    Tensor view = base.t();  // [3, 2]
    const uint64_t v = base.version();
    view.add_(make({10, 20}, {2}, dt));  // adds 10 to row 0 of base, 20 to row 1
    EXPECT_GT(base.version(), v);
    expect_values(base, {10, 11, 12, 23, 24, 25});
    Tensor col = base.select(1, 1);  // elements 11 and 24
    col.mul_(2);
    col.neg_();
    expect_values(base, {10, stored(dt, -22), 12, 23, stored(dt, -48), 25});
    Tensor sl = base.slice(1, 0, 3, 2);  // columns 0 and 2
    sl.clamp_(11, 24);
    expect_values(base, {11, stored(dt, -22), 12, 23, stored(dt, -48), 24});
  }
}

TEST(ElementwiseInPlace, AliasingOperands) {
  // other is self: x + x.
  Tensor a = make({1, 2, 3});
  a.add_(a);
  expect_values(a, {2, 4, 6});
  a.mul_(a);
  expect_values(a, {4, 16, 36});
  // other overlaps self shifted by one element: every element must read the old values.
  Tensor buf = make({1, 2, 3, 4, 5});
  Tensor head = buf.slice(0, 0, 4), tail = buf.slice(0, 1, 5);
  head.add_(tail);
  expect_values(buf, {3, 5, 7, 9, 5});
  Tensor buf2 = make({1, 2, 3, 4, 5});
  Tensor tail2 = buf2.slice(0, 1, 5);
  tail2.sub_(buf2.slice(0, 0, 4));
  expect_values(buf2, {1, 1, 1, 1, 1});
  // other is a broadcast element of self.
  Tensor c = make({2, 3, 4});
  c.mul_(c.select(0, 0));
  expect_values(c, {4, 6, 8});
  // Operators go through the in-place methods.
  Tensor d = make({1, 2});
  d += make({1, 1});
  d -= 0.5;
  d *= make({2, 4});
  d /= 2;
  expect_values(d, {1.5, 5});
  d -= d;
  expect_values(d, {0, 0});
  Tensor e = tensor<int64_t>({6, 8});
  e *= 3;
  e += 1;
  e -= tensor<int64_t>({1, 2});
  EXPECT_EQ(e.to_vector<int64_t>(), (std::vector<int64_t>{18, 23}));
  expect_invalid([&] { e /= 2; }, {"div_", "float32", "int64"});
}

// ---------------------------------------------------------------- operators

TEST(ElementwiseOperators, TensorAndScalarForms) {
  const Tensor a = make({1, 2, 4}), b = make({2, 2, 2});
  expect_values(a + b, {3, 4, 6});
  expect_values(a - b, {-1, 0, 2});
  expect_values(a * b, {2, 4, 8});
  expect_values(a / b, {0.5, 1, 2});
  expect_values(a + 1, {2, 3, 5});
  expect_values(a - 1, {0, 1, 3});
  expect_values(a * 3, {3, 6, 12});
  expect_values(a / 4, {0.25, 0.5, 1});
  expect_values(1 + a, {2, 3, 5});
  expect_values(1 - a, {0, -1, -3});
  expect_values(3 * a, {3, 6, 12});
  expect_values(4 / a, {4, 2, 1});
  expect_values(-a, {-1, -2, -4});
  const Tensor i = tensor<int32_t>({1, 2, 4});
  EXPECT_EQ((10 - i).dtype(), kInt32);
  EXPECT_EQ((10 - i).to_vector<int32_t>(), (std::vector<int32_t>{9, 8, 6}));
  EXPECT_EQ((1 / i).dtype(), kFloat32);
  expect_values(1 / i, {1, 0.5, 0.25});
  EXPECT_EQ((i * 0.5).dtype(), kFloat32);
  expect_values(i * 0.5, {0.5, 1, 2});
  EXPECT_EQ((i + true).dtype(), kInt32);
}

// ---------------------------------------------------------------- add_out / mul_out

TEST(ElementwiseOut, WritesIntoOutWithoutAllocating) {
  const Tensor a = make({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32),
               b = make({10, 20, 30}, {3}, kFloat32);
  Tensor out = zeros({2, 3});
  const void* data = out.data_ptr();
  const uint64_t v = out.version();
  Tensor& r = add_out(out, a, b);
  EXPECT_EQ(&r, &out);
  EXPECT_EQ(out.data_ptr(), data);
  EXPECT_GT(out.version(), v);
  expect_values(out, {11, 22, 33, 14, 25, 36});
  mul_out(out, a, b);
  expect_values(out, {10, 40, 90, 40, 100, 180});
  // A wider out dtype: int inputs into float64.
  Tensor wide = zeros({3}, kFloat64);
  add_out(wide, tensor<int32_t>({1, 2, 3}), tensor<int32_t>({1, 1, 1}));
  expect_values(wide, {2, 3, 4});
  // A non-contiguous out.
  Tensor base = zeros({3, 2});
  Tensor view = base.t();
  add_out(view, a, b);
  expect_values(base, {11, 14, 22, 25, 33, 36});
}

TEST(ElementwiseOut, AliasedOut) {
  Tensor a = make({1, 2, 3}, {3}, kFloat32);
  add_out(a, a, a);
  expect_values(a, {2, 4, 6});
  Tensor buf = make({1, 2, 3, 4}, {4}, kFloat32);
  Tensor out = buf.slice(0, 1, 4);
  add_out(out, buf.slice(0, 0, 3), make({0, 0, 0}, {3}, kFloat32));
  expect_values(buf, {1, 1, 2, 3});
  Tensor c = make({1, 2, 3}, {3}, kFloat32);
  mul_out(c, c, make({2}, {1}, kFloat32));
  expect_values(c, {2, 4, 6});
}

TEST(ElementwiseOut, Errors) {
  const Tensor a = zeros({2, 3}), b = zeros({3});
  Tensor wrong = zeros({3, 2});
  expect_invalid([&] { add_out(wrong, a, b); }, {"add_out", "[3, 2]", "[2, 3]"});
  Tensor small = zeros({3});
  expect_invalid([&] { mul_out(small, a, b); }, {"mul_out", "[3]", "[2, 3]"});
  Tensor ints = zeros({2, 3}, kInt32);
  expect_invalid([&] { add_out(ints, a, b); },
                 {"add_out: result type float32 can't be cast to the desired output type int32"});
  Tensor undefined;
  expect_invalid([&] { add_out(undefined, a, b); }, {"add_out", "undefined"});
  Tensor expanded = zeros({1, 3}).expand({2, 3});
  expect_invalid([&] { add_out(expanded, a, b); }, {"add_out", "expanded"});
}

// ---------------------------------------------------------------- allclose / equal

TEST(ElementwiseAllclose, TolerancesNanInfAndBroadcast) {
  const Tensor a = make({1, 2, 3});
  EXPECT_TRUE(allclose(a, make({1, 2, 3})));
  // |a - b| <= atol + rtol * |b|: 1e-5 * 3 = 3e-5 allowed at the last element.
  EXPECT_TRUE(allclose(a, make({1, 2, 3 + 2.9e-5})));
  EXPECT_FALSE(allclose(a, make({1, 2, 3 + 3.2e-5})));
  EXPECT_TRUE(allclose(make({0}), make({1e-9})));
  EXPECT_FALSE(allclose(make({0}), make({1e-7})));
  EXPECT_TRUE(allclose(make({0}), make({1e-7}), 0, 1e-6));
  EXPECT_FALSE(allclose(make({100}), make({101}), 0.001, 0));
  EXPECT_TRUE(allclose(make({100}), make({101}), 0.01, 0));
  // rtol scales |b|, not |a|: asymmetric.
  EXPECT_TRUE(allclose(make({0.5}), make({1}), 0.5, 0));
  EXPECT_FALSE(allclose(make({1}), make({0.5}), 0.5, 0));
  const double nan = std::nan(""), inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(allclose(make({nan}), make({nan})));
  EXPECT_TRUE(allclose(make({nan}), make({nan}), 1e-5, 1e-8, /*equal_nan=*/true));
  EXPECT_FALSE(allclose(make({nan}), make({1}), 1e-5, 1e-8, true));
  EXPECT_TRUE(allclose(make({inf, -inf}), make({inf, -inf})));
  EXPECT_FALSE(allclose(make({inf}), make({-inf})));
  EXPECT_FALSE(allclose(make({1e308}), make({inf}), 1, 1));
  // Broadcasting, mixed dtypes, views.
  EXPECT_TRUE(allclose(make({2, 2, 2, 2}, {2, 2}, kFloat32), make({2}, {}, kInt64)));
  EXPECT_FALSE(allclose(make({2, 2, 2, 3}, {2, 2}, kFloat32), make({2}, {}, kInt64)));
  EXPECT_TRUE(
      allclose(make({1, 2, 3, 4}, {2, 2}, kFloat16).t(), make({1, 3, 2, 4}, {2, 2}, kFloat64)));
  // Integers compare exactly beyond 2^53.
  EXPECT_FALSE(allclose(tensor<int64_t>({(int64_t{1} << 60) + 1}),
                        tensor<int64_t>({int64_t{1} << 60}), 0, 0));
  EXPECT_TRUE(allclose(tensor<int64_t>({(int64_t{1} << 60) + 1}),
                       tensor<int64_t>({(int64_t{1} << 60) + 1}), 0, 0));
  EXPECT_TRUE(allclose(make({1, 0}, kBool), tensor<uint8_t>({1, 0})));
  expect_invalid([&] { allclose(a, make({1, 2})); }, {"allclose", "[3]", "[2]"});
  expect_invalid([&] { allclose(a, a, -1); }, {"allclose", "rtol"});
}

TEST(ElementwiseEqual, ShapesDtypesAndNan) {
  EXPECT_TRUE(equal(make({1, 2}), make({1, 2})));
  EXPECT_FALSE(equal(make({1, 2}), make({1, 2.5})));
  EXPECT_FALSE(equal(make({1, 2}), make({1, 2}, {1, 2}, kFloat64)));  // shape differs
  EXPECT_FALSE(equal(make({1, 1}), make({1})));                       // no broadcasting
  EXPECT_TRUE(equal(tensor<int32_t>({1, 2}), make({1, 2}, kFloat32)));
  EXPECT_TRUE(equal(make({1, 2, 3, 4}, {2, 2}, kFloat64).t(), make({1, 3, 2, 4}, {2, 2}, kInt64)));
  EXPECT_FALSE(equal(make({std::nan("")}), make({std::nan("")})));
  EXPECT_TRUE(equal(zeros({0, 2}), zeros({0, 2}, kInt32)));
  EXPECT_TRUE(equal(scalar_tensor(3), scalar_tensor(3.0)));
  expect_invalid([] { equal(Tensor(), zeros({1})); }, {"equal", "undefined"});
}

}  // namespace
}  // namespace gradwire
