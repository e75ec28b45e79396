// Tensor's autograd methods, and the registrar that installs the hooks at load time.
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/ops.h"
#include "hooks_impl.h"
#include "meta.h"

namespace gradwire::autograd {
namespace detail {

bool AutogradHooksImpl::requires_grad(const Tensor& t) const {
  return detail::requires_grad(t);
}

void AutogradHooksImpl::set_requires_grad(const Tensor& t, bool requires_grad) {
  AutogradMeta* existing = get_meta(t);
  if (existing != nullptr && existing->grad_fn != nullptr) {
    GRADWIRE_CHECK_ARG(requires_grad)
        << "set_requires_grad(false) on a non-leaf tensor (it has grad_fn "
        << existing->grad_fn->name() << "); use detach() to get a tensor without history";
    return;
  }
  if (requires_grad) {
    GRADWIRE_CHECK_ARG(!t.is_sparse())
        << "set_requires_grad: a sparse-rows tensor of shape " << t.shape_string()
        << " cannot require gradients (it is a gradient; ops do not record on it)";
    GRADWIRE_CHECK_ARG(is_floating_point(t.dtype()))
        << "set_requires_grad: only tensors of floating point dtype can require gradients, got "
        << dtype_name(t.dtype());
  }
  materialize_meta(t).requires_grad_flag = requires_grad;
}

Tensor AutogradHooksImpl::grad(const Tensor& t) const {
  AutogradMeta* meta = get_meta(t);
  if (meta == nullptr) return Tensor();
  MutexLock lock(meta->mutex);
  return meta->grad;
}

void AutogradHooksImpl::set_grad(const Tensor& t, const Tensor& grad) {
  if (grad.defined()) {
    GRADWIRE_CHECK_ARG(grad.sizes() == t.sizes())
        << "set_grad: gradient of shape " << grad.shape_string() << " for a tensor of shape "
        << t.shape_string();
  }
  AutogradMeta& meta = materialize_meta(t);
  MutexLock lock(meta.mutex);
  meta.grad = grad;
}

std::shared_ptr<Node> AutogradHooksImpl::grad_fn(const Tensor& t) const {
  AutogradMeta* meta = get_meta(t);
  return meta == nullptr ? nullptr : meta->grad_fn;
}

bool AutogradHooksImpl::is_leaf(const Tensor& t) const {
  AutogradMeta* meta = get_meta(t);
  return meta == nullptr || meta->grad_fn == nullptr;
}

void AutogradHooksImpl::retain_grad(const Tensor& t) {
  AutogradMeta* meta = get_meta(t);
  GRADWIRE_CHECK_ARG(meta != nullptr && meta->requires_grad())
      << "retain_grad: can't retain_grad on a tensor that does not require grad";
  if (meta->grad_fn == nullptr || meta->retains_grad) return;  // leaves keep grad anyway
  meta->retains_grad = true;
  // The hook holds the tensor weakly: retaining must not keep it alive.
  std::weak_ptr<TensorImpl> weak = t.impl_ptr();
  meta->grad_fn->add_pre_hook(meta->output_nr, [weak](const Tensor& g) -> Tensor {
    if (std::shared_ptr<TensorImpl> impl = weak.lock()) {
      AutogradMeta& m = materialize_meta(Tensor(impl));
      MutexLock lock(m.mutex);
      m.grad = m.grad.defined() ? gradwire::add(m.grad, g) : g.clone();
    }
    return Tensor();
  });
}

bool AutogradHooksImpl::retains_grad(const Tensor& t) const {
  AutogradMeta* meta = get_meta(t);
  return meta != nullptr && meta->retains_grad;
}

uint64_t AutogradHooksImpl::register_hook(const Tensor& t, TensorHook hook) {
  AutogradMeta* meta = get_meta(t);
  GRADWIRE_CHECK_ARG(meta != nullptr && meta->requires_grad())
      << "register_hook: cannot register a hook on a tensor that does not require gradient";
  if (meta->grad_fn != nullptr)
    return meta->grad_fn->add_pre_hook(meta->output_nr, std::move(hook));
  const uint64_t handle = new_hook_handle();
  MutexLock lock(meta->mutex);
  meta->hooks.push_back(AutogradMeta::LeafHook{handle, std::move(hook)});
  return handle;
}

uint64_t AutogradHooksImpl::register_post_accumulate_grad_hook(const Tensor& t,
                                                               PostAccumulateGradHook hook) {
  AutogradMeta* meta = get_meta(t);
  GRADWIRE_CHECK_ARG(meta != nullptr && meta->requires_grad() && meta->grad_fn == nullptr)
      << "register_post_accumulate_grad_hook: post-accumulate-grad hooks can only be "
         "registered on leaf tensors that require grad";
  const uint64_t handle = new_hook_handle();
  MutexLock lock(meta->mutex);
  meta->post_hooks.push_back(AutogradMeta::PostHook{handle, std::move(hook)});
  return handle;
}

bool AutogradHooksImpl::remove_hook(const Tensor& t, uint64_t handle) {
  AutogradMeta* meta = get_meta(t);
  if (meta == nullptr) return false;
  if (meta->grad_fn != nullptr && meta->grad_fn->remove_pre_hook(handle)) return true;
  MutexLock lock(meta->mutex);
  for (auto it = meta->hooks.begin(); it != meta->hooks.end(); ++it) {
    if (it->handle == handle) {
      meta->hooks.erase(it);
      return true;
    }
  }
  for (auto it = meta->post_hooks.begin(); it != meta->post_hooks.end(); ++it) {
    if (it->handle == handle) {
      meta->post_hooks.erase(it);
      return true;
    }
  }
  for (auto it = meta->gradient_hooks.begin(); it != meta->gradient_hooks.end(); ++it) {
    if (it->handle == handle) {
      meta->gradient_hooks.erase(it);
      return true;
    }
  }
  return false;
}

void AutogradHooksImpl::backward(const Tensor& root, const Tensor& gradient, bool retain_graph) {
  autograd::backward({root},
                     gradient.defined() ? std::vector<Tensor>{gradient} : std::vector<Tensor>{},
                     retain_graph);
}

void AutogradHooksImpl::check_out_op(const char* op, const std::vector<const Tensor*>& inputs) {
  for (const Tensor* t : inputs) {
    GRADWIRE_CHECK_ARG(t == nullptr || !detail::requires_grad(*t))
        << op
        << ": functions that write into a given output tensor do not support automatic "
           "differentiation, but one of the arguments requires grad; use the out-of-place "
           "op, or run it under a NoGradGuard";
  }
}

namespace {
// Installed before main(): a static object's constructor in this translation unit. The
// linker keeps this object file because the autograd target forces its anchor symbol
// (autograd/CMakeLists.txt), and because the engine's public functions live beside it.
// Never destroyed, so that tensors released by other static destructors still find it.
AutogradHooksImpl* const g_hooks_impl = new AutogradHooksImpl();
struct Registrar {
  Registrar() { set_autograd_hooks(g_hooks_impl); }
} g_registrar;
}  // namespace

}  // namespace detail

bool ensure_registered() {
  return autograd_hooks() == detail::g_hooks_impl;
}

}  // namespace gradwire::autograd

extern "C" int gradwire_autograd_anchor() {
  return gradwire::autograd::ensure_registered() ? 1 : 0;
}
