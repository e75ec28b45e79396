// CPU matrix products through CBLAS (kernels.h: cpu::gemm).
//
// Each operand is handed to BLAS in place: a matrix whose unit stride is in its last dim
// is row-major (CblasNoTrans), one whose unit stride is in dim -2 is the transpose of a
// row-major matrix (CblasTrans), with the other stride as the leading dimension. So
// transposed views cost no copy. Degenerate sizes are settled here rather than passed
// to BLAS, which rejects a leading dimension below max(1, cols) even when nothing is read.
#include <cblas.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "gradwire/core/check.h"
#include "kernels.h"

namespace gradwire::detail::cpu {

namespace {

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
  for (int64_t i = 0; i < batch; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      cblas_sgemm(CblasRowMajor, la.trans, lb.trans, n, m, k, static_cast<float>(alpha),
                  pa + i * sa, la.ld, pb + i * sb, lb.ld, static_cast<float>(beta), c + i * n * m,
                  m);
    } else {
      cblas_dgemm(CblasRowMajor, la.trans, lb.trans, n, m, k, alpha, pa + i * sa, la.ld,
                  pb + i * sb, lb.ld, beta, c + i * n * m, m);
    }
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
