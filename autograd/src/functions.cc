#include "functions.h"

#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/dtype.h"
#include "meta.h"

namespace gradwire::autograd::detail {

Recorder::Recorder(const char* name, const std::vector<Tensor>& inputs) {
  edges_.reserve(inputs.size());
  for (const Tensor& t : inputs) {
    edges_.push_back(gradient_edge(t));
    active_ = active_ || edges_.back().is_valid();
  }
  if (active_) node_ = std::make_shared<FormulaNode>(name, nullptr);
}

Recorder::Recorder(const char* name, const char* op, const Tensor& self,
                   const std::vector<Tensor>& inputs) {
  bool any = false;
  for (const Tensor& t : inputs)
    any = any || requires_grad(t);
  if (!any) return;
  AutogradMeta* meta = get_meta(self);
  if (meta != nullptr && meta->grad_fn == nullptr && meta->requires_grad_flag) {
    GRADWIRE_THROW(InvalidArgument)
        << op << ": a leaf tensor that requires grad (shape " << self.shape_string()
        << ") is being used in an in-place operation; do it under a NoGradGuard, or on a clone()";
  }
  if (meta != nullptr && meta->is_view) {
    GRADWIRE_THROW(InvalidArgument)
        << op << ": in-place operation on a view (created by " << meta->view_op << ", shape "
        << self.shape_string()
        << ") of a tensor that requires grad; autograd does not rebase views onto their base. "
           "Apply the operation out of place, or to a clone() of the view";
  }
  if ((meta == nullptr || meta->grad_fn == nullptr) && self.storage().use_count() > 1) {
    GRADWIRE_THROW(InvalidArgument)
        << op << ": in-place operation that makes a tensor (shape " << self.shape_string()
        << ") require grad, but its storage is shared with other tensors (views or a base) "
           "that autograd does not track, so their gradients would silently be lost; use an "
           "out-of-place operation, or a tensor that owns its storage";
  }
  *this = Recorder(name, inputs);
}

Tensor Recorder::finish(Tensor out, Formula formula) {
  std::vector<Tensor> outs = finish_many({std::move(out)}, std::move(formula));
  return std::move(outs[0]);
}

Tensor Recorder::finish_view(Tensor out, const char* op, Formula formula) {
  Tensor r = finish(std::move(out), std::move(formula));
  if (AutogradMeta* m = get_meta(r); m != nullptr && m->grad_fn != nullptr) {
    m->is_view = true;
    m->view_version = r.version();
    m->view_op = op;
  }
  return r;
}

std::vector<Tensor> Recorder::finish_many(std::vector<Tensor> outs, Formula formula) {
  if (!active_) return outs;
  node_->set_next_edges(std::move(edges_));
  node_->set_formula(std::move(formula));
  for (Tensor& out : outs) {
    if (!out.defined() || !is_floating_point(out.dtype())) continue;
    // An op may return its input unchanged; the result must be a tensor of its own.
    if (out.impl().autograd_meta() != nullptr) out = out.detach();
    set_history(out, node_);
  }
  return outs;
}

void Recorder::finish_inplace(const Tensor& self, Formula formula) {
  if (!active_) return;
  node_->set_next_edges(std::move(edges_));
  node_->set_formula(std::move(formula));
  AutogradMeta& meta = materialize_meta(self);
  meta.grad_fn = node_;
  meta.output_nr = node_->add_input_metadata(self);
  meta.requires_grad_flag = false;
}

}  // namespace gradwire::autograd::detail
