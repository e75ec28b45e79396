// Batched matrix products for CUDA tensors through cuBLAS (contract in kernels.h).
//
// cuBLAS is column-major and gradwire row-major. A row-major [r, c] matrix read as
// column-major is its transpose, so out = a @ b (row-major) is computed as
// out^T = b^T a^T (column-major) with the operands swapped; a transposed view (unit stride
// along its rows) is passed with the transpose flag instead of being copied. Only layouts
// cuBLAS cannot express (no unit stride, or rows that overlap) are packed first.
//
// Loading: cuBLAS is opened with dlopen on the first device GEMM rather than linked, because
// loading it (its Lt library is over 500 MB) would slow the start of every process, GPU or
// not, and most gradwire processes never multiply on a device.
//
// Handles: one cublasHandle_t per device, created on first use under a lock and never
// destroyed: destroying it from a static destructor can run after the CUDA runtime has
// unloaded, and the process exit releases it anyway. cuBLAS allows one handle to be used
// from several threads as long as its configuration does not change after creation.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <dlfcn.h>

#include <climits>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/cuda_utils.h"
#include "gradwire/tensor/factory.h"
#include "kernels.h"

namespace gradwire::detail::cuda {

namespace {

// The cuBLAS entry points gemm uses, resolved from the shared library on first use.
struct CublasApi {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm_strided_batched = nullptr;
  decltype(&cublasDgemmStridedBatched) dgemm_strided_batched = nullptr;
};

template <typename F>
void resolve(void* library, const char* symbol, F& slot) {
  slot = reinterpret_cast<F>(dlsym(library, symbol));
  if (slot == nullptr) {
    GRADWIRE_THROW(Error) << "cuBLAS library " << GRADWIRE_CUBLAS_LIBRARY << " lacks " << symbol;
  }
}

const CublasApi& cublas() {
  static std::once_flag once;
  static CublasApi api;
  static std::string failure;
  std::call_once(once, [] {
    // Never closed: handles created from it live until the process exits.
    void* library = dlopen(GRADWIRE_CUBLAS_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* reason = dlerror();
      failure = std::string("cannot load cuBLAS (") + GRADWIRE_CUBLAS_LIBRARY +
                "): " + (reason ? reason : "unknown error");
      return;
    }
    try {
      resolve(library, "cublasCreate_v2", api.create);
      resolve(library, "cublasDestroy_v2", api.destroy);
      resolve(library, "cublasSetMathMode", api.set_math_mode);
      resolve(library, "cublasGetStatusString", api.status_string);
      resolve(library, "cublasGetStatusName", api.status_name);
      resolve(library, "cublasSgemmStridedBatched", api.sgemm_strided_batched);
      resolve(library, "cublasDgemmStridedBatched", api.dgemm_strided_batched);
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) GRADWIRE_THROW(Error) << failure;
  return api;
}

[[noreturn]] void throw_cublas_error(cublasStatus_t status, const char* call, int device) {
  GRADWIRE_THROW(Error) << call << " failed on cuda:" << device << ": "
                        << cublas().status_string(status) << " (" << cublas().status_name(status)
                        << ")";
}

#define GRADWIRE_CUBLAS_CHECK(call_name, device, expr)                \
  do {                                                                \
    const cublasStatus_t gradwire_cublas_status_ = (expr);            \
    if (gradwire_cublas_status_ != CUBLAS_STATUS_SUCCESS) {           \
      throw_cublas_error(gradwire_cublas_status_, call_name, device); \
    }                                                                 \
  } while (0)

cublasHandle_t handle_for(int device) {
  static std::mutex mutex;
  // Leaked on purpose (see the file comment).
  static auto* handles = new std::vector<cublasHandle_t>();
  std::lock_guard<std::mutex> lock(mutex);
  if (handles->size() <= static_cast<size_t>(device)) handles->resize(device + 1, nullptr);
  cublasHandle_t& handle = (*handles)[device];
  if (handle == nullptr) {
    DeviceGuard guard(device);  // a handle belongs to the device current at creation
    cublasHandle_t created = nullptr;
    GRADWIRE_CUBLAS_CHECK("cublasCreate", device, cublas().create(&created));
    // No TF32 for float32: results must match the CPU within float32 rounding.
    const cublasStatus_t status = cublas().set_math_mode(created, CUBLAS_DEFAULT_MATH);
    if (status != CUBLAS_STATUS_SUCCESS) {
      cublas().destroy(created);
      throw_cublas_error(status, "cublasSetMathMode", device);
    }
    handle = created;
  }
  return handle;
}

// How one row-major operand X ([batch, r, c]) is handed to cuBLAS so that the column-major
// matrix cuBLAS sees, after `op`, is X^T ([c, r] column-major).
struct Operand {
  Tensor tensor;  // X itself, or a packed copy when its layout cannot be expressed
  cublasOperation_t op = CUBLAS_OP_N;
  int64_t ld = 1;
  int64_t batch_stride = 0;
};

// Fills `out` for X, or returns false when cuBLAS cannot read X's layout in place.
bool describe(const Tensor& x, Operand* out) {
  const int64_t r = x.size(1), c = x.size(2);
  const int64_t sr = x.stride(1), sc = x.stride(2);
  const int64_t sb = x.size(0) > 1 ? x.stride(0) : 0;
  if (sb < 0) return false;
  // The stride of a size-1 dim is never used, so there any ld cuBLAS accepts will do.
  // Unit stride along the columns: X's storage read column-major is X^T with ld = sr.
  if (sc == 1 || c == 1) {
    const int64_t ld = r > 1 ? sr : std::max<int64_t>(c, 1);
    if (ld >= std::max<int64_t>(c, 1)) {
      *out = Operand{x, CUBLAS_OP_N, ld, sb};
      return true;
    }
  }
  // Unit stride along the rows: X's storage read column-major is X with ld = sc, and its
  // transpose is X^T.
  if (sr == 1 || r == 1) {
    const int64_t ld = c > 1 ? sc : std::max<int64_t>(r, 1);
    if (ld >= std::max<int64_t>(r, 1)) {
      *out = Operand{x, CUBLAS_OP_T, ld, sb};
      return true;
    }
  }
  return false;
}

Operand operand_for(const Tensor& x) {
  Operand out;
  if (describe(x, &out)) return out;
  const bool described = describe(x.contiguous(), &out);
  GRADWIRE_CHECK(described) << "cuda gemm: a packed operand of shape " << x.shape_string()
                            << " must be describable";
  return out;
}

int to_int(int64_t value, const char* what) {
  GRADWIRE_CHECK_ARG(value <= INT_MAX)
      << "gemm: " << what << " " << value << " exceeds cuBLAS's limit of " << INT_MAX;
  return static_cast<int>(value);
}

template <typename T>
__global__ void scale_kernel(T* data, T beta, int64_t n) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    // beta == 0 overwrites: out's old contents (maybe nan) must not leak through.
    data[i] = beta == T(0) ? T(0) : data[i] * beta;
  }
}

}  // namespace

void gemm(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta) {
  GRADWIRE_CHECK(out.dim() == 3 && a.dim() == 3 && b.dim() == 3 && out.is_contiguous())
      << "cuda gemm: expects 3-d operands and a contiguous output, got " << out.shape_string()
      << " = " << a.shape_string() << " @ " << b.shape_string();
  const int64_t batch = out.size(0), n = out.size(1), m = out.size(2), k = a.size(2);
  GRADWIRE_CHECK(a.size(0) == batch && b.size(0) == batch && a.size(1) == n && b.size(1) == k &&
                 b.size(2) == m)
      << "cuda gemm: shapes " << out.shape_string() << " = " << a.shape_string() << " @ "
      << b.shape_string();
  if (out.dtype() != kFloat32 && out.dtype() != kFloat64) {
    throw_unsupported_dtype("gemm", out.dtype(), "float32 or float64");
  }
  GRADWIRE_CHECK(a.dtype() == out.dtype() && b.dtype() == out.dtype())
      << "cuda gemm: dtypes " << a.dtype() << " and " << b.dtype() << " into " << out.dtype();
  if (batch == 0 || n == 0 || m == 0) return;
  const int device = device_of(out);
  DeviceGuard guard(device);

  if (k == 0) {
    // An empty sum: out = beta * out. Done here rather than relying on how cuBLAS treats
    // k = 0 with leading dimensions that describe no memory.
    const int64_t total = out.numel();
    if (out.dtype() == kFloat32) {
      scale_kernel<float><<<blocks_for(total), kBlockSize>>>(static_cast<float*>(out.data_ptr()),
                                                             static_cast<float>(beta), total);
    } else {
      scale_kernel<double>
          <<<blocks_for(total), kBlockSize>>>(static_cast<double*>(out.data_ptr()), beta, total);
    }
    GRADWIRE_CUDA_CHECK_LAUNCH("scale_kernel");
    return;
  }

  // cuBLAS computes C = op(A_) op(B_) with A_ = b (giving b^T, m x k) and B_ = a (giving
  // a^T, k x n), so that C is out^T: m x n column-major with ld m.
  const Operand ob = operand_for(b);
  const Operand oa = operand_for(a);
  const int im = to_int(m, "size"), in = to_int(n, "size"), ik = to_int(k, "size");
  const int ldb = to_int(ob.ld, "leading dimension"), lda = to_int(oa.ld, "leading dimension");
  const int ibatch = to_int(batch, "batch count");
  const long long stride_c = static_cast<long long>(n) * m;
  cublasHandle_t handle = handle_for(device);
  if (out.dtype() == kFloat32) {
    const float falpha = static_cast<float>(alpha), fbeta = static_cast<float>(beta);
    GRADWIRE_CUBLAS_CHECK("cublasSgemmStridedBatched", device,
                          cublas().sgemm_strided_batched(
                              handle, ob.op, oa.op, im, in, ik, &falpha,
                              static_cast<const float*>(ob.tensor.data_ptr()), ldb, ob.batch_stride,
                              static_cast<const float*>(oa.tensor.data_ptr()), lda, oa.batch_stride,
                              &fbeta, static_cast<float*>(out.data_ptr()), im, stride_c, ibatch));
  } else {
    GRADWIRE_CUBLAS_CHECK(
        "cublasDgemmStridedBatched", device,
        cublas().dgemm_strided_batched(
            handle, ob.op, oa.op, im, in, ik, &alpha,
            static_cast<const double*>(ob.tensor.data_ptr()), ldb, ob.batch_stride,
            static_cast<const double*>(oa.tensor.data_ptr()), lda, oa.batch_stride, &beta,
            static_cast<double*>(out.data_ptr()), im, stride_c, ibatch));
  }
}

}  // namespace gradwire::detail::cuda
