#include "gradwire/autograd/node.h"

#include <atomic>

namespace gradwire::autograd {

namespace {
std::atomic<uint64_t> g_sequence_nr{0};
std::atomic<uint64_t> g_hook_handle{1};
}  // namespace

namespace detail {
uint64_t new_hook_handle() {
  return g_hook_handle.fetch_add(1, std::memory_order_relaxed);
}
}  // namespace detail

Node::Node() : sequence_nr_(g_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}
Node::Node(uint64_t sequence_nr) : sequence_nr_(sequence_nr) {}
Node::~Node() = default;

uint64_t Node::next_hook_handle() {
  return detail::new_hook_handle();
}

uint32_t Node::add_input_metadata(const Tensor& t) {
  return add_input_metadata(InputMetadata{t.sizes(), t.dtype(), t.device()});
}

uint32_t Node::add_input_metadata(InputMetadata meta) {
  input_metadata_.push_back(std::move(meta));
  return static_cast<uint32_t>(input_metadata_.size() - 1);
}

uint64_t Node::add_pre_hook(uint32_t input_nr, TensorHook hook) {
  const uint64_t handle = next_hook_handle();
  MutexLock lock(hooks_mutex_);
  pre_hooks_.push_back(PreHook{handle, input_nr, std::move(hook)});
  return handle;
}

bool Node::remove_pre_hook(uint64_t handle) {
  MutexLock lock(hooks_mutex_);
  for (auto it = pre_hooks_.begin(); it != pre_hooks_.end(); ++it) {
    if (it->handle == handle) {
      pre_hooks_.erase(it);
      return true;
    }
  }
  return false;
}

void Node::run_pre_hooks(std::vector<Tensor>& grads) {
  std::vector<PreHook> hooks;
  {
    MutexLock lock(hooks_mutex_);
    if (pre_hooks_.empty()) return;
    hooks = pre_hooks_;  // hooks run unlocked: they may register or remove hooks
  }
  for (const PreHook& h : hooks) {
    // A hook computes with the gradient: it is not shown an input nothing flowed into.
    if (h.input_nr >= grads.size() || !grads[h.input_nr].defined()) continue;
    Tensor replaced = h.fn(grads[h.input_nr]);
    if (replaced.defined()) grads[h.input_nr] = std::move(replaced);
  }
}

}  // namespace gradwire::autograd
