// Storage (storage.h): host allocations are 64-byte aligned and never null, borrowed memory
// runs its deleter exactly once when the last reference (storage or tensor view) drops,
// version counters are shared by all views, and devices that do not exist are refused.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/storage.h"

namespace gradwire {
namespace {

TEST(StorageTest, HostAllocationIsAlignedAndSized) {
  for (size_t n : {size_t{1}, size_t{3}, size_t{64}, size_t{100}, size_t{4097}}) {
    Storage s = Storage::allocate(n, Device::cpu());
    ASSERT_TRUE(s.defined());
    EXPECT_EQ(s.nbytes(), n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(s.data()) % 64, 0u) << n;
    EXPECT_TRUE(s.device().is_cpu());
    // The whole range is writable (the sanitizer build checks this).
    std::memset(s.data(), 0xAB, n);
  }
}

TEST(StorageTest, ZeroBytesStillGivesAPointer) {
  Storage s = Storage::allocate(0, Device::cpu());
  EXPECT_NE(s.data(), nullptr);
  EXPECT_EQ(s.nbytes(), 0u);
  EXPECT_NE(empty({0}).data_ptr(), nullptr);
}

TEST(StorageTest, UndefinedStorage) {
  Storage s;
  EXPECT_FALSE(s.defined());
  EXPECT_EQ(s.data(), nullptr);
  EXPECT_EQ(s.nbytes(), 0u);
  EXPECT_EQ(s.version(), 0u);
  s.bump_version();  // a no-op, not a crash
  EXPECT_TRUE(s.device().is_cpu());
}

TEST(StorageTest, BorrowRunsDeleterOnceAfterLastCopy) {
  int calls = 0;
  void* seen = nullptr;
  std::vector<char> buffer(16);
  {
    Storage a = Storage::borrow(buffer.data(), buffer.size(), Device::cpu(), [&](void* p) {
      ++calls;
      seen = p;
    });
    EXPECT_EQ(a.data(), buffer.data());
    Storage b = a;
    EXPECT_TRUE(b.is_same(a));
    EXPECT_EQ(a.use_count(), 2);
    a = Storage();
    EXPECT_EQ(calls, 0);
  }
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, buffer.data());
}

TEST(StorageTest, BorrowWithoutDeleter) {
  std::vector<char> buffer(8, 'x');
  {
    Storage s = Storage::borrow(buffer.data(), 8, Device::cpu(), {});
    static_cast<char*>(s.data())[0] = 'y';
  }
  EXPECT_EQ(buffer[0], 'y');  // memory untouched by the release
}

TEST(StorageTest, DistinctAllocationsAreNotSame) {
  Storage a = Storage::allocate(8, Device::cpu());
  Storage b = Storage::allocate(8, Device::cpu());
  EXPECT_FALSE(a.is_same(b));
  EXPECT_NE(a.data(), b.data());
}

TEST(StorageTest, VersionCounterIsSharedByEveryView) {
  Tensor base = zeros({3, 4});
  Tensor row = base.select(0, 1);
  Tensor col = base.transpose(0, 1).select(0, 2);
  const uint64_t v0 = base.version();
  EXPECT_EQ(row.version(), v0);
  row.fill_(2);
  EXPECT_EQ(base.version(), v0 + 1);
  EXPECT_EQ(col.version(), v0 + 1);
  col.copy_(ones({3}));
  EXPECT_EQ(base.version(), v0 + 2);
  EXPECT_EQ(row.version(), v0 + 2);
  // A different storage keeps its own counter.
  Tensor other = base.clone();
  const uint64_t ov = other.version();
  base.zero_();
  EXPECT_EQ(other.version(), ov);
  // Reads and views do not bump it.
  const uint64_t v = base.version();
  (void)base.to_vector<float>();
  (void)base.view({12});
  EXPECT_EQ(base.version(), v);
}

TEST(StorageTest, TensorsKeepStorageAlive) {
  int calls = 0;
  auto* data = new float[4]{1, 2, 3, 4};
  Tensor t = from_blob(data, {4}, kFloat32, [&](void* p) {
    ++calls;
    delete[] static_cast<float*>(p);
  });
  Storage s = t.storage();
  t = Tensor();
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(static_cast<float*>(s.data())[2], 3.0f);
  s = Storage();
  EXPECT_EQ(calls, 1);
}

TEST(StorageTest, DeviceThatDoesNotExistIsRefused) {
  // In a build without CUDA every CUDA ordinal is refused; with CUDA, the first ordinal
  // past the device count is.
  const Device missing = Device::cuda(cuda_device_count());
  try {
    Storage::allocate(16, missing);
    ADD_FAILURE() << "allocating on " << missing << " succeeded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(missing.str()), std::string::npos) << e.what();
  }
  EXPECT_THROW(empty({2}, TensorOptions().device(missing)), InvalidArgument);
}

}  // namespace
}  // namespace gradwire
