#include "gradwire/tensor/storage.h"

#include <cstdlib>
#include <string>

#include "gradwire/core/check.h"
#include "kernels.h"

namespace gradwire {

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() {
  if (deleter_) deleter_(data_);
}

namespace {
constexpr size_t kHostAlignment = 64;  // a cache line, and enough for any SIMD load
}

Storage Storage::allocate(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    // Never hand out a null pointer, even for zero bytes: views compute addresses from it.
    size_t rounded = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    if (rounded == 0) rounded = kHostAlignment;
    void* ptr = std::aligned_alloc(kHostAlignment, rounded);
    if (ptr == nullptr) {
      GRADWIRE_THROW(Error) << "out of host memory allocating " << nbytes << " bytes";
    }
    return Storage(std::make_shared<StorageImpl>(ptr, nbytes, device,
                                                 [](void* p) { std::free(p); }));
  }
#if GRADWIRE_HAS_CUDA
  const int count = detail::cuda::device_count();
  GRADWIRE_CHECK_ARG(device.index >= 0 && device.index < count)
      << "cannot allocate on " << device.str() << ": this machine has " << count
      << " CUDA device(s)";
  const int index = device.index;
  void* ptr = detail::cuda::allocate(nbytes, index);
  return Storage(std::make_shared<StorageImpl>(
      ptr, nbytes, device, [index](void* p) { detail::cuda::release(p, index); }));
#else
  GRADWIRE_THROW(InvalidArgument) << "cannot allocate on " << device.str()
                                  << ": gradwire was built without CUDA";
#endif
}

Storage Storage::borrow(void* data, size_t nbytes, Device device,
                        StorageImpl::Deleter deleter) {
  return Storage(std::make_shared<StorageImpl>(data, nbytes, device, std::move(deleter)));
}

}  // namespace gradwire
