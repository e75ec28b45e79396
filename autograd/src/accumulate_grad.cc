#include "gradwire/autograd/accumulate_grad.h"

#include "gradwire/core/check.h"
#include "meta.h"

namespace gradwire::autograd {

AccumulateGrad::AccumulateGrad(Tensor variable) : Node(UINT64_MAX), variable_(std::move(variable)) {
  // The highest sequence number: leaves accumulate as soon as their gradient is complete,
  // so post-accumulate hooks (DDP's allreduce launches) fire as early as possible.
  add_input_metadata(variable_);
}

void AccumulateGrad::run_pre_hooks(std::vector<Tensor>& grads) {
  detail::AutogradMeta* meta = detail::get_meta(variable_);
  if (meta == nullptr || grads.empty()) return;
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

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  GRADWIRE_CHECK(grads.size() == 1) << "AccumulateGrad expects one gradient";
  Tensor g = std::move(grads[0]);
  if (!g.defined()) return {};
  detail::AutogradMeta& meta = detail::materialize_meta(variable_);
  std::vector<detail::AutogradMeta::PostHook> post;
  {
    MutexLock lock(meta.mutex);
    if (!meta.grad.defined()) {
      // Take the gradient when nothing else can see it; otherwise keep a private copy, so
      // that later in-place accumulation cannot write into another tensor's storage.
      const bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 &&
                             g.is_contiguous() && g.impl().autograd_meta() == nullptr;
      meta.grad = exclusive ? std::move(g) : g.clone();
    } else {
      meta.grad.add_(g);
    }
    post = meta.post_hooks;
  }
  for (const auto& h : post)
    h.fn(variable_);
  return {};
}

}  // namespace gradwire::autograd
