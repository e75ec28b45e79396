// The host allocator's block cache (storage.h): reuse of released blocks by size class,
// the byte limit, and emptying.
#include <gtest/gtest.h>

#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/storage.h"

namespace gradwire {
namespace {

// Each test sets its own limit and leaves a generous one behind for the other suites.
class HostCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    empty_host_cache();
    set_host_cache_limit(size_t{256} << 20);
  }
  void TearDown() override { set_host_cache_limit(size_t{1024} << 20); }
};

TEST_F(HostCacheTest, ReleasedBlockIsReusedForTheSameSizeClass) {
  void* first = nullptr;
  {
    Tensor t = empty({1 << 18});  // 1 MiB of float32
    first = t.data_ptr();
  }
  const HostCacheStats after_release = host_cache_stats();
  EXPECT_EQ(after_release.cached_blocks, 1u);
  EXPECT_EQ(after_release.cached_bytes, size_t{1} << 20);
  // 1 MiB - 100 bytes rounds up to the same class (steps of 256 KiB at this size).
  Tensor again = empty({(1 << 18) - 25});
  EXPECT_EQ(again.data_ptr(), first);
  const HostCacheStats after_reuse = host_cache_stats();
  EXPECT_EQ(after_reuse.hits, after_release.hits + 1);
  EXPECT_EQ(after_reuse.cached_blocks, 0u);
}

TEST_F(HostCacheTest, SmallBlocksAreNotCached) {
  { Tensor t = empty({100}); }
  EXPECT_EQ(host_cache_stats().cached_blocks, 0u);
}

TEST_F(HostCacheTest, LimitBoundsWhatIsKept) {
  set_host_cache_limit(size_t{1} << 20);
  {
    Tensor a = empty({1 << 18});  // 1 MiB: fits
    Tensor b = empty({1 << 18});  // a second 1 MiB: over the limit once a is cached
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, size_t{1} << 20);
  set_host_cache_limit(0);
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
  { Tensor c = empty({1 << 18}); }
  EXPECT_EQ(host_cache_stats().cached_blocks, 0u);
}

TEST_F(HostCacheTest, EmptyReleasesEverything) {
  { Tensor a = empty({1 << 18}), b = empty({1 << 20}); }
  EXPECT_EQ(host_cache_stats().cached_blocks, 2u);
  empty_host_cache();
  EXPECT_EQ(host_cache_stats().cached_bytes, 0u);
  EXPECT_EQ(host_cache_stats().cached_blocks, 0u);
}

TEST_F(HostCacheTest, ReusedMemoryIsNotAssumedZero) {
  {
    Tensor t = full({1 << 18}, 7.0f);
  }
  Tensor z = zeros({1 << 18});
  EXPECT_EQ(sum(z).item<double>(), 0.0);
}

}  // namespace
}  // namespace gradwire
