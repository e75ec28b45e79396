// Device memory, the device count, and the error and device-guard helpers of cuda_utils.h.
#include <cuda_runtime.h>

#include <cstring>
#include <string>

#include "cuda/cuda_utils.h"
#include "gradwire/core/logging.h"
#include "kernels.h"

namespace gradwire::detail::cuda {

namespace {
std::string call_name(const char* call) {
  const char* paren = std::strchr(call, '(');
  return paren ? std::string(call, paren) : std::string(call);
}

std::string device_text(int device) {
  return device >= 0 ? "cuda:" + std::to_string(device) : std::string("an unknown CUDA device");
}
}  // namespace

int current_device_or_minus_one() noexcept {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return device;
}

void throw_cuda_error(cudaError_t err, const char* call, const char* file, int line) {
  // Clear the error if it is not sticky, so that later unrelated calls do not report it.
  (void)cudaGetLastError();
  const char* base = std::strrchr(file, '/');
  GRADWIRE_THROW(Error) << call_name(call) << " failed on "
                        << device_text(current_device_or_minus_one()) << ": "
                        << cudaGetErrorString(err) << " (" << cudaGetErrorName(err) << ") at "
                        << (base ? base + 1 : file) << ":" << line;
}

void check_launch(const char* kernel_name, const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return;
  const char* base = std::strrchr(file, '/');
  GRADWIRE_THROW(Error) << "launching the CUDA kernel " << kernel_name << " failed on "
                        << device_text(current_device_or_minus_one()) << ": "
                        << cudaGetErrorString(err) << " (" << cudaGetErrorName(err) << ") at "
                        << (base ? base + 1 : file) << ":" << line;
}

DeviceGuard::DeviceGuard(int device) : previous_(-1), switched_(false) {
  GRADWIRE_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    GRADWIRE_CUDA_CHECK(cudaSetDevice(device));
    switched_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  // A destructor cannot throw; failing to switch back can only happen when the driver is
  // already broken, which the next checked call reports.
  if (switched_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
}

int device_count() {
  // Asked once: the answer cannot change while the process runs (CUDA fixes the visible
  // devices at initialisation), and a machine without a driver answers with an error,
  // which means "no devices" here. The static's initialisation is thread-safe.
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      (void)cudaGetLastError();
      n = 0;
    }
    return n;
  }();
  return count;
}

void* allocate(size_t nbytes, int device) {
  DeviceGuard guard(device);
  void* ptr = nullptr;
  // cudaMalloc of zero bytes may return null, but a storage's pointer must never be null
  // (views compute addresses from it), so an empty storage still holds one byte.
  const cudaError_t err = cudaMalloc(&ptr, nbytes == 0 ? 1 : nbytes);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    const bool have_info = cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess;
    if (!have_info) (void)cudaGetLastError();
    ErrorBuilder<Error> builder;
    builder << "cudaMalloc of " << nbytes << " bytes on cuda:" << device
            << " failed: " << cudaGetErrorString(err) << " (" << cudaGetErrorName(err) << ")";
    if (have_info) builder << "; " << free_bytes << " of " << total_bytes << " bytes free";
    builder.raise();
  }
  return ptr;
}

void release(void* ptr, int device) {
  // Runs from storage deleters, which must not throw: failures are logged. At process exit
  // the runtime may already be unloaded, and the memory goes away with the process.
  const int previous = current_device_or_minus_one();
  if (previous != device && cudaSetDevice(device) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  const cudaError_t err = cudaFree(ptr);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    if (err != cudaErrorCudartUnloading) {
      GRADWIRE_LOG(kError) << "cudaFree on cuda:" << device
                           << " failed: " << cudaGetErrorString(err) << " ("
                           << cudaGetErrorName(err) << ")";
    }
  }
  if (previous >= 0 && previous != device && cudaSetDevice(previous) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

}  // namespace gradwire::detail::cuda
