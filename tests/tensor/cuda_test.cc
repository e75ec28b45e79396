// The CUDA backend, checked against the CPU: every result computed on the device is copied
// back and compared with the same op run by the CPU kernels on the same inputs. Covers
// allocation, uploads/downloads/device copies (dtype conversions, strided and expanded
// operands, across devices when there are two), fill, every binary and unary op, where,
// reductions (including ties and nan), matrix products (transposed, batched, broadcast,
// k = 0), round trips through to(Device), and DLPack export of device tensors.
//
// Without a CUDA device (or in a build without CUDA) the device tests report themselves
// skipped; the refusal of a device ordinal that does not exist is checked everywhere.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/dlpack.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

#define SKIP_WITHOUT_CUDA()                                     \
  do {                                                          \
    if (!cuda_is_available()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

const Device kGpu = Device::cuda(0);
const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt32,   kInt64,   kUInt8,   kBool};
const std::vector<DType> kNumericDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                           kInt32,   kInt64,   kUInt8};
const std::vector<DType> kFloatDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16};
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Deterministic values in [lo, hi) from an LCG, rounded to `step` (so that integral and
// half-precision dtypes hold them exactly).
std::vector<double> lcg_values(int64_t n, double lo, double hi, double step, uint64_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const double u = static_cast<double>(s >> 11) / 9007199254740992.0;
    x = lo + std::floor(u * (hi - lo) / step) * step;
  }
  return v;
}

Tensor host_tensor(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return tensor<double>(v, shape).to(dtype);
}

// Relative tolerance per dtype for results of a few roundings.
double tolerance(DType t) {
  switch (t) {
    case kFloat16:
      return 2e-3;
    case kBFloat16:
      return 1.6e-2;
    case kFloat32:
      return 2e-5;
    case kFloat64:
      return 1e-12;
    default:
      return 0.0;
  }
}

// Checks that `device` (a CUDA tensor) equals `host` (the CPU result): same dtype and
// shape, elements within rtol * max(1, |expected|) (nan only where nan is expected).
void expect_matches(const Tensor& device, const Tensor& host, double rtol,
                    const std::string& what) {
  ASSERT_TRUE(device.is_cuda()) << what;
  ASSERT_EQ(device.dtype(), host.dtype()) << what;
  ASSERT_EQ(device.sizes(), host.sizes()) << what;
  const std::vector<double> got = device.to(Device::cpu()).to_vector<double>();
  const std::vector<double> want = host.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(want[i])) {
      EXPECT_TRUE(std::isnan(got[i])) << what << " at " << i << ": got " << got[i];
    } else if (std::isinf(want[i])) {
      EXPECT_EQ(got[i], want[i]) << what << " at " << i;
    } else {
      EXPECT_NEAR(got[i], want[i], rtol * std::max(1.0, std::abs(want[i]))) << what << " at " << i;
    }
  }
}

// ---------------------------------------------------------------- devices and memory

TEST(CudaDeviceTest, MissingOrdinalIsInvalidArgument) {
  // Runs with and without a GPU: the first ordinal past the count never exists.
  const int count = cuda_device_count();
  EXPECT_GE(count, 0);
  EXPECT_EQ(cuda_is_available(), count > 0);
  const Device missing = Device::cuda(count);
  try {
    (void)empty({4}, TensorOptions(kFloat32).device(missing));
    ADD_FAILURE() << "allocated on " << missing;
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(missing.str()), std::string::npos) << e.what();
  }
  EXPECT_THROW(ones({2}).to(missing), InvalidArgument);
}

TEST(CudaMemoryTest, AllocationOnTheDevice) {
  SKIP_WITHOUT_CUDA();
  Tensor t = empty({3, 5}, TensorOptions(kFloat64).device(kGpu));
  EXPECT_TRUE(t.is_cuda());
  EXPECT_EQ(t.device(), kGpu);
  EXPECT_EQ(t.storage().nbytes(), 120u);
  EXPECT_NE(t.storage().data(), nullptr);
  Tensor z = empty({0}, TensorOptions(kFloat32).device(kGpu));
  EXPECT_NE(z.storage().data(), nullptr);  // never null, even for zero bytes
  EXPECT_EQ(z.to(Device::cpu()).numel(), 0);
}

TEST(CudaMemoryTest, ImpossibleAllocationIsAnErrorNamingSizeAndDevice) {
  SKIP_WITHOUT_CUDA();
  const int64_t huge = int64_t{1} << 52;  // 4 PiB
  try {
    (void)empty({huge}, TensorOptions(kUInt8).device(kGpu));
    ADD_FAILURE() << "a 4 PiB allocation succeeded";
  } catch (const InvalidArgument&) {
    ADD_FAILURE() << "allocation failure must be an Error, not InvalidArgument";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(huge)), std::string::npos) << msg;
    EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  }
  // The device is still usable afterwards.
  EXPECT_EQ(ones({2}, TensorOptions().device(kGpu)).to_vector<float>(), (std::vector<float>{1, 1}));
}

// ---------------------------------------------------------------- copies

TEST(CudaCopyTest, RoundTripEveryDType) {
  SKIP_WITHOUT_CUDA();
  const std::vector<double> v = lcg_values(1000, 0, 100, 1, 1);
  for (DType dtype : kAllDTypes) {
    const Tensor host = host_tensor(v, {10, 100}, dtype);
    const Tensor dev = host.to(kGpu);
    EXPECT_TRUE(dev.is_cuda());
    EXPECT_EQ(dev.dtype(), dtype);
    EXPECT_EQ(dev.sizes(), host.sizes());
    const Tensor back = dev.to(Device::cpu());
    EXPECT_EQ(back.dtype(), dtype);
    EXPECT_EQ(back.sizes(), (Shape{10, 100}));
    EXPECT_TRUE(equal(back, host)) << dtype;
  }
}

TEST(CudaCopyTest, DTypeConversionOnTheDeviceMatchesTheCpu) {
  SKIP_WITHOUT_CUDA();
  // Non-negative values with fractions: every conversion is defined in C++ and on the GPU.
  std::vector<double> v = lcg_values(257, 0, 250, 0.125, 2);
  v[0] = 0.0;
  v[1] = 1.0 / 3.0;
  v[2] = 249.875;
  for (DType from : kAllDTypes) {
    const Tensor host = host_tensor(v, {257}, from);
    const Tensor dev = host.to(kGpu);
    for (DType to : kAllDTypes) {
      // Conversions are exact functions of their input: bit-for-bit equal results.
      expect_matches(dev.to(to), host.to(to), 0.0,
                     std::string(dtype_name(from)) + " -> " + std::string(dtype_name(to)));
    }
  }
}

TEST(CudaCopyTest, StridedAndExpandedSources) {
  SKIP_WITHOUT_CUDA();
  const Tensor host = host_tensor(lcg_values(60, -50, 50, 0.5, 3), {3, 4, 5}, kFloat32);
  const Tensor dev = host.to(kGpu);
  // Device -> host of a permuted, sliced view (packed on the device first).
  const Tensor view = dev.permute({2, 0, 1}).slice(0, 1, 5, 2);
  expect_matches(view.contiguous(), host.permute({2, 0, 1}).slice(0, 1, 5, 2).contiguous(), 0,
                 "device contiguous of a view");
  EXPECT_TRUE(equal(view.to(Device::cpu()), host.permute({2, 0, 1}).slice(0, 1, 5, 2)));
  // Host -> device of an expanded source.
  const Tensor row = host_tensor({1, 2, 3, 4}, {1, 4}, kInt64);
  const Tensor up = row.expand({3, 4}).to(kGpu);
  EXPECT_EQ(up.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}));
  // Device -> device of an expanded source with conversion.
  const Tensor col = host_tensor({5, 6}, {2, 1}, kFloat64).to(kGpu);
  Tensor dst = empty({2, 3}, TensorOptions(kInt32).device(kGpu));
  dst.copy_(col);
  EXPECT_EQ(dst.to_vector<int32_t>(), (std::vector<int32_t>{5, 5, 5, 6, 6, 6}));
}

TEST(CudaCopyTest, StridedDestinations) {
  SKIP_WITHOUT_CUDA();
  const Tensor src = host_tensor(lcg_values(24, 0, 10, 1, 4), {6, 4}, kFloat32);
  // Host -> strided device view: lands in a staging buffer, then scattered.
  Tensor base = zeros({4, 6}, TensorOptions().device(kGpu));
  base.t().copy_(src);
  EXPECT_TRUE(equal(base.to(Device::cpu()), src.t()));
  // Device -> strided host view.
  Tensor host_base = zeros({4, 6});
  host_base.t().copy_(src.to(kGpu));
  EXPECT_TRUE(equal(host_base, src.t()));
  // Device -> strided device view with conversion, and a slice with a step.
  Tensor d = zeros({6, 8}, TensorOptions(kFloat64).device(kGpu));
  d.slice(1, 0, 8, 2).copy_(src.to(kGpu));
  Tensor expected = zeros({6, 8}, kFloat64);
  expected.slice(1, 0, 8, 2).copy_(src);
  EXPECT_TRUE(equal(d.to(Device::cpu()), expected));
  // Overlapping device views.
  Tensor x = arange(0, 6, 1, TensorOptions(kFloat32).device(kGpu));
  x.slice(0, 1, 6).copy_(x.slice(0, 0, 5));
  EXPECT_EQ(x.to_vector<float>(), (std::vector<float>{0, 0, 1, 2, 3, 4}));
}

TEST(CudaCopyTest, BetweenDevices) {
  SKIP_WITHOUT_CUDA();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices";
  const Tensor host = host_tensor(lcg_values(40, 0, 9, 1, 5), {5, 8}, kFloat32);
  const Tensor a = host.to(Device::cuda(0));
  const Tensor b = a.to(Device::cuda(1));
  EXPECT_EQ(b.device(), Device::cuda(1));
  EXPECT_TRUE(equal(b.to(Device::cpu()), host));
  Tensor c = zeros({8, 5}, TensorOptions(kFloat64).device(Device::cuda(1)));
  c.t().copy_(a);
  EXPECT_TRUE(equal(c.to(Device::cpu()), host.t().to(kFloat64)));
}

TEST(CudaCopyTest, FillAndElementAccess) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : kAllDTypes) {
    Tensor t = zeros({4, 4}, TensorOptions(dtype).device(kGpu));
    t.select(1, 2).fill_(7);
    Tensor expected = zeros({4, 4}, dtype);
    expected.select(1, 2).fill_(7);
    EXPECT_TRUE(equal(t.to(Device::cpu()), expected)) << dtype;
    EXPECT_EQ(t.at({3, 2}), dtype == kBool ? 1.0 : 7.0);
    EXPECT_EQ(t.select(0, 1).select(0, 2).item<double>(), dtype == kBool ? 1.0 : 7.0);
  }
  Tensor f = full({2, 3}, 2.5, TensorOptions(kFloat16).device(kGpu));
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(6, 2.5f));
  const uint64_t v = f.version();
  f.t().fill_(-1);
  EXPECT_EQ(f.version(), v + 1);
  EXPECT_EQ(f.to_vector<float>(), std::vector<float>(6, -1.0f));
}

// ---------------------------------------------------------------- elementwise

TEST(CudaElementwiseTest, BinaryOpsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  // Broadcast [5, 1] against [1, 7] plus a transposed operand, so every indexer path runs.
  for (DType dtype : kNumericDTypes) {
    const bool floating = is_floating_point(dtype);
    const double lo = dtype == kUInt8 ? 0 : -8;
    const Tensor a = host_tensor(lcg_values(5, lo, 8, floating ? 0.25 : 1, 6), {5, 1}, dtype);
    std::vector<double> bv = lcg_values(7, lo, 8, floating ? 0.25 : 1, 7);
    bv[3] = 0.0;
    const Tensor b = host_tensor(bv, {1, 7}, dtype);
    const Tensor c = host_tensor(lcg_values(35, lo, 8, floating ? 0.25 : 1, 8), {7, 5}, dtype).t();
    const Tensor da = a.to(kGpu), db = b.to(kGpu), dc = c.to(kGpu);
    const double tol = tolerance(dtype);
    const std::string name(dtype_name(dtype));
    expect_matches(add(da, db), add(a, b), tol, "add " + name);
    expect_matches(add(da, dc, 3), add(a, c, 3), tol, "add alpha " + name);
    expect_matches(sub(da, db, 2), sub(a, b, 2), tol, "sub " + name);
    expect_matches(mul(dc, db), mul(c, b), tol, "mul " + name);
    expect_matches(maximum(da, dc), maximum(a, c), 0, "maximum " + name);
    expect_matches(minimum(da, dc), minimum(a, c), 0, "minimum " + name);
    expect_matches(eq(da, dc), eq(a, c), 0, "eq " + name);
    expect_matches(ne(da, db), ne(a, b), 0, "ne " + name);
    expect_matches(lt(da, db), lt(a, b), 0, "lt " + name);
    expect_matches(le(dc, db), le(c, b), 0, "le " + name);
    expect_matches(gt(da, db), gt(a, b), 0, "gt " + name);
    expect_matches(ge(da, dc), ge(a, c), 0, "ge " + name);
    expect_matches(add(da, 2), add(a, 2), tol, "add scalar " + name);
    if (floating) {
      expect_matches(div(da, db), div(a, b), tol, "div " + name);  // includes x / 0
      const Tensor pa = abs(a), dpa = pa.to(kGpu);
      expect_matches(pow(dpa, db), pow(pa, b), std::max(tol, 1e-5), "pow " + name);
    } else {
      const Tensor e = host_tensor(lcg_values(7, 0, 5, 1, 9), {1, 7}, dtype);
      expect_matches(pow(da, e.to(kGpu)), pow(a, e), 0, "int pow " + name);
      expect_matches(div(da, db), div(a, b), 2e-5, "int div " + name);
    }
  }
  // Logical ops on bool, with a broadcast scalar-like operand.
  const Tensor p = host_tensor({1, 0, 1, 0}, {4}, kBool);
  const Tensor q = host_tensor({1, 1, 0, 0}, {4}, kBool);
  expect_matches(logical_and(p.to(kGpu), q.to(kGpu)), logical_and(p, q), 0, "and");
  expect_matches(logical_or(p.to(kGpu), q.to(kGpu)), logical_or(p, q), 0, "or");
  expect_matches(add(p.to(kGpu), q.to(kGpu)), add(p, q), 0, "bool add");
  expect_matches(mul(p.to(kGpu), q.to(kGpu)), mul(p, q), 0, "bool mul");
}

TEST(CudaElementwiseTest, NanPropagationInMaximumAndComparisons) {
  SKIP_WITHOUT_CUDA();
  const Tensor a = host_tensor({kNaN, 1, kNaN, -2}, {4}, kFloat32);
  const Tensor b = host_tensor({0, kNaN, kNaN, 3}, {4}, kFloat32);
  const Tensor da = a.to(kGpu), db = b.to(kGpu);
  expect_matches(maximum(da, db), maximum(a, b), 0, "maximum nan");
  expect_matches(minimum(da, db), minimum(a, b), 0, "minimum nan");
  expect_matches(eq(da, db), eq(a, b), 0, "eq nan");
  expect_matches(ne(da, db), ne(a, b), 0, "ne nan");
}

TEST(CudaElementwiseTest, InPlaceAndOutVariants) {
  SKIP_WITHOUT_CUDA();
  const Tensor a = host_tensor(lcg_values(12, -4, 4, 0.5, 10), {3, 4}, kFloat32);
  const Tensor b = host_tensor(lcg_values(4, -4, 4, 0.5, 11), {4}, kFloat32);
  Tensor ha = a.clone(), da = a.to(kGpu);
  ha.add_(b, 2).mul_(3).sub_(1).div_(2).neg_().relu_();
  da.add_(b.to(kGpu), 2).mul_(3).sub_(1).div_(2).neg_().relu_();
  expect_matches(da, ha, 1e-6, "in-place chain");
  Tensor out = empty({3, 4}, TensorOptions().device(kGpu));
  add_out(out, a.to(kGpu), b.to(kGpu));
  expect_matches(out, add(a, b), 1e-6, "add_out");
  mul_out(out, a.to(kGpu), b.to(kGpu));
  expect_matches(out, mul(a, b), 1e-6, "mul_out");
}

TEST(CudaElementwiseTest, UnaryOpsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : kFloatDTypes) {
    std::vector<double> v = lcg_values(64, -6, 6, 0.0625, 12);
    v[0] = 0.0;
    v[1] = -0.0;
    v[2] = kNaN;
    v[3] = 60.0;  // sigmoid/tanh saturate
    v[4] = -60.0;
    const Tensor x = host_tensor(v, {8, 8}, dtype).t();
    const Tensor dx = x.to(kGpu);
    const Tensor px = abs(x) + 0.5, dpx = px.to(kGpu);
    const double tol = std::max(tolerance(dtype), 1e-5);
    const std::string name(dtype_name(dtype));
    expect_matches(exp(dx), exp(x), tol, "exp " + name);
    expect_matches(log(dpx), log(px), tol, "log " + name);
    expect_matches(sqrt(dpx), sqrt(px), tol, "sqrt " + name);
    expect_matches(rsqrt(dpx), rsqrt(px), tol, "rsqrt " + name);
    expect_matches(abs(dx), abs(x), 0, "abs " + name);
    expect_matches(neg(dx), neg(x), 0, "neg " + name);
    expect_matches(relu(dx), relu(x), 0, "relu " + name);
    expect_matches(sigmoid(dx), sigmoid(x), tol, "sigmoid " + name);
    expect_matches(tanh(dx), tanh(x), tol, "tanh " + name);
    expect_matches(sign(dx), sign(x), 0, "sign " + name);
    expect_matches(square(dx), square(x), tol, "square " + name);
    expect_matches(reciprocal(dpx), reciprocal(px), tol, "reciprocal " + name);
    expect_matches(pow(dpx, 2.5), pow(px, 2.5), tol, "pow scalar " + name);
    expect_matches(pow(dx, 2), pow(x, 2), tol, "pow 2 " + name);
    expect_matches(clamp(dx, -1.5, 2.0), clamp(x, -1.5, 2.0), 0, "clamp " + name);
    expect_matches(clamp(dx, std::nullopt, 0.25), clamp(x, std::nullopt, 0.25), 0,
                   "clamp max " + name);
    expect_matches(logical_not(dx), logical_not(x), 0, "logical_not " + name);
  }
  for (DType dtype : {kInt32, kInt64, kUInt8}) {
    const double lo = dtype == kUInt8 ? 0 : -20;
    const Tensor x = host_tensor(lcg_values(30, lo, 20, 1, 13), {5, 6}, dtype);
    const Tensor dx = x.to(kGpu);
    const std::string name(dtype_name(dtype));
    expect_matches(abs(dx), abs(x), 0, "abs " + name);
    expect_matches(neg(dx), neg(x), 0, "neg " + name);
    expect_matches(relu(dx), relu(x), 0, "relu " + name);
    expect_matches(sign(dx), sign(x), 0, "sign " + name);
    expect_matches(square(dx), square(x), 0, "square " + name);
    expect_matches(pow(dx, 3), pow(x, 3), 0, "pow " + name);
    expect_matches(clamp(dx, 2, 9), clamp(x, 2, 9), 0, "clamp " + name);
    expect_matches(logical_not(dx), logical_not(x), 0, "logical_not " + name);
    // Integral inputs of float functions are computed in float32 by the frontend.
    expect_matches(exp(dx.slice(0, 0, 1)), exp(x.slice(0, 0, 1)), 1e-5, "int exp " + name);
  }
  const Tensor flags = host_tensor({1, 0, 1}, {3}, kBool);
  expect_matches(logical_not(flags.to(kGpu)), logical_not(flags), 0, "logical_not bool");
}

TEST(CudaElementwiseTest, Where) {
  SKIP_WITHOUT_CUDA();
  const Tensor cond = host_tensor({1, 0, 0, 1, 1, 0}, {2, 3}, kBool);
  for (DType dtype : kAllDTypes) {
    const Tensor a = host_tensor(lcg_values(3, 0, 9, 1, 14), {3}, dtype);
    const Tensor b = host_tensor(lcg_values(6, 0, 9, 1, 15), {3, 2}, dtype).t();
    expect_matches(where(cond.to(kGpu), a.to(kGpu), b.to(kGpu)), where(cond, a, b), 0,
                   "where " + std::string(dtype_name(dtype)));
  }
  const Tensor x = host_tensor({1, 2, 3, 4, 5, 6}, {2, 3}, kFloat32);
  expect_matches(where(cond.to(kGpu), x.to(kGpu), -1.0), where(cond, x, -1.0), 0, "where scalar");
}

TEST(CudaElementwiseTest, MixedDevicesAreRefused) {
  SKIP_WITHOUT_CUDA();
  EXPECT_THROW(add(ones({2}), ones({2}, TensorOptions().device(kGpu))), InvalidArgument);
}

// ---------------------------------------------------------------- reductions

TEST(CudaReduceTest, SumProdMaxMinMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : kAllDTypes) {
    const bool floating = is_floating_point(dtype);
    const double hi = dtype == kBool ? 2 : floating ? 4 : 9;
    const Tensor x =
        host_tensor(lcg_values(3 * 700, 0, hi, floating ? 0.25 : 1, 16), {3, 700}, dtype);
    const Tensor dx = x.to(kGpu);
    const std::string name(dtype_name(dtype));
    const double tol = floating ? std::max(tolerance(dtype), 1e-4) : 0;
    expect_matches(sum(dx), sum(x), tol, "sum all " + name);
    expect_matches(sum(dx, {1}), sum(x, {1}), tol, "sum rows " + name);
    expect_matches(sum(dx, {0}, true), sum(x, {0}, true), tol, "sum cols " + name);
    expect_matches(sum(dx.t(), {1}), sum(x.t(), {1}), tol, "sum transposed " + name);
    expect_matches(amax(dx, {1}), amax(x, {1}), 0, "amax " + name);
    expect_matches(amin(dx, {0}), amin(x, {0}), 0, "amin " + name);
    expect_matches(max(dx), max(x), 0, "max all " + name);
    expect_matches(min(dx), min(x), 0, "min all " + name);
    if (dtype != kBool) {
      const Tensor small = x.slice(1, 0, 6);
      expect_matches(prod(small.to(kGpu), 1), prod(small, 1), tol, "prod " + name);
    }
    if (floating) {
      expect_matches(mean(dx, {1}), mean(x, {1}), tol, "mean " + name);
      expect_matches(norm(dx), norm(x), tol, "norm " + name);
    }
  }
}

TEST(CudaReduceTest, IndicesTiesAndNan) {
  SKIP_WITHOUT_CUDA();
  // Row 0: ties for the max at 1 and 5, for the min at 0 and 7. Row 1: a nan at 2 and 6.
  // Row 2 is long, so its extremes are split among many threads.
  std::vector<double> v(3 * 600, 1.0);
  const std::vector<double> r0 = {-2, 9, 3, 0, 1, 9, 4, -2};
  for (size_t i = 0; i < r0.size(); ++i)
    v[i] = r0[i];
  v[600 + 2] = kNaN;
  v[600 + 6] = kNaN;
  v[1200 + 599] = 50;
  v[1200 + 300] = 50;
  v[1200 + 17] = -50;
  v[1200 + 511] = -50;
  for (DType dtype : kFloatDTypes) {
    const Tensor x = host_tensor(v, {3, 600}, dtype);
    const Tensor dx = x.to(kGpu);
    const std::string name(dtype_name(dtype));
    auto [dmax, dimax] = max(dx, 1);
    auto [hmax, himax] = max(x, 1);
    expect_matches(dmax, hmax, 0, "max values " + name);
    expect_matches(dimax, himax, 0, "max indices " + name);
    EXPECT_EQ(dimax.to_vector<int64_t>(), (std::vector<int64_t>{1, 2, 300})) << name;
    auto [dmin, dimin] = min(dx, 1, true);
    auto [hmin, himin] = min(x, 1, true);
    expect_matches(dmin, hmin, 0, "min values " + name);
    EXPECT_EQ(dimin.to_vector<int64_t>(), (std::vector<int64_t>{0, 2, 17})) << name;
    expect_matches(argmax(dx, 1), argmax(x, 1), 0, "argmax " + name);
    expect_matches(argmin(dx, 1), argmin(x, 1), 0, "argmin " + name);
    expect_matches(argmax(dx), argmax(x), 0, "argmax all " + name);
    expect_matches(amax(dx, {1}), amax(x, {1}), 0, "amax nan " + name);
  }
  // Integers: ties only.
  const Tensor xi = host_tensor({3, 7, 7, 1, 1, 0, 0, 7}, {2, 4}, kInt32);
  EXPECT_EQ(argmax(xi.to(kGpu), 1).to_vector<int64_t>(), (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(argmin(xi.to(kGpu), 1).to_vector<int64_t>(), (std::vector<int64_t>{3, 1}));
}

TEST(CudaReduceTest, ManyRowsAndEmptyRows) {
  SKIP_WITHOUT_CUDA();
  // More rows than the kernel launches blocks: the grid strides over rows.
  const Tensor x = host_tensor(lcg_values(70000 * 3, 0, 8, 1, 17), {70000, 3}, kInt64);
  expect_matches(sum(x.to(kGpu), {1}), sum(x, {1}), 0, "sum of 70000 rows");
  expect_matches(argmax(x.to(kGpu), 1), argmax(x, 1), 0, "argmax of 70000 rows");
  // Reducing over an empty dim gives the identity.
  const Tensor e = zeros({4, 0}, TensorOptions().device(kGpu));
  EXPECT_EQ(sum(e, {1}).to_vector<float>(), std::vector<float>(4, 0.0f));
  EXPECT_EQ(prod(e, 1).to_vector<float>(), std::vector<float>(4, 1.0f));
}

TEST(CudaReduceTest, SoftmaxFamily) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = host_tensor(lcg_values(4 * 33, -30, 30, 0.125, 18), {4, 33}, kFloat32);
  expect_matches(softmax(x.to(kGpu), 1), softmax(x, 1), 1e-5, "softmax");
  expect_matches(log_softmax(x.to(kGpu), 0), log_softmax(x, 0), 1e-5, "log_softmax");
  expect_matches(logsumexp(x.to(kGpu), 1), logsumexp(x, 1), 1e-5, "logsumexp");
}

// ---------------------------------------------------------------- matrix products

TEST(CudaGemmTest, MatrixProductsMatchTheCpu) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {kFloat32, kFloat64}) {
    const double tol = dtype == kFloat32 ? 1e-4 : 1e-12;
    const std::string name(dtype_name(dtype));
    const Tensor a = host_tensor(lcg_values(37 * 19, -1, 1, 1.0 / 64, 19), {37, 19}, dtype);
    const Tensor b = host_tensor(lcg_values(19 * 23, -1, 1, 1.0 / 64, 20), {19, 23}, dtype);
    const Tensor da = a.to(kGpu), db = b.to(kGpu);
    expect_matches(mm(da, db), mm(a, b), tol, "mm " + name);
    // Transposed operands are read in place through cuBLAS's op flags.
    const Tensor col_a = da.t().contiguous().t(), col_b = db.t().contiguous().t();
    ASSERT_EQ(col_a.stride(0), 1);
    expect_matches(mm(col_a, col_b), mm(a, b), tol, "mm column-major " + name);
    expect_matches(mm(col_a, db), mm(a, b), tol, "mm mixed layouts " + name);
    expect_matches(mm(db.t(), da.t()), mm(b.t(), a.t()), tol, "mm of views " + name);
    // Vectors and 1-wide matrices (leading dimensions of size-1 dims).
    const Tensor v = host_tensor(lcg_values(19, -1, 1, 1.0 / 64, 21), {19}, dtype);
    expect_matches(matmul(da, v.to(kGpu)), matmul(a, v), tol, "mv " + name);
    expect_matches(matmul(v.to(kGpu), db), matmul(v, b), tol, "vm " + name);
    expect_matches(dot(v.to(kGpu), v.to(kGpu)), dot(v, v), tol, "dot " + name);
    expect_matches(outer(v.to(kGpu), v.to(kGpu)), outer(v, v), tol, "outer " + name);
    // A sliced operand with a leading dimension larger than its width.
    expect_matches(mm(da.slice(1, 2, 9), db.slice(0, 2, 9)), mm(a.slice(1, 2, 9), b.slice(0, 2, 9)),
                   tol, "mm of slices " + name);
    // Rows that repeat (stride 0) cannot be read by cuBLAS and are packed first.
    expect_matches(mm(da.slice(0, 0, 1).expand({5, 19}), db),
                   mm(a.slice(0, 0, 1).expand({5, 19}), b), tol, "mm expanded " + name);
  }
}

TEST(CudaGemmTest, BatchedAndBroadcast) {
  SKIP_WITHOUT_CUDA();
  for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    const double tol = dtype == kFloat64 ? 1e-12 : dtype == kFloat32 ? 1e-4 : 2e-2;
    const std::string name(dtype_name(dtype));
    const Tensor a = host_tensor(lcg_values(4 * 6 * 5, -1, 1, 1.0 / 16, 22), {4, 6, 5}, dtype);
    const Tensor b = host_tensor(lcg_values(4 * 5 * 3, -1, 1, 1.0 / 16, 23), {4, 5, 3}, dtype);
    expect_matches(bmm(a.to(kGpu), b.to(kGpu)), bmm(a, b), tol, "bmm " + name);
    const Tensor bt = b.transpose(1, 2).contiguous();
    expect_matches(bmm(a.to(kGpu), bt.to(kGpu).transpose(1, 2)), bmm(a, bt.transpose(1, 2)), tol,
                   "bmm transposed " + name);
    // A [5, 3] right operand broadcast over the batch (batch stride 0).
    const Tensor w = b.select(0, 1);
    expect_matches(matmul(a.to(kGpu), w.to(kGpu)), matmul(a, w), tol, "matmul broadcast " + name);
  }
}

TEST(CudaGemmTest, AddmmAndEmptyInnerDim) {
  SKIP_WITHOUT_CUDA();
  const Tensor a = host_tensor(lcg_values(6, -1, 1, 0.25, 24), {2, 3}, kFloat64);
  const Tensor b = host_tensor(lcg_values(12, -1, 1, 0.25, 25), {3, 4}, kFloat64);
  const Tensor c = host_tensor(lcg_values(8, -1, 1, 0.25, 26), {2, 4}, kFloat64);
  Tensor hc = c.clone(), dc = c.to(kGpu);
  addmm_(hc, a, b, 0.5, 2);
  addmm_(dc, a.to(kGpu), b.to(kGpu), 0.5, 2);
  expect_matches(dc, hc, 1e-12, "addmm_");
  // beta = 0 ignores out's contents, even nan.
  Tensor hn = full({2, 4}, kNaN, kFloat64), dn = hn.to(kGpu);
  addmm_(hn, a, b, 0, 1);
  addmm_(dn, a.to(kGpu), b.to(kGpu), 0, 1);
  expect_matches(dn, hn, 1e-12, "addmm_ beta 0");
  // k = 0: an empty sum.
  const Tensor ea = zeros({3, 0}, kFloat32), eb = zeros({0, 4}, kFloat32);
  expect_matches(mm(ea.to(kGpu), eb.to(kGpu)), mm(ea, eb), 0, "mm k=0");
  Tensor o = full({3, 4}, 2.0, kFloat32), od = o.to(kGpu);
  addmm_(o, ea, eb, 3, 1);
  addmm_(od, ea.to(kGpu), eb.to(kGpu), 3, 1);
  expect_matches(od, o, 0, "addmm_ k=0");
  // Integer products go through the host and come back.
  const Tensor ia = host_tensor({1, 2, 3, 4}, {2, 2}, kInt64);
  expect_matches(mm(ia.to(kGpu), ia.to(kGpu)), mm(ia, ia), 0, "int mm");
}

// ---------------------------------------------------------------- interop

TEST(CudaDlpackTest, ExportAndImportDeviceTensors) {
  SKIP_WITHOUT_CUDA();
  const Tensor x = arange(0, 6, 1, TensorOptions(kFloat32).device(kGpu)).view({2, 3});
  DLManagedTensor* m = to_dlpack(x.t());
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCUDA);
  EXPECT_EQ(m->dl_tensor.device.device_id, 0);
  EXPECT_EQ(m->dl_tensor.data, x.data_ptr());
  Tensor y = from_dlpack(m);
  EXPECT_TRUE(y.is_cuda());
  EXPECT_EQ(y.data_ptr(), x.data_ptr());
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

}  // namespace
}  // namespace gradwire
