// Shared machinery of the CUDA backend: error checks, a device guard, launch sizing, the
// strided indexer the elementwise kernels use, and element conversions usable on the
// device.
//
// Every CUDA runtime or cuBLAS call goes through GRADWIRE_CUDA_CHECK / GRADWIRE_CUBLAS_CHECK,
// which turn a failure into gradwire::Error naming the call, the device and CUDA's own
// description of the error, so that "the GPU went away" reaches the user as a typed error
// and never as a silently wrong result.
//
// Streams and synchronisation: every kernel, copy and cuBLAS call of the backend runs on
// the legacy default stream of the current device, so work is ordered as it was issued.
// Copies that touch host memory are synchronous with respect to the host (they return
// once the host buffer may be reused or read); kernels are asynchronous, and an error in
// one surfaces at the next synchronising call. Temporaries (staging buffers, packed
// operands) may be dropped as soon as the work using them is issued: their storage is
// released with cudaFree, which waits for the device to finish that work.
//
// Thread-safety: the helpers are stateless apart from CUDA's per-thread current device,
// which DeviceGuard saves and restores.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <type_traits>

#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/tensor.h"
#include "loop.h"

namespace gradwire::detail::cuda {

// Throws gradwire::Error for a failed CUDA runtime call. `call` is the stringified call;
// only its function name is kept in the message.
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line);

// The device ordinal CUDA currently uses on this thread, or -1 when it cannot tell.
int current_device_or_minus_one() noexcept;

#define GRADWIRE_CUDA_CHECK(expr)                                                                \
  do {                                                                                           \
    const cudaError_t gradwire_cuda_err_ = (expr);                                               \
    if (gradwire_cuda_err_ != cudaSuccess) {                                                     \
      ::gradwire::detail::cuda::throw_cuda_error(gradwire_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                                            \
  } while (0)

// Checks that the kernel launched just before could start (bad configuration, no kernel
// image for this GPU, a sticky error from earlier work).
#define GRADWIRE_CUDA_CHECK_LAUNCH(kernel_name) \
  ::gradwire::detail::cuda::check_launch(kernel_name, __FILE__, __LINE__)
void check_launch(const char* kernel_name, const char* file, int line);

// Makes `device` current for the scope and restores the previous device afterwards, so
// that the backend never leaves the caller's thread on another device.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_;
  bool switched_;
};

// ---------------------------------------------------------------- launch sizing

inline constexpr int kBlockSize = 256;
// Grid-stride loops cover any count, so the grid stays bounded; 2^16 blocks of 256
// threads saturate every current GPU.
inline constexpr int64_t kMaxBlocks = int64_t{1} << 16;

inline unsigned int blocks_for(int64_t n) {
  return static_cast<unsigned int>(
      std::clamp<int64_t>((n + kBlockSize - 1) / kBlockSize, 1, kMaxBlocks));
}

// ---------------------------------------------------------------- strided indexing

// Operands of one elementwise kernel rarely need many dims once size-1 dims are dropped and
// dims that are contiguous for every operand are merged (make_plan); what is left must fit
// in this fixed array so the geometry can travel by value as a kernel argument.
inline constexpr int kMaxKernelDims = 16;

// Maps a linear (row-major) index over the iteration shape to one operand's element offset.
struct StridedIndexer {
  int ndim = 0;
  int64_t sizes[kMaxKernelDims] = {};
  int64_t strides[kMaxKernelDims] = {};  // elements

  __host__ __device__ int64_t offset(int64_t linear) const {
    // The two common shapes (one merged dim, or a single element) skip the divisions.
    if (ndim == 1) return linear * strides[0];
    int64_t off = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t size = sizes[d];
      off += (linear % size) * strides[d];
      linear /= size;
    }
    return off;
  }
};

// Indexers for N operands sharing `shape`, with their dims merged jointly. `strides[k]` are
// operand k's element strides over `shape`. Throws InvalidArgument naming `op` when more
// than kMaxKernelDims dims remain.
template <size_t N>
std::array<StridedIndexer, N> make_indexers(const char* op, const Shape& shape,
                                            const std::array<Shape, N>& strides) {
  const LoopPlan<N> plan = make_plan<N>(shape, strides);
  const int ndim = static_cast<int>(plan.sizes.size());
  GRADWIRE_CHECK_ARG(ndim <= kMaxKernelDims)
      << op << ": a CUDA tensor of shape " << shape_to_string(shape) << " has " << ndim
      << " dims that cannot be merged; the CUDA kernels handle at most " << kMaxKernelDims;
  std::array<StridedIndexer, N> out{};
  for (size_t k = 0; k < N; ++k) {
    out[k].ndim = ndim;
    for (int d = 0; d < ndim; ++d) {
      out[k].sizes[d] = plan.sizes[d];
      out[k].strides[d] = plan.strides[k][d];
    }
  }
  return out;
}

// ---------------------------------------------------------------- element types on device

// The type arithmetic happens in: compute_t (dispatch.h: float for the 16-bit floats),
// except int for bool so that the generic arithmetic compiles (results are mapped back by
// != 0).
template <typename T>
using dcompute_t = std::conditional_t<std::is_same_v<T, bool>, int, compute_t<T>>;

template <typename T>
__host__ __device__ inline bool is_nan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return v != v;
  } else {
    return false;
  }
}

// Writes `v` into element `i` of a buffer whose dtype is only known at run time (reduction
// outputs, whose dtype the frontend chooses independently of the input's).
template <typename V>
__device__ inline void store_as(void* base, DType dtype, int64_t i, V v) {
  switch (dtype) {
    case DType::kFloat32:
      static_cast<float*>(base)[i] = convert<float>(v);
      break;
    case DType::kFloat64:
      static_cast<double*>(base)[i] = convert<double>(v);
      break;
    case DType::kFloat16:
      static_cast<Half*>(base)[i] = convert<Half>(v);
      break;
    case DType::kBFloat16:
      static_cast<BFloat16*>(base)[i] = convert<BFloat16>(v);
      break;
    case DType::kInt32:
      static_cast<int32_t*>(base)[i] = convert<int32_t>(v);
      break;
    case DType::kInt64:
      static_cast<int64_t*>(base)[i] = convert<int64_t>(v);
      break;
    case DType::kUInt8:
      static_cast<uint8_t*>(base)[i] = convert<uint8_t>(v);
      break;
    case DType::kBool:
      static_cast<bool*>(base)[i] = convert<bool>(v);
      break;
  }
}

// The device ordinal of a CUDA tensor.
inline int device_of(const Tensor& t) {
  return t.device().index;
}

}  // namespace gradwire::detail::cuda
