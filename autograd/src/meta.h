// AutogradMeta: the per-tensor autograd state behind tensor/'s opaque slot.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/node.h"
#include "gradwire/core/mutex.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::autograd::detail {

// A leaf has no grad_fn; it requires grad when `requires_grad` is set. A non-leaf has a
// grad_fn (and always requires grad). `grad`, the leaf's hooks (tensor, leaf-gradient and
// post-accumulate) and its AccumulateGrad
// are guarded by `mutex` because backward passes on other threads reach them.
class AutogradMeta final : public AutogradMetaInterface {
 public:
  struct LeafHook {
    uint64_t handle;
    TensorHook fn;
  };
  struct PostHook {
    uint64_t handle;
    PostAccumulateGradHook fn;
  };
  struct GradientHook {
    uint64_t handle;
    LeafGradientHook fn;
  };

  bool requires_grad() const { return requires_grad_flag || grad_fn != nullptr; }

  bool requires_grad_flag = false;
  std::shared_ptr<Node> grad_fn;
  uint32_t output_nr = 0;
  bool retains_grad = false;
  // Set on outputs of view ops: autograd does not rebase views, so an in-place write
  // through a view, or use of a view after its storage changed, is refused (docs).
  bool is_view = false;
  uint64_t view_version = 0;
  std::string view_op;

  Mutex mutex;
  Tensor grad GRADWIRE_GUARDED_BY(mutex);
  std::weak_ptr<AccumulateGrad> grad_accumulator GRADWIRE_GUARDED_BY(mutex);
  std::vector<LeafHook> hooks GRADWIRE_GUARDED_BY(mutex);
  std::vector<PostHook> post_hooks GRADWIRE_GUARDED_BY(mutex);
  std::vector<GradientHook> gradient_hooks GRADWIRE_GUARDED_BY(mutex);
};

// The meta of `t`, or null.
inline AutogradMeta* get_meta(const Tensor& t) {
  if (!t.defined()) return nullptr;
  return static_cast<AutogradMeta*>(t.impl().autograd_meta());
}
// The meta of `t`, created when missing.
AutogradMeta& materialize_meta(const Tensor& t);

inline bool requires_grad(const Tensor& t) {
  AutogradMeta* m = get_meta(t);
  return m != nullptr && m->requires_grad();
}

uint64_t new_hook_handle();

}  // namespace gradwire::autograd::detail
