// Intra-op parallelism: how many threads one tensor op may use, and parallel_for, the
// loop that large CPU kernels (GEMM, elementwise ops, reductions) split their work with.
//
// There is one process-wide intra-op pool, started on first use (never when the library
// loads, so a process may still fork before it computes anything). Only one op at a time
// uses it: parallel_for takes the pool with a try-lock, and a caller that cannot get it
// (another op holds it, or the caller is itself running a parallel_for chunk or is one of
// the pool's workers) runs its loop serially on its own thread. So K threads computing at
// once use at most K + get_num_threads() - 1 threads, never K × cores; this is why
// OpenBLAS is kept single-threaded and large GEMMs are split here instead.
//
// The number of threads defaults to GRADWIRE_NUM_THREADS, else the number of cores.
// Kernels choose their chunks so that results do not depend on it (reductions sum fixed-
// size chunks in a fixed order; see docs/threads.md).
//
// A forked child forgets the parent's pool (its threads do not exist there) and starts
// its own on first use.
//
// Thread-safety: every function may be called from any thread. set_num_threads takes
// effect for parallel_for calls that start after it returns.
// Errors: set_num_threads(n < 1) throws InvalidArgument. An exception thrown by `fn` in
// any chunk is rethrown by parallel_for once every chunk has finished (the first one if
// several throw); chunks not yet started when it was thrown may be skipped.
//
// Example:
//   gradwire::parallel_for(0, n, 32768, [&](int64_t b, int64_t e) {
//     for (int64_t i = b; i < e; ++i) y[i] = 2 * x[i];
//   });
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace gradwire {

// The most threads (the caller included) one op may use.
int get_num_threads();
// Sets it for the whole process; n >= 1, 1 meaning every op runs on its caller's thread.
void set_num_threads(int n);

// The kernel set OpenBLAS runs matrix products with, by OpenBLAS's own name ("Haswell",
// "SkylakeX", "Cooperlake", "Zen", ...): the one it picked for this CPU when it loaded, or
// the one OPENBLAS_CORETYPE named. The benchmarks report it beside every figure that
// multiplies matrices, so that figures from different machines say which kernels made them.
std::string blas_core();

// Whether the calling thread is running a parallel_for chunk or is an intra-op worker;
// a parallel_for from such a thread runs serially.
bool in_parallel_region();

// Calls fn(b, e) over disjoint ranges covering [begin, end) exactly once, each range at
// least `grain` long except possibly the last; with fewer than 2 * grain indices, one
// thread, or the pool busy, it is one call fn(begin, end) on the calling thread. Returns
// when every range is done. grain < 1 counts as 1.
void parallel_for(int64_t begin, int64_t end, int64_t grain,
                  const std::function<void(int64_t, int64_t)>& fn);

}  // namespace gradwire
