// The engine: runs a backward pass over the recorded graph.
//
// Each call is one graph task (graph_task.h), independent of every other: it counts, for
// each node reachable from its roots, how many edges lead into it, keeps one input buffer per
// node (gradients arriving from several consumers are summed there, so a tensor used twice
// gets the sum), and runs nodes whose count has dropped to zero, highest sequence number
// first, on the calling thread, then the callbacks queued during the pass (queue_callback). There
// is no engine thread and no global queue: many threads may run backward passes at once (the RPC
// thread pool does); nodes shared between concurrent passes (a parameter's AccumulateGrad) are
// serialised by the node's mutex.
//
// Built for distribution from the start:
//   - execute() starts from arbitrary (edge, gradient) pairs, not only from tensors, so
//     dist_autograd can start a pass at its recv functions with gradients from the wire;
//   - a GradientSink receives leaf gradients instead of .grad (a dist-autograd context),
//     with the leaf's hooks still run (gradient_sink.h);
//   - a GraphTask can be fed gradients as they arrive, for passes that span messages;
//   - Node kinds may be defined outside autograd/ (node.h).
//
// Errors (InvalidArgument): a root that does not require grad; a non-scalar root without
// a gradient; a root gradient whose shape, dtype or device does not match its input (or an
// input number the node does not have: names the node); backward through a graph
// freed by an earlier pass without retain_graph (names the node); a saved tensor modified
// in place (saved_variable.h); for grad(), an input not reached unless allow_unused. An
// exception thrown by a node, hook, sink or end-of-pass callback propagates out of the call
// that ran it.
//
// Thread-safety: all functions may be called concurrently from any threads.
//
// Example:
//   Tensor loss = mean(square(mm(x, w) - y));
//   backward({loss});                              // w.grad() now holds d loss / d w
//   auto [gw] = grad({loss2}, {w}) ...;            // returns d loss2 / d w; w.grad() untouched
#pragma once

#include <memory>
#include <vector>

#include "gradwire/autograd/graph_task.h"
#include "gradwire/autograd/node.h"

namespace gradwire::autograd {

// One starting point of a backward pass: `grad` flows into `edge`.
struct GraphRoot {
  Edge edge;
  Tensor grad;
};

// Runs one backward pass from `roots`. Returns the captured gradients (empty when
// options.capture is empty). Gradients of roots that share an edge are summed.
std::vector<Tensor> execute(const std::vector<GraphRoot>& roots,
                            const ExecuteOptions& options = {});

// The roots for backpropagating from `tensors`: each tensor's gradient edge with its
// gradient (grad_tensors[i], or ones for a one-element tensor when grad_tensors is empty or
// grad_tensors[i] undefined). Validates as described in the header comment.
std::vector<GraphRoot> make_roots(const std::vector<Tensor>& tensors,
                                  const std::vector<Tensor>& grad_tensors = {});

// Accumulates d(tensors)/d(leaf) into every leaf's .grad (torch.autograd.backward).
void backward(const std::vector<Tensor>& tensors, const std::vector<Tensor>& grad_tensors = {},
              bool retain_graph = false);

// Returns d(outputs)/d(inputs) without touching any .grad (torch.autograd.grad). An
// input no output depends on is an error unless allow_unused (then its gradient is
// undefined). No higher-order graphs: the results do not require grad.
std::vector<Tensor> grad(const std::vector<Tensor>& outputs, const std::vector<Tensor>& inputs,
                         const std::vector<Tensor>& grad_outputs = {}, bool retain_graph = false,
                         bool allow_unused = false);

}  // namespace gradwire::autograd
