#include "gradwire/dist_nn/remote_module.h"

#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/node.h"
#include "gradwire/autograd/variable.h"

namespace gradwire::dist_nn::detail {

namespace {

// A node made only to read the autograd node counter: nodes made after it number higher.
class Marker final : public autograd::Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&&) override { return {}; }
  std::string name() const override { return "RemoteModuleMarker"; }
};

}  // namespace

uint64_t next_node_number() {
  const Marker marker;
  return marker.sequence_nr() + 1;
}

void reroute(const Tensor& output, uint64_t first, const std::vector<Tensor>& from,
             const std::vector<Tensor>& to, std::shared_ptr<void> keep) {
  if (from.size() != to.size()) {
    throw InvalidArgument("RemoteModule: the replica has " + std::to_string(from.size()) +
                          " parameters and the module " + std::to_string(to.size()));
  }
  if (!output.defined()) return;
  std::unordered_map<const TensorImpl*, autograd::Edge> target;
  for (size_t i = 0; i < from.size(); ++i) {
    if (output.impl_ptr() == from[i].impl_ptr()) {
      throw InvalidArgument(
          "RemoteModule: forward returned one of the module's parameters itself; a forward "
          "under ForwardParameters::kSnapshot returns a tensor computed from them");
    }
    target.emplace(from[i].impl_ptr().get(), autograd::gradient_edge(to[i]));
  }
  const std::shared_ptr<autograd::Node> root = output.grad_fn();
  if (root == nullptr) return;  // nothing recorded: the replica is free again at once
  std::unordered_set<const autograd::Node*> seen{root.get()};
  std::deque<autograd::Node*> todo{root.get()};
  while (!todo.empty()) {
    autograd::Node* node = todo.front();
    todo.pop_front();
    std::vector<autograd::Edge> edges = node->next_edges();
    bool changed = false;
    for (autograd::Edge& edge : edges) {
      if (!edge.is_valid()) continue;
      if (const auto* acc = dynamic_cast<const autograd::AccumulateGrad*>(edge.function.get())) {
        auto it = target.find(acc->variable().impl_ptr().get());
        if (it != target.end()) {
          edge = it->second;
          changed = true;
        }
      } else if (edge.function->sequence_nr() >= first && seen.insert(edge.function.get()).second) {
        todo.push_back(edge.function.get());
      }
    }
    if (changed) node->set_next_edges(std::move(edges));
  }
  // The graph holds the replica (its saved tensors are the replica's) while it lives.
  output.register_hook([keep = std::move(keep)](const Tensor&) { return Tensor(); });
}

void copy_state(const nn::Module& from, nn::Module& to, const std::string& type) {
  const std::vector<Tensor> src = from.parameters(), dst = to.parameters();
  const std::vector<Tensor> src_buffers = from.buffers(), dst_buffers = to.buffers();
  if (src.size() != dst.size() || src_buffers.size() != dst_buffers.size()) {
    throw InvalidArgument(
        "RemoteModule: a replica of " + type + " has " + std::to_string(dst.size()) +
        " parameters and " + std::to_string(dst_buffers.size()) + " buffers, the module " +
        std::to_string(src.size()) + " and " + std::to_string(src_buffers.size()) +
        " (its constructor must build the same module each time)");
  }
  autograd::NoGradGuard no_grad;
  for (size_t i = 0; i < src.size(); ++i)
    dst[i].detach().copy_(src[i].detach());
  for (size_t i = 0; i < src_buffers.size(); ++i)
    dst_buffers[i].detach().copy_(src_buffers[i].detach());
}

void rethrow_with(const std::string& prefix) {
  try {
    throw;
  } catch (const RemoteError& e) {
    throw RemoteError(e.worker(), e.remote_type(), prefix + e.remote_message());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(prefix + e.what());
  } catch (const TimeoutError& e) {
    throw TimeoutError(prefix + e.what());
  } catch (const NetworkError& e) {
    throw NetworkError(prefix + e.what());
  }
}

}  // namespace gradwire::dist_nn::detail
