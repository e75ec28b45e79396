// CPU matrix products through CBLAS (kernels.h: cpu::gemm).
//
// Each operand is handed to BLAS in place: a matrix whose unit stride is in its last dim
// is row-major (CblasNoTrans), one whose unit stride is in dim -2 is the transpose of a
// row-major matrix (CblasTrans), with the other stride as the leading dimension. So
// transposed views cost no copy. Degenerate sizes are settled here rather than passed
// to BLAS, which rejects a leading dimension below max(1, cols) even when nothing is read.
//
// OpenBLAS runs single-threaded (set when the library loads): its own thread team is
// process-wide, so K threads each calling a GEMM would otherwise wake K teams of `cores`
// threads. A large product is instead split by rows of C through parallel_for, each
// block one single-threaded BLAS call, which follows the intra-op policy (parallel.h):
// concurrent callers get serial GEMMs rather than oversubscribed ones.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "gradwire/core/check.h"
#include "gradwire/tensor/parallel.h"
#include "kernels.h"

// Debian 12's OpenBLAS (0.3.21) has only this process-wide setter, no per-thread one.
extern "C" void openblas_set_num_threads(int num_threads);
extern "C" char* openblas_get_corename(void);

namespace gradwire {

std::string blas_core() {
  const char* name = openblas_get_corename();
  return name == nullptr ? std::string() : std::string(name);
}

}  // namespace gradwire

namespace gradwire::detail::cpu {

namespace {

// Setting the count starts no thread; OpenBLAS's team started when it loaded is left
// idle (and stopped by OpenBLAS itself around fork()).
const bool g_blas_single_threaded = [] {
  openblas_set_num_threads(1);
  return true;
}();

// Below this many multiply-adds a product is one BLAS call: splitting it costs more in
// wake-ups than it saves. Each block gets at least this much work too.
constexpr int64_t kParallelGemmWork = int64_t{1} << 21;
// Rows per block are a multiple of this, to keep BLAS's register blocking whole.
constexpr int64_t kRowAlign = 16;

struct BlasMatrix {
  CBLAS_TRANSPOSE trans;
  int64_t ld;
};

// How BLAS reads a row-major [rows, cols] matrix with element strides (rs, cs). A size-1
// dim's stride is never used, so either layout fits it.
BlasMatrix blas_layout(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cs == 1 || cols == 1) {
    const int64_t ld = rows == 1 ? std::max<int64_t>(1, cols) : rs;
    if (ld >= std::max<int64_t>(1, cols)) return {CblasNoTrans, ld};
  }
  if (rs == 1 || rows == 1) {
    const int64_t ld = cols == 1 ? std::max<int64_t>(1, rows) : cs;
    if (ld >= std::max<int64_t>(1, rows)) return {CblasTrans, ld};
  }
  GRADWIRE_CHECK(false) << "gemm: operand [" << rows << ", " << cols << "] with strides [" << rs
                        << ", " << cs << "] has no unit stride in its last two dims";
  return {CblasNoTrans, 0};
}

template <typename T>
void scale_out(T* c, int64_t count, double beta) {
  if (beta == 0.0) {
    // beta == 0 means "ignore out": stale nan or inf must not survive as 0 * nan.
    std::fill(c, c + count, T(0));
  } else if (beta != 1.0) {
    const T b = static_cast<T>(beta);
    for (int64_t i = 0; i < count; ++i)
      c[i] *= b;
  }
}

template <typename T>
void gemm_typed(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  const int64_t batch = out.size(0), n = out.size(1), m = out.size(2), k = a.size(2);
  if (batch == 0 || n == 0 || m == 0) return;
  T* c = static_cast<T*>(out.data_ptr());
  if (k == 0) {
    scale_out(c, batch * n * m, beta);
    return;
  }
  const BlasMatrix la = blas_layout(n, k, a.stride(1), a.stride(2));
  const BlasMatrix lb = blas_layout(k, m, b.stride(1), b.stride(2));
  constexpr int64_t kMaxBlasInt = std::numeric_limits<int>::max();
  GRADWIRE_CHECK_ARG(std::max({n, m, k, la.ld, lb.ld}) <= kMaxBlasInt)
      << "gemm: sizes [" << n << ", " << k << "] x [" << k << ", " << m << "] (leading dims "
      << la.ld << ", " << lb.ld << ") exceed what CBLAS can index";
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(b.data_ptr());
  const int64_t sa = a.stride(0), sb = b.stride(0);
  (void)g_blas_single_threaded;
  // C[r0:r1] = op(A)[r0:r1] * op(B): the rows of op(A) start at row r0 of a row-major A,
  // or at column r0 of a transposed one.
  const int64_t a_row_step = la.trans == CblasNoTrans ? la.ld : 1;
  auto block = [&](int64_t i, int64_t r0, int64_t r1) {
    const T* ai = pa + i * sa + r0 * a_row_step;
    T* ci = c + i * n * m + r0 * m;
    const int rows = static_cast<int>(r1 - r0);
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, la.trans, lb.trans, rows, m, k, static_cast<float>(alpha), ai,
                  la.ld, pb + i * sb, lb.ld, static_cast<float>(beta), ci, m);
    } else {
      cblas_dgemm(CblasRowMajor, la.trans, lb.trans, rows, m, k, alpha, ai, la.ld, pb + i * sb,
                  lb.ld, beta, ci, m);
    }
  };
  const int64_t row_work = m * k;
  if (n * row_work < kParallelGemmWork || n < 2 * kRowAlign) {
    for (int64_t i = 0; i < batch; ++i)
      block(i, 0, n);
    return;
  }
  // Blocks of rows, in units of kRowAlign rows, each with at least kParallelGemmWork.
  const int64_t units = (n + kRowAlign - 1) / kRowAlign;
  const int64_t grain = std::max<int64_t>(1, kParallelGemmWork / (row_work * kRowAlign));
  for (int64_t i = 0; i < batch; ++i) {
    parallel_for(0, units, grain, [&](int64_t u0, int64_t u1) {
      block(i, u0 * kRowAlign, std::min(n, u1 * kRowAlign));
    });
  }
}

}  // namespace

void gemm(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  switch (out.dtype()) {
    case DType::kFloat32:
      gemm_typed<float>(out, a, b, alpha, beta);
      return;
    case DType::kFloat64:
      gemm_typed<double>(out, a, b, alpha, beta);
      return;
    default:
      GRADWIRE_CHECK(false) << "gemm: float32 or float64 expected, got " << dtype_name(out.dtype());
  }
}

}  // namespace gradwire::detail::cpu
