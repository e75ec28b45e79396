// LibTorch's CPU tensors in gradwire's host memory.
//
//   int main() {
//     gradwire::torch::use_gradwire_host_memory();   // first thing, before any tensor
//     ...
//   }
//
// After use_gradwire_host_memory(), LibTorch allocates the memory of its CPU tensors of
// `min_bytes` (64 KiB) and more from gradwire's host block cache, as gradwire allocates its
// own tensors (tensor/storage.h): blocks kept for reuse when freed, and blocks of 2 MiB and
// more on transparent huge pages. Two costs LibTorch's default allocator (glibc's malloc)
// has in a distributed program go away:
//   - the page faults of memory given back to the kernel between steps and touched again
//     (glibc trims its heap when a step frees megabytes of gradients; the next backward
//     faults them in again, 4 KiB at a time);
//   - the 4 KiB-page reads of a large tensor copied to another process (a lent rpc tensor,
//     a shared-memory collective), which huge pages cut by a factor of 512.
// docs/benchmarks.md measures both (libtorch.ddp_step_ms, libtorch.rpc_tensor_us). Smaller
// tensors keep malloc's memory (with a 64-byte header, so that every block says where it
// came from). use_torch_host_memory() makes LibTorch's default allocator the CPU allocator
// again for new tensors; tensors allocated before keep their memory, each freed by the
// allocator that gave it.
//
// The cache is process-wide and holds only free memory, up to GRADWIRE_HOST_CACHE_MB (1024
// by default; host_cache_stats(), empty_host_cache() and set_host_cache_limit() in
// tensor/storage.h see and bound it).
//
// Thread-safety: call these at start-up, before other threads allocate LibTorch tensors:
// LibTorch reads its CPU allocator without synchronisation. The allocator itself may be
// used from any thread.
//
// Errors: an allocation that fails throws c10::Error naming the size (as LibTorch's own
// allocator does); InvalidArgument for a min_bytes below 64 KiB (below the cache's smallest
// class) or above 1 GiB.
#pragma once

#include <cstddef>

namespace gradwire::torch {

inline constexpr size_t kDefaultHostMemoryMinBytes = 64 * 1024;

// LibTorch's CPU allocations of min_bytes and more come from gradwire's host block cache.
void use_gradwire_host_memory(size_t min_bytes = kDefaultHostMemoryMinBytes);
// LibTorch's default CPU allocator again, for new allocations.
void use_torch_host_memory();
// Whether LibTorch's CPU allocator is gradwire's (set here and not replaced since).
bool uses_gradwire_host_memory();

}  // namespace gradwire::torch
