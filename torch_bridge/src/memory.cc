// LibTorch's CPU allocator over gradwire's host block cache (memory.h). Every block starts
// with a 64-byte header holding the gradwire Storage that owns it (null for a block from
// malloc), so one deleter frees what either source gave, and raw_allocate works (LibTorch's
// raw allocations need the context to be the data pointer).
#include "gradwire/torch/memory.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <new>

#include "gradwire/core/check.h"
#include "gradwire/core/error.h"
#include "gradwire/tensor/storage.h"

namespace gradwire::torch {
namespace {

// The header before every block's data: 64 bytes keep LibTorch's 64-byte alignment.
constexpr size_t kHeader = 64;

void release(void* data) {
  if (data == nullptr) return;
  char* base = static_cast<char*>(data) - kHeader;
  Storage* holder = nullptr;
  std::memcpy(&holder, base, sizeof holder);
  if (holder != nullptr) {
    delete holder;  // back to gradwire's cache
  } else {
    std::free(base);
  }
}

class GradwireCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) const override {
    const size_t min = min_bytes.load(std::memory_order_relaxed);
    char* base = nullptr;
    Storage* holder = nullptr;
    if (n >= min) {
      try {
        holder = new Storage(Storage::allocate(n + kHeader, Device::cpu()));
      } catch (const std::exception& e) {
        delete holder;
        TORCH_CHECK(false, "gradwire host memory: cannot allocate ", n, " bytes: ", e.what());
      }
      base = static_cast<char*>(holder->data());
    } else {
      void* p = nullptr;
      TORCH_CHECK(posix_memalign(&p, kHeader, n + kHeader) == 0,
                  "gradwire host memory: cannot allocate ", n, " bytes");
      base = static_cast<char*>(p);
    }
    std::memcpy(base, &holder, sizeof holder);
    void* data = base + kHeader;
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  std::atomic<size_t> min_bytes{kDefaultHostMemoryMinBytes};
};

GradwireCpuAllocator& allocator() {
  // Never destroyed: tensors freed during static destruction still reach release().
  static GradwireCpuAllocator* a = new GradwireCpuAllocator();
  return *a;
}

}  // namespace

void use_gradwire_host_memory(size_t min_bytes) {
  GRADWIRE_CHECK_ARG(min_bytes >= kDefaultHostMemoryMinBytes && min_bytes <= (size_t{1} << 30))
      << "use_gradwire_host_memory: min_bytes must be in [64 KiB, 1 GiB], got " << min_bytes;
  allocator().min_bytes.store(min_bytes, std::memory_order_relaxed);
  c10::SetCPUAllocator(&allocator(), /*priority=*/0);
}

void use_torch_host_memory() {
  c10::SetCPUAllocator(c10::GetDefaultCPUAllocator(), /*priority=*/0);
}

bool uses_gradwire_host_memory() {
  return c10::GetCPUAllocator() == &allocator();
}

}  // namespace gradwire::torch
