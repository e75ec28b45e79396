// The kernel layer under the ops: a small set of primitives that every device implements
// (cpu:: in src/cpu/, cuda:: in src/cuda/ when built with CUDA). The ops in ops.h do all
// checking, type promotion, broadcasting and allocation, then call one of these with
// operands already in the shape and dtype the contract states; a kernel checks nothing.
//
// The device_* wrappers pick the implementation from the output's device. Without CUDA no
// CUDA tensor can exist (Storage::allocate refuses), so the CPU path is the only one.
#pragma once

#include <cstdint>

#include "gradwire/config.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::detail {

enum class BinaryOp : uint8_t {
  kAdd,  // a + alpha * b
  kSub,  // a - alpha * b
  kMul,
  kDiv,
  kPow,
  kMaximum,
  kMinimum,
  kEq,  // comparisons write bool
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kLogicalAnd,  // bool inputs and output
  kLogicalOr,
};
inline bool is_comparison(BinaryOp op) { return op >= BinaryOp::kEq; }

enum class UnaryOp : uint8_t {
  kExp,
  kLog,
  kSqrt,
  kRsqrt,
  kAbs,
  kNeg,
  kRelu,
  kSigmoid,
  kTanh,
  kSign,
  kSquare,
  kReciprocal,
  kPowScalar,   // x ^ p0
  kClamp,       // clamp to [p0, p1]; p0 = -inf / p1 = +inf for an open side
  kLogicalNot,  // any dtype in, bool out
};

enum class ReduceOp : uint8_t {
  kSum,
  kProd,
  kMax,     // nan propagates
  kMin,
  kArgMax,  // values and int64 indices; first index on ties
  kArgMin,
};

namespace cpu {
// out: contiguous. a, b: dtype of the computation, expanded to out's shape (stride 0 where
// broadcast). out's dtype equals theirs, or is bool for comparisons. alpha for kAdd/kSub.
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, Scalar alpha);
// out: contiguous, in's shape; dtype equal to in's (bool for kLogicalNot).
void unary(UnaryOp op, const Tensor& out, const Tensor& in, double p0, double p1);
// out: contiguous; cond (bool), a, b (out's dtype) expanded to out's shape.
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
// in: contiguous [rows, cols] of any dtype; out: contiguous [rows] of the accumulation
// dtype (the frontend chooses); index: contiguous [rows] int64 for kArgMax/kArgMin (and
// optional for kMax/kMin: undefined Tensor when not wanted). cols may be 0 only for kSum
// and kProd.
void reduce_rows(ReduceOp op, const Tensor& out, const Tensor& index, const Tensor& in);
// out [B, n, m] contiguous = alpha * a @ b + beta * out, a [B, n, k], b [B, k, m]; each of
// a and b has unit stride in one of its last two dims, and one stride for the batch dim.
// float32/float64 only (the frontend converts other dtypes).
void gemm(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta);
}  // namespace cpu

#if GRADWIRE_HAS_CUDA
namespace cuda {
// The same contracts as cpu::, for tensors on a CUDA device (all operands on one device).
void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b, Scalar alpha);
void unary(UnaryOp op, const Tensor& out, const Tensor& in, double p0, double p1);
void where(const Tensor& out, const Tensor& cond, const Tensor& a, const Tensor& b);
void reduce_rows(ReduceOp op, const Tensor& out, const Tensor& index, const Tensor& in);
void gemm(const Tensor& out, const Tensor& a, const Tensor& b, double alpha, double beta);
// dst and src have the same shape (src possibly expanded) and any dtypes; at least one is
// on a CUDA device. Host<->device copies go through a staging buffer when strided.
void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& dst, Scalar value);
// Device memory (cudaMalloc / cudaFree on the given ordinal) and the device count.
void* allocate(size_t nbytes, int device);
void release(void* ptr, int device);
int device_count();
}  // namespace cuda
#endif

#if GRADWIRE_HAS_CUDA
#define GRADWIRE_IF_CUDA(stmt) stmt
#else
#define GRADWIRE_IF_CUDA(stmt) (void)0
#endif

inline void device_binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                          Scalar alpha) {
  if (out.is_cuda()) {
    GRADWIRE_IF_CUDA(cuda::binary(op, out, a, b, alpha));
  } else {
    cpu::binary(op, out, a, b, alpha);
  }
}
inline void device_unary(UnaryOp op, const Tensor& out, const Tensor& in, double p0 = 0,
                         double p1 = 0) {
  if (out.is_cuda()) {
    GRADWIRE_IF_CUDA(cuda::unary(op, out, in, p0, p1));
  } else {
    cpu::unary(op, out, in, p0, p1);
  }
}
inline void device_where(const Tensor& out, const Tensor& cond, const Tensor& a,
                         const Tensor& b) {
  if (out.is_cuda()) {
    GRADWIRE_IF_CUDA(cuda::where(out, cond, a, b));
  } else {
    cpu::where(out, cond, a, b);
  }
}
inline void device_reduce_rows(ReduceOp op, const Tensor& out, const Tensor& index,
                               const Tensor& in) {
  if (out.is_cuda()) {
    GRADWIRE_IF_CUDA(cuda::reduce_rows(op, out, index, in));
  } else {
    cpu::reduce_rows(op, out, index, in);
  }
}
inline void device_gemm(const Tensor& out, const Tensor& a, const Tensor& b, double alpha,
                        double beta) {
  if (out.is_cuda()) {
    GRADWIRE_IF_CUDA(cuda::gemm(out, a, b, alpha, beta));
  } else {
    cpu::gemm(out, a, b, alpha, beta);
  }
}

// Checks that every defined tensor is on `device`; throws InvalidArgument naming the op.
void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors);

}  // namespace gradwire::detail
