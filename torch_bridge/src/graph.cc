// The mirror of LibTorch's graph in gradwire's (graph.h): TorchNodeBackward runs a torch
// node; GradwireRecvBackward is the torch grad_fn of a received tensor; the twins of torch
// leaves hold their gradients in a context.
#include "graph.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/grad_mode.h>
#include <torch/csrc/autograd/variable.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"
#include "gradwire/torch/convert.h"

namespace gradwire::torch::graph {
namespace {

using TorchNode = ::torch::autograd::Node;
using TorchEdge = ::torch::autograd::Edge;

// Runs one torch node in gradwire's engine: the gradients cross without a copy; the node's
// pre-hooks (a non-leaf's register_hook) run first, as torch's engine runs them.
class TorchNodeBackward final : public autograd::Node {
 public:
  explicit TorchNodeBackward(std::shared_ptr<TorchNode> fn) : fn_(std::move(fn)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    ::torch::autograd::variable_list in;
    in.reserve(grads.size());
    for (Tensor& g : grads)
      in.push_back(g.defined() ? to_torch(g) : at::Tensor());
    ::torch::autograd::variable_list out;
    try {
      ::torch::autograd::AutoGradMode no_grad(false);
      for (const auto& hook : fn_->pre_hooks())
        in = (*hook)(in);
      out = (*fn_)(std::move(in));
    } catch (const c10::Error& e) {
      GRADWIRE_THROW(Error) << "LibTorch's " << fn_->name()
                            << " failed in a backward pass: " << e.what_without_backtrace();
    }
    std::vector<Tensor> result;
    result.reserve(out.size());
    for (size_t i = 0; i < out.size(); ++i) {
      if (!out[i].defined() || !should_compute_output(i)) {
        result.emplace_back();
        continue;
      }
      try {
        result.push_back(from_torch(out[i]));
      } catch (const InvalidArgument& e) {
        GRADWIRE_THROW(InvalidArgument) << "LibTorch's " << fn_->name() << " returned gradient "
                                        << i << " that gradwire cannot take: " << e.what();
      }
    }
    return result;
  }
  std::string name() const override { return fn_->name(); }
  void release_variables() override { fn_->release_variables(); }
  const std::shared_ptr<TorchNode>& fn() const { return fn_; }

 private:
  const std::shared_ptr<TorchNode> fn_;
};

// The identity from a tensor that left (or a root) to its place in the mirrored graph.
class TorchEdgeBackward final : public autograd::Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return std::move(grads); }
  std::string name() const override { return "TorchToGradwireBackward"; }
};

// The torch grad_fn of a tensor received within a context: its gradient belongs to the
// received gradwire tensor's history, which only dist_autograd's pass runs.
class GradwireRecvBackward final : public TorchNode {
 public:
  explicit GradwireRecvBackward(autograd::Edge edge) : edge_(std::move(edge)) {}
  ::torch::autograd::variable_list apply(::torch::autograd::variable_list&&) override {
    throw InvalidArgument(
        "this tensor came over rpc within a dist_autograd context: its gradient flows back "
        "to the sender only in gradwire::torch::dist_autograd::backward, not in LibTorch's "
        "own backward()");
  }
  std::string name() const override { return "GradwireRecvBackward"; }
  const autograd::Edge& edge() const { return edge_; }

 private:
  const autograd::Edge edge_;
};

// Both sides weak: a twin lives while something holds it (a DistributedOptimizer's RRef, a
// graph's accumulator, a context's gradients), and while it does, the leaf has that twin;
// the table never keeps the leaf's memory alive.
struct Twin {
  c10::weak_intrusive_ptr<c10::TensorImpl> leaf;
  std::weak_ptr<TensorImpl> twin;
};

Mutex g_mutex;
// A torch node -> its mirror (expired entries are swept as the table grows).
std::unordered_map<const TorchNode*, std::weak_ptr<TorchNodeBackward>> g_mirrors
    GRADWIRE_GUARDED_BY(g_mutex);
size_t g_mirror_sweep_at GRADWIRE_GUARDED_BY(g_mutex) = 1024;
// A torch leaf's TensorImpl -> its twin; and a twin's TensorImpl -> the leaf's (entries
// with either side gone are swept as the table grows).
std::unordered_map<const c10::TensorImpl*, Twin> g_twins GRADWIRE_GUARDED_BY(g_mutex);
std::unordered_map<const void*, const c10::TensorImpl*> g_leaf_of GRADWIRE_GUARDED_BY(g_mutex);
size_t g_twin_sweep_at GRADWIRE_GUARDED_BY(g_mutex) = 1024;

Device device_of(const at::Device& d) {
  if (d.is_cuda()) return Device::cuda(d.has_index() ? d.index() : 0);
  return Device::cpu();
}

// The shape of a torch node's input, read from the metadata's own description of it (the
// metadata keeps its shape private); zeros_like() is the fallback, which allocates.
Shape shape_of(const ::torch::autograd::InputMetadata& md) {
  const std::string text =
      md.incompatible_shape_error_message(0, at::empty({0}, at::TensorOptions())).str();
  const std::string marker = "compatible with [";
  const size_t at = text.rfind(marker);
  if (at != std::string::npos && text.back() == ']') {
    Shape shape;
    std::istringstream in(text.substr(at + marker.size(), text.size() - at - marker.size() - 1));
    std::string field;
    bool ok = true;
    while (std::getline(in, field, ',')) {
      char* end = nullptr;
      const long long v = std::strtoll(field.c_str(), &end, 10);
      while (end != nullptr && *end == ' ')
        ++end;
      if (end == nullptr || *end != '\0' || v < 0) {
        ok = false;
        break;
      }
      shape.push_back(v);
    }
    if (ok) return shape;
  }
  at::Tensor z = md.zeros_like();
  return Shape(z.sizes().begin(), z.sizes().end());
}

std::shared_ptr<TorchNodeBackward> make_mirror(const std::shared_ptr<TorchNode>& fn) {
  auto m = std::make_shared<TorchNodeBackward>(fn);
  for (uint32_t i = 0; i < fn->num_inputs(); ++i) {
    const auto& md = fn->input_metadata(i);
    const c10::ScalarType type = c10::typeMetaToScalarType(md.dtype());
    const std::optional<DType> dtype = dtype_from_torch(type);
    GRADWIRE_CHECK_ARG(dtype.has_value())
        << "dist_autograd: LibTorch's " << fn->name() << " takes a gradient of "
        << torch_dtype_name(type) << ", which gradwire has no type for";
    m->add_input_metadata(autograd::InputMetadata{shape_of(md), *dtype, device_of(md.device())});
  }
  return m;
}

Tensor twin_locked(const at::Tensor& leaf) GRADWIRE_REQUIRES(g_mutex) {
  const c10::TensorImpl* key = leaf.unsafeGetTensorImpl();
  auto it = g_twins.find(key);
  if (it != g_twins.end()) {
    std::shared_ptr<TensorImpl> held = it->second.twin.lock();
    if (held != nullptr) {
      Tensor t(std::move(held));
      // The same leaf, still viewing the same memory: the same twin.
      if (!it->second.leaf.expired() && t.data_ptr() == leaf.data_ptr() &&
          t.sizes() == Shape(leaf.sizes().begin(), leaf.sizes().end())) {
        return t;
      }
      g_leaf_of.erase(&t.impl());
    }
    g_twins.erase(it);
  }
  if (g_twins.size() >= g_twin_sweep_at) {
    for (auto i = g_twins.begin(); i != g_twins.end();) {
      std::shared_ptr<TensorImpl> held = i->second.twin.lock();
      if (held == nullptr || i->second.leaf.expired()) {
        i = g_twins.erase(i);
      } else {
        ++i;
      }
    }
    std::erase_if(g_leaf_of, [](const auto& kv) { return g_twins.count(kv.second) == 0; });
    g_twin_sweep_at = std::max<size_t>(1024, 2 * g_twins.size());
  }
  Tensor twin = from_torch(leaf.detach());
  twin.set_requires_grad(true);
  g_twins.emplace(
      key, Twin{c10::weak_intrusive_ptr<c10::TensorImpl>(leaf.getIntrusivePtr()), twin.impl_ptr()});
  g_leaf_of[&twin.impl()] = key;
  return twin;
}

// gradwire's edge for a torch edge: the twin's accumulator for a leaf, the received
// tensor's history for a GradwireRecvBackward, else the mirror of the node (made when
// missing and queued in `fill` for its own edges).
autograd::Edge edge_locked(const TorchEdge& e,
                           std::vector<std::shared_ptr<TorchNodeBackward>>& fill)
    GRADWIRE_REQUIRES(g_mutex) {
  if (!e.is_valid()) return {};
  TorchNode* fn = e.function.get();
  if (auto* acc = dynamic_cast<::torch::autograd::AccumulateGrad*>(fn)) {
    return autograd::gradient_edge(twin_locked(acc->variable));
  }
  if (auto* recv = dynamic_cast<GradwireRecvBackward*>(fn)) return recv->edge();
  auto it = g_mirrors.find(fn);
  if (it != g_mirrors.end()) {
    if (std::shared_ptr<TorchNodeBackward> m = it->second.lock()) {
      return autograd::Edge(std::move(m), e.input_nr);
    }
  }
  if (g_mirrors.size() >= g_mirror_sweep_at) {
    std::erase_if(g_mirrors, [](const auto& kv) { return kv.second.expired(); });
    g_mirror_sweep_at = std::max<size_t>(1024, 2 * g_mirrors.size());
  }
  std::shared_ptr<TorchNodeBackward> m = make_mirror(e.function);
  g_mirrors[fn] = m;
  fill.push_back(m);
  return autograd::Edge(std::move(m), e.input_nr);
}

// The mirror of the graph behind torch edge `e`, every node's edges set.
autograd::Edge mirror(const TorchEdge& e) {
  MutexLock lock(g_mutex);
  std::vector<std::shared_ptr<TorchNodeBackward>> fill;
  autograd::Edge out = edge_locked(e, fill);
  while (!fill.empty()) {
    std::shared_ptr<TorchNodeBackward> m = std::move(fill.back());
    fill.pop_back();
    std::vector<autograd::Edge> edges;
    edges.reserve(m->fn()->next_edges().size());
    for (const TorchEdge& next : m->fn()->next_edges())
      edges.push_back(edge_locked(next, fill));
    m->set_next_edges(std::move(edges));
  }
  return out;
}

}  // namespace

Tensor recorded(const at::Tensor& t) {
  if (t.is_leaf()) return twin_of(t);
  Tensor g = from_torch(t.detach());
  auto node = std::make_shared<TorchEdgeBackward>();
  node->add_next_edge(mirror(::torch::autograd::impl::gradient_edge(t)));
  autograd::set_history(g, node);
  return g;
}

at::Tensor received(const Tensor& g) {
  at::Tensor t = to_torch(g.detach());
  std::shared_ptr<GradwireRecvBackward> fn(new GradwireRecvBackward(autograd::gradient_edge(g)),
                                           ::torch::autograd::deleteNode);
  ::torch::autograd::set_history(t, fn);
  return t;
}

Tensor twin_of(const at::Tensor& leaf) {
  GRADWIRE_CHECK_ARG(leaf.defined()) << "dist_autograd: an undefined torch tensor has no twin";
  GRADWIRE_CHECK_ARG(leaf.is_leaf())
      << "dist_autograd: a torch tensor with a grad_fn (" << leaf.grad_fn()->name()
      << ") is no leaf: only leaves (parameters, inputs) have a gradwire twin";
  MutexLock lock(g_mutex);
  return twin_locked(leaf);
}

at::Tensor leaf_of_twin(const Tensor& twin) {
  if (!twin.defined()) return {};
  MutexLock lock(g_mutex);
  auto it = g_leaf_of.find(&twin.impl());
  if (it == g_leaf_of.end()) return {};
  auto t = g_twins.find(it->second);
  // The entry must still be this twin's (a twin's address may be reused once it is gone).
  if (t == g_twins.end() || t->second.twin.lock() != twin.impl_ptr()) return {};
  c10::intrusive_ptr<c10::TensorImpl> impl = t->second.leaf.lock();
  if (!impl) return {};
  return at::Tensor(std::move(impl));
}

}  // namespace gradwire::torch::graph
