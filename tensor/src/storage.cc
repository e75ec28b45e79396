#include "gradwire/tensor/storage.h"

#include <sys/mman.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>

#include "gradwire/core/check.h"
#include "gradwire/core/env.h"
#include "gradwire/core/mutex.h"
#include "kernels.h"

namespace gradwire {

StorageImpl::StorageImpl(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

StorageImpl::~StorageImpl() {
  if (deleter_) deleter_(data_);
}

namespace {
constexpr size_t kHostAlignment = 64;         // a cache line, and enough for any SIMD load
constexpr size_t kMinCachedBytes = 64 << 10;  // below this glibc's heap already reuses memory
constexpr size_t kHugePageBytes = 2 << 20;    // x86-64 and aarch64 transparent huge pages

#if defined(__SANITIZE_ADDRESS__)
constexpr int64_t kDefaultCacheMb = 0;
#else
constexpr int64_t kDefaultCacheMb = 1024;
#endif

// Free host blocks by size class. Blocks are never handed back to a different class, so a
// class is just an exact byte count.
class HostBlockCache {
 public:
  HostBlockCache()
      : limit_(static_cast<size_t>(
                   env_int("GRADWIRE_HOST_CACHE_MB", kDefaultCacheMb, 0, int64_t{1} << 30))
               << 20) {}

  static size_t size_class(size_t nbytes) {
    if (nbytes < kMinCachedBytes) {
      const size_t n = (nbytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
      return n == 0 ? kHostAlignment : n;
    }
    const size_t step = std::bit_floor(nbytes) / 4;
    return (nbytes + step - 1) / step * step;
  }

  void* allocate(size_t bytes) {
    const bool small = bytes < kMinCachedBytes;
    if (!small) {
      MutexLock lock(mutex_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        cached_bytes_ -= bytes;
        ++hits_;
        return p;
      }
      ++misses_;
    }
    void* p = small ? small_allocate(bytes) : system_allocate(bytes);
    if (p == nullptr) {
      // Cached blocks of other classes may be what stands between us and success.
      empty();
      p = small ? small_allocate(bytes) : system_allocate(bytes);
    }
    return p;
  }

  void release(void* p, size_t bytes) {
    if (bytes < kMinCachedBytes) {
      small_release(p);
      return;
    }
    {
      MutexLock lock(mutex_);
      if (cached_bytes_ + bytes <= limit_) {
        free_.emplace(bytes, p);
        cached_bytes_ += bytes;
        return;
      }
    }
    std::free(p);
  }

  // Blocks below kMinCachedBytes come from malloc, whose per-thread cache makes a small
  // allocation and its release a few dozen instructions. aligned_alloc would go around that
  // cache (memalign carves an aligned chunk out of a larger one every time, many times the
  // cost, and most of the tensors of a small rpc call are such blocks). So a small block is
  // malloc'd with room to align it, and the pointer malloc returned is kept in the word just
  // before the aligned block. Under AddressSanitizer blocks stay exact (aligned_alloc), so
  // that an access past a small tensor's end is still caught.
  static void* small_allocate(size_t bytes) {
#if defined(__SANITIZE_ADDRESS__)
    return std::aligned_alloc(kHostAlignment, bytes);
#else
    static_assert(alignof(std::max_align_t) >= sizeof(void*));
    void* raw = std::malloc(bytes + kHostAlignment);
    if (raw == nullptr) return nullptr;
    // malloc's blocks are at least max_align_t-aligned: there is always a word free before
    // the next multiple of kHostAlignment past raw + sizeof(void*), within the slack.
    const uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + sizeof(void*) + kHostAlignment - 1) &
                         ~uintptr_t{kHostAlignment - 1};
    void* block = reinterpret_cast<void*>(at);
    static_cast<void**>(block)[-1] = raw;
    return block;
#endif
  }
  static void small_release(void* p) {
#if defined(__SANITIZE_ADDRESS__)
    std::free(p);
#else
    std::free(static_cast<void**>(p)[-1]);
#endif
  }

  void empty() {
    trim_to(0, /*set_limit=*/false);
  }

  // Blocks of a huge page or more start on a huge-page boundary and ask the kernel for
  // transparent huge pages (where THP is in "madvise" mode): 512 times fewer page faults,
  // TLB misses and page pins, which is what a cross-process copy of a large tensor
  // (process_vm_readv) spends most of its time on. GRADWIRE_HOST_HUGE_PAGES=0 turns it off.
  void* system_allocate(size_t bytes) const {
    if (bytes < kHugePageBytes || !huge_pages_) return std::aligned_alloc(kHostAlignment, bytes);
    void* p = nullptr;
    if (::posix_memalign(&p, kHugePageBytes, bytes) != 0) return nullptr;
#if defined(MADV_HUGEPAGE)
    // Advice only: a kernel without THP refuses it and the block works as before.
    (void)::madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
#endif
    return p;
  }

  void set_limit(size_t bytes) {
    trim_to(bytes, /*set_limit=*/true);
  }

  HostCacheStats stats() {
    MutexLock lock(mutex_);
    return HostCacheStats{cached_bytes_, free_.size(), limit_, hits_, misses_};
  }

 private:
  void trim_to(size_t bytes, bool set_limit) {
    std::multimap<size_t, void*> released;
    {
      MutexLock lock(mutex_);
      if (set_limit) limit_ = bytes;
      // Release the largest blocks first: they are the rarest to be asked for again.
      while (cached_bytes_ > bytes && !free_.empty()) {
        auto it = std::prev(free_.end());
        cached_bytes_ -= it->first;
        released.insert(*it);
        free_.erase(it);
      }
    }
    for (auto& [size, p] : released)
      std::free(p);
  }

  const bool huge_pages_ = env_int("GRADWIRE_HOST_HUGE_PAGES", 1, 0, 1) != 0;
  Mutex mutex_;
  std::multimap<size_t, void*> free_ GRADWIRE_GUARDED_BY(mutex_);
  size_t cached_bytes_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  size_t limit_ GRADWIRE_GUARDED_BY(mutex_);
  uint64_t hits_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  uint64_t misses_ GRADWIRE_GUARDED_BY(mutex_) = 0;
};

// Never destroyed: storages released during static destruction still return here.
HostBlockCache& host_cache() {
  static HostBlockCache* cache = new HostBlockCache();
  return *cache;
}
}  // namespace

HostCacheStats host_cache_stats() {
  return host_cache().stats();
}
void empty_host_cache() {
  host_cache().empty();
}
void set_host_cache_limit(size_t bytes) {
  host_cache().set_limit(bytes);
}

Storage Storage::allocate(size_t nbytes, Device device) {
  if (device.is_cpu()) {
    // Never hand out a null pointer, even for zero bytes: views compute addresses from it.
    const size_t size_class = HostBlockCache::size_class(nbytes);
    void* ptr = host_cache().allocate(size_class);
    if (ptr == nullptr) {
      GRADWIRE_THROW(Error) << "out of host memory allocating " << nbytes << " bytes";
    }
    return Storage(std::make_shared<StorageImpl>(
        ptr, nbytes, device, [size_class](void* p) { host_cache().release(p, size_class); }));
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

Storage Storage::borrow(void* data, size_t nbytes, Device device, StorageImpl::Deleter deleter) {
  return Storage(std::make_shared<StorageImpl>(data, nbytes, device, std::move(deleter)));
}

}  // namespace gradwire
