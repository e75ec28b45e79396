// gradwire::torch::dist_autograd: torch roots for gradwire's pass, the torch leaves'
// gradients out of a context, and the twins a DistributedOptimizer steps.
#include "gradwire/torch/dist_autograd.h"

#include <string>
#include <utility>
#include <vector>

#include "gradwire/core/check.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/torch/convert.h"
#include "gradwire/torch/value_convert.h"
#include "graph.h"

namespace gradwire::torch::dist_autograd {

void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<at::Tensor>& roots,
              const BackwardOptions& options) {
  GRADWIRE_CHECK_ARG(!roots.empty())
      << "gradwire::torch::dist_autograd::backward: no roots given (context " << context_id << ")";
  std::vector<Tensor> gw;
  gw.reserve(roots.size());
  for (size_t i = 0; i < roots.size(); ++i) {
    const at::Tensor& r = roots[i];
    GRADWIRE_CHECK_ARG(r.defined())
        << "gradwire::torch::dist_autograd::backward: root " << i << " is undefined";
    GRADWIRE_CHECK_ARG(r.requires_grad())
        << "gradwire::torch::dist_autograd::backward: root " << i << " (" << r.sizes() << ", "
        << r.scalar_type() << ") does not require grad";
    gw.push_back(graph::recorded(r));
  }
  gradwire::dist_autograd::backward(agent, context_id, gw, options);
}

void backward(uint64_t context_id, const std::vector<at::Tensor>& roots,
              const BackwardOptions& options) {
  backward(*rpc::default_agent(), context_id, roots, options);
}

Gradients::Gradients(std::vector<std::pair<at::Tensor, at::Tensor>> items)
    : items_(std::move(items)) {
  for (size_t i = 0; i < items_.size(); ++i)
    index_.emplace(items_[i].first.unsafeGetTensorImpl(), i);
}

at::Tensor Gradients::at(const at::Tensor& leaf) const {
  auto it = leaf.defined() ? index_.find(leaf.unsafeGetTensorImpl()) : index_.end();
  if (it == index_.end()) {
    GRADWIRE_THROW(InvalidArgument)
        << "dist_autograd: the context holds no gradient for this torch tensor"
        << (leaf.defined() ? " (" + std::to_string(leaf.dim()) + "-d, " +
                                 std::string(c10::toString(leaf.scalar_type())) + ")"
                           : std::string(" (undefined)"))
        << "; it holds " << items_.size() << " leaf gradient(s)";
  }
  return items_[it->second].second;
}

bool Gradients::contains(const at::Tensor& leaf) const {
  return leaf.defined() && index_.count(leaf.unsafeGetTensorImpl()) != 0;
}

Gradients get_gradients(rpc::RpcAgent& agent, uint64_t context_id) {
  gradwire::dist_autograd::Gradients all =
      gradwire::dist_autograd::get_gradients(agent, context_id);
  std::vector<std::pair<at::Tensor, at::Tensor>> items;
  for (const auto& [leaf, grad] : all.items()) {
    at::Tensor t = graph::leaf_of_twin(leaf);
    if (t.defined()) items.emplace_back(std::move(t), to_torch(grad));
  }
  return Gradients(std::move(items));
}

Gradients get_gradients(uint64_t context_id) {
  return get_gradients(*rpc::default_agent(), context_id);
}

Tensor autograd_leaf(const at::Tensor& leaf) {
  return graph::twin_of(leaf);
}

rref::RRef<Tensor> parameter_rref(rpc::RpcAgent& agent, const at::Tensor& param) {
  return rref::make_local<Tensor>(agent, graph::twin_of(param));
}

std::vector<rref::RRef<Tensor>> parameter_rrefs(rpc::RpcAgent& agent,
                                                const ::torch::nn::Module& module) {
  std::vector<rref::RRef<Tensor>> out;
  for (const at::Tensor& p : module.parameters())
    out.push_back(parameter_rref(agent, p));
  return out;
}

}  // namespace gradwire::torch::dist_autograd
