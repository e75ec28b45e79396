#include "gradwire/autograd/engine.h"

#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "grad_utils.h"
#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::autograd {

namespace {

// Per-node state of one graph task.
struct NodeState {
  std::vector<Tensor> buffer;    // input gradients, summed over producers
  int dependencies = 0;          // running producers that have not delivered yet
  bool useful = true;            // runs or is captured (always, unless capturing)
  bool runs = true;              // apply() is called
  std::vector<size_t> captures;  // indices into options.capture targeting this node
};

struct ReadyOrder {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

// Makes a producer's gradient fit the receiving input: sums a broadcast gradient, and
// casts dtype and device, as PyTorch's validate_outputs does; any other shape is an error.
Tensor fit_gradient(Tensor g, const Node& producer, size_t index, const Node& receiver,
                    uint32_t input_nr) {
  if (input_nr >= receiver.num_inputs()) return g;
  const InputMetadata& meta = receiver.input_metadata(input_nr);
  if (g.sizes() != meta.shape) {
    if (!detail::broadcasts_to(meta.shape, g.sizes())) {
      GRADWIRE_THROW(InvalidArgument)
          << "Function " << producer.name() << " returned an invalid gradient at index " << index
          << ": got shape " << g.shape_string() << " but expected shape "
          << shape_to_string(meta.shape) << " (input " << input_nr << " of " << receiver.name()
          << ")";
    }
    g = detail::sum_to(g, meta.shape);
  }
  if (g.dtype() != meta.dtype) g = g.to(meta.dtype);
  if (g.device() != meta.device) g = g.to(meta.device);
  return g;
}

void add_to_buffer(NodeState& state, size_t slot, Tensor g, size_t num_inputs) {
  if (state.buffer.size() < std::max(num_inputs, slot + 1)) {
    state.buffer.resize(std::max(num_inputs, slot + 1));
  }
  Tensor& cur = state.buffer[slot];
  cur = cur.defined() ? add(cur, g) : std::move(g);
}

}  // namespace

std::vector<Tensor> execute(const std::vector<GraphRoot>& roots, const ExecuteOptions& options) {
  // Formulas compute plain gradients: nothing they do is recorded (no higher-order graphs).
  AutoGradMode no_grad(false);
  const bool capturing = !options.capture.empty();

  // Discover the graph reachable from the roots (DFS, post-order for usefulness).
  std::unordered_map<Node*, NodeState> states;
  std::vector<Node*> post_order;
  {
    std::unordered_set<Node*> seen;
    std::vector<std::pair<Node*, size_t>> stack;
    for (const GraphRoot& r : roots) {
      GRADWIRE_CHECK_ARG(r.edge.is_valid()) << "execute: a root edge has no function";
      Node* n = r.edge.function.get();
      if (seen.insert(n).second) stack.emplace_back(n, 0);
      while (!stack.empty()) {
        auto& [node, next] = stack.back();
        if (next < node->next_edges().size()) {
          Node* child = node->next_edges()[next++].function.get();
          if (child != nullptr && seen.insert(child).second) stack.emplace_back(child, 0);
        } else {
          post_order.push_back(node);
          states[node];
          stack.pop_back();
        }
      }
    }
  }
  for (size_t i = 0; i < options.capture.size(); ++i) {
    const Edge& e = options.capture[i];
    GRADWIRE_CHECK_ARG(e.is_valid()) << "execute: capture edge " << i << " has no function";
    auto it = states.find(e.function.get());
    if (it != states.end()) it->second.captures.push_back(i);
  }
  if (capturing) {
    // Children come before parents in post_order.
    for (Node* n : post_order) {
      NodeState& s = states[n];
      bool runs = false;
      for (const Edge& e : n->next_edges()) {
        if (e.is_valid() && states[e.function.get()].useful) runs = true;
      }
      s.runs = runs;
      s.useful = runs || !s.captures.empty();
    }
  }
  for (Node* n : post_order) {
    const NodeState& s = states[n];
    if (!s.runs) continue;
    for (const Edge& e : n->next_edges()) {
      if (!e.is_valid()) continue;
      NodeState& c = states[e.function.get()];
      if (c.useful) ++c.dependencies;
    }
  }

  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready;
  for (const GraphRoot& r : roots) {
    Node* n = r.edge.function.get();
    NodeState& s = states[n];
    if (!s.useful) continue;
    if (r.grad.defined()) add_to_buffer(s, r.edge.input_nr, r.grad, n->num_inputs());
  }
  {
    std::unordered_set<Node*> queued;
    for (const GraphRoot& r : roots) {
      Node* n = r.edge.function.get();
      const NodeState& s = states[n];
      if (s.useful && s.dependencies == 0 && queued.insert(n).second) ready.push(n);
    }
  }

  std::vector<Tensor> captured(options.capture.size());
  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    NodeState& state = states[node];
    std::vector<Tensor> inputs = std::move(state.buffer);
    inputs.resize(std::max(inputs.size(), node->num_inputs()));
    node->run_pre_hooks(inputs);
    for (size_t i : state.captures) {
      const uint32_t nr = options.capture[i].input_nr;
      if (nr < inputs.size()) captured[i] = inputs[nr];
    }
    if (!state.runs) continue;

    auto* acc = dynamic_cast<AccumulateGrad*>(node);
    if (acc != nullptr) {
      if (inputs.empty() || !inputs[0].defined()) continue;
      MutexLock lock(node->mutex());
      if (options.sink != nullptr) {
        options.sink->accumulate(acc->variable(), inputs[0]);
      } else {
        acc->apply(std::move(inputs));
      }
      continue;
    }

    for (size_t i = 0; i < node->num_inputs(); ++i) {
      if (!inputs[i].defined()) {
        const InputMetadata& m = node->input_metadata(i);
        inputs[i] = zeros(m.shape, TensorOptions(m.dtype).device(m.device));
      }
    }
    std::vector<Tensor> outputs;
    {
      MutexLock lock(node->mutex());
      outputs = node->apply(std::move(inputs));
      if (!options.retain_graph) node->release_variables();
    }
    const auto& edges = node->next_edges();
    GRADWIRE_CHECK_ARG(outputs.size() == edges.size())
        << "Function " << node->name() << " returned " << outputs.size() << " gradients, expected "
        << edges.size() << " (one per next edge)";
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.is_valid()) continue;
      Node* child = e.function.get();
      NodeState& c = states[child];
      if (!c.useful) continue;
      if (outputs[i].defined()) {
        add_to_buffer(c, e.input_nr,
                      fit_gradient(std::move(outputs[i]), *node, i, *child, e.input_nr),
                      child->num_inputs());
      }
      if (--c.dependencies == 0) ready.push(child);
    }
  }
  return captured;
}

std::vector<GraphRoot> make_roots(const std::vector<Tensor>& tensors,
                                  const std::vector<Tensor>& grad_tensors) {
  GRADWIRE_CHECK_ARG(grad_tensors.empty() || grad_tensors.size() == tensors.size())
      << "backward: got " << grad_tensors.size() << " gradients for " << tensors.size()
      << " tensors";
  std::vector<GraphRoot> roots;
  roots.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    GRADWIRE_CHECK_ARG(t.defined()) << "backward: element " << i << " of tensors is undefined";
    Edge edge = gradient_edge(t);
    GRADWIRE_CHECK_ARG(edge.is_valid())
        << "element " << i << " of tensors does not require grad and does not have a grad_fn";
    Tensor g = grad_tensors.empty() ? Tensor() : grad_tensors[i];
    if (g.defined()) {
      GRADWIRE_CHECK_ARG(g.sizes() == t.sizes())
          << "backward: gradient " << i << " has shape " << g.shape_string()
          << " but its tensor has shape " << t.shape_string();
    } else {
      GRADWIRE_CHECK_ARG(t.numel() == 1)
          << "grad can be implicitly created only for scalar outputs: element " << i
          << " of tensors has shape " << t.shape_string()
          << "; pass a gradient of that shape to backward()";
      g = ones(t.sizes(), t.options());
    }
    roots.push_back(GraphRoot{std::move(edge), std::move(g)});
  }
  return roots;
}

void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors,
              bool retain_graph) {
  ExecuteOptions options;
  options.retain_graph = retain_graph;
  execute(make_roots(tensors, grad_tensors), options);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs, bool retain_graph,
                         bool allow_unused) {
  GRADWIRE_CHECK_ARG(!inputs.empty()) << "grad: no inputs given";
  ExecuteOptions options;
  options.retain_graph = retain_graph;
  for (size_t i = 0; i < inputs.size(); ++i) {
    GRADWIRE_CHECK_ARG(inputs[i].defined()) << "grad: input " << i << " is undefined";
    Edge e = gradient_edge(inputs[i]);
    GRADWIRE_CHECK_ARG(e.is_valid())
        << "grad: input " << i << " does not require grad and does not have a grad_fn";
    options.capture.push_back(std::move(e));
  }
  std::vector<Tensor> result = execute(make_roots(outputs, grad_outputs), options);
  for (size_t i = 0; i < result.size(); ++i) {
    GRADWIRE_CHECK_ARG(allow_unused || result[i].defined())
        << "grad: input " << i
        << " appears to not have been used in the graph; pass allow_unused=true if this is "
           "intended";
  }
  return result;
}

}  // namespace gradwire::autograd
