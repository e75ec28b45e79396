// tensor/ figures: GEMM through matmul against a direct cblas_sgemm, and a large add
// against memcpy, each baseline measured in the same run.
#include <cblas.h>

#include <cstring>

#include "bench.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

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
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data<float>(), n,
                    b.data<float>(), n, 0.0f, c.data<float>(), n);
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
               {"baseline", "cblas_sgemm (OpenBLAS)"},
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

}  // namespace
}  // namespace gradwire::bench
