#include "gradwire/tensor/autograd_hooks.h"

#include <atomic>

#include "autograd_dispatch.h"
#include "gradwire/core/check.h"

namespace gradwire {

namespace detail {
thread_local AutogradTls autograd_tls;
}  // namespace detail

namespace {
// Constant-initialised, so it is valid before any static constructor (the registrar in
// autograd/src) runs.
std::atomic<AutogradHooks*> g_hooks{nullptr};

AutogradHooks& require_hooks(const char* what) {
  AutogradHooks* hooks = g_hooks.load(std::memory_order_acquire);
  if (hooks == nullptr) {
    GRADWIRE_THROW(InvalidArgument)
        << what << ": autograd is not available; link gradwire::autograd (target_link_libraries("
        << "<target> PRIVATE gradwire::autograd)) to record operations and compute gradients";
  }
  return *hooks;
}
}  // namespace

AutogradHooks* set_autograd_hooks(AutogradHooks* hooks) {
  return g_hooks.exchange(hooks, std::memory_order_acq_rel);
}
AutogradHooks* autograd_hooks() {
  return g_hooks.load(std::memory_order_acquire);
}

bool is_grad_enabled() {
  return detail::autograd_tls.grad_enabled;
}
void set_grad_enabled(bool enabled) {
  detail::autograd_tls.grad_enabled = enabled;
}
bool is_below_autograd() {
  return detail::autograd_tls.below_autograd;
}
void set_below_autograd(bool below) {
  detail::autograd_tls.below_autograd = below;
}

// ---------------------------------------------------------------- Tensor's autograd methods

bool Tensor::requires_grad() const {
  if (!detail::has_autograd_meta(*this)) return false;
  AutogradHooks* hooks = autograd_hooks();
  return hooks != nullptr && hooks->requires_grad(*this);
}

Tensor& Tensor::set_requires_grad(bool requires_grad) {
  impl();  // undefined tensors throw
  if (!requires_grad && !detail::has_autograd_meta(*this)) return *this;
  require_hooks("set_requires_grad").set_requires_grad(*this, requires_grad);
  return *this;
}

Tensor Tensor::grad() const {
  if (!detail::has_autograd_meta(*this)) return Tensor();
  AutogradHooks* hooks = autograd_hooks();
  return hooks != nullptr ? hooks->grad(*this) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  impl();
  if (!grad.defined() && !detail::has_autograd_meta(*this)) return;
  require_hooks("set_grad").set_grad(*this, grad);
}

std::shared_ptr<autograd::Node> Tensor::grad_fn() const {
  if (!detail::has_autograd_meta(*this)) return nullptr;
  AutogradHooks* hooks = autograd_hooks();
  return hooks != nullptr ? hooks->grad_fn(*this) : nullptr;
}

bool Tensor::is_leaf() const {
  if (!detail::has_autograd_meta(*this)) return true;
  AutogradHooks* hooks = autograd_hooks();
  return hooks == nullptr || hooks->is_leaf(*this);
}

void Tensor::retain_grad() const {
  require_hooks("retain_grad").retain_grad(*this);
}

bool Tensor::retains_grad() const {
  if (!detail::has_autograd_meta(*this)) return false;
  AutogradHooks* hooks = autograd_hooks();
  return hooks != nullptr && hooks->retains_grad(*this);
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  impl();
  require_hooks("backward").backward(*this, gradient, retain_graph);
}

uint64_t Tensor::register_hook(TensorHook hook) const {
  return require_hooks("register_hook").register_hook(*this, std::move(hook));
}

uint64_t Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  return require_hooks("register_post_accumulate_grad_hook")
      .register_post_accumulate_grad_hook(*this, std::move(hook));
}

bool Tensor::remove_hook(uint64_t handle) const {
  if (!detail::has_autograd_meta(*this)) return false;
  return require_hooks("remove_hook").remove_hook(*this, handle);
}

}  // namespace gradwire
