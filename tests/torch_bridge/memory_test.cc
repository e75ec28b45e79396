// LibTorch's CPU tensors in gradwire's host memory (gradwire/torch/memory.h): large tensors
// come from gradwire's host block cache and go back to it, small ones from malloc; LibTorch's
// raw allocations work; switching back to LibTorch's allocator leaves earlier tensors intact;
// tensors in that memory travel and convert as any; bad thresholds are refused.
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "gradwire/core/error.h"
#include "gradwire/tensor/storage.h"
#include "gradwire/torch/convert.h"
#include "gradwire/torch/memory.h"
#include "support/error_text.h"
#include "torch_bridge/torch_test_util.h"

namespace gradwire::torch {
namespace {

using test::error_text;
using test_util::values;

class TorchHostMemory : public ::testing::Test {
 protected:
  void SetUp() override { use_gradwire_host_memory(); }
  void TearDown() override { use_torch_host_memory(); }
};

TEST_F(TorchHostMemory, LargeTensorsComeFromGradwiresCacheAndGoBack) {
  EXPECT_TRUE(uses_gradwire_host_memory());
  const uint64_t misses = host_cache_stats().misses;
  const uint64_t hits = host_cache_stats().hits;
  void* first = nullptr;
  {
    at::Tensor t = at::empty({1 << 20}, at::kFloat);  // 4 MiB
    first = t.data_ptr();
    t.fill_(2.5f);
    EXPECT_EQ(t.sum().item<double>(), 2.5 * (1 << 20));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 64, 0u);
  }
  EXPECT_EQ(host_cache_stats().misses + host_cache_stats().hits, misses + hits + 1);
  // Freed into the cache: the next tensor of that size gets the same block.
  const uint64_t hits_before = host_cache_stats().hits;
  at::Tensor again = at::empty({1 << 20}, at::kFloat);
  EXPECT_EQ(host_cache_stats().hits, hits_before + 1);
  EXPECT_EQ(again.data_ptr(), first);
}

TEST_F(TorchHostMemory, SmallTensorsStayWithMalloc) {
  const HostCacheStats before = host_cache_stats();
  at::Tensor t = at::arange(100, at::kDouble);  // 800 bytes
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % 64, 0u);
  EXPECT_EQ(t.sum().item<double>(), 4950.0);
  EXPECT_EQ(host_cache_stats().hits + host_cache_stats().misses, before.hits + before.misses);
}

TEST_F(TorchHostMemory, TheThresholdIsTheCallers) {
  use_gradwire_host_memory(1 << 20);
  const HostCacheStats before = host_cache_stats();
  { at::Tensor below = at::empty({100 << 10}, at::kByte); }  // 100 KiB: malloc
  EXPECT_EQ(host_cache_stats().hits + host_cache_stats().misses, before.hits + before.misses);
  { at::Tensor above = at::empty({2 << 20}, at::kByte); }  // 2 MiB: the cache
  EXPECT_EQ(host_cache_stats().hits + host_cache_stats().misses, before.hits + before.misses + 1);
  const std::string low = error_text<InvalidArgument>([] { use_gradwire_host_memory(4096); });
  EXPECT_NE(low.find("min_bytes"), std::string::npos) << low;
  EXPECT_NE(low.find("4096"), std::string::npos) << low;
  EXPECT_THROW(use_gradwire_host_memory(size_t{1} << 31), InvalidArgument);
}

TEST_F(TorchHostMemory, RawAllocationsWork) {
  c10::Allocator* a = c10::GetCPUAllocator();
  for (size_t n : {size_t{64}, size_t{1} << 20}) {
    void* p = a->raw_allocate(n);
    ASSERT_NE(p, nullptr);
    std::memset(p, 7, n);
    a->raw_deallocate(p);
  }
}

TEST_F(TorchHostMemory, TensorsOutliveASwitchBackAndConvert) {
  at::Tensor big = at::full({1 << 18}, 3.0f);  // 1 MiB, gradwire's memory
  at::Tensor small = at::full({4}, 1.0f);
  use_torch_host_memory();
  EXPECT_FALSE(uses_gradwire_host_memory());
  at::Tensor later = at::full({1 << 18}, 4.0f);  // LibTorch's allocator again
  const Tensor g = from_torch(big);
  EXPECT_EQ(g.data_ptr(), big.data_ptr());
  EXPECT_EQ(g.data<float>()[12345], 3.0f);
  EXPECT_EQ((big + later).sum().item<double>(), 7.0 * (1 << 18));
  EXPECT_EQ(small.sum().item<double>(), 4.0);
  big = at::Tensor();  // freed by the allocator that gave it, whichever is current
  small = at::Tensor();
  use_gradwire_host_memory();
  EXPECT_TRUE(uses_gradwire_host_memory());
}

}  // namespace
}  // namespace gradwire::torch
