#include "context_state.h"

#include <vector>

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

bool ContextState::apply(ContextEvent event) {
  const std::optional<ContextPhase> to = next(phase, event);
  if (!to) return false;
  phase = *to;
  return true;
}

PassPhase ContextState::pass_phase(uint64_t pass_id) const {
  auto it = passes.find(pass_id);
  return it == passes.end() ? PassPhase::kNone : it->second.phase;
}

Pass* ContextState::part(uint64_t pass_id) {
  auto it = passes.find(pass_id);
  return it != passes.end() && holds_part(it->second.phase) ? &it->second : nullptr;
}

bool ContextState::apply(uint64_t pass_id, PassEvent event) {
  auto it = passes.find(pass_id);
  const std::optional<PassPhase> to =
      next(it == passes.end() ? PassPhase::kNone : it->second.phase, event);
  if (!to) return false;
  if (*to == PassPhase::kNone) {
    if (it != passes.end()) passes.erase(it);
    return true;
  }
  if (it == passes.end()) it = passes.emplace(pass_id, Pass{}).first;
  Pass& pass = it->second;
  pass.phase = *to;
  if (*to == PassPhase::kAborted) pass.sink.reset();  // nothing left to take back
  if (event != PassEvent::kReport) return true;
  // Reported: discovery's bookkeeping goes (a Discover naming a send again finds the part
  // over, not the send named); the sink and done stay, for an abort or a Wait asked again.
  pass.notified.clear();
  pass.named.clear();
  std::vector<uint64_t> earlier;
  for (const auto& [id, other] : passes) {
    if (id != pass_id && next(other.phase, PassEvent::kSuperseded)) earlier.push_back(id);
  }
  for (uint64_t id : earlier)
    apply(id, PassEvent::kSuperseded);
  return true;
}

}  // namespace gradwire::dist_autograd::internal
