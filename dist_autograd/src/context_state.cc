#include "context_state.h"

namespace gradwire::dist_autograd::internal {

void PassSink::accumulate(const Tensor& leaf, const Tensor& grad) {
  MutexLock lock(mutex_);
  if (!open_) return;
  remember(leaf);
  target_->accumulate(leaf, grad);
}

Tensor PassSink::gradient(const Tensor& leaf) const {
  return target_->gradient(leaf);
}

void PassSink::set_gradient(const Tensor& leaf, const Tensor& grad) {
  MutexLock lock(mutex_);
  if (!open_) return;
  remember(leaf);
  target_->set_gradient(leaf, grad);
}

void PassSink::remember(const Tensor& leaf) {
  auto [it, fresh] = before_.try_emplace(leaf.impl_ptr().get());
  if (fresh) it->second = {leaf, target_->gradient(leaf)};
}

void PassSink::finish(bool take_back) {
  MutexLock lock(mutex_);
  open_ = false;
  if (!take_back || taken_back_) return;
  taken_back_ = true;
  for (const auto& [key, entry] : before_)
    target_->set_gradient(entry.first, entry.second);
}

}  // namespace gradwire::dist_autograd::internal
