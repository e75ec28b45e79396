// tensor/ figures: GEMM through matmul against a direct cblas_sgemm, GEMMs from four
// threads at once against one thread alone, and a large add and sum against memcpy, each
// baseline measured in the same run.
#include <cblas.h>
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "bench.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/parallel.h"

// Debian 12's OpenBLAS has only this process-wide setter.
extern "C" void openblas_set_num_threads(int num_threads);

namespace gradwire::bench {
namespace {

const Register gemm_bench({"tensor.gemm_gflops"}, [](const auto& emit) {
  constexpr int64_t n = 1024;
  Generator gen(1);
  Tensor a = randn({n, n}, &gen), b = randn({n, n}, &gen);
  Tensor c = empty({n, n});
  Tensor out;
  auto [t_ours, t_blas] = time_interleaved(
      [&] { out = matmul(a, b); },
      [&] {
        // OpenBLAS with as many threads as gradwire's ops may use, for this call only:
        // gradwire keeps it single-threaded (docs/threads.md), which would make the
        // baseline one core against matmul's whole pool.
        openblas_set_num_threads(get_num_threads());
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n,
                    b.data<float>(), n, 0.0f, c.data<float>(), n);
        openblas_set_num_threads(1);
      },
      9);
  const double flops = 2.0 * n * n * n;
  const double ours = flops / t_ours / 1e9, base = flops / t_blas / 1e9;
  emit(Figure{"tensor.gemm_gflops",
              ours,
              "GFLOP/s",
              {{"m", double(n)},
               {"n", double(n)},
               {"k", double(n)},
               {"dtype", "float32"},
               {"baseline", "cblas_sgemm (OpenBLAS with the intra-op thread count)"},
               {"blas_core", blas_core()},
               {"baseline_gflops", base},
               {"ratio", ours / base},
               {"target_ratio_min", 0.95}}});
});

const Register add_bench({"tensor.add_gbps"}, [](const auto& emit) {
  constexpr int64_t bytes = 64 << 20;
  constexpr int64_t n = bytes / 4;
  Tensor a = ones({n}), b = ones({n}), out = empty({n});
  Tensor src = ones({n}), dst = empty({n});
  auto [t_add, t_copy] = time_interleaved(
      [&] { add_out(out, a, b); }, [&] { std::memcpy(dst.data_ptr(), src.data_ptr(), bytes); }, 11);
  // Bytes that cross the memory bus: add reads two arrays and writes one; memcpy reads
  // one and writes one.
  const double add_gbps = 3.0 * bytes / t_add / 1e9;
  const double memcpy_gbps = 2.0 * bytes / t_copy / 1e9;
  emit(Figure{"tensor.add_gbps",
              add_gbps,
              "GB/s",
              {{"bytes_per_operand", double(bytes)},
               {"dtype", "float32"},
               {"memcpy_gbps", memcpy_gbps},
               {"ratio", add_gbps / memcpy_gbps},
               {"target_ratio_min", 0.5}}});
});

int online_cores() {
  cpu_set_t set;
  if (::sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The oversubscription the intra-op policy prevents: callers on several threads each
// computing GEMMs must share the cores, not each wake a BLAS team of `cores` threads.
const Register concurrent_gemm_bench({"tensor.concurrent_gemm_gflops"}, [](const auto& emit) {
  constexpr int64_t n = 256;
  constexpr int kCallers = 4;
  constexpr int kReps = 64;
  Generator gen(3);
  std::vector<Tensor> as, bs;
  for (int t = 0; t < kCallers; ++t) {
    as.push_back(randn({n, n}, &gen));
    bs.push_back(randn({n, n}, &gen));
  }
  auto [t_many, t_one] = time_interleaved(
      [&] {
        std::vector<std::thread> callers;
        for (int t = 0; t < kCallers; ++t) {
          callers.emplace_back([&, t] {
            for (int r = 0; r < kReps; ++r)
              (void)mm(as[t], bs[t]);
          });
        }
        for (auto& caller : callers)
          caller.join();
      },
      [&] {
        // One thread alone: the caller with no intra-op helpers.
        const int threads = get_num_threads();
        set_num_threads(1);
        for (int r = 0; r < kReps; ++r)
          (void)mm(as[0], bs[0]);
        set_num_threads(threads);
      },
      7);
  const double flops = 2.0 * n * n * n * kReps;
  const double total = kCallers * flops / t_many / 1e9, single = flops / t_one / 1e9;
  const int cores = online_cores();
  const double target = 0.9 * single * std::min(kCallers, cores);
  emit(Figure{"tensor.concurrent_gemm_gflops",
              total,
              "GFLOP/s",
              {{"m", double(n)},
               {"n", double(n)},
               {"k", double(n)},
               {"callers", double(kCallers)},
               {"cores", double(cores)},
               {"intra_op_threads", double(get_num_threads())},
               {"baseline", "the same GEMMs from one thread, set_num_threads(1)"},
               {"baseline_gflops", single},
               {"ratio", total / single},
               {"target_ratio_min", target / single}}});
});

const Register sum_bench({"tensor.sum_gbps"}, [](const auto& emit) {
  constexpr int64_t bytes = 64 << 20;
  constexpr int64_t n = bytes / 4;
  Generator gen(5);
  Tensor a = rand({n}, &gen);
  Tensor src = ones({n}), dst = empty({n});
  Tensor s;
  auto [t_sum, t_copy] = time_interleaved(
      [&] { s = sum(a); }, [&] { std::memcpy(dst.data_ptr(), src.data_ptr(), bytes); }, 11);
  // Bytes that cross the memory bus: sum reads one array; memcpy reads one and writes one.
  const double sum_gbps = 1.0 * bytes / t_sum / 1e9;
  const double memcpy_gbps = 2.0 * bytes / t_copy / 1e9;
  emit(Figure{"tensor.sum_gbps",
              sum_gbps,
              "GB/s",
              {{"bytes", double(bytes)},
               {"dtype", "float32"},
               {"intra_op_threads", double(get_num_threads())},
               {"memcpy_gbps", memcpy_gbps},
               {"ratio", sum_gbps / memcpy_gbps},
               {"target_ratio_min", 0.5}}});
});

}  // namespace
}  // namespace gradwire::bench
