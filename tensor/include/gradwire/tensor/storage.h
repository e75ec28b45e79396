// Storage: a reference-counted block of memory on one device that tensors view.
//
// Several tensors (views) may share one Storage; it is freed when the last one goes away.
// Memory is either owned (allocated by gradwire: 64-byte aligned on the host, cudaMalloc
// on a device) or borrowed through from_blob with a deleter that runs when the last
// reference drops. A storage also carries a version counter that every in-place write
// through any view bumps, so that autograd can detect a saved tensor modified later.
//
// Thread-safety: the handle may be copied across threads. The bytes themselves are not
// synchronised: concurrent writes to one storage are the caller's race.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

#include "gradwire/tensor/device.h"

namespace gradwire {

class StorageImpl {
 public:
  using Deleter = std::function<void(void*)>;
  // Borrows `data` (nbytes long, on `device`); `deleter` (may be empty) runs on release.
  StorageImpl(void* data, size_t nbytes, Device device, Deleter deleter);
  ~StorageImpl();
  StorageImpl(const StorageImpl&) = delete;
  StorageImpl& operator=(const StorageImpl&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }
  uint64_t version() const { return version_.load(std::memory_order_acquire); }
  void bump_version() { version_.fetch_add(1, std::memory_order_acq_rel); }

 private:
  void* data_;
  size_t nbytes_;
  Device device_;
  Deleter deleter_;
  std::atomic<uint64_t> version_{0};
};

class Storage {
 public:
  Storage() = default;
  explicit Storage(std::shared_ptr<StorageImpl> impl) : impl_(std::move(impl)) {}

  // Allocates nbytes of uninitialised memory on `device`. Throws InvalidArgument for a
  // CUDA device in a build without CUDA or an ordinal out of range, Error when the
  // allocation fails (the message names the size and device).
  static Storage allocate(size_t nbytes, Device device);
  // Wraps memory the caller owns; `deleter` runs when the last reference drops.
  static Storage borrow(void* data, size_t nbytes, Device device, StorageImpl::Deleter deleter);

  bool defined() const { return impl_ != nullptr; }
  void* data() const { return impl_ ? impl_->data() : nullptr; }
  size_t nbytes() const { return impl_ ? impl_->nbytes() : 0; }
  Device device() const { return impl_ ? impl_->device() : Device::cpu(); }
  uint64_t version() const { return impl_ ? impl_->version() : 0; }
  void bump_version() const {
    if (impl_) impl_->bump_version();
  }
  long use_count() const { return impl_.use_count(); }
  const std::shared_ptr<StorageImpl>& impl() const { return impl_; }
  bool is_same(const Storage& other) const { return impl_ == other.impl_; }

 private:
  std::shared_ptr<StorageImpl> impl_;
};

// ---- the host allocator's block cache
//
// First touching freshly mapped memory costs a page fault per 4 KiB page, which for a
// multi-megabyte tensor can cost as much as the arithmetic that fills it. Host storages of
// 64 KiB and more are therefore rounded to a size class (steps of a quarter power of two)
// and, when released, kept in a process-wide cache for the next allocation of that class,
// up to a byte limit: GRADWIRE_HOST_CACHE_MB (default 1024; 0 disables the cache; builds
// with AddressSanitizer default to 0 so that use-after-free stays detectable).
// Like malloc, this cache is process-wide; it holds only free memory.
//
// Host storages of 2 MiB and more are aligned to 2 MiB and advised to use transparent huge
// pages (MADV_HUGEPAGE; effective where the kernel's THP mode is "madvise" or "always"),
// which cuts page faults, TLB misses and the page pinning of cross-process copies by a
// factor of 512. GRADWIRE_HOST_HUGE_PAGES=0 turns the advice off.
//
// Thread-safety: all functions may be called from any thread.
struct HostCacheStats {
  size_t cached_bytes = 0;  // free bytes held for reuse
  size_t cached_blocks = 0;
  size_t limit_bytes = 0;
  uint64_t hits = 0;    // allocations served from the cache
  uint64_t misses = 0;  // cacheable allocations that went to the system
};
HostCacheStats host_cache_stats();
// Returns every cached block to the system.
void empty_host_cache();
// Changes the limit; blocks beyond a lower limit are released at once.
void set_host_cache_limit(size_t bytes);

}  // namespace gradwire
