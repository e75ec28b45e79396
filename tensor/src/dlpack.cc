// DLPack export and import (dlpack.h, ABI version 0.6 as Debian 12 ships it).
//
// Element types: float16/32/64 as kDLFloat, bfloat16 as kDLBfloat, int32/int64 as kDLInt,
// uint8 as kDLUInt 8. DLPack 0.6 has no boolean code, so bool is exported as kDLUInt 8
// (the same bytes: 0 or 1), which a foreign consumer sees as uint8. On import, kDLBool
// (code 6, added in DLPack 0.8) with 8 bits is accepted as bool, so booleans from newer
// producers keep their dtype.
//
// Devices: kDLCPU and kDLCUDAHost (pinned host memory, readable by the CPU) import as the
// CPU; kDLCUDA as cuda:<device_id>, which needs a build with CUDA and that device.
//
// CUDA tensors: gradwire's device work runs on the legacy default stream, which orders
// itself with every blocking stream, so a consumer that uses such a stream sees the
// exported data complete without an explicit synchronisation.
//
// A tensor exported by gradwire and imported back is recognised by its deleter and
// becomes a view of the original storage, so both share one version counter; the
// DLManagedTensor is released at once in that case.
#include "gradwire/tensor/dlpack.h"

#include <dlpack/dlpack.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include "gradwire/config.h"
#include "gradwire/core/check.h"

namespace gradwire {

namespace {

// The code DLPack 0.8 gave to booleans; 0.6 headers do not name it.
constexpr uint8_t kDLBoolCode = 6;

// What a gradwire export keeps alive: the tensor (hence its storage) and the shape and
// strides arrays the DLTensor points into.
struct ExportContext {
  Tensor tensor;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
};

void delete_export(DLManagedTensor* self) {
  if (self != nullptr) delete static_cast<ExportContext*>(self->manager_ctx);
}

DLDataType to_dl_dtype(DType t) {
  DLDataType dt{};
  dt.lanes = 1;
  dt.bits = static_cast<uint8_t>(element_size(t) * 8);
  switch (t) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kFloat16:
      dt.code = kDLFloat;
      break;
    case DType::kBFloat16:
      dt.code = kDLBfloat;
      break;
    case DType::kInt32:
    case DType::kInt64:
      dt.code = kDLInt;
      break;
    case DType::kUInt8:
    case DType::kBool:
      dt.code = kDLUInt;
      break;
  }
  return dt;
}

DType from_dl_dtype(DLDataType dt) {
  GRADWIRE_CHECK_ARG(dt.lanes == 1)
      << "from_dlpack: vector dtypes are not supported (code " << int{dt.code} << ", bits "
      << int{dt.bits} << ", lanes " << dt.lanes << ")";
  switch (dt.code) {
    case kDLFloat:
      if (dt.bits == 32) return kFloat32;
      if (dt.bits == 64) return kFloat64;
      if (dt.bits == 16) return kFloat16;
      break;
    case kDLBfloat:
      if (dt.bits == 16) return kBFloat16;
      break;
    case kDLInt:
      if (dt.bits == 32) return kInt32;
      if (dt.bits == 64) return kInt64;
      break;
    case kDLUInt:
      if (dt.bits == 8) return kUInt8;
      break;
    case kDLBoolCode:
      if (dt.bits == 8) return kBool;
      break;
    default:
      break;
  }
  GRADWIRE_THROW(InvalidArgument)
      << "from_dlpack: no gradwire dtype for DLPack dtype code " << int{dt.code} << ", bits "
      << int{dt.bits} << ", lanes " << dt.lanes
      << " (supported: float 16/32/64, bfloat 16, int 32/64, uint 8, bool 8)";
}

Device from_dl_device(DLDevice d) {
  switch (d.device_type) {
    case kDLCPU:
    case kDLCUDAHost:
      return Device::cpu();
    case kDLCUDA: {
      GRADWIRE_CHECK_ARG(d.device_id >= 0 && d.device_id < cuda_device_count())
          << "from_dlpack: tensor on CUDA device " << d.device_id << ", but this process has "
          << cuda_device_count() << " CUDA device(s)"
          << (GRADWIRE_HAS_CUDA ? "" : " (gradwire was built without CUDA)");
      return Device::cuda(d.device_id);
    }
    default:
      break;
  }
  GRADWIRE_THROW(InvalidArgument) << "from_dlpack: unsupported DLPack device type "
                                  << static_cast<int>(d.device_type) << " (device id "
                                  << d.device_id << "); only CPU and CUDA tensors are accepted";
}

// Calls the producer's deleter when the import fails before a storage took ownership.
struct ManagedOwner {
  void operator()(DLManagedTensor* m) const {
    if (m->deleter != nullptr) m->deleter(m);
  }
};

int64_t checked_add(int64_t a, int64_t b) {
  int64_t r;
  GRADWIRE_CHECK_ARG(!__builtin_add_overflow(a, b, &r))
      << "from_dlpack: the tensor's extent overflows int64";
  return r;
}

int64_t checked_mul(int64_t a, int64_t b) {
  int64_t r;
  GRADWIRE_CHECK_ARG(!__builtin_mul_overflow(a, b, &r))
      << "from_dlpack: the tensor's extent overflows int64";
  return r;
}

}  // namespace

DLManagedTensor* to_dlpack(const Tensor& t) {
  GRADWIRE_CHECK_ARG(t.defined()) << "to_dlpack: tensor is undefined";
  auto ctx = std::make_unique<ExportContext>();
  ctx->tensor = t.detach();
  ctx->shape = t.sizes();
  ctx->strides = t.strides();
  DLTensor& dl = ctx->managed.dl_tensor;
  // The element pointer itself, with no byte_offset: consumers that ignore byte_offset
  // still read the right elements.
  dl.data = t.data_ptr();
  dl.byte_offset = 0;
  dl.device.device_type = t.is_cuda() ? kDLCUDA : kDLCPU;
  dl.device.device_id = t.is_cuda() ? t.device().index : 0;
  dl.ndim = static_cast<int>(t.dim());
  dl.dtype = to_dl_dtype(t.dtype());
  dl.shape = ctx->shape.data();
  dl.strides = ctx->strides.data();
  ctx->managed.manager_ctx = ctx.get();
  ctx->managed.deleter = &delete_export;
  return &ctx.release()->managed;
}

Tensor from_dlpack(DLManagedTensor* managed) {
  GRADWIRE_CHECK_ARG(managed != nullptr) << "from_dlpack: null DLManagedTensor";
  std::unique_ptr<DLManagedTensor, ManagedOwner> owner(managed);

  if (managed->deleter == &delete_export && managed->manager_ctx != nullptr) {
    // One of ours: view the original storage directly (one version counter, no extra
    // indirection) and release the export now.
    Tensor original = static_cast<ExportContext*>(managed->manager_ctx)->tensor;
    return original.detach();
  }

  const DLTensor& dl = managed->dl_tensor;
  const DType dtype = from_dl_dtype(dl.dtype);
  const Device device = from_dl_device(dl.device);
  GRADWIRE_CHECK_ARG(dl.ndim >= 0) << "from_dlpack: negative ndim " << dl.ndim;
  GRADWIRE_CHECK_ARG(dl.ndim == 0 || dl.shape != nullptr)
      << "from_dlpack: null shape for a tensor of " << dl.ndim << " dims";
  Shape sizes(dl.shape, dl.shape + dl.ndim);
  for (int64_t s : sizes) {
    GRADWIRE_CHECK_ARG(s >= 0) << "from_dlpack: negative size in shape " << shape_to_string(sizes);
  }
  const int64_t numel = shape_numel(sizes);
  Shape strides =
      dl.strides != nullptr ? Shape(dl.strides, dl.strides + dl.ndim) : contiguous_strides(sizes);
  GRADWIRE_CHECK_ARG(dl.data != nullptr || numel == 0)
      << "from_dlpack: null data pointer for shape " << shape_to_string(sizes);
  GRADWIRE_CHECK_ARG(dl.byte_offset <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      << "from_dlpack: byte_offset " << dl.byte_offset << " is out of range";

  // The storage starts at the lowest element the strides reach (strides may be negative)
  // and ends after the highest, so the Tensor's own bounds check holds.
  const int64_t esize = element_size(dtype);
  int64_t lo = 0, hi = 0;
  if (numel > 0) {
    for (size_t d = 0; d < sizes.size(); ++d) {
      const int64_t reach = checked_mul(strides[d], sizes[d] - 1);
      if (reach < 0) {
        lo = checked_add(lo, reach);
      } else {
        hi = checked_add(hi, reach);
      }
    }
  }
  const int64_t span_elements = numel > 0 ? checked_add(checked_add(hi, -lo), 1) : 0;
  const int64_t span_bytes = checked_mul(span_elements, esize);
  char* base = static_cast<char*>(dl.data);
  if (numel > 0) {
    char* first = base + dl.byte_offset;
    GRADWIRE_CHECK_ARG(reinterpret_cast<uintptr_t>(first) % static_cast<uintptr_t>(esize) == 0)
        << "from_dlpack: data pointer plus byte_offset " << dl.byte_offset
        << " is not aligned to the " << esize << "-byte elements of " << dtype_name(dtype);
    base = first + checked_mul(lo, esize);
  }

  auto deleter = [managed](void*) {
    if (managed->deleter != nullptr) managed->deleter(managed);
  };
  Storage storage =
      Storage::borrow(base, static_cast<size_t>(span_bytes), device, std::move(deleter));
  owner.release();  // the storage calls the producer's deleter from now on
  return Tensor(std::move(storage), std::move(sizes), std::move(strides), -lo, dtype);
}

}  // namespace gradwire
