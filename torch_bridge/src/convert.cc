// from_torch / to_torch: one storage seen by both libraries.
//
// A torch storage seen by gradwire: a gradwire Storage borrowing the torch storage's
// memory, whose deleter holds a c10::Storage (a reference to the c10::StorageImpl) until
// the last gradwire tensor of it is gone.
//
// A gradwire storage seen by torch: a c10::StorageImpl whose DataPtr points at the
// gradwire storage's memory, with a heap-held gradwire Storage as its context and
// release_gradwire_storage as its deleter. from_torch recognises that deleter and returns
// a view of the gradwire storage itself, so a round trip gwire -> torch -> gwire adds no
// layer.
//
// The torch tensor is made directly from a TensorImpl over that storage (no dispatched
// op), which works for CUDA storages too and keeps sizes, strides and offset exactly.
#include "gradwire/torch/convert.h"

#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/Allocator.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/Storage.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <c10/util/typeid.h>

#include <sstream>
#include <utility>
#include <vector>

#include "gradwire/core/check.h"
#include "gradwire/core/error.h"

namespace gradwire::torch {

namespace {

// The DataPtr deleter of a torch storage made by to_torch: its context is a heap-held
// gradwire Storage.
void release_gradwire_storage(void* ctx) {
  delete static_cast<Storage*>(ctx);
}

const char* python_dtype_name(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Byte:
      return "torch.uint8";
    case c10::ScalarType::Char:
      return "torch.int8";
    case c10::ScalarType::Short:
      return "torch.int16";
    case c10::ScalarType::Int:
      return "torch.int32";
    case c10::ScalarType::Long:
      return "torch.int64";
    case c10::ScalarType::Half:
      return "torch.float16";
    case c10::ScalarType::Float:
      return "torch.float32";
    case c10::ScalarType::Double:
      return "torch.float64";
    case c10::ScalarType::ComplexHalf:
      return "torch.complex32";
    case c10::ScalarType::ComplexFloat:
      return "torch.complex64";
    case c10::ScalarType::ComplexDouble:
      return "torch.complex128";
    case c10::ScalarType::Bool:
      return "torch.bool";
    case c10::ScalarType::QInt8:
      return "torch.qint8";
    case c10::ScalarType::QUInt8:
      return "torch.quint8";
    case c10::ScalarType::QInt32:
      return "torch.qint32";
    case c10::ScalarType::BFloat16:
      return "torch.bfloat16";
    case c10::ScalarType::QUInt4x2:
      return "torch.quint4x2";
    case c10::ScalarType::QUInt2x4:
      return "torch.quint2x4";
    default:
      return nullptr;
  }
}

// The gradwire device of a torch tensor's device.
Device device_from_torch(const c10::Device& device) {
  if (device.is_cpu()) return Device::cpu();
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : 0;
    GRADWIRE_CHECK_ARG(index < cuda_device_count())
        << "from_torch: the torch tensor is on " << device.str() << ", but gradwire sees "
        << cuda_device_count() << " CUDA device(s)"
        << (cuda_device_count() == 0 ? " (is it built with CUDA?)" : "");
    return Device::cuda(index);
  }
  GRADWIRE_THROW(InvalidArgument) << "from_torch: the torch tensor is on device " << device.str()
                                  << "; gradwire takes CPU and CUDA tensors";
}

// The torch device and dispatch key of a gradwire device.
std::pair<c10::Device, c10::DispatchKey> device_to_torch(Device device) {
  if (!device.is_cuda()) return {c10::Device(c10::DeviceType::CPU), c10::DispatchKey::CPU};
  const auto& cuda = at::detail::getCUDAHooks();
  GRADWIRE_CHECK_ARG(cuda.hasCUDA() && device.index < cuda.getNumGPUs())
      << "to_torch: the gradwire tensor is on " << device.str() << ", but LibTorch "
      << (cuda.hasCUDA() ? "sees " + std::to_string(cuda.getNumGPUs()) + " CUDA device(s)"
                         : std::string("has no CUDA (a CPU-only build, or no device)"));
  return {c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(device.index)),
          c10::DispatchKey::CUDA};
}

// What from_torch refuses before it looks at the memory.
void check_shareable(const at::Tensor& t) {
  GRADWIRE_CHECK_ARG(t.defined()) << "from_torch: the torch tensor is undefined";
  if (t.layout() != c10::kStrided) {
    std::ostringstream layout;
    layout << t.layout();
    GRADWIRE_THROW(InvalidArgument)
        << "from_torch: the torch tensor has layout " << layout.str()
        << "; only strided tensors can be shared (call to_dense() on a sparse tensor)";
  }
  GRADWIRE_CHECK_ARG(!t.is_quantized())
      << "from_torch: the torch tensor is quantized (dtype " << torch_dtype_name(t.scalar_type())
      << "); gradwire has no quantized dtypes (call dequantize())";
  GRADWIRE_CHECK_ARG(dtype_from_torch(t.scalar_type()).has_value())
      << "from_torch: torch dtype " << torch_dtype_name(t.scalar_type())
      << " has no gradwire dtype (gradwire has float32, float64, float16, bfloat16, int32, "
         "int64, uint8 and bool)";
  GRADWIRE_CHECK_ARG(t.has_storage())
      << "from_torch: the torch tensor has no storage (a nested tensor or a wrapper such as "
         "a functional or batched tensor); only tensors over a plain storage can be shared";
  GRADWIRE_CHECK_ARG(!t.is_neg() && !t.is_conj())
      << "from_torch: the torch tensor has its " << (t.is_neg() ? "negative" : "conjugate")
      << " bit set, so its memory does not hold its values (call resolve_neg() or "
         "resolve_conj() first)";
}

}  // namespace

std::optional<DType> dtype_from_torch(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return kFloat32;
    case c10::ScalarType::Double:
      return kFloat64;
    case c10::ScalarType::Half:
      return kFloat16;
    case c10::ScalarType::BFloat16:
      return kBFloat16;
    case c10::ScalarType::Int:
      return kInt32;
    case c10::ScalarType::Long:
      return kInt64;
    case c10::ScalarType::Byte:
      return kUInt8;
    case c10::ScalarType::Bool:
      return kBool;
    default:
      return std::nullopt;
  }
}

c10::ScalarType dtype_to_torch(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return c10::ScalarType::Float;
    case DType::kFloat64:
      return c10::ScalarType::Double;
    case DType::kFloat16:
      return c10::ScalarType::Half;
    case DType::kBFloat16:
      return c10::ScalarType::BFloat16;
    case DType::kInt32:
      return c10::ScalarType::Int;
    case DType::kInt64:
      return c10::ScalarType::Long;
    case DType::kUInt8:
      return c10::ScalarType::Byte;
    case DType::kBool:
      return c10::ScalarType::Bool;
  }
  GRADWIRE_THROW(InvalidArgument) << "dtype_to_torch: unknown gradwire dtype "
                                  << static_cast<int>(dtype);
}

std::string torch_dtype_name(c10::ScalarType type) {
  const char* python = python_dtype_name(type);
  const std::string c10_name = c10::toString(type);
  return python != nullptr ? std::string(python) + " (" + c10_name + ")" : c10_name;
}

Tensor from_torch(const at::Tensor& t) {
  check_shareable(t);
  const DType dtype = *dtype_from_torch(t.scalar_type());
  const c10::Storage& st = t.storage();
  Storage storage;
  if (st.data_ptr().get_deleter() == &release_gradwire_storage) {
    // Made by to_torch: the gradwire storage itself.
    storage = *static_cast<const Storage*>(st.data_ptr().get_context());
  } else {
    const Device device = device_from_torch(t.device());
    // Growing the storage would move the memory gradwire views. Written only once, so
    // later conversions of the storage only read the flag.
    if (st.resizable()) st.unsafeGetStorageImpl()->set_resizable(false);
    storage = Storage::borrow(st.data(), st.nbytes(), device, [keep = st](void*) {});
  }
  const auto sizes = t.sizes();
  const auto strides = t.strides();
  return Tensor(std::move(storage), Shape(sizes.begin(), sizes.end()),
                Shape(strides.begin(), strides.end()), t.storage_offset(), dtype);
}

at::Tensor to_torch(const Tensor& t) {
  GRADWIRE_CHECK_ARG(t.defined()) << "to_torch: the gradwire tensor is undefined";
  GRADWIRE_CHECK_ARG(!t.is_sparse())
      << "to_torch: the gradwire tensor " << shape_to_string(t.sizes())
      << " is sparse rows; convert its indices() and values() instead";
  const auto [device, key] = device_to_torch(t.device());
  const Storage& storage = t.storage();
  c10::DataPtr data(storage.data(), new Storage(storage), &release_gradwire_storage, device);
  c10::Storage st(c10::Storage::use_byte_size_t(), storage.nbytes(), std::move(data),
                  /*allocator=*/nullptr, /*resizable=*/false);
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      std::move(st), c10::DispatchKeySet(key),
      caffe2::TypeMeta::fromScalarType(dtype_to_torch(t.dtype())));
  impl->set_sizes_and_strides(c10::IntArrayRef(t.sizes()), c10::IntArrayRef(t.strides()),
                              t.storage_offset());
  return at::Tensor(std::move(impl));
}

}  // namespace gradwire::torch
