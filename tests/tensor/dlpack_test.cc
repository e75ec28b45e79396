// DLPack exchange (dlpack.h): the fields of an export, zero-copy round trips (same memory,
// writes visible both ways, one version counter), imports from a hand-built producer with
// strides, byte_offset and negative strides, that producer's deleter running exactly once
// (after the last view, or at once on an error), and every kind of bad input.
#include <dlpack/dlpack.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/dlpack.h"
#include "gradwire/tensor/factory.h"

namespace gradwire {
namespace {

// A foreign producer: owns a float buffer and counts how often its deleter runs.
struct Producer {
  std::vector<unsigned char> bytes;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  int* deleted;
  DLManagedTensor managed{};
};

void producer_deleter(DLManagedTensor* self) {
  auto* p = static_cast<Producer*>(self->manager_ctx);
  ++*p->deleted;
  delete p;
}

// Builds a managed tensor over `count` floats 0, 1, 2, ... (or raw bytes of the given
// dtype); shape and strides as given (strides may be empty for "null").
DLManagedTensor* make_foreign(int* deleted, std::vector<int64_t> shape,
                              std::vector<int64_t> strides, int64_t count,
                              DLDataType dtype = DLDataType{kDLFloat, 32, 1},
                              uint64_t byte_offset = 0, int64_t data_element_offset = 0) {
  auto* p = new Producer();
  p->deleted = deleted;
  p->shape = std::move(shape);
  p->strides = std::move(strides);
  p->bytes.resize(static_cast<size_t>(count) * 4 + 64);
  if (dtype.code == kDLFloat && dtype.bits == 32) {
    auto* f = reinterpret_cast<float*>(p->bytes.data());
    for (int64_t i = 0; i < count; ++i)
      f[i] = static_cast<float>(i);
  } else {
    for (size_t i = 0; i < p->bytes.size(); ++i)
      p->bytes[i] = static_cast<unsigned char>(i);
  }
  DLTensor& dl = p->managed.dl_tensor;
  dl.data = p->bytes.data() + data_element_offset * 4;
  dl.device = DLDevice{kDLCPU, 0};
  dl.ndim = static_cast<int>(p->shape.size());
  dl.dtype = dtype;
  dl.shape = p->shape.data();
  dl.strides = p->strides.empty() ? nullptr : p->strides.data();
  dl.byte_offset = byte_offset;
  p->managed.manager_ctx = p;
  p->managed.deleter = &producer_deleter;
  return &p->managed;
}

template <typename F>
void expect_invalid(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument mentioning '" << needle << "'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

Tensor arange_f32(int64_t n) {
  return arange(0, n, 1, kFloat32);
}

TEST(DlpackTest, ExportFields) {
  const Tensor t = arange_f32(12).reshape({3, 4});
  const long uses = t.storage().use_count();
  DLManagedTensor* m = to_dlpack(t);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->dl_tensor.data, t.data_ptr());
  EXPECT_EQ(m->dl_tensor.byte_offset, 0u);
  EXPECT_EQ(m->dl_tensor.device.device_type, kDLCPU);
  EXPECT_EQ(m->dl_tensor.device.device_id, 0);
  EXPECT_EQ(m->dl_tensor.ndim, 2);
  EXPECT_EQ(m->dl_tensor.dtype.code, kDLFloat);
  EXPECT_EQ(m->dl_tensor.dtype.bits, 32);
  EXPECT_EQ(m->dl_tensor.dtype.lanes, 1);
  EXPECT_EQ(std::vector<int64_t>(m->dl_tensor.shape, m->dl_tensor.shape + 2),
            (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(std::vector<int64_t>(m->dl_tensor.strides, m->dl_tensor.strides + 2),
            (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(t.storage().use_count(), uses + 1);  // the export holds the storage
  m->deleter(m);
  EXPECT_EQ(t.storage().use_count(), uses);
}

TEST(DlpackTest, ExportDTypeCodes) {
  struct Case {
    DType dtype;
    uint8_t code;
    uint8_t bits;
  };
  // bool has no code in DLPack 0.6 and travels as uint8 (documented in dlpack.cc).
  const std::vector<Case> cases = {{kFloat32, kDLFloat, 32}, {kFloat64, kDLFloat, 64},
                                   {kFloat16, kDLFloat, 16}, {kBFloat16, kDLBfloat, 16},
                                   {kInt32, kDLInt, 32},     {kInt64, kDLInt, 64},
                                   {kUInt8, kDLUInt, 8},     {kBool, kDLUInt, 8}};
  for (const Case& c : cases) {
    DLManagedTensor* m = to_dlpack(zeros({2}, c.dtype));
    EXPECT_EQ(m->dl_tensor.dtype.code, c.code) << c.dtype;
    EXPECT_EQ(m->dl_tensor.dtype.bits, c.bits) << c.dtype;
    EXPECT_EQ(m->dl_tensor.dtype.lanes, 1) << c.dtype;
    m->deleter(m);
  }
}

TEST(DlpackTest, ExportKeepsStorageAliveAfterTensorDies) {
  Tensor t = arange_f32(6);
  DLManagedTensor* m = to_dlpack(t.slice(0, 2, 6));
  t = Tensor();
  const float* p = static_cast<const float*>(m->dl_tensor.data);
  EXPECT_EQ(p[0], 2.0f);
  EXPECT_EQ(p[3], 5.0f);
  m->deleter(m);
}

TEST(DlpackTest, ExportNonContiguousView) {
  const Tensor base = arange_f32(12).reshape({3, 4});
  const Tensor v = base.transpose(0, 1).slice(0, 1, 4, 2);  // [2, 3] strides [2, 4] offset 1
  DLManagedTensor* m = to_dlpack(v);
  EXPECT_EQ(m->dl_tensor.data, static_cast<const void*>(base.data<float>() + 1));
  EXPECT_EQ(std::vector<int64_t>(m->dl_tensor.shape, m->dl_tensor.shape + 2),
            (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::vector<int64_t>(m->dl_tensor.strides, m->dl_tensor.strides + 2),
            (std::vector<int64_t>{2, 4}));
  const float* p = static_cast<const float*>(m->dl_tensor.data);
  EXPECT_EQ(p[1 * 2 + 2 * 4], 11.0f);  // v[1][2] = base[2][3]
  m->deleter(m);
}

TEST(DlpackTest, RoundTripIsZeroCopyBothWays) {
  Tensor x = arange_f32(8).reshape({2, 4});
  Tensor y = from_dlpack(to_dlpack(x));
  EXPECT_EQ(y.data_ptr(), x.data_ptr());
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(y.strides(), x.strides());
  EXPECT_EQ(y.dtype(), kFloat32);
  y.select(0, 1).select(0, 2).fill_(-1.5);
  EXPECT_EQ(x.at({1, 2}), -1.5);
  x.select(0, 0).select(0, 0).fill_(42);
  EXPECT_EQ(y.at({0, 0}), 42.0);
  // One storage, so one version counter for autograd's checks.
  const uint64_t v = y.version();
  x.zero_();
  EXPECT_EQ(y.version(), v + 1);
}

TEST(DlpackTest, RoundTripOfViewsAndEveryDType) {
  for (DType dtype : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    const Tensor base = arange_f32(24).reshape({2, 3, 4}).to(dtype);
    const Tensor view = base.permute({2, 0, 1}).slice(0, 1, 4, 2);
    const Tensor back = from_dlpack(to_dlpack(view));
    EXPECT_EQ(back.dtype(), dtype);  // a gradwire export comes back as itself, bool too
    EXPECT_EQ(back.data_ptr(), view.data_ptr());
    EXPECT_EQ(back.sizes(), view.sizes());
    EXPECT_EQ(back.strides(), view.strides());
    EXPECT_EQ(back.to_vector<double>(), view.to_vector<double>());
  }
}

TEST(DlpackTest, ForeignDeleterRunsOnceAfterLastView) {
  int deleted = 0;
  Tensor t = from_dlpack(make_foreign(&deleted, {2, 3}, {3, 1}, 6));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  Tensor view = t.transpose(0, 1);
  Tensor row = t.select(0, 1);
  t = Tensor();
  view = Tensor();
  EXPECT_EQ(deleted, 0);
  EXPECT_EQ(row.to_vector<float>(), (std::vector<float>{3, 4, 5}));
  row = Tensor();
  EXPECT_EQ(deleted, 1);
}

TEST(DlpackTest, ForeignWritesAreVisibleToTheProducer) {
  int deleted = 0;
  DLManagedTensor* m = make_foreign(&deleted, {4}, {}, 4);
  float* data = static_cast<float*>(m->dl_tensor.data);
  Tensor t = from_dlpack(m);
  EXPECT_EQ(t.data_ptr(), static_cast<void*>(data));
  t.select(0, 2).fill_(9);
  EXPECT_EQ(data[2], 9.0f);
  data[0] = -7.0f;
  EXPECT_EQ(t.at({0}), -7.0);
  t = Tensor();
  EXPECT_EQ(deleted, 1);
}

TEST(DlpackTest, ForeignNullStridesAreRowMajor) {
  int deleted = 0;
  Tensor t = from_dlpack(make_foreign(&deleted, {2, 2, 3}, {}, 12));
  EXPECT_EQ(t.strides(), (Shape{6, 3, 1}));
  EXPECT_EQ(t.at({1, 0, 2}), 8.0);
  EXPECT_TRUE(t.is_contiguous());
}

TEST(DlpackTest, ForeignStridedLayout) {
  int deleted = 0;
  // Column-major 3x4 over 12 floats: element (i, j) at i + 3j.
  Tensor t = from_dlpack(make_foreign(&deleted, {3, 4}, {1, 3}, 12));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.at({2, 1}), 5.0);
  EXPECT_EQ(t.at({1, 3}), 10.0);
  EXPECT_EQ(t.contiguous().to_vector<float>(),
            (std::vector<float>{0, 3, 6, 9, 1, 4, 7, 10, 2, 5, 8, 11}));
}

TEST(DlpackTest, ForeignByteOffset) {
  int deleted = 0;
  Tensor t = from_dlpack(make_foreign(&deleted, {3}, {1}, 16, DLDataType{kDLFloat, 32, 1},
                                      /*byte_offset=*/8));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2, 3, 4}));
  // Strided with an offset: every other element starting at element 5.
  Tensor u = from_dlpack(make_foreign(&deleted, {3}, {2}, 16, DLDataType{kDLFloat, 32, 1},
                                      /*byte_offset=*/20));
  EXPECT_EQ(u.to_vector<float>(), (std::vector<float>{5, 7, 9}));
}

TEST(DlpackTest, ForeignNegativeStrides) {
  int deleted = 0;
  // data points at element 3; stride -1 walks back to element 0.
  Tensor t = from_dlpack(make_foreign(&deleted, {4}, {-1}, 8, DLDataType{kDLFloat, 32, 1},
                                      /*byte_offset=*/0, /*data_element_offset=*/3));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{3, 2, 1, 0}));
  // A 2-d view reversed along rows only.
  Tensor u = from_dlpack(make_foreign(&deleted, {2, 3}, {-3, 1}, 6, DLDataType{kDLFloat, 32, 1},
                                      /*byte_offset=*/12));
  EXPECT_EQ(u.to_vector<float>(), (std::vector<float>{3, 4, 5, 0, 1, 2}));
  t = Tensor();
  u = Tensor();
  EXPECT_EQ(deleted, 2);
}

TEST(DlpackTest, ForeignDTypes) {
  int deleted = 0;
  struct Case {
    DLDataType dl;
    DType expected;
  };
  const std::vector<Case> cases = {{{kDLFloat, 16, 1}, kFloat16},
                                   {{kDLFloat, 64, 1}, kFloat64},
                                   {{kDLBfloat, 16, 1}, kBFloat16},
                                   {{kDLInt, 32, 1}, kInt32},
                                   {{kDLInt, 64, 1}, kInt64},
                                   {{kDLUInt, 8, 1}, kUInt8},
                                   {{6, 8, 1}, kBool}};  // kDLBool of DLPack 0.8
  for (const Case& c : cases) {
    Tensor t = from_dlpack(make_foreign(&deleted, {2}, {1}, 8, c.dl));
    EXPECT_EQ(t.dtype(), c.expected) << int{c.dl.code} << "/" << int{c.dl.bits};
  }
  EXPECT_EQ(deleted, static_cast<int>(cases.size()));
  // A uint8 export read back as uint8 bytes: 0, 1, 2, ...
  Tensor bytes = from_dlpack(make_foreign(&deleted, {3}, {1}, 8, DLDataType{kDLUInt, 8, 1}));
  EXPECT_EQ(bytes.to_vector<uint8_t>(), (std::vector<uint8_t>{0, 1, 2}));
}

TEST(DlpackTest, PinnedHostMemoryImportsAsCpu) {
  int deleted = 0;
  DLManagedTensor* m = make_foreign(&deleted, {2}, {1}, 2);
  m->dl_tensor.device = DLDevice{kDLCUDAHost, 0};
  Tensor t = from_dlpack(m);
  EXPECT_TRUE(t.device().is_cpu());
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1}));
}

TEST(DlpackTest, ZeroElementsWithNullData) {
  int deleted = 0;
  DLManagedTensor* m = make_foreign(&deleted, {0, 3}, {}, 0);
  m->dl_tensor.data = nullptr;
  Tensor t = from_dlpack(m);
  EXPECT_EQ(t.numel(), 0);
  EXPECT_EQ(t.sizes(), (Shape{0, 3}));
  t = Tensor();
  EXPECT_EQ(deleted, 1);
}

TEST(DlpackTest, BadDTypesCallTheDeleterAndThrow) {
  struct Case {
    DLDataType dl;
    std::string needle;
  };
  const std::vector<Case> cases = {{{kDLComplex, 64, 1}, "code 5"},
                                   {{kDLFloat, 8, 1}, "bits 8"},
                                   {{kDLInt, 16, 1}, "bits 16"},
                                   {{kDLUInt, 32, 1}, "bits 32"},
                                   {{kDLFloat, 32, 4}, "lanes 4"},
                                   {{kDLOpaqueHandle, 64, 1}, "code 3"},
                                   {{6, 1, 1}, "bits 1"}};
  for (const Case& c : cases) {
    int deleted = 0;
    expect_invalid([&] { from_dlpack(make_foreign(&deleted, {2}, {1}, 2, c.dl)); }, c.needle);
    EXPECT_EQ(deleted, 1) << c.needle;
  }
}

TEST(DlpackTest, BadGeometryAndDevicesCallTheDeleterAndThrow) {
  int deleted = 0;
  DLManagedTensor* m = make_foreign(&deleted, {2}, {1}, 2);
  m->dl_tensor.device = DLDevice{kDLOpenCL, 0};
  expect_invalid([&] { from_dlpack(m); }, "device type 4");
  EXPECT_EQ(deleted, 1);

  m = make_foreign(&deleted, {2}, {1}, 2);
  m->dl_tensor.device = DLDevice{kDLCUDA, cuda_device_count()};
  expect_invalid([&] { from_dlpack(m); }, "CUDA device");
  EXPECT_EQ(deleted, 2);

  m = make_foreign(&deleted, {2, -3}, {}, 2);
  expect_invalid([&] { from_dlpack(m); }, "negative size");
  EXPECT_EQ(deleted, 3);

  m = make_foreign(&deleted, {2}, {1}, 2);
  m->dl_tensor.ndim = -1;
  expect_invalid([&] { from_dlpack(m); }, "negative ndim");
  EXPECT_EQ(deleted, 4);

  m = make_foreign(&deleted, {2}, {1}, 2);
  m->dl_tensor.shape = nullptr;
  expect_invalid([&] { from_dlpack(m); }, "null shape");
  EXPECT_EQ(deleted, 5);

  m = make_foreign(&deleted, {2}, {1}, 2);
  m->dl_tensor.data = nullptr;
  expect_invalid([&] { from_dlpack(m); }, "null data");
  EXPECT_EQ(deleted, 6);

  m = make_foreign(&deleted, {2}, {1}, 4, DLDataType{kDLFloat, 32, 1}, /*byte_offset=*/2);
  expect_invalid([&] { from_dlpack(m); }, "aligned");
  EXPECT_EQ(deleted, 7);

  m = make_foreign(&deleted, {3}, {INT64_MAX / 2}, 4);
  expect_invalid([&] { from_dlpack(m); }, "overflows");
  EXPECT_EQ(deleted, 8);

  expect_invalid([&] { from_dlpack(nullptr); }, "null");
  expect_invalid([&] { to_dlpack(Tensor()); }, "undefined");
}

TEST(DlpackTest, NullDeleterIsAllowed) {
  // A producer that keeps ownership itself passes no deleter.
  std::vector<float> data = {1, 2, 3};
  int64_t shape[1] = {3};
  DLManagedTensor m{};
  m.dl_tensor.data = data.data();
  m.dl_tensor.device = DLDevice{kDLCPU, 0};
  m.dl_tensor.ndim = 1;
  m.dl_tensor.dtype = DLDataType{kDLFloat, 32, 1};
  m.dl_tensor.shape = shape;
  m.deleter = nullptr;
  Tensor t = from_dlpack(&m);
  EXPECT_EQ(t.to_vector<float>(), data);
}

}  // namespace
}  // namespace gradwire
