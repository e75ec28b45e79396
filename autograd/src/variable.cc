#include "gradwire/autograd/variable.h"

#include "gradwire/core/check.h"
#include "gradwire/tensor/dtype.h"
#include "meta.h"

namespace gradwire::autograd {

namespace detail {
AutogradMeta& materialize_meta(const Tensor& t) {
  auto* meta = static_cast<AutogradMeta*>(t.impl().autograd_meta());
  if (meta == nullptr) {
    auto fresh = std::make_unique<AutogradMeta>();
    meta = fresh.get();
    t.impl().set_autograd_meta(std::move(fresh));
  }
  return *meta;
}
}  // namespace detail

std::shared_ptr<AccumulateGrad> grad_accumulator(const Tensor& leaf) {
  detail::AutogradMeta* meta = detail::get_meta(leaf);
  if (meta == nullptr || meta->grad_fn != nullptr || !meta->requires_grad_flag) return nullptr;
  MutexLock lock(meta->mutex);
  std::shared_ptr<AccumulateGrad> acc = meta->grad_accumulator.lock();
  if (acc == nullptr) {
    acc = std::make_shared<AccumulateGrad>(Tensor(leaf.impl_ptr()));
    meta->grad_accumulator = acc;
  }
  return acc;
}

uint64_t register_leaf_gradient_hook(const Tensor& leaf, LeafGradientHook hook) {
  detail::AutogradMeta* meta = detail::get_meta(leaf);
  GRADWIRE_CHECK_ARG(meta != nullptr && meta->requires_grad() && meta->grad_fn == nullptr)
      << "register_leaf_gradient_hook: leaf-gradient hooks can only be registered on leaf "
         "tensors that require grad";
  GRADWIRE_CHECK_ARG(hook != nullptr) << "register_leaf_gradient_hook: empty hook";
  const uint64_t handle = detail::new_hook_handle();
  MutexLock lock(meta->mutex);
  meta->gradient_hooks.push_back(detail::AutogradMeta::GradientHook{handle, std::move(hook)});
  return handle;
}

Edge gradient_edge(const Tensor& t) {
  detail::AutogradMeta* meta = detail::get_meta(t);
  if (meta == nullptr) return Edge();
  if (meta->grad_fn != nullptr) {
    if (meta->is_view && t.version() != meta->view_version) {
      GRADWIRE_THROW(InvalidArgument)
          << "a view created by " << meta->view_op << " (shape " << t.shape_string()
          << ") is used after its storage was modified in place (version " << t.version()
          << ", expected " << meta->view_version
          << "); autograd does not rebase views onto modified bases: take the view again after "
             "the in-place operation, or clone() it first";
    }
    return Edge(meta->grad_fn, meta->output_nr);
  }
  if (meta->requires_grad_flag) return Edge(grad_accumulator(t), 0);
  return Edge();
}

std::vector<Edge> collect_next_edges(const std::vector<Tensor>& tensors) {
  std::vector<Edge> edges;
  edges.reserve(tensors.size());
  for (const Tensor& t : tensors)
    edges.push_back(gradient_edge(t));
  return edges;
}

void set_history(const Tensor& t, const std::shared_ptr<Node>& fn) {
  GRADWIRE_CHECK_ARG(t.defined() && fn != nullptr) << "set_history: undefined tensor or node";
  GRADWIRE_CHECK_ARG(is_floating_point(t.dtype()))
      << "set_history: only floating point tensors can have a gradient, got "
      << dtype_name(t.dtype());
  detail::AutogradMeta& meta = detail::materialize_meta(t);
  meta.grad_fn = fn;
  meta.output_nr = fn->add_input_metadata(t);
  meta.requires_grad_flag = false;
}

uint32_t output_nr(const Tensor& t) {
  detail::AutogradMeta* meta = detail::get_meta(t);
  return meta == nullptr ? 0 : meta->output_nr;
}

}  // namespace gradwire::autograd
