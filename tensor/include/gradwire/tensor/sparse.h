// Sparse-rows tensors: the gradient of an embedding table, sized by the rows a batch
// touched instead of by the table.
//
// A sparse-rows tensor stands for a dense tensor of shape `sizes` ([rows, d1, d2, ...])
// whose row indices[i] holds values[i] and every other row is zero. It is PyTorch's sparse
// COO layout with one sparse dimension (`torch.sparse_coo_tensor(indices[None], values,
// sizes)`), the layout `nn.Embedding(sparse=True)` produces. Row numbers may repeat (the
// rows then add up) until coalesce() sorts them and sums the duplicates.
//
// What works on one: its metadata (sizes, dtype, device, layout), indices(), values(),
// nnz(), coalesce(), to_dense(), clone(), detach(), to(dtype), zero_() (no rows left),
// mul/div by a scalar (in place or not), add(a, b) and a.add_(b) for any mix of layouts
// (sparse + sparse stays sparse, without densifying: the rows are concatenated; sparse +
// dense is dense), sub likewise, and the rpc wire (only the stored rows travel). Every
// strided op (views, elementwise, reductions, data access) refuses one with an
// InvalidArgument that says to call to_dense() or use values(). Autograd accumulates them
// (docs/autograd.md, "Sparse gradients"); optimizers update only their rows (optim/). The
// row arithmetic runs on the CPU.
//
// Errors: sparse_rows() throws InvalidArgument for indices that are not a 1-d int64 (or
// int32) tensor, values whose first dim differs from the number of indices or whose other
// dims differ from sizes[1:], a row index outside [0, sizes[0]), a dtype or device mismatch
// between two operands, and values that are not floating point.
//
// Thread-safety: as Tensor. A sparse tensor's in-place ops replace its parts; concurrent
// use of one tensor with an in-place op is a data race.
//
// Example:
//   Tensor g = sparse_rows(tensor<int64_t>({3, 0, 3}), ones({3, 4}), {10, 4});
//   g.nnz();                     // 3 (row 3 twice)
//   Tensor c = g.coalesce();     // indices {0, 3}, row 3 holds 2s
//   Tensor d = g.to_dense();     // 10x4, rows 0 and 3 non-zero
//   Tensor w = zeros({10, 4});
//   w.add_(g, -0.1);             // touches rows 0 and 3 only
#pragma once

#include "gradwire/tensor/tensor.h"

namespace gradwire {

// A sparse-rows tensor of dense shape `sizes` (at least 1-d) with the given rows; checked
// as the header says (every index is read once). `values` is kept as given (no copy):
// in-place ops on the result replace it rather than write into it.
Tensor sparse_rows(const Tensor& indices, const Tensor& values, const Shape& sizes);
// A sparse-rows tensor with no rows stored (the zero of that shape).
Tensor sparse_rows_zeros(const Shape& sizes, TensorOptions options = {});

namespace detail {
// The sparse branches of Tensor's methods and of add/sub/mul/div (sparse.cc).
Tensor sparse_clone(const Tensor& t);
Tensor sparse_detach(const Tensor& t);
// A new sparse-rows tensor over the same indices and values tensors (its own parts, so
// in-place ops on either leave the other alone).
Tensor sparse_shallow_copy(const Tensor& t);
Tensor sparse_to(const Tensor& t, DType dtype);
void sparse_zero_(const Tensor& t);
void sparse_scale_(const Tensor& t, double factor);
Tensor sparse_scale(const Tensor& t, double factor);
// a + alpha * b where a or b is sparse.
Tensor sparse_add(const Tensor& a, const Tensor& b, double alpha);
// a += alpha * b where a or b is sparse (a sparse a takes only a sparse b).
void sparse_add_(Tensor& a, const Tensor& b, double alpha);
std::string sparse_to_string(const Tensor& t);
}  // namespace detail

}  // namespace gradwire
