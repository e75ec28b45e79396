// The row-wise updates of sparse-rows gradients (tensor/sparse.h): each touches only the
// rows the gradient holds, coalesced first (duplicates summed, as a dense gradient would
// have summed them), and computes every touched element as the dense step does, so that a
// sparse step equals the dense step on the same rows.
#include <cmath>
#include <string>

#include "detail.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"

namespace gradwire::optim::detail {

void refuse_sparse(const char* op, size_t i, const Tensor& param, const std::string& why) {
  GRADWIRE_THROW(InvalidArgument) << op << ": parameter " << i << " (shape " << param.shape_string()
                                  << ") has a sparse-rows gradient, " << why;
}

void refuse_dense(const char* op, size_t i, const Tensor& param, const std::string& why) {
  GRADWIRE_THROW(InvalidArgument) << op << ": parameter " << i << " (shape " << param.shape_string()
                                  << ") has a dense gradient, " << why;
}

SparseRowsGrad coalesced_rows(const Tensor& grad) {
  const Tensor c = grad.coalesce();
  return {c.indices(), c.values().contiguous()};
}

void sgd_sparse_update(const Tensor& param, const Tensor& grad, double lr) {
  const SparseRowsGrad g = coalesced_rows(grad);
  Tensor p = param;
  index_add_(p, 0, g.index, g.values, -lr);
}

void adagrad_sparse_update(const Tensor& param, const Tensor& grad, const Tensor& sum, double clr,
                           double eps) {
  const SparseRowsGrad g = coalesced_rows(grad);
  if (fusable({&param, &sum}) && g.values.dtype() == param.dtype() && g.values.is_contiguous() &&
      g.values.device().is_cpu()) {
    fused_adagrad_rows(param, g.index, g.values, sum, {clr, eps, 0.0});
    return;
  }
  const Tensor squared = square(g.values);
  Tensor s = sum, p = param;
  index_add_(s, 0, g.index, squared);
  // The rows of the updated sum: std = sqrt(sum) + eps, as the dense step computes it.
  Tensor std = sqrt(index_select(s, 0, g.index));
  std.add_(eps);
  index_add_(p, 0, g.index, div(g.values, std), -clr);
}

void sparse_adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                        const Tensor& exp_avg_sq, const SparseAdamCoefficients& c) {
  const SparseRowsGrad g = coalesced_rows(grad);
  const Tensor old_avg = index_select(exp_avg, 0, g.index);
  const Tensor old_sq = index_select(exp_avg_sq, 0, g.index);
  // The moments move by (g - m) (1 - beta1) and (g^2 - v) (1 - beta2) on these rows only.
  Tensor avg_update = mul(sub(g.values, old_avg), 1.0 - c.beta1);
  Tensor sq_update = mul(sub(square(g.values), old_sq), 1.0 - c.beta2);
  Tensor m = exp_avg, v = exp_avg_sq, p = param;
  index_add_(m, 0, g.index, avg_update);
  index_add_(v, 0, g.index, sq_update);
  Tensor numer = add(avg_update, old_avg);
  Tensor denom = sqrt(add(sq_update, old_sq));
  denom.add_(c.eps);
  index_add_(p, 0, g.index, mul(div(numer, denom), -c.step_size));
}

}  // namespace gradwire::optim::detail
