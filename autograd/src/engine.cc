#include "gradwire/autograd/engine.h"

#include "gradwire/autograd/graph_task.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::autograd {

std::vector<Tensor> execute(const std::vector<GraphRoot>& roots, const ExecuteOptions& options) {
  GraphTask task(options);
  for (size_t i = 0; i < roots.size(); ++i) {
    GRADWIRE_CHECK_ARG(roots[i].edge.is_valid()) << "execute: root " << i << " has no function";
    task.expect(roots[i].edge);
  }
  for (const GraphRoot& r : roots)
    task.add_gradient(r.edge, r.grad);
  task.run_ready();
  // Every gradient was given before running, so one run on this thread finishes the task.
  GRADWIRE_CHECK(task.completed()) << "execute: the pass ended with nodes left to run";
  return task.captured();
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
