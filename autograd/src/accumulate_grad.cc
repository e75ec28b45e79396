#include "gradwire/autograd/accumulate_grad.h"

#include "gradwire/core/check.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "meta.h"

namespace gradwire::autograd {

namespace {

// A replacement from a leaf-gradient hook must be able to stand in for the leaf's gradient.
void check_replacement(const Tensor& leaf, const Tensor& g) {
  if (!g.defined()) return;
  GRADWIRE_CHECK_ARG(g.sizes() == leaf.sizes() && g.dtype() == leaf.dtype() &&
                     g.device() == leaf.device())
      << "a leaf-gradient hook replaced the gradient of a " << dtype_name(leaf.dtype()) << " "
      << leaf.shape_string() << " leaf on " << leaf.device().str() << " with a "
      << dtype_name(g.dtype()) << " " << g.shape_string() << " tensor on " << g.device().str();
}

// The gradient a leaf keeps. Taken as is when nothing else can see it; otherwise a private
// copy, so that later in-place accumulation cannot write into another tensor's storage. A
// sparse-rows gradient is never written into (its in-place ops replace its parts), so a
// new handle over the same rows is enough.
Tensor own_gradient(Tensor g) {
  if (g.is_sparse())
    return g.impl_ptr().use_count() == 1 ? std::move(g) : gradwire::detail::sparse_shallow_copy(g);
  const bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
                         g.is_contiguous() && g.impl().autograd_meta() == nullptr;
  return exclusive ? std::move(g) : g.clone();
}

}  // namespace

AccumulateGrad::AccumulateGrad(Tensor variable) : Node(UINT64_MAX), variable_(std::move(variable)) {
  // The highest sequence number: leaves accumulate as soon as their gradient is complete,
  // so post-accumulate hooks (DDP's allreduce launches) fire as early as possible.
  add_input_metadata(variable_);
}

void AccumulateGrad::run_pre_hooks(std::vector<Tensor>& grads) {
  detail::AutogradMeta* meta = detail::get_meta(variable_);
  if (meta == nullptr || grads.empty() || !grads[0].defined()) return;
  std::vector<detail::AutogradMeta::LeafHook> hooks;
  {
    MutexLock lock(meta->mutex);
    hooks = meta->hooks;
  }
  for (const auto& h : hooks) {
    Tensor replaced = h.fn(grads[0]);
    if (replaced.defined()) grads[0] = std::move(replaced);
  }
}

void AccumulateGrad::accumulate_pass(Tensor g, GradientSink* sink) {
  detail::AutogradMeta& meta = detail::materialize_meta(variable_);
  const bool produced = g.defined();
  std::vector<detail::AutogradMeta::GradientHook> gradient_hooks;
  std::vector<detail::AutogradMeta::PostHook> post_hooks;
  Tensor current;
  {
    MutexLock lock(meta.mutex);
    if (sink == nullptr && produced) {
      if (!meta.grad.defined()) {
        meta.grad = own_gradient(std::move(g));
      } else if (meta.grad.is_sparse() && !g.is_sparse()) {
        // sparse + dense is dense: a new tensor (PyTorch's .grad changes layout the same way).
        meta.grad = add(meta.grad, g);
      } else {
        // dense += dense or sparse rows (touching only those rows); sparse += sparse
        // concatenates the rows, never densifying the table.
        meta.grad.add_(g);
      }
    }
    if (sink == nullptr) current = meta.grad;
    gradient_hooks = meta.gradient_hooks;
    post_hooks = meta.post_hooks;
  }
  if (sink != nullptr) current = std::move(g);

  if (!gradient_hooks.empty()) {
    LeafGradient view{variable_, current, produced, sink != nullptr, sink};
    for (const auto& h : gradient_hooks) {
      h.fn(view);
      check_replacement(variable_, view.grad);
    }
    if (sink == nullptr && !view.grad.is_same(current)) {
      MutexLock lock(meta.mutex);
      meta.grad = view.grad;
    }
    current = std::move(view.grad);
  }
  if (sink != nullptr && current.defined()) sink->accumulate(variable_, current);
  for (const auto& h : post_hooks)
    h.fn(variable_);
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  GRADWIRE_CHECK(grads.size() == 1) << "AccumulateGrad expects one gradient";
  accumulate_pass(std::move(grads[0]), nullptr);
  return {};
}

}  // namespace gradwire::autograd
