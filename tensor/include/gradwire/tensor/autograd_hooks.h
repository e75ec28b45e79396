// AutogradHooks: how tensor/ hands differentiable work to the autograd module without
// depending on it.
//
// Layering: tensor/ sits below autograd/ (docs/architecture.md, Layers), yet users write
// `Tensor y = a * b + c; y.sum().backward();` on plain Tensors. So every differentiable
// frontend in tensor/ (ops.h and the view, copy and in-place methods of Tensor) begins with
// one cheap test: "does any tensor argument carry autograd state, and is recording active
// on this thread?" Only when it does is the call forwarded to the AutogradHooks object that
// gradwire::autograd installs once, when its library is loaded (a static registrar in
// autograd/src). Tensors that never met autograd have no autograd meta, so non-autograd
// code pays one null test per argument and nothing else.
//
// The hooks implement each op by running the raw op under a BelowAutogradGuard (so the
// frontend's test fails and the kernel runs without recursion) and recording a graph node
// for the result. Tensor's autograd methods (requires_grad(), grad(), backward(), ...)
// forward here too. Without gradwire::autograd linked, autograd_hooks() is null: reading
// autograd state answers "no gradient" and set_requires_grad(true), backward() and the
// hook registrations throw InvalidArgument telling the user to link gradwire::autograd.
//
// Thread-locals: grad mode and the below-autograd flag are per thread, as in PyTorch, so
// that a NoGradGuard on one thread (an optimizer step) does not disable recording on
// another (a concurrent forward). The one process thread-local the machinery keeps is the
// dist-autograd context id; these two recording switches are the standard exception
// (docs/threads.md, "Thread-locals"), kept here because tensor/'s frontends must read them.
//
// Thread-safety: set_autograd_hooks() is meant to be called once at load time (later calls
// replace the pointer atomically); the hooks object itself must be thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire {

// TensorHook, PostAccumulateGradHook and autograd::Node are declared in tensor.h.
class AutogradHooks {
 public:
  virtual ~AutogradHooks() = default;

  // ---- per-tensor autograd state (Tensor's methods of the same names forward here)
  virtual bool requires_grad(const Tensor& t) const = 0;
  virtual void set_requires_grad(const Tensor& t, bool requires_grad) = 0;
  virtual Tensor grad(const Tensor& t) const = 0;
  virtual void set_grad(const Tensor& t, const Tensor& grad) = 0;
  virtual std::shared_ptr<autograd::Node> grad_fn(const Tensor& t) const = 0;
  virtual bool is_leaf(const Tensor& t) const = 0;
  virtual void retain_grad(const Tensor& t) = 0;
  virtual bool retains_grad(const Tensor& t) const = 0;
  virtual uint64_t register_hook(const Tensor& t, TensorHook hook) = 0;
  virtual uint64_t register_post_accumulate_grad_hook(const Tensor& t,
                                                      PostAccumulateGradHook hook) = 0;
  virtual bool remove_hook(const Tensor& t, uint64_t handle) = 0;
  virtual void backward(const Tensor& root, const Tensor& gradient, bool retain_graph) = 0;

  // ---- elementwise (ops.h)
  virtual Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) = 0;
  virtual Tensor add(const Tensor& a, Scalar b) = 0;
  virtual Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) = 0;
  virtual Tensor sub(const Tensor& a, Scalar b) = 0;
  virtual Tensor rsub(Scalar a, const Tensor& b) = 0;  // a - b
  virtual Tensor mul(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor mul(const Tensor& a, Scalar b) = 0;
  virtual Tensor div(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor div(const Tensor& a, Scalar b) = 0;
  virtual Tensor rdiv(Scalar a, const Tensor& b) = 0;  // a / b
  virtual Tensor pow(const Tensor& a, const Tensor& exponent) = 0;
  virtual Tensor pow(const Tensor& a, Scalar exponent) = 0;
  virtual Tensor maximum(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor minimum(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) = 0;
  virtual Tensor where(const Tensor& cond, const Tensor& a, Scalar b) = 0;
  virtual Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) = 0;
  virtual Tensor exp(const Tensor& a) = 0;
  virtual Tensor log(const Tensor& a) = 0;
  virtual Tensor sqrt(const Tensor& a) = 0;
  virtual Tensor rsqrt(const Tensor& a) = 0;
  virtual Tensor abs(const Tensor& a) = 0;
  virtual Tensor neg(const Tensor& a) = 0;
  virtual Tensor relu(const Tensor& a) = 0;
  virtual Tensor sigmoid(const Tensor& a) = 0;
  virtual Tensor tanh(const Tensor& a) = 0;
  virtual Tensor sign(const Tensor& a) = 0;
  virtual Tensor square(const Tensor& a) = 0;
  virtual Tensor reciprocal(const Tensor& a) = 0;

  // ---- reductions
  virtual Tensor sum(const Tensor& a, const Shape& dims, bool keepdim,
                     std::optional<DType> dtype) = 0;  // dims empty: all
  virtual Tensor mean(const Tensor& a, const Shape& dims, bool keepdim) = 0;
  virtual Tensor prod(const Tensor& a, int64_t dim, bool keepdim) = 0;
  virtual Tensor amax(const Tensor& a, const Shape& dims, bool keepdim) = 0;
  virtual Tensor amin(const Tensor& a, const Shape& dims, bool keepdim) = 0;
  virtual Tensor max(const Tensor& a) = 0;
  virtual Tensor min(const Tensor& a) = 0;
  virtual std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) = 0;
  virtual std::pair<Tensor, Tensor> min(const Tensor& a, int64_t dim, bool keepdim) = 0;
  virtual Tensor norm(const Tensor& a) = 0;

  // ---- matrix products and softmax
  virtual Tensor mm(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor bmm(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor matmul(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor& addmm_(Tensor& out, const Tensor& a, const Tensor& b, Scalar beta,
                         Scalar alpha) = 0;
  virtual Tensor dot(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor outer(const Tensor& a, const Tensor& b) = 0;
  virtual Tensor softmax(const Tensor& a, int64_t dim) = 0;
  virtual Tensor log_softmax(const Tensor& a, int64_t dim) = 0;
  virtual Tensor logsumexp(const Tensor& a, int64_t dim, bool keepdim) = 0;

  // ---- indexing and joining (stack, split, chunk and unflatten_dense_tensors are built
  // from the recorded ops below, so they need no hook of their own)
  virtual Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) = 0;
  virtual Tensor embedding_rows(const Tensor& weight, const Tensor& index, bool sparse_grad) = 0;
  virtual Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) = 0;
  virtual Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index,
                             const Tensor& src) = 0;
  virtual Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) = 0;
  virtual Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index,
                           const Tensor& src) = 0;
  virtual Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) = 0;
  virtual Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) = 0;
  virtual Tensor flatten_dense_tensors(const std::vector<Tensor>& tensors) = 0;

  // ---- Tensor views, copies and conversions
  virtual Tensor view(const Tensor& a, const Shape& shape) = 0;
  virtual Tensor transpose(const Tensor& a, int64_t dim0, int64_t dim1) = 0;
  virtual Tensor permute(const Tensor& a, const Shape& dims) = 0;
  virtual Tensor slice(const Tensor& a, int64_t dim, int64_t start, int64_t end, int64_t step) = 0;
  virtual Tensor select(const Tensor& a, int64_t dim, int64_t index) = 0;
  virtual Tensor expand(const Tensor& a, const Shape& shape) = 0;
  virtual Tensor squeeze(const Tensor& a, std::optional<int64_t> dim) = 0;
  virtual Tensor unsqueeze(const Tensor& a, int64_t dim) = 0;
  virtual Tensor as_strided(const Tensor& a, const Shape& sizes, const Shape& strides,
                            std::optional<int64_t> storage_offset) = 0;
  virtual Tensor clone(const Tensor& a) = 0;
  virtual Tensor to(const Tensor& a, DType dtype) = 0;
  virtual Tensor to(const Tensor& a, Device device) = 0;

  // ---- in-place methods (return self)
  virtual Tensor& copy_(Tensor& self, const Tensor& src) = 0;
  virtual Tensor& fill_(Tensor& self, Scalar value) = 0;
  virtual Tensor& add_(Tensor& self, const Tensor& other, Scalar alpha) = 0;
  virtual Tensor& add_(Tensor& self, Scalar other) = 0;
  virtual Tensor& sub_(Tensor& self, const Tensor& other, Scalar alpha) = 0;
  virtual Tensor& sub_(Tensor& self, Scalar other) = 0;
  virtual Tensor& mul_(Tensor& self, const Tensor& other) = 0;
  virtual Tensor& mul_(Tensor& self, Scalar other) = 0;
  virtual Tensor& div_(Tensor& self, const Tensor& other) = 0;
  virtual Tensor& div_(Tensor& self, Scalar other) = 0;
  virtual Tensor& pow_(Tensor& self, Scalar exponent) = 0;
  virtual Tensor& neg_(Tensor& self) = 0;
  virtual Tensor& relu_(Tensor& self) = 0;
  virtual Tensor& clamp_(Tensor& self, std::optional<Scalar> min, std::optional<Scalar> max) = 0;

  // ---- ops that write into a caller's buffer cannot be recorded (PyTorch refuses them
  // too); called when an argument requires grad so the hooks can refuse with a clear error.
  virtual void check_out_op(const char* op, const std::vector<const Tensor*>& inputs) = 0;
};

// Installs the process's hooks (gradwire::autograd does this when loaded). Returns the
// previous pointer. The object must outlive every tensor operation.
AutogradHooks* set_autograd_hooks(AutogradHooks* hooks);
// The installed hooks, or null when gradwire::autograd is not linked.
AutogradHooks* autograd_hooks();

// ---- per-thread recording switches (see the header comment for why these are thread-local)
// Grad mode: when false, ops record nothing (autograd's NoGradGuard sets it).
bool is_grad_enabled();
void set_grad_enabled(bool enabled);
// True while autograd's own implementation runs a raw op on this thread.
bool is_below_autograd();
void set_below_autograd(bool below);

// Runs raw tensor ops without recording, even on tensors that require grad. Autograd's
// op implementations use it; a node defined outside autograd/ (dist_autograd's send/recv
// functions) may too. Not a user-facing NoGradGuard: it also skips the in-place checks.
class BelowAutogradGuard {
 public:
  BelowAutogradGuard() : previous_(is_below_autograd()) { set_below_autograd(true); }
  ~BelowAutogradGuard() { set_below_autograd(previous_); }
  BelowAutogradGuard(const BelowAutogradGuard&) = delete;
  BelowAutogradGuard& operator=(const BelowAutogradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace gradwire
