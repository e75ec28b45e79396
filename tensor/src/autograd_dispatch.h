// The test every differentiable tensor/ frontend runs first (autograd_hooks.h explains the
// design): forward to the autograd hooks when an argument carries autograd state and
// recording is active on this thread. Kept to a null test per argument plus one branch on
// a thread-local so that code that never uses autograd stays fast.
#pragma once

#include <vector>

#include "gradwire/tensor/autograd_hooks.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::detail {

struct AutogradTls {
  bool grad_enabled = true;
  bool below_autograd = false;
};
extern thread_local AutogradTls autograd_tls;

inline bool has_autograd_meta(const Tensor& t) {
  return t.impl_ptr() != nullptr && t.impl_ptr()->autograd_meta() != nullptr;
}

// True when the call must go to autograd_hooks(). Recording is active when grad mode is on
// and autograd is not already running the raw op; in-place ops under no-grad need no hook.
template <typename... Ts>
inline bool autograd_dispatch(const Ts&... tensors) {
  if (!(has_autograd_meta(tensors) || ...)) return false;
  return autograd_tls.grad_enabled && !autograd_tls.below_autograd && autograd_hooks() != nullptr;
}

inline bool autograd_dispatch_list(const std::vector<Tensor>& tensors) {
  bool any = false;
  for (const Tensor& t : tensors)
    any = any || has_autograd_meta(t);
  if (!any) return false;
  return autograd_tls.grad_enabled && !autograd_tls.below_autograd && autograd_hooks() != nullptr;
}

}  // namespace gradwire::detail
