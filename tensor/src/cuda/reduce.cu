// Row reductions for CUDA tensors (contract in kernels.h): sum, prod, max, min, argmax,
// argmin over the columns of a contiguous [rows, cols] input.
//
// One block per row (grid-stride over rows when there are more rows than blocks): each
// thread folds a strided subset of the row in the accumulation type, then the block folds
// the per-thread results with a shared-memory tree. Extremes carry their column index, and
// the fold keeps the smaller index on ties and prefers nan, so the result is the first nan
// if there is one, else the first extreme, however the columns were split among threads.
//
// The output dtype is chosen by the frontend independently of the input's, so results are
// written through store_as rather than by instantiating every (input, output) pair.
#include <cuda_runtime.h>

#include <type_traits>

#include "cuda/cuda_utils.h"
#include "kernels.h"

namespace gradwire::detail::cuda {

namespace {

// Integer sums and products wrap like two's complement (through uint64_t, since signed
// overflow is undefined), as on the CPU.
template <typename A>
__device__ inline void fold_sum_prod(ReduceOp op, A& acc, A v) {
  if constexpr (std::is_integral_v<A>) {
    const uint64_t x = static_cast<uint64_t>(acc), y = static_cast<uint64_t>(v);
    acc = static_cast<A>(op == ReduceOp::kSum ? x + y : x * y);
  } else {
    acc = op == ReduceOp::kSum ? acc + v : acc * v;
  }
}

// Folds (v2, i2) into (v, i); an index of -1 means "no element yet".
template <typename A>
__device__ inline void fold_extreme(bool want_max, A& v, int64_t& i, A v2, int64_t i2) {
  if (i2 < 0) return;
  if (i < 0) {
    v = v2;
    i = i2;
    return;
  }
  const bool nan1 = is_nan(v), nan2 = is_nan(v2);
  if (nan1 || nan2) {
    if (nan2 && (!nan1 || i2 < i)) {
      v = v2;
      i = i2;
    }
    return;
  }
  const bool better = want_max ? v2 > v : v2 < v;
  if (better || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

template <typename T>
__global__ void reduce_rows_kernel(ReduceOp op, const T* in, int64_t rows, int64_t cols, void* out,
                                   DType out_dtype, int64_t* index) {
  using A = acc_t<T>;
  __shared__ A values[kBlockSize];
  __shared__ int64_t indices[kBlockSize];
  const bool extreme = op != ReduceOp::kSum && op != ReduceOp::kProd;
  const bool want_max = op == ReduceOp::kMax || op == ReduceOp::kArgMax;
  const int tid = static_cast<int>(threadIdx.x);

  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = in + row * cols;
    A acc = op == ReduceOp::kProd ? A(1) : A(0);
    int64_t best = -1;
    for (int64_t j = tid; j < cols; j += blockDim.x) {
      const A v = convert<A>(p[j]);
      if (extreme) {
        fold_extreme(want_max, acc, best, v, j);
      } else {
        fold_sum_prod(op, acc, v);
      }
    }
    values[tid] = acc;
    indices[tid] = best;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
      if (tid < s) {
        if (extreme) {
          fold_extreme(want_max, values[tid], indices[tid], values[tid + s], indices[tid + s]);
        } else {
          fold_sum_prod(op, values[tid], values[tid + s]);
        }
      }
      __syncthreads();
    }
    if (tid == 0) {
      if (out != nullptr) store_as(out, out_dtype, row, values[0]);
      if (index != nullptr) index[row] = indices[0];
    }
    // The next row reuses the shared arrays.
    __syncthreads();
  }
}

}  // namespace

void reduce_rows(ReduceOp op, const Tensor& out, const Tensor& index, const Tensor& in) {
  GRADWIRE_CHECK(in.dim() == 2 && in.is_contiguous())
      << "cuda reduce_rows: input of shape " << in.shape_string() << " must be a contiguous "
      << "[rows, cols] tensor";
  const int64_t rows = in.size(0), cols = in.size(1);
  const bool extreme = op != ReduceOp::kSum && op != ReduceOp::kProd;
  GRADWIRE_CHECK(!extreme || cols > 0) << "cuda reduce_rows: max/min over zero columns";
  GRADWIRE_CHECK(out.defined() || index.defined()) << "cuda reduce_rows: no output";
  GRADWIRE_CHECK(!out.defined() || (out.is_contiguous() && out.numel() == rows))
      << "cuda reduce_rows: output of shape " << out.shape_string() << " for " << rows << " rows";
  GRADWIRE_CHECK(!index.defined() ||
                 (index.is_contiguous() && index.numel() == rows && index.dtype() == kInt64))
      << "cuda reduce_rows: index must be contiguous int64 with " << rows << " elements";
  if (rows == 0) return;
  const Tensor& any_output = out.defined() ? out : index;
  DeviceGuard guard(device_of(any_output));
  const unsigned int blocks = static_cast<unsigned int>(std::min<int64_t>(rows, kMaxBlocks));
  dispatch_all(in.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    reduce_rows_kernel<T><<<blocks, kBlockSize>>>(
        op, static_cast<const T*>(in.data_ptr()), rows, cols,
        out.defined() ? out.data_ptr() : nullptr, out.defined() ? out.dtype() : kFloat32,
        index.defined() ? static_cast<int64_t*>(index.data_ptr()) : nullptr);
    GRADWIRE_CUDA_CHECK_LAUNCH("reduce_rows_kernel");
  });
}

}  // namespace gradwire::detail::cuda
