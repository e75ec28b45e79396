// The AutogradHooks that gradwire::autograd installs: records a backward node for every
// differentiable tensor op (formulas in ops_*.cc) and implements Tensor's autograd methods.
#pragma once

#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "gradwire/tensor/autograd_hooks.h"

namespace gradwire::autograd::detail {

class AutogradHooksImpl final : public AutogradHooks {
 public:
  bool requires_grad(const Tensor& t) const override;
  void set_requires_grad(const Tensor& t, bool requires_grad) override;
  Tensor grad(const Tensor& t) const override;
  void set_grad(const Tensor& t, const Tensor& grad) override;
  std::shared_ptr<autograd::Node> grad_fn(const Tensor& t) const override;
  bool is_leaf(const Tensor& t) const override;
  void retain_grad(const Tensor& t) override;
  bool retains_grad(const Tensor& t) const override;
  uint64_t register_hook(const Tensor& t, TensorHook hook) override;
  uint64_t register_post_accumulate_grad_hook(const Tensor& t,
                                              PostAccumulateGradHook hook) override;
  bool remove_hook(const Tensor& t, uint64_t handle) override;
  void backward(const Tensor& root, const Tensor& gradient, bool retain_graph) override;
  Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) override;
  Tensor add(const Tensor& a, Scalar b) override;
  Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) override;
  Tensor sub(const Tensor& a, Scalar b) override;
  Tensor rsub(Scalar a, const Tensor& b) override;
  Tensor mul(const Tensor& a, const Tensor& b) override;
  Tensor mul(const Tensor& a, Scalar b) override;
  Tensor div(const Tensor& a, const Tensor& b) override;
  Tensor div(const Tensor& a, Scalar b) override;
  Tensor rdiv(Scalar a, const Tensor& b) override;
  Tensor pow(const Tensor& a, const Tensor& exponent) override;
  Tensor pow(const Tensor& a, Scalar exponent) override;
  Tensor maximum(const Tensor& a, const Tensor& b) override;
  Tensor minimum(const Tensor& a, const Tensor& b) override;
  Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) override;
  Tensor where(const Tensor& cond, const Tensor& a, Scalar b) override;
  Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) override;
  Tensor exp(const Tensor& a) override;
  Tensor log(const Tensor& a) override;
  Tensor sqrt(const Tensor& a) override;
  Tensor rsqrt(const Tensor& a) override;
  Tensor abs(const Tensor& a) override;
  Tensor neg(const Tensor& a) override;
  Tensor relu(const Tensor& a) override;
  Tensor sigmoid(const Tensor& a) override;
  Tensor tanh(const Tensor& a) override;
  Tensor sign(const Tensor& a) override;
  Tensor square(const Tensor& a) override;
  Tensor reciprocal(const Tensor& a) override;
  Tensor sum(const Tensor& a, const Shape& dims, bool keepdim, std::optional<DType> dtype) override;
  Tensor mean(const Tensor& a, const Shape& dims, bool keepdim) override;
  Tensor prod(const Tensor& a, int64_t dim, bool keepdim) override;
  Tensor amax(const Tensor& a, const Shape& dims, bool keepdim) override;
  Tensor amin(const Tensor& a, const Shape& dims, bool keepdim) override;
  Tensor max(const Tensor& a) override;
  Tensor min(const Tensor& a) override;
  std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) override;
  std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) override;
  Tensor norm(const Tensor& a) override;
  Tensor mm(const Tensor& a, const Tensor& b) override;
  Tensor bmm(const Tensor& a, const Tensor& b) override;
  Tensor matmul(const Tensor& a, const Tensor& b) override;
  Tensor& addmm_(Tensor& out, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) override;
  Tensor dot(const Tensor& a, const Tensor& b) override;
  Tensor outer(const Tensor& a, const Tensor& b) override;
  Tensor softmax(const Tensor& a, int64_t dim) override;
  Tensor log_softmax(const Tensor& a, int64_t dim) override;
  Tensor logsumexp(const Tensor& a, int64_t dim, bool keepdim) override;
  Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) override;
  Tensor embedding_rows(const Tensor& weight, const Tensor& index, bool sparse_grad) override;
  Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) override;
  Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) override;
  Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) override;
  Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) override;
  Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) override;
  Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) override;
  Tensor flatten_dense_tensors(const std::vector<Tensor>& tensors) override;
  Tensor view(const Tensor& a, const Shape& shape) override;
  Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1) override;
  Tensor permute(const Tensor& a, const Shape& dims) override;
  Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) override;
  Tensor select(const Tensor& a, int64_t dim, int64_t index) override;
  Tensor expand(const Tensor& a, const Shape& shape) override;
  Tensor squeeze(const Tensor& a, std::optional<int64_t> dim) override;
  Tensor unsqueeze(const Tensor& a, int64_t dim) override;
  Tensor as_strided(const Tensor& a, const Shape& sizes, const Shape& strides,
                    std::optional<int64_t> storage_offset) override;
  Tensor clone(const Tensor& a) override;
  Tensor to(const Tensor& a, DType dtype) override;
  Tensor to(const Tensor& a, Device device) override;
  Tensor& copy_(Tensor& self, const Tensor& src) override;
  Tensor& fill_(Tensor& self, Scalar value) override;
  Tensor& add_(Tensor& self, const Tensor& other, Scalar alpha) override;
  Tensor& add_(Tensor& self, Scalar other) override;
  Tensor& sub_(Tensor& self, const Tensor& other, Scalar alpha) override;
  Tensor& sub_(Tensor& self, Scalar other) override;
  Tensor& mul_(Tensor& self, const Tensor& other) override;
  Tensor& mul_(Tensor& self, Scalar other) override;
  Tensor& div_(Tensor& self, const Tensor& other) override;
  Tensor& div_(Tensor& self, Scalar other) override;
  Tensor& pow_(Tensor& self, Scalar exponent) override;
  Tensor& neg_(Tensor& self) override;
  Tensor& relu_(Tensor& self) override;
  Tensor& clamp_(Tensor& self, std::optional<Scalar> min, std::optional<Scalar> max) override;
  void check_out_op(const char* op, const std::vector<const Tensor*>& inputs) override;
};

}  // namespace gradwire::autograd::detail
