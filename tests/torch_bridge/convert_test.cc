// from_torch / to_torch: every dtype both libraries have round-trips with its values and
// one shared memory; views keep sizes, strides and storage offset; writes are seen both
// ways; whichever side is dropped first, the memory lives on until the other is gone; what
// cannot be shared is refused with an InvalidArgument naming it.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/sparse.h"
#include "gradwire/torch/convert.h"
#include "support/error_text.h"
#include "torch_bridge/torch_test_util.h"

namespace gradwire::torch {
namespace {

using test::error_text;
using test_util::iota;
using test_util::values;

const std::vector<DType> kAllDTypes = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                       kInt32,   kInt64,   kUInt8,   kBool};

// 0..n-1 in `type` (bool: alternating), as torch makes it.
at::Tensor torch_iota(int64_t n, c10::ScalarType type) {
  at::Tensor t = at::arange(n, at::TensorOptions().dtype(at::kLong));
  if (type == c10::ScalarType::Bool) t = t.remainder(2);
  return t.to(type);
}

TEST(TorchDTypes, TheTablesMapEachDtypeToItsNamesakeAndBack) {
  for (DType d : kAllDTypes) {
    const c10::ScalarType s = dtype_to_torch(d);
    EXPECT_EQ(dtype_from_torch(s), d) << dtype_name(d);
    EXPECT_EQ(static_cast<int64_t>(c10::elementSize(s)), element_size(d)) << dtype_name(d);
  }
  EXPECT_EQ(dtype_to_torch(kFloat32), c10::ScalarType::Float);
  EXPECT_EQ(dtype_to_torch(kInt32), c10::ScalarType::Int);
  EXPECT_EQ(dtype_to_torch(kUInt8), c10::ScalarType::Byte);
  for (c10::ScalarType s :
       {c10::ScalarType::Char, c10::ScalarType::Short, c10::ScalarType::ComplexFloat,
        c10::ScalarType::ComplexDouble, c10::ScalarType::QInt8}) {
    EXPECT_FALSE(dtype_from_torch(s).has_value()) << c10::toString(s);
  }
  EXPECT_EQ(torch_dtype_name(c10::ScalarType::Char), "torch.int8 (Char)");
}

TEST(TorchConvert, EveryDtypeRoundTripsWithItsValuesThroughOneMemory) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    const at::Tensor t = torch_iota(7, dtype_to_torch(d));
    const Tensor g = from_torch(t);
    EXPECT_EQ(g.dtype(), d);
    EXPECT_EQ(g.sizes(), (Shape{7}));
    EXPECT_EQ(g.data_ptr(), t.data_ptr());
    EXPECT_EQ(values(g), values(t));
    const at::Tensor back = to_torch(g);
    EXPECT_EQ(back.scalar_type(), t.scalar_type());
    EXPECT_EQ(back.data_ptr(), t.data_ptr());
    EXPECT_TRUE(at::equal(back, t));
  }
}

TEST(TorchConvert, GradwireTensorsOfEveryDtypeBecomeTorchTensorsOverTheirMemory) {
  for (DType d : kAllDTypes) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor g = arange(0, 5, 1, kInt64).to(d);
    const at::Tensor t = to_torch(g);
    EXPECT_EQ(t.scalar_type(), dtype_to_torch(d));
    EXPECT_EQ(t.data_ptr(), g.data_ptr());
    EXPECT_EQ(values(t), values(g));
    EXPECT_TRUE(t.device().is_cpu());
  }
}

// Each view of a 3x4x5 tensor keeps its geometry and reads the same elements.
TEST(TorchConvert, TorchViewsKeepSizesStridesAndStorageOffset) {
  const at::Tensor base = at::arange(60, at::TensorOptions().dtype(at::kFloat)).reshape({3, 4, 5});
  const std::vector<at::Tensor> views = {base.transpose(0, 2),
                                         base.slice(1, 1, 4, 2),
                                         base.select(0, 2),
                                         base.narrow(2, 1, 3),
                                         base.select(1, 3).unsqueeze(0).expand({4, 3, 5}),
                                         base.as_strided({2, 2}, {7, 3}, 11),
                                         base.permute({1, 2, 0}).slice(0, 3)};
  for (size_t i = 0; i < views.size(); ++i) {
    SCOPED_TRACE("view " + std::to_string(i));
    const at::Tensor& v = views[i];
    const Tensor g = from_torch(v);
    EXPECT_EQ(g.sizes(), Shape(v.sizes().begin(), v.sizes().end()));
    EXPECT_EQ(g.strides(), Shape(v.strides().begin(), v.strides().end()));
    EXPECT_EQ(g.storage_offset(), v.storage_offset());
    EXPECT_EQ(g.storage().data(), base.storage().data());
    EXPECT_EQ(g.data_ptr(), v.data_ptr());
    EXPECT_EQ(values(g), values(v));
    const at::Tensor back = to_torch(g);
    EXPECT_EQ(back.sizes(), v.sizes());
    EXPECT_EQ(back.strides(), v.strides());
    EXPECT_EQ(back.storage_offset(), v.storage_offset());
    EXPECT_EQ(back.data_ptr(), v.data_ptr());
  }
}

TEST(TorchConvert, GradwireViewsKeepSizesStridesAndStorageOffset) {
  const Tensor base = arange(0, 24, 1, kFloat64).reshape({2, 3, 4});
  const std::vector<Tensor> views = {base.transpose(0, 2), base.slice(2, 1, 4, 2),
                                     base.select(1, 2), base.narrow(0, 1, 1),
                                     base.select(2, 0).unsqueeze(2).expand({2, 3, 5})};
  for (size_t i = 0; i < views.size(); ++i) {
    SCOPED_TRACE("view " + std::to_string(i));
    const Tensor& v = views[i];
    const at::Tensor t = to_torch(v);
    EXPECT_EQ(Shape(t.sizes().begin(), t.sizes().end()), v.sizes());
    EXPECT_EQ(Shape(t.strides().begin(), t.strides().end()), v.strides());
    EXPECT_EQ(t.storage_offset(), v.storage_offset());
    EXPECT_EQ(t.data_ptr(), v.data_ptr());
    EXPECT_EQ(values(t), values(v));
  }
}

TEST(TorchConvert, WritesThroughEitherSideAreSeenByTheOther) {
  at::Tensor t = at::zeros({3, 4}, at::TensorOptions().dtype(at::kDouble));
  Tensor g = from_torch(t);
  t.select(0, 1).fill_(5.0);  // torch writes a row
  EXPECT_EQ(values(g.select(0, 1)), std::vector<double>(4, 5.0));
  g.transpose(0, 1).select(0, 2).fill_(Scalar(7.0));  // gradwire writes a column
  EXPECT_EQ(values(t.select(1, 2)), std::vector<double>(3, 7.0));
  EXPECT_EQ(values(t.select(0, 0)), (std::vector<double>{0, 0, 7, 0}));

  Tensor h = zeros({4}, kInt32);
  at::Tensor u = to_torch(h);
  u.add_(3);
  EXPECT_EQ(values(h), std::vector<double>(4, 3.0));
  h.narrow(0, 2, 2).fill_(Scalar(int64_t{-1}));
  EXPECT_EQ(values(u), (std::vector<double>{3, 3, -1, -1}));
}

// A torch tensor over memory whose release this test sees: the gradwire view keeps it
// alive after every torch tensor of it is gone, and releases it with the last view.
TEST(TorchConvert, TheTorchMemoryLivesUntilTheLastGradwireViewIsGone) {
  auto* buffer = new float[8]{0, 1, 2, 3, 4, 5, 6, 7};
  std::atomic<bool> released{false};
  Tensor g;
  {
    at::Tensor t = at::from_blob(
        buffer, {8},
        [&](void* p) {
          delete[] static_cast<float*>(p);
          released = true;
        },
        at::TensorOptions().dtype(at::kFloat));
    g = from_torch(t.narrow(0, 2, 4));
  }
  EXPECT_FALSE(released);
  EXPECT_EQ(values(g), (std::vector<double>{2, 3, 4, 5}));
  Tensor copy_of_handle = g.view({2, 2});
  g = Tensor();
  EXPECT_FALSE(released);
  copy_of_handle = Tensor();
  EXPECT_TRUE(released);
}

TEST(TorchConvert, TheGradwireMemoryLivesUntilTheLastTorchViewIsGone) {
  auto* buffer = new double[6]{1, 2, 3, 4, 5, 6};
  std::atomic<bool> released{false};
  at::Tensor t;
  {
    Storage storage = Storage::borrow(buffer, 6 * sizeof(double), Device::cpu(), [&](void* p) {
      delete[] static_cast<double*>(p);
      released = true;
    });
    Tensor g(storage, {2, 3}, {3, 1}, 0, kFloat64);
    t = to_torch(g.t());
  }
  EXPECT_FALSE(released);
  EXPECT_EQ(values(t), (std::vector<double>{1, 4, 2, 5, 3, 6}));
  at::Tensor row = t.select(0, 1);
  t = at::Tensor();
  EXPECT_FALSE(released);
  EXPECT_EQ(values(row), (std::vector<double>{2, 5}));
  row = at::Tensor();
  EXPECT_TRUE(released);
}

TEST(TorchConvert, GradwireToTorchAndBackIsTheOriginalStorage) {
  const Tensor g = arange(0, 12, 1, kFloat32).reshape({3, 4});
  const Tensor back = from_torch(to_torch(g.slice(1, 1, 3)));
  EXPECT_TRUE(back.storage().is_same(g.storage()));
  EXPECT_EQ(back.storage_offset(), 1);
  EXPECT_EQ(back.strides(), (Shape{4, 1}));
  EXPECT_EQ(values(back), (std::vector<double>{1, 2, 5, 6, 9, 10}));
}

TEST(TorchConvert, TorchToGradwireAndBackSharesTheMemory) {
  at::Tensor t = at::arange(10, at::TensorOptions().dtype(at::kLong));
  at::Tensor back = to_torch(from_torch(t.slice(0, 2, 10, 3)));
  EXPECT_EQ(back.data_ptr(), t.slice(0, 2, 10, 3).data_ptr());
  EXPECT_EQ(back.storage_offset(), 2);
  EXPECT_EQ(back.strides(), (c10::IntArrayRef{3}));
  back.fill_(-4);
  EXPECT_EQ(values(t), (std::vector<double>{0, 1, -4, 3, 4, -4, 6, 7, -4, 9}));
}

TEST(TorchConvert, ASharedTorchStorageCannotGrowUnderGradwire) {
  at::Tensor t = at::zeros({4}, at::TensorOptions().dtype(at::kFloat));
  const Tensor g = from_torch(t);
  t.resize_({2});  // shrinking keeps the memory
  EXPECT_EQ(t.data_ptr(), g.data_ptr());
  EXPECT_THROW(t.resize_({1 << 20}), c10::Error);
  EXPECT_EQ(values(g), std::vector<double>(4, 0.0));
}

TEST(TorchConvert, EmptyAndZeroDimensionalTensorsConvert) {
  const at::Tensor scalar = at::scalar_tensor(2.5, at::TensorOptions().dtype(at::kDouble));
  const Tensor g = from_torch(scalar);
  EXPECT_EQ(g.dim(), 0);
  EXPECT_EQ(g.item<double>(), 2.5);
  EXPECT_EQ(to_torch(g).item<double>(), 2.5);
  const at::Tensor empty = at::empty({0, 3}, at::TensorOptions().dtype(at::kFloat));
  const Tensor e = from_torch(empty);
  EXPECT_EQ(e.sizes(), (Shape{0, 3}));
  EXPECT_EQ(e.numel(), 0);
  const at::Tensor e_back = to_torch(zeros({2, 0}, kInt64));
  EXPECT_EQ(e_back.sizes(), (c10::IntArrayRef{2, 0}));
  EXPECT_EQ(e_back.scalar_type(), c10::ScalarType::Long);
}

TEST(TorchConvert, ConvertedTensorsWorkWithTorchOpsAndTorchAutograd) {
  const Tensor a = arange(0, 6, 1, kFloat64).reshape({2, 3});
  const Tensor b = arange(1, 7, 1, kFloat64).reshape({3, 2});
  at::Tensor ta = to_torch(a).clone().requires_grad_(true);
  const at::Tensor tb = to_torch(b);
  at::Tensor product = at::matmul(ta, tb);
  // [[0,1,2],[3,4,5]] x [[1,2],[3,4],[5,6]] = [[13,16],[40,52]]
  EXPECT_EQ(values(product), (std::vector<double>{13, 16, 40, 52}));
  product.sum().backward();
  // d(sum)/d(a[i][k]) = sum_j b[k][j]: 3, 7, 11 on each row.
  EXPECT_EQ(values(ta.grad()), (std::vector<double>{3, 7, 11, 3, 7, 11}));
  // The result of from_torch carries data only.
  EXPECT_FALSE(from_torch(ta).requires_grad());
}

TEST(TorchConvertRefusals, DtypesGradwireLacksAreNamed) {
  for (c10::ScalarType s : {c10::ScalarType::Char, c10::ScalarType::Short,
                            c10::ScalarType::ComplexFloat, c10::ScalarType::ComplexDouble}) {
    const at::Tensor t = at::zeros({2}, at::TensorOptions().dtype(s));
    const std::string what = error_text<InvalidArgument>([&] { from_torch(t); });
    EXPECT_NE(what.find("from_torch"), std::string::npos) << what;
    EXPECT_NE(what.find(torch_dtype_name(s)), std::string::npos) << what;
    EXPECT_NE(what.find("has no gradwire dtype"), std::string::npos) << what;
  }
}

TEST(TorchConvertRefusals, SparseLayoutsAreNamed) {
  const at::Tensor dense = at::eye(3, at::TensorOptions().dtype(at::kFloat));
  std::string what = error_text<InvalidArgument>([&] { from_torch(dense.to_sparse()); });
  EXPECT_NE(what.find("layout Sparse"), std::string::npos) << what;
  EXPECT_NE(what.find("to_dense()"), std::string::npos) << what;
  what = error_text<InvalidArgument>([&] { from_torch(dense.to_sparse_csr()); });
  EXPECT_NE(what.find("layout SparseCsr"), std::string::npos) << what;
}

TEST(TorchConvertRefusals, QuantizedTensorsAreNamed) {
  const at::Tensor q = at::quantize_per_tensor(at::ones({4}), 0.5, 0, at::kQInt8);
  const std::string what = error_text<InvalidArgument>([&] { from_torch(q); });
  EXPECT_NE(what.find("quantized"), std::string::npos) << what;
  EXPECT_NE(what.find("torch.qint8"), std::string::npos) << what;
}

TEST(TorchConvertRefusals, MkldnnTensorsAreNamed) {
  if (!at::hasMKLDNN()) GTEST_SKIP() << "this LibTorch has no MKL-DNN";
  const at::Tensor m = at::ones({2, 2}, at::TensorOptions().dtype(at::kFloat)).to_mkldnn();
  const std::string what = error_text<InvalidArgument>([&] { from_torch(m); });
  EXPECT_NE(what.find("layout Mkldnn"), std::string::npos) << what;
}

TEST(TorchConvertRefusals, UndefinedMetaAndNegativeViewTensorsAreNamed) {
  EXPECT_NE(error_text<InvalidArgument>([] { from_torch(at::Tensor()); }).find("undefined"),
            std::string::npos);
  const at::Tensor meta = at::empty({2}, at::TensorOptions().device(at::kMeta));
  std::string what = error_text<InvalidArgument>([&] { from_torch(meta); });
  EXPECT_NE(what.find("device meta"), std::string::npos) << what;
  const at::Tensor neg = at::_neg_view(at::ones({3}));
  what = error_text<InvalidArgument>([&] { from_torch(neg); });
  EXPECT_NE(what.find("negative bit"), std::string::npos) << what;
  EXPECT_NE(what.find("resolve_neg()"), std::string::npos) << what;
}

TEST(TorchConvertRefusals, ToTorchNamesUndefinedAndSparseRowsTensors) {
  EXPECT_NE(error_text<InvalidArgument>([] { to_torch(Tensor()); }).find("undefined"),
            std::string::npos);
  const Tensor rows = sparse_rows(tensor<int64_t>({0, 2}), ones({2, 3}), {4, 3});
  const std::string what = error_text<InvalidArgument>([&] { to_torch(rows); });
  EXPECT_NE(what.find("sparse rows"), std::string::npos) << what;
  EXPECT_NE(what.find("[4, 3]"), std::string::npos) << what;
}

// On a host where both libraries see a CUDA device, a CUDA tensor converts to the same
// device and memory; elsewhere the conversion is refused naming the device.
TEST(TorchConvertCuda, CudaTensorsMapToTheSameDevice) {
  if (cuda_device_count() == 0 || !at::hasCUDA()) {
    GTEST_SKIP() << "needs a CUDA device seen by both gradwire and LibTorch";
  }
  const Tensor g = arange(0, 6, 1, kFloat32).to(Device::cuda(0));
  const at::Tensor t = to_torch(g);
  EXPECT_TRUE(t.is_cuda());
  EXPECT_EQ(t.device().index(), 0);
  EXPECT_EQ(t.data_ptr(), g.data_ptr());
  EXPECT_EQ(values(t.cpu()), iota(6));
  const Tensor back = from_torch(t.mul(2));
  EXPECT_TRUE(back.is_cuda());
  EXPECT_EQ(values(back.to(Device::cpu())), (std::vector<double>{0, 2, 4, 6, 8, 10}));
}

TEST(TorchConvertCuda, ACudaTensorWithoutCudaOnTheOtherSideIsRefusedNamingTheDevice) {
  if (cuda_device_count() == 0 || at::hasCUDA()) {
    GTEST_SKIP() << "needs a CUDA device seen by gradwire and a LibTorch without CUDA";
  }
  const Tensor g = zeros({2}, TensorOptions(kFloat32).device(Device::cuda(0)));
  const std::string what = error_text<InvalidArgument>([&] { to_torch(g); });
  EXPECT_NE(what.find("cuda:0"), std::string::npos) << what;
  EXPECT_NE(what.find("LibTorch has no CUDA"), std::string::npos) << what;
}

}  // namespace
}  // namespace gradwire::torch
