// Matrix products (mm, bmm, matmul, addmm_, dot, outer) against triple loops in double
// written here: every numeric dtype, transposed/sliced/expanded operands, NumPy matmul
// shapes with broadcast batch dims, degenerate sizes, and errors naming both shapes.
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

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// Uniform doubles in [-1, 1) from an LCG.
std::vector<double> uniform(int64_t n, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<double>(s >> 11) / 9007199254740992.0 * 2.0 - 1.0;
  }
  return v;
}

// Integers in [lo, lo + span) from an LCG: exact in every dtype used with them.
std::vector<double> ints(int64_t n, int lo, int span, uint32_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = lo + static_cast<double>((s >> 16) % static_cast<uint32_t>(span));
  }
  return v;
}

// [n, k] x [k, m], row-major, plain triple loop in double.
std::vector<double> ref_mm(const std::vector<double>& a, const std::vector<double>& b, int64_t n,
                           int64_t k, int64_t m) {
  std::vector<double> c(static_cast<size_t>(n * m), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < m; ++j)
      for (int64_t p = 0; p < k; ++p)
        c[i * m + j] += a[i * k + p] * b[p * m + j];
  return c;
}

void expect_near_all(const Tensor& t, const std::vector<double>& want, double tol,
                     const std::string& what) {
  auto got = t.to_vector<double>();
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << what << " at " << i;
  }
}

TEST(LinalgTest, MmFloatAgainstTripleLoop) {
  const int64_t n = 7, k = 5, m = 9;
  auto a = uniform(n * k, 1), b = uniform(k * m, 2);
  auto want = ref_mm(a, b, n, k, m);
  // float32 rounding of inputs and k = 5 products: well inside 1e-5.
  for (auto [t, tol] : {std::pair{kFloat32, 1e-5}, std::pair{kFloat64, 1e-13}}) {
    Tensor c = mm(tensor<double>(a, {n, k}).to(t), tensor<double>(b, {k, m}).to(t));
    EXPECT_EQ(c.dtype(), t);
    EXPECT_EQ(c.sizes(), Shape({n, m}));
    expect_near_all(c, want, tol, std::string("mm ") + std::string(dtype_name(t)));
  }
}

TEST(LinalgTest, MmTransposedAndStridedViews) {
  const int64_t n = 6, k = 4, m = 5;
  // at_base [k, n]: a = at_base.t() is [n, k] with unit stride in dim 0.
  auto at = uniform(k * n, 3);
  // bt_base [m, k]: b = bt_base.t() is [k, m] with unit stride in dim 0.
  auto bt = uniform(m * k, 4);
  std::vector<double> a(n * k), b(k * m);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < k; ++p)
      a[i * k + p] = at[p * n + i];
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < m; ++j)
      b[p * m + j] = bt[j * k + p];
  auto want = ref_mm(a, b, n, k, m);
  for (DType t : {kFloat32, kFloat64}) {
    const double tol = t == kFloat32 ? 1e-5 : 1e-13;
    Tensor a_view = tensor<double>(at, {k, n}).to(t).t();
    Tensor b_view = tensor<double>(bt, {m, k}).to(t).t();
    Tensor a_cont = tensor<double>(a, {n, k}).to(t);
    Tensor b_cont = tensor<double>(b, {k, m}).to(t);
    expect_near_all(mm(a_view, b_cont), want, tol, "mm(a^T view, b)");
    expect_near_all(mm(a_cont, b_view), want, tol, "mm(a, b^T view)");
    expect_near_all(mm(a_view, b_view), want, tol, "mm(a^T view, b^T view)");
  }

  // A column slice keeps unit stride but has a leading dim larger than its width; a
  // step-2 slice has no unit stride at all and must be packed first.
  auto wide = uniform(n * 10, 5);
  std::vector<double> narrow_vals(n * k), step_vals(n * k);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      narrow_vals[i * k + p] = wide[i * 10 + 3 + p];
      step_vals[i * k + p] = wide[i * 10 + 2 * p + 1];
    }
  }
  Tensor w = tensor<double>(wide, {n, 10});
  Tensor bc = tensor<double>(b, {k, m});
  expect_near_all(mm(w.narrow(1, 3, k), bc), ref_mm(narrow_vals, b, n, k, m), 1e-13,
                  "mm(column slice, b)");
  expect_near_all(mm(w.slice(1, 1, 8, 2), bc), ref_mm(step_vals, b, n, k, m), 1e-13,
                  "mm(step-2 slice, b)");
  // An expanded row (stride 0 in dim 0) repeats one row of a.
  std::vector<double> rep(n * k);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t p = 0; p < k; ++p)
      rep[i * k + p] = a[2 * k + p];
  Tensor row = tensor<double>(a, {n, k}).select(0, 2).unsqueeze(0).expand({n, k});
  expect_near_all(mm(row, bc), ref_mm(rep, b, n, k, m), 1e-13, "mm(expanded row, b)");
}

TEST(LinalgTest, MmIntegerDTypes) {
  const int64_t n = 4, k = 6, m = 3;
  for (DType t : {kInt32, kInt64, kUInt8}) {
    // uint8 products stay below 256: values 0..2 and k = 6 give at most 24.
    const int lo = t == kUInt8 ? 0 : -9, span = t == kUInt8 ? 3 : 19;
    auto a = ints(n * k, lo, span, 7), b = ints(k * m, lo, span, 8);
    auto want = ref_mm(a, b, n, k, m);
    Tensor c = mm(tensor<double>(a, {n, k}).to(t), tensor<double>(b, {k, m}).to(t));
    EXPECT_EQ(c.dtype(), t);
    expect_near_all(c, want, 0, std::string("mm ") + std::string(dtype_name(t)));
    // A transposed integer operand is read through its strides.
    std::vector<double> at(k * n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t p = 0; p < k; ++p)
        at[p * n + i] = a[i * k + p];
    Tensor c2 = mm(tensor<double>(at, {k, n}).to(t).t(), tensor<double>(b, {k, m}).to(t));
    expect_near_all(c2, want, 0, "mm transposed int");
  }
  // int32 wraps like two's complement instead of being undefined.
  Tensor big = tensor<int32_t>({65536}, {1, 1});
  EXPECT_EQ(mm(big, big).item<int64_t>(), 0);
}

TEST(LinalgTest, MmHalfTypesComputeInFloat) {
  const int64_t n = 5, k = 8, m = 4;
  // Quarter steps in [-2, 2): exact in half and bfloat16; the float32 products and sums
  // are exact too, so the only error is the final rounding to 16 bits.
  auto a = ints(n * k, -8, 16, 9), b = ints(k * m, -8, 16, 10);
  for (auto& x : a)
    x /= 4;
  for (auto& x : b)
    x /= 4;
  auto want = ref_mm(a, b, n, k, m);
  for (auto [t, tol] : {std::pair{kFloat16, 1e-3}, std::pair{kBFloat16, 8e-3}}) {
    Tensor c = mm(tensor<double>(a, {n, k}).to(t), tensor<double>(b, {k, m}).to(t));
    EXPECT_EQ(c.dtype(), t);
    expect_near_all(c, want, tol, std::string("mm ") + std::string(dtype_name(t)));
    Tensor ct = mm(tensor<double>(b, {k, m}).to(t).t(), tensor<double>(a, {n, k}).to(t).t());
    std::vector<double> want_t(m * n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < m; ++j)
        want_t[j * n + i] = want[i * m + j];
    expect_near_all(ct, want_t, tol, "mm of transposed half views");
  }
}

TEST(LinalgTest, MixedDTypesPromote) {
  auto a = ints(6, -3, 7, 11), b = ints(6, -3, 7, 12);
  Tensor c = mm(tensor<double>(a, {2, 3}).to(kInt32), tensor<double>(b, {3, 2}).to(kFloat32));
  EXPECT_EQ(c.dtype(), kFloat32);
  expect_near_all(c, ref_mm(a, b, 2, 3, 2), 0, "int32 @ float32");
}

TEST(LinalgTest, DegenerateSizes) {
  for (DType t : {kFloat32, kFloat64, kFloat16, kInt64}) {
    // k == 0: the sum over nothing is 0 everywhere.
    Tensor z = mm(empty({3, 0}, t), empty({0, 4}, t));
    EXPECT_EQ(z.sizes(), Shape({3, 4}));
    for (double v : z.to_vector<double>())
      EXPECT_EQ(v, 0.0) << dtype_name(t);
    EXPECT_EQ(mm(empty({0, 3}, t), ones({3, 4}, t)).sizes(), Shape({0, 4}));
    EXPECT_EQ(mm(ones({2, 3}, t), empty({3, 0}, t)).sizes(), Shape({2, 0}));
    EXPECT_EQ(bmm(empty({0, 2, 3}, t), empty({0, 3, 4}, t)).sizes(), Shape({0, 2, 4}));
    EXPECT_EQ(dot(empty({0}, t), empty({0}, t)).item<double>(), 0.0);
  }
  // Single rows and columns: BLAS leading dims are derived, not taken from strides.
  auto a = uniform(5, 13), b = uniform(5, 14);
  double want = 0;
  for (int i = 0; i < 5; ++i)
    want += a[i] * b[i];
  Tensor col = tensor<double>(b, {5, 1});
  EXPECT_NEAR(mm(tensor<double>(a, {1, 5}), col).item<double>(), want, 1e-14);
  EXPECT_NEAR(mm(tensor<double>(a, {5, 1}).t(), col).item<double>(), want, 1e-14);
}

TEST(LinalgTest, BmmAndBatchedTransposes) {
  const int64_t B = 3, n = 4, k = 5, m = 2;
  auto a = uniform(B * n * k, 15), b = uniform(B * k * m, 16);
  for (DType t : {kFloat32, kFloat64, kInt64, kBFloat16}) {
    const double tol = t == kFloat32 ? 1e-5 : t == kBFloat16 ? 2e-2 : 1e-13;
    std::vector<double> av = a, bv = b;
    if (t == kInt64 || t == kBFloat16) {
      av = ints(B * n * k, -4, 9, 17);
      bv = ints(B * k * m, -4, 9, 18);
    }
    std::vector<double> w;
    for (int64_t i = 0; i < B; ++i) {
      std::vector<double> ai(av.begin() + i * n * k, av.begin() + (i + 1) * n * k);
      std::vector<double> bi(bv.begin() + i * k * m, bv.begin() + (i + 1) * k * m);
      auto ci = ref_mm(ai, bi, n, k, m);
      w.insert(w.end(), ci.begin(), ci.end());
    }
    Tensor c = bmm(tensor<double>(av, {B, n, k}).to(t), tensor<double>(bv, {B, k, m}).to(t));
    EXPECT_EQ(c.sizes(), Shape({B, n, m}));
    expect_near_all(c, w, tol, std::string("bmm ") + std::string(dtype_name(t)));
    // The same product from transposed storage: [B, k, n] transposed in its last two dims.
    std::vector<double> at(B * k * n);
    for (int64_t i = 0; i < B; ++i)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t p = 0; p < k; ++p)
          at[(i * k + p) * n + r] = av[(i * n + r) * k + p];
    Tensor c2 = bmm(tensor<double>(at, {B, k, n}).to(t).transpose(1, 2),
                    tensor<double>(bv, {B, k, m}).to(t));
    expect_near_all(c2, w, tol, "bmm transposed");
  }
}

// Reference for matmul with broadcast batch dims: a [..., n, k] and b [..., k, m] as
// row-major vectors with their shapes; returns the batch-broadcast result.
std::vector<double> ref_batched(const std::vector<double>& a, const Shape& sa,
                                const std::vector<double>& b, const Shape& sb, Shape* out_shape) {
  const int64_t n = sa[sa.size() - 2], k = sa.back(), m = sb.back();
  Shape ba(sa.begin(), sa.end() - 2), bb(sb.begin(), sb.end() - 2);
  const size_t nd = std::max(ba.size(), bb.size());
  ba.insert(ba.begin(), nd - ba.size(), 1);
  bb.insert(bb.begin(), nd - bb.size(), 1);
  Shape batch(nd);
  for (size_t d = 0; d < nd; ++d)
    batch[d] = std::max(ba[d], bb[d]);
  int64_t total = 1;
  for (int64_t s : batch)
    total *= s;
  std::vector<double> out;
  for (int64_t flat = 0; flat < total; ++flat) {
    // Batch index, then the offset of each operand's matrix (size-1 dims repeat).
    int64_t rem = flat, oa = 0, ob = 0, stride_a = 1, stride_b = 1;
    for (int64_t d = static_cast<int64_t>(nd) - 1; d >= 0; --d) {
      const int64_t i = rem % batch[d];
      rem /= batch[d];
      oa += (ba[d] == 1 ? 0 : i) * stride_a;
      ob += (bb[d] == 1 ? 0 : i) * stride_b;
      stride_a *= ba[d];
      stride_b *= bb[d];
    }
    std::vector<double> am(a.begin() + oa * n * k, a.begin() + (oa + 1) * n * k);
    std::vector<double> bm(b.begin() + ob * k * m, b.begin() + (ob + 1) * k * m);
    auto c = ref_mm(am, bm, n, k, m);
    out.insert(out.end(), c.begin(), c.end());
  }
  *out_shape = batch;
  out_shape->push_back(n);
  out_shape->push_back(m);
  return out;
}

TEST(LinalgTest, MatmulShapes) {
  auto v = uniform(400, 19), w = uniform(400, 20);
  auto take = [](const std::vector<double>& x, int64_t n) {
    return std::vector<double>(x.begin(), x.begin() + n);
  };
  // 1-d x 1-d: a dot product, 0-d.
  {
    Tensor r = matmul(tensor<double>(take(v, 4)), tensor<double>(take(w, 4)));
    EXPECT_EQ(r.dim(), 0);
    double want = 0;
    for (int i = 0; i < 4; ++i)
      want += v[i] * w[i];
    EXPECT_NEAR(r.item<double>(), want, 1e-14);
  }
  // 2-d x 1-d: [3, 4] @ [4] -> [3].
  {
    Tensor r = matmul(tensor<double>(take(v, 12), {3, 4}), tensor<double>(take(w, 4)));
    EXPECT_EQ(r.sizes(), Shape({3}));
    expect_near_all(r, ref_mm(take(v, 12), take(w, 4), 3, 4, 1), 1e-14, "mv");
  }
  // 1-d x 2-d: [4] @ [4, 5] -> [5].
  {
    Tensor r = matmul(tensor<double>(take(v, 4)), tensor<double>(take(w, 20), {4, 5}));
    EXPECT_EQ(r.sizes(), Shape({5}));
    expect_near_all(r, ref_mm(take(v, 4), take(w, 20), 1, 4, 5), 1e-14, "vm");
  }
  // Batched with broadcasting, including the folded [..., n, k] @ [k, m] form.
  const std::vector<std::pair<Shape, Shape>> cases = {
      {{2, 3, 4}, {4, 5}},    {{4, 5}, {2, 5, 3}},    {{2, 1, 3, 4}, {5, 4, 2}},
      {{3, 2, 4}, {3, 4, 2}}, {{1, 2, 3}, {4, 3, 2}}, {{2, 2, 3, 4}, {1, 4, 1}},
  };
  for (const auto& [sa, sb] : cases) {
    auto a = take(v, shape_numel(sa)), b = take(w, shape_numel(sb));
    Shape want_shape;
    auto want = ref_batched(a, sa, b, sb, &want_shape);
    for (DType t : {kFloat32, kFloat64}) {
      Tensor r = matmul(tensor<double>(a, sa).to(t), tensor<double>(b, sb).to(t));
      EXPECT_EQ(r.sizes(), want_shape) << shape_to_string(sa) << " @ " << shape_to_string(sb);
      expect_near_all(r, want, t == kFloat32 ? 1e-5 : 1e-13,
                      "matmul " + shape_to_string(sa) + " @ " + shape_to_string(sb));
    }
  }
  // 1-d against batched operands: the added dim is removed again.
  {
    Shape want_shape;
    auto want = ref_batched(take(v, 4), {1, 4}, take(w, 40), {2, 4, 5}, &want_shape);
    Tensor r = matmul(tensor<double>(take(v, 4)), tensor<double>(take(w, 40), {2, 4, 5}));
    EXPECT_EQ(r.sizes(), Shape({2, 5}));
    expect_near_all(r, want, 1e-13, "[4] @ [2, 4, 5]");
    auto want2 = ref_batched(take(v, 24), {2, 3, 4}, take(w, 4), {4, 1}, &want_shape);
    Tensor r2 = matmul(tensor<double>(take(v, 24), {2, 3, 4}), tensor<double>(take(w, 4)));
    EXPECT_EQ(r2.sizes(), Shape({2, 3}));
    expect_near_all(r2, want2, 1e-13, "[2, 3, 4] @ [4]");
  }
  // A batched operand that is a transposed view of its batch.
  {
    auto a = take(v, 24);  // [2, 4, 3] storage, viewed as [2, 3, 4]
    std::vector<double> logical(24);
    for (int bi = 0; bi < 2; ++bi)
      for (int i = 0; i < 3; ++i)
        for (int p = 0; p < 4; ++p)
          logical[(bi * 3 + i) * 4 + p] = a[(bi * 4 + p) * 3 + i];
    Shape want_shape;
    auto want = ref_batched(logical, {2, 3, 4}, take(w, 8), {4, 2}, &want_shape);
    Tensor r =
        matmul(tensor<double>(a, {2, 4, 3}).transpose(1, 2), tensor<double>(take(w, 8), {4, 2}));
    expect_near_all(r, want, 1e-13, "matmul of transposed batch");
  }
}

TEST(LinalgTest, AddmmInPlace) {
  const int64_t n = 3, k = 4, m = 2;
  auto a = uniform(n * k, 21), b = uniform(k * m, 22), c0 = uniform(n * m, 23);
  auto prod = ref_mm(a, b, n, k, m);
  for (DType t : {kFloat32, kFloat64}) {
    const double tol = t == kFloat32 ? 1e-5 : 1e-13;
    Tensor out = tensor<double>(c0, {n, m}).to(t);
    const uint64_t version = out.version();
    Tensor& r =
        addmm_(out, tensor<double>(a, {n, k}).to(t), tensor<double>(b, {k, m}).to(t), 0.5, 2.0);
    EXPECT_TRUE(r.is_same(out));
    EXPECT_GT(out.version(), version);
    std::vector<double> want(n * m);
    for (int64_t i = 0; i < n * m; ++i)
      want[i] = 0.5 * c0[i] + 2.0 * prod[i];
    expect_near_all(out, want, tol, "addmm_");
    // beta == 0 ignores out, even when it holds nan.
    Tensor junk = full({n, m}, std::numeric_limits<double>::quiet_NaN(), t);
    addmm_(junk, tensor<double>(a, {n, k}).to(t), tensor<double>(b, {k, m}).to(t), 0, 1);
    expect_near_all(junk, prod, tol, "addmm_ beta 0");
  }
  // k == 0 only scales out.
  Tensor s = tensor<double>(c0, {n, m});
  addmm_(s, empty({n, 0}, kFloat64), empty({0, m}, kFloat64), 3, 1);
  std::vector<double> tripled(c0);
  for (auto& x : tripled)
    x *= 3;
  expect_near_all(s, tripled, 1e-15, "addmm_ k 0");
  // Integer out with integer alpha and beta.
  auto ia = ints(n * k, -5, 11, 24), ib = ints(k * m, -5, 11, 25), ic = ints(n * m, -5, 11, 26);
  auto ip = ref_mm(ia, ib, n, k, m);
  Tensor io = tensor<double>(ic, {n, m}).to(kInt64);
  addmm_(io, tensor<double>(ia, {n, k}).to(kInt64), tensor<double>(ib, {k, m}).to(kInt64), 2, -3);
  std::vector<double> iw(n * m);
  for (int64_t i = 0; i < n * m; ++i)
    iw[i] = 2 * ic[i] - 3 * ip[i];
  expect_near_all(io, iw, 0, "addmm_ int64");
  // Half out goes through float32.
  Tensor ho = zeros({n, m}, kFloat16);
  addmm_(ho, tensor<double>(ia, {n, k}).to(kFloat16), tensor<double>(ib, {k, m}).to(kFloat16));
  expect_near_all(ho, ip, 1e-3, "addmm_ half");
  // out may alias an operand: the product uses the operand's values from before the call.
  auto sq = uniform(9, 27), other = uniform(9, 28);
  Tensor x = tensor<double>(sq, {3, 3});
  addmm_(x, x, tensor<double>(other, {3, 3}), 0, 1);
  expect_near_all(x, ref_mm(sq, other, 3, 3, 3), 1e-13, "addmm_ aliasing out");
}

TEST(LinalgTest, DotAndOuter) {
  auto a = uniform(10, 29), b = uniform(10, 30);
  // dot of step-2 slices: elements 0, 2, 4, 6, 8.
  double want = 0;
  for (int i = 0; i < 10; i += 2)
    want += a[i] * b[i];
  for (DType t : {kFloat32, kFloat64}) {
    Tensor d =
        dot(tensor<double>(a).to(t).slice(0, 0, 10, 2), tensor<double>(b).to(t).slice(0, 0, 10, 2));
    EXPECT_EQ(d.dim(), 0);
    EXPECT_EQ(d.dtype(), t);
    EXPECT_NEAR(d.item<double>(), want, t == kFloat32 ? 1e-6 : 1e-14);
  }
  Tensor di = dot(tensor<int32_t>({1, 2, 3}), tensor<int32_t>({4, -5, 6}));
  EXPECT_EQ(di.dtype(), kInt32);
  EXPECT_EQ(di.item<int64_t>(), 4 - 10 + 18);
  Tensor o = outer(tensor<double>(a).slice(0, 0, 3), tensor<double>(b).slice(0, 0, 4));
  EXPECT_EQ(o.sizes(), Shape({3, 4}));
  auto ov = o.to_vector<double>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j)
      EXPECT_NEAR(ov[i * 4 + j], a[i] * b[j], 1e-15);
  Tensor oi = outer(tensor<int64_t>({1, -2}), tensor<int64_t>({3, 4, 5}));
  EXPECT_EQ(oi.to_vector<int64_t>(), (std::vector<int64_t>{3, 4, 5, -6, -8, -10}));
  Tensor oh = outer(tensor<double>({0.5, 2}).to(kFloat16), tensor<double>({4, -1}).to(kFloat16));
  EXPECT_EQ(oh.dtype(), kFloat16);
  EXPECT_EQ(oh.to_vector<double>(), (std::vector<double>{2, -0.5, 8, -2}));
}

TEST(LinalgTest, ErrorsNameOpAndShapes) {
  Tensor a = zeros({2, 3}), b = zeros({4, 5});
  expect_invalid([&] { mm(a, b); }, "mm: shapes [2, 3] and [4, 5] cannot be multiplied");
  expect_invalid([&] { mm(a, zeros({3})); }, "mm: expected 2-d tensors, got shapes [2, 3] and [3]");
  expect_invalid([&] { matmul(a, b); }, "matmul: shapes [2, 3] and [4, 5]");
  expect_invalid([&] { matmul(zeros({3}), zeros({4})); }, "matmul: shapes [3] and [4]");
  expect_invalid(
      [&] {
        matmul(zeros({2, 2, 3}), zeros({3, 3, 4}));
      },
      "matmul: batch dims of shapes [2, 2, 3] and [3, 3, 4] do not broadcast");
  expect_invalid([&] { matmul(zeros({}), zeros({3})); }, "matmul");
  expect_invalid([&] { bmm(zeros({2, 2, 3}), zeros({3, 3, 4})); }, "bmm: batch sizes differ");
  expect_invalid(
      [&] {
        bmm(zeros({2, 2, 3}), zeros({2, 4, 4}));
      },
      "bmm: shapes [2, 2, 3] and [2, 4, 4]");
  expect_invalid([&] { bmm(a, a); }, "bmm: expected 3-d");
  expect_invalid([&] { dot(zeros({3}), zeros({4})); }, "dot: shapes [3] and [4]");
  expect_invalid([&] { dot(a, a); }, "dot: expected 1-d");
  expect_invalid([&] { outer(a, zeros({3})); }, "outer: expected 1-d");
  expect_invalid([&] { mm(zeros({2, 2}, kBool), zeros({2, 2}, kBool)); }, "mm: dtype bool");
  expect_invalid([&] { matmul(zeros({2}, kBool), zeros({2}, kBool)); }, "matmul: dtype bool");
  Tensor out = zeros({2, 5});
  expect_invalid([&] { addmm_(out, a, zeros({3, 4})); }, "addmm_: out has shape [2, 5]");
  Tensor strided = zeros({5, 2}).t();
  expect_invalid([&] { addmm_(strided, a, zeros({3, 5})); }, "addmm_: out must be contiguous");
  Tensor iout = zeros({2, 2}, kInt64);
  expect_invalid([&] { addmm_(iout, zeros({2, 3}), zeros({3, 2})); }, "addmm_");
  expect_invalid(
      [&] {
        addmm_(iout, zeros({2, 3}, kInt64), zeros({3, 2}, kInt64), 0.5);
      },
      "must be integers");
  expect_invalid([&] { mm(Tensor(), a); }, "mm");
}

}  // namespace
}  // namespace gradwire
