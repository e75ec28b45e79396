// GraphTask: one backward pass as an object that can be fed gradients as they arrive.
//
// execute() (engine.h) is a GraphTask fed all at once. A distributed engine uses the task
// directly: gradients for one dist-autograd context reach a worker in several messages,
// each at a recv function, and the local graph below those functions may be shared (two
// remote calls whose results met in one local op). A shared node must run once, after all
// of its gradients have arrived, and only then may its saved tensors be freed; running each
// message as its own pass would either free the graph under the second message or need
// retain_graph and a hand-made release. The task instead:
//   - is told which gradients to expect: expect(edge, n) declares n more gradients for
//     `edge` (discovering and counting the graph below it on first sight); the counts are
//     what a distributed engine learns from other workers;
//   - takes them as they come: add_gradient(edge, grad) checks the gradient against the
//     receiving input (shape, dtype, device) and adds it to that node's input buffer;
//   - runs what is ready: run_ready() runs, on the calling thread, every node whose
//     gradients have all arrived, highest sequence number first (AccumulateGrad first), as
//     long as any is ready; threads may call it concurrently, each running other nodes;
//   - may hold nodes back (hold()): a held node does not start and the task does not
//     finish until the hold ends, for an engine that runs gradients as they arrive while
//     other workers still tell it what more to expect;
//   - completes when every node has run: run_ready() then runs the end-of-pass callbacks
//     (queue_callback) in order on the thread that finished the last node, and completes
//     completion(). A failure (a node, hook or callback throwing) fails the task: the first
//     error is rethrown by the call that met it, by every later call, and by completion().
//
// End-of-pass callbacks: anything running inside the task (a node, a hook, a sink, another
// callback) may call autograd::queue_callback(fn). The callbacks run once, in the order
// queued, after the last node and before the pass is reported complete (before backward()
// returns). DDP's Reducer waits for its bucket all-reduces there.
//
// Thread-locals: while a task runs a node, hook or callback on a thread, GraphTask::current()
// returns it there (PyTorch keeps the current graph task the same way); this is what lets a
// hook, which has no task parameter, queue a callback. A nested pass started from a hook is
// its own task and restores the outer one when it returns.
//
// Errors (InvalidArgument): an invalid edge; a gradient for an input the node does not have,
// or whose shape, dtype or device differs from the input's (names the node, the input and
// both values); a gradient where none is expected, or more than were expected; expect()
// reaching a node that has already run; expect() after a capturing task started; any call
// after release(); queue_callback() with no task running on the thread. Errors of nodes,
// hooks and callbacks propagate as thrown.
//
// Thread-safety: every method may be called from any thread. Nodes run outside the task's
// lock, each under its own mutex; hooks and sinks run under no lock.
//
// Example (two messages whose gradients meet in a shared node):
//   auto task = std::make_shared<GraphTask>();
//   task->expect(recv1_edge);
//   task->expect(recv2_edge);
//   task->add_gradient(recv1_edge, g1);  task->run_ready();   // runs recv1 only
//   task->add_gradient(recv2_edge, g2);  task->run_ready();   // recv2, the shared node, ...
//   task->completion().get(timeout);                          // done: callbacks have run
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#include "gradwire/autograd/gradient_sink.h"
#include "gradwire/autograd/node.h"
#include "gradwire/core/future.h"

namespace gradwire::autograd {

struct ExecuteOptions {
  // Keep saved tensors so the graph can be run again.
  bool retain_graph = false;
  // When not empty (grad()): run only the nodes on paths to these edges, return the
  // gradient flowing into each (after tensor hooks, undefined when none arrives), and
  // accumulate into no leaf. Leaf edges are their AccumulateGrad nodes (input 0). A
  // capturing task must be told all its expectations before it first runs.
  std::vector<Edge> capture;
  // Where leaf gradients go when capture is empty; null means each leaf's .grad.
  std::shared_ptr<GradientSink> sink;
  // Non-zero: the distributed autograd context this task is a part of. While tracing is on
  // (gradwire::trace), each node that runs is then recorded as a span dist_autograd.node
  // (the node's name, this context id). Zero: nothing is recorded.
  uint64_t trace_context = 0;
};

class GraphTask {
 public:
  explicit GraphTask(ExecuteOptions options = {});
  // Releases what the task still holds (release()).
  ~GraphTask();
  GraphTask(const GraphTask&) = delete;
  GraphTask& operator=(const GraphTask&) = delete;

  // Declares `count` (>= 1) more gradients for `edge`, to come through add_gradient().
  // Nodes below edge.function not seen before are discovered and their edges counted.
  void expect(const Edge& edge, int count = 1);

  // Delivers one expected gradient for `edge` (an undefined gradient delivers "none": the
  // expectation is met and nothing is added). Checked against the node's input metadata.
  void add_gradient(const Edge& edge, Tensor grad);

  // Checks a gradient from outside the graph against the input it enters, as add_gradient
  // does (an undefined one passes): InvalidArgument naming the node, the input and both
  // values otherwise.
  static void check_gradient(const Edge& edge, const Tensor& grad);

  // Runs every ready node on this thread; returns how many ran. Finishes the task (its
  // callbacks, then completion()) when the last node has run. Rethrows the task's error.
  size_t run_ready();

  // Finishes the task on this thread when that is all that is left to do: no node ready,
  // waiting, running or held, and no callback queued (so finishing runs nothing but the
  // completion's own continuations). Returns whether it did; false leaves the task as it
  // was, for run_ready(). Any thread may call it, whatever it must not block on (a
  // transport's, say). Rethrows the task's error.
  bool finish_if_idle();

  // True once every node has run and every callback has returned without error.
  bool completed() const;
  // Completed (or failed) when the task is; wait on it with a timeout.
  Future<void> completion() const;

  // The gradients captured for options.capture (undefined where none arrived); complete
  // once the task is.
  std::vector<Tensor> captured() const;

  // Holds `nodes` back: none of them starts, even once its gradients have all arrived, and
  // the task does not finish, until a later hold() leaves it out or release_hold() is
  // called. A distributed engine that runs what has arrived before it knows every gradient
  // to come holds the nodes that gradients it has not yet been told of could still reach
  // (expect() may add to their counts). Each call replaces the held set; a node that leaves
  // it and is ready is queued for the next run_ready(). Nodes already running or run are
  // unaffected. After release_hold(), hold() does nothing.
  void hold(std::unordered_set<const Node*> nodes);
  // Ends the hold for good: held nodes that are ready are queued, and the task may finish.
  // Call run_ready() afterwards (it runs them, or finishes a task with nothing left).
  void release_hold();

  // Queues `callback` to run when the task finishes (see the header comment).
  void queue_callback(std::function<void()> callback);

  // Drops every buffered gradient and the task's hold on the graph. A task released before
  // completion fails its completion() with InvalidArgument; any later call throws.
  void release();

  // The task running a node, hook or callback on this thread, or null.
  static GraphTask* current();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Queues `callback` on the task running on this thread (GraphTask::current()); throws
// InvalidArgument when no backward pass is running here.
void queue_callback(std::function<void()> callback);

}  // namespace gradwire::autograd
