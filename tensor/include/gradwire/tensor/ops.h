// Tensor operations: elementwise arithmetic with broadcasting, comparisons, where, unary
// math, reductions, matrix products, softmax, indexing, joining and splitting, and the
// flatten/unflatten of tensor lists that DDP buckets use.
//
// Broadcasting follows NumPy/PyTorch: shapes are aligned at the trailing dim, and each
// pair of sizes must be equal or one of them 1. Results of out-of-place ops are new,
// contiguous tensors on the inputs' device; all tensor inputs of an op must share one
// device. Result dtypes follow result_type() (dtype.h documents the lattice), except:
// division and the float functions (exp, log, sqrt, sigmoid, tanh, softmax, mean) of
// integral inputs give float32; comparisons give bool; sum of bool/integral gives int64.
//
// Errors: shapes that do not broadcast, dims out of range, dtypes an op does not accept,
// indices out of range, and mixed devices throw InvalidArgument naming the op and the
// shapes/dtypes involved, e.g. "add: shapes [2, 3] and [4] do not broadcast".
//
// Thread-safety: ops read their inputs and write only their outputs; concurrent ops on
// shared inputs are safe. Large ops split their work over the intra-op threads
// (parallel.h), shared by all callers without oversubscription; results do not depend on
// the thread count.
//
// Example:
//   Tensor logits = mm(x, w.t()) + b;                 // [N, C]
//   Tensor p = softmax(logits, 1);
//   auto [best, idx] = max(p, 1);
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire {

// ---- dtype and shape rules
DType result_type(const Tensor& a, const Tensor& b);
DType result_type(const Tensor& a, Scalar b);
// The broadcast shape of a and b; throws InvalidArgument naming `op` when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op = "broadcast");

// ---- elementwise binary (broadcasting)
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha = 1);  // a + alpha * b
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha = 1);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, const Tensor& b);  // true division
Tensor div(const Tensor& a, Scalar b);
Tensor pow(const Tensor& a, const Tensor& exponent);
Tensor pow(const Tensor& a, Scalar exponent);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
// Writes a + b into `out`, which must already have the broadcast shape and a dtype the
// result can be cast to; no allocation (the benchmarked path).
Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b);
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a);
Tensor& operator+=(Tensor& a, const Tensor& b);
Tensor& operator-=(Tensor& a, const Tensor& b);
Tensor& operator*=(Tensor& a, const Tensor& b);
Tensor& operator/=(Tensor& a, const Tensor& b);
Tensor& operator+=(Tensor& a, Scalar b);
Tensor& operator-=(Tensor& a, Scalar b);
Tensor& operator*=(Tensor& a, Scalar b);
Tensor& operator/=(Tensor& a, Scalar b);

// ---- comparisons (bool results, broadcasting; compared in the promoted dtype)
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, Scalar b);
Tensor ne(const Tensor& a, Scalar b);
Tensor lt(const Tensor& a, Scalar b);
Tensor le(const Tensor& a, Scalar b);
Tensor gt(const Tensor& a, Scalar b);
Tensor ge(const Tensor& a, Scalar b);
Tensor logical_not(const Tensor& a);
Tensor logical_and(const Tensor& a, const Tensor& b);
Tensor logical_or(const Tensor& a, const Tensor& b);

// Elementwise select: cond (bool) ? a : b, all three broadcast together.
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
Tensor where(const Tensor& cond, const Tensor& a, Scalar b);
Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max);

// ---- unary math
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor rsqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor neg(const Tensor& a);  // not for bool
Tensor relu(const Tensor& a);
Tensor sigmoid(const Tensor& a);  // computed stably for large |x|
Tensor tanh(const Tensor& a);
Tensor sign(const Tensor& a);
Tensor square(const Tensor& a);
Tensor reciprocal(const Tensor& a);

// ---- reductions. `dims` empty means every dim; keepdim keeps reduced dims as size 1.
// Floating reductions accumulate in double for float64 and float for the others, with
// pairwise (blocked) summation to bound rounding error.
Tensor sum(const Tensor& a, std::optional<DType> dtype = std::nullopt);
Tensor sum(const Tensor& a, const Shape& dims, bool keepdim = false,
           std::optional<DType> dtype = std::nullopt);
Tensor mean(const Tensor& a);  // floating inputs only
Tensor mean(const Tensor& a, const Shape& dims, bool keepdim = false);
Tensor prod(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor amax(const Tensor& a, const Shape& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& a, const Shape& dims = {}, bool keepdim = false);
Tensor max(const Tensor& a);  // max of all elements (0-d); nan propagates
Tensor min(const Tensor& a);
// (values, indices) along one dim; the index of the first extreme on ties.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim = false);
// The index of the first extreme of the flattened tensor (0-d int64).
Tensor argmax(const Tensor& a);
Tensor argmin(const Tensor& a);
Tensor norm(const Tensor& a);  // 2-norm of all elements

// ---- matrix products (float32/float64 through CBLAS; half types through float32;
// integer types by a blocked loop). Inputs may be transposed views without copies.
Tensor mm(const Tensor& a, const Tensor& b);   // [n,k] x [k,m]
Tensor bmm(const Tensor& a, const Tensor& b);  // [B,n,k] x [B,k,m]
// NumPy matmul: 1-d x 1-d dot, 2-d mm, batched with broadcast batch dims.
Tensor matmul(const Tensor& a, const Tensor& b);
// out = beta * out + alpha * a @ b, written in place into a contiguous `out`.
Tensor& addmm_(Tensor& out, const Tensor& a, const Tensor& b, Scalar beta = 1, Scalar alpha = 1);
Tensor dot(const Tensor& a, const Tensor& b);
Tensor outer(const Tensor& a, const Tensor& b);

// ---- softmax family (subtracting the max first, so no overflow for large logits)
Tensor softmax(const Tensor& a, int64_t dim);
Tensor log_softmax(const Tensor& a, int64_t dim);
Tensor logsumexp(const Tensor& a, int64_t dim, bool keepdim = false);

// ---- indexing. Indices are int64 (int32 accepted); a negative or too large index is
// an InvalidArgument naming the op, the index and the size. These ops run on the CPU
// only: a CUDA tensor argument is an InvalidArgument ("<op>: CUDA tensors are not
// supported; move to cpu first"), never a silent round trip through host memory.
// index_select: the slices index[i] of `a` along dim (index 1-d).
Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index);
// The rows index[i] of a table `weight` (index 1-d): index_select(weight, 0, index), whose
// gradient with respect to `weight` is, when `sparse_grad`, a sparse-rows tensor holding
// only those rows (sparse.h; PyTorch's embedding(..., sparse=True)), else dense.
Tensor embedding_rows(const Tensor& weight, const Tensor& index, bool sparse_grad);
// out[i][j] = a[i][index[i][j]] for dim 1 (likewise for other dims); out has index's
// shape, and index.size(d) <= a.size(d) for d != dim, as PyTorch.
Tensor gather(const Tensor& a, int64_t dim, const Tensor& index);
// out = a.clone(); out[..index[i][j]..] += src[i][j] along dim. Duplicate indices
// accumulate; index.size(d) <= src.size(d) everywhere and <= a.size(d) for d != dim.
// Numeric dtypes (not bool); src is converted to a's dtype where an in-place op may.
Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// out = a.clone(); out.select(dim, index[i]) += src.select(dim, i) for each i, duplicates
// accumulating (the EmbeddingBag backward). src matches a except at dim, where it has
// index.numel() entries.
Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src);
// In place: a.select(dim, index[i]) += alpha * src.select(dim, i), touching only those
// slices (a sparse gradient's update of a large table). Not recorded by autograd: a
// tensor that requires grad is refused while grad mode is on.
Tensor& index_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src,
                   Scalar alpha = 1);
// a.clone() with `value` wherever the bool mask (broadcast to a's shape) is true.
Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value);
// A one-hot float32 encoding, shape labels.shape + [num_classes], of int64/int32 labels;
// num_classes == -1 uses max(labels) + 1.
Tensor one_hot(const Tensor& labels, int64_t num_classes);

// ---- joining and splitting
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
Tensor stack(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Views of at most split_size along dim (the last may be smaller).
std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim = 0);
std::vector<Tensor> split_with_sizes(const Tensor& a, const Shape& sizes, int64_t dim = 0);
// `chunks` views as equal as possible (ceil-sized, as PyTorch), fewer when too small.
std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim = 0);

// ---- tensor lists as one buffer (DDP buckets). All tensors must share dtype and device.
// flatten: one contiguous 1-d tensor holding each tensor's elements back to back.
Tensor flatten_dense_tensors(const std::vector<Tensor>& tensors);
// unflatten: views into `flat` shaped like each of `like` (no copy).
std::vector<Tensor> unflatten_dense_tensors(const Tensor& flat, const std::vector<Tensor>& like);

// ---- comparisons of whole tensors
// |a - b| <= atol + rtol * |b| elementwise (broadcasting), nan equal only if equal_nan.
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8,
              bool equal_nan = false);
// Same shape and exactly equal elements (after promotion).
bool equal(const Tensor& a, const Tensor& b);

}  // namespace gradwire
