#include "gradwire/autograd/graph_task.h"

#include <deque>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "grad_utils.h"
#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/core/trace.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/factory.h"

namespace gradwire::autograd {

namespace {

thread_local GraphTask* t_current_task = nullptr;

// Makes `task` current on this thread for a scope, restoring the outer one (a pass started
// from a hook) afterwards.
class CurrentTaskGuard {
 public:
  explicit CurrentTaskGuard(GraphTask* task) : previous_(t_current_task) { t_current_task = task; }
  ~CurrentTaskGuard() { t_current_task = previous_; }
  CurrentTaskGuard(const CurrentTaskGuard&) = delete;
  CurrentTaskGuard& operator=(const CurrentTaskGuard&) = delete;

 private:
  GraphTask* previous_;
};

enum class Phase { kWaiting, kRunning, kDone };

// Per-node state of one graph task.
struct NodeState {
  std::shared_ptr<Node> node;  // the task holds the graph it still has to run
  std::vector<Tensor> buffer;  // input gradients, summed over producers
  int dependencies = 0;        // gradients still to come: producers and expected ones
  int expected = 0;            // of those, the ones announced by expect()
  bool useful = true;          // runs or is captured (always, unless capturing)
  bool runs = true;            // apply() is called
  bool queued = false;         // in the ready queue
  Phase phase = Phase::kWaiting;
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

// A gradient from outside the graph (a root, a message) must match the input it enters
// exactly: nothing upstream will fit it, and a wrong one would otherwise fail deep inside
// a formula, or grow the buffer for an input the node does not have.
void check_external_gradient(const Edge& edge, const Tensor& g) {
  const Node& node = *edge.function;
  GRADWIRE_CHECK_ARG(edge.input_nr < node.num_inputs())
      << "a gradient for input " << edge.input_nr << " of " << node.name() << ", which has "
      << node.num_inputs() << " input" << (node.num_inputs() == 1 ? "" : "s");
  if (!g.defined()) return;
  const InputMetadata& meta = node.input_metadata(edge.input_nr);
  GRADWIRE_CHECK_ARG(g.sizes() == meta.shape)
      << "the gradient for input " << edge.input_nr << " of " << node.name() << " has shape "
      << g.shape_string() << " but the input has shape " << shape_to_string(meta.shape);
  GRADWIRE_CHECK_ARG(g.dtype() == meta.dtype)
      << "the gradient for input " << edge.input_nr << " of " << node.name() << " has dtype "
      << dtype_name(g.dtype()) << " but the input has dtype " << dtype_name(meta.dtype);
  GRADWIRE_CHECK_ARG(g.device() == meta.device)
      << "the gradient for input " << edge.input_nr << " of " << node.name() << " is on "
      << g.device().str() << " but the input is on " << meta.device.str();
}

void add_to_buffer(NodeState& state, size_t slot, Tensor g) {
  if (state.buffer.size() < std::max(state.node->num_inputs(), slot + 1)) {
    state.buffer.resize(std::max(state.node->num_inputs(), slot + 1));
  }
  Tensor& cur = state.buffer[slot];
  cur = cur.defined() ? add(cur, g) : std::move(g);
}

}  // namespace

struct GraphTask::Impl {
  explicit Impl(ExecuteOptions opts) : options(std::move(opts)) {}

  const ExecuteOptions options;
  mutable Mutex mutex;
  std::unordered_map<Node*, NodeState> states GRADWIRE_GUARDED_BY(mutex);
  std::priority_queue<Node*, std::vector<Node*>, ReadyOrder> ready GRADWIRE_GUARDED_BY(mutex);
  size_t pending GRADWIRE_GUARDED_BY(mutex) = 0;  // useful nodes not yet done
  size_t running GRADWIRE_GUARDED_BY(mutex) = 0;
  bool sealed GRADWIRE_GUARDED_BY(mutex) = false;     // usefulness known, queue live
  bool finishing GRADWIRE_GUARDED_BY(mutex) = false;  // callbacks started
  bool completed GRADWIRE_GUARDED_BY(mutex) = false;  // callbacks done, no error
  bool released GRADWIRE_GUARDED_BY(mutex) = false;
  bool holding GRADWIRE_GUARDED_BY(mutex) = false;  // hold(): may not finish
  bool hold_ended GRADWIRE_GUARDED_BY(mutex) = false;
  std::unordered_set<const Node*> held GRADWIRE_GUARDED_BY(mutex);
  std::exception_ptr error GRADWIRE_GUARDED_BY(mutex);
  std::vector<Tensor> captured GRADWIRE_GUARDED_BY(mutex);
  std::deque<std::function<void()>> callbacks GRADWIRE_GUARDED_BY(mutex);
  Future<void> done;

  // Throws the task's first error, or that it was released.
  void check_usable(const char* op) GRADWIRE_REQUIRES(mutex) {
    if (error) std::rethrow_exception(error);
    GRADWIRE_CHECK_ARG(!released) << "GraphTask::" << op << ": the task has been released";
  }

  // Records the first error and fails completion; later calls rethrow it.
  void fail(std::exception_ptr e) {
    {
      MutexLock lock(mutex);
      if (error == nullptr) error = e;
      e = error;
      ready = {};
      callbacks.clear();
    }
    done.try_set_error(e);
  }

  // Adds the nodes below `root` that the task has not seen, counting their edges.
  void discover(const std::shared_ptr<Node>& root) GRADWIRE_REQUIRES(mutex) {
    if (states.count(root.get()) != 0) return;
    // First collect and check, so that a refused call leaves the task as it was.
    std::vector<std::shared_ptr<Node>> fresh{root};
    std::unordered_set<Node*> seen{root.get()};
    for (size_t i = 0; i < fresh.size(); ++i) {
      for (const Edge& e : fresh[i]->next_edges()) {
        if (!e.is_valid()) continue;
        auto it = states.find(e.function.get());
        if (it != states.end()) {
          GRADWIRE_CHECK_ARG(it->second.phase == Phase::kWaiting)
              << "GraphTask::expect: the graph below the new gradient reaches "
              << e.function->name() << ", which has already run in this task";
          continue;
        }
        if (seen.insert(e.function.get()).second) fresh.push_back(e.function);
      }
    }
    for (const auto& n : fresh) {
      NodeState& s = states[n.get()];
      s.node = n;
    }
    for (const auto& n : fresh) {
      for (const Edge& e : n->next_edges()) {
        if (e.is_valid()) ++states[e.function.get()].dependencies;
      }
    }
    pending += fresh.size();
  }

  void push_if_ready(Node* node, NodeState& s) GRADWIRE_REQUIRES(mutex) {
    if (sealed && s.useful && s.phase == Phase::kWaiting && s.dependencies == 0 && !s.queued &&
        held.count(node) == 0) {
      s.queued = true;
      ready.push(node);
    }
  }

  // Decides what runs (capturing tasks run only the paths to their captures) and makes
  // the queue live. Called once, by the first run_ready().
  void seal() GRADWIRE_REQUIRES(mutex) {
    sealed = true;
    captured.resize(options.capture.size());
    if (!options.capture.empty()) {
      for (size_t i = 0; i < options.capture.size(); ++i) {
        auto it = states.find(options.capture[i].function.get());
        if (it != states.end()) it->second.captures.push_back(i);
      }
      // Post-order over the graph: a node runs when any child is useful.
      std::unordered_set<Node*> visited;
      std::vector<std::pair<Node*, size_t>> stack;
      for (auto& [root, unused] : states) {
        if (!visited.insert(root).second) continue;
        stack.emplace_back(root, 0);
        while (!stack.empty()) {
          auto& [node, next] = stack.back();
          if (next < node->next_edges().size()) {
            Node* child = node->next_edges()[next++].function.get();
            if (child != nullptr && visited.insert(child).second) stack.emplace_back(child, 0);
            continue;
          }
          NodeState& s = states.at(node);
          s.runs = false;
          for (const Edge& e : node->next_edges()) {
            if (e.is_valid() && states.at(e.function.get()).useful) s.runs = true;
          }
          s.useful = s.runs || !s.captures.empty();
          stack.pop_back();
        }
      }
      for (auto& [node, s] : states) {
        if (!s.runs) {
          // Its children will hear nothing from it.
          for (const Edge& e : node->next_edges()) {
            if (e.is_valid()) --states.at(e.function.get()).dependencies;
          }
        }
        if (!s.useful) {
          s.phase = Phase::kDone;
          s.buffer.clear();
          --pending;
        }
      }
    }
    for (auto& [node, s] : states)
      push_if_ready(node, s);
  }

  // Runs one node (outside the task's lock); returns the gradients for its next edges.
  std::vector<Tensor> run_node(Node* node, std::vector<Tensor>& inputs,
                               const std::vector<size_t>& captures, bool runs) {
    // The node's run as a trace span, when this task is a traced part of a context.
    struct NodeSpan {
      Node* node;
      uint64_t context;
      int64_t start_ns;
      ~NodeSpan() {
        if (start_ns == 0) return;
        const std::string name = node->name();
        const trace::Text text{"node", name};
        trace::complete("dist_autograd.node", "dist_autograd", start_ns, trace::now_ns(),
                        {trace::Arg("context_id", context)}, &text);
      }
    } span{node, options.trace_context,
           runs && options.trace_context != 0 && trace::enabled() ? trace::now_ns() : 0};
    inputs.resize(std::max(inputs.size(), node->num_inputs()));
    node->run_pre_hooks(inputs);
    if (!captures.empty()) {
      MutexLock lock(mutex);
      for (size_t i : captures) {
        const uint32_t nr = options.capture[i].input_nr;
        if (nr < inputs.size()) captured[i] = inputs[nr];
      }
    }
    if (!runs) return {};
    if (auto* acc = dynamic_cast<AccumulateGrad*>(node)) {
      acc->accumulate_pass(inputs.empty() ? Tensor() : std::move(inputs[0]), options.sink.get());
      return {};
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
      if (edges[i].is_valid() && outputs[i].defined()) {
        outputs[i] =
            fit_gradient(std::move(outputs[i]), *node, i, *edges[i].function, edges[i].input_nr);
      }
    }
    return outputs;
  }

  // Runs the end-of-pass callbacks in order (more may be queued meanwhile), then completes.
  void finish() {
    for (;;) {
      std::function<void()> callback;
      {
        MutexLock lock(mutex);
        if (error) return;
        if (callbacks.empty()) {
          completed = true;
          states.clear();  // the graph is no longer needed by this task
          break;
        }
        callback = std::move(callbacks.front());
        callbacks.pop_front();
      }
      callback();
    }
    done.try_set_value();
  }
  // finish() for the caller that set `finishing`: a callback that throws fails the task,
  // and the error goes on to the caller.
  void finish_or_fail() {
    try {
      finish();
    } catch (...) {
      fail(std::current_exception());
      throw;
    }
  }
};

GraphTask::GraphTask(ExecuteOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {
  for (size_t i = 0; i < impl_->options.capture.size(); ++i) {
    GRADWIRE_CHECK_ARG(impl_->options.capture[i].is_valid())
        << "GraphTask: capture edge " << i << " has no function";
  }
}

GraphTask::~GraphTask() {
  release();
}

void GraphTask::expect(const Edge& edge, int count) {
  GRADWIRE_CHECK_ARG(edge.is_valid()) << "GraphTask::expect: the edge has no function";
  GRADWIRE_CHECK_ARG(count >= 1) << "GraphTask::expect: count must be at least 1, got " << count;
  GRADWIRE_CHECK_ARG(edge.input_nr < edge.function->num_inputs())
      << "GraphTask::expect: input " << edge.input_nr << " of " << edge.function->name()
      << ", which has " << edge.function->num_inputs() << " inputs";
  Impl& d = *impl_;
  MutexLock lock(d.mutex);
  d.check_usable("expect");
  GRADWIRE_CHECK_ARG(d.options.capture.empty() || !d.sealed)
      << "GraphTask::expect: a capturing task must be told all its gradients before it runs";
  GRADWIRE_CHECK_ARG(!d.finishing) << "GraphTask::expect: the task has finished";
  d.discover(edge.function);
  NodeState& s = d.states.at(edge.function.get());
  GRADWIRE_CHECK_ARG(s.phase == Phase::kWaiting)
      << "GraphTask::expect: " << edge.function->name() << " has already run in this task";
  s.dependencies += count;
  s.expected += count;
}

void GraphTask::check_gradient(const Edge& edge, const Tensor& grad) {
  GRADWIRE_CHECK_ARG(edge.is_valid()) << "GraphTask::check_gradient: the edge has no function";
  check_external_gradient(edge, grad);
}

void GraphTask::add_gradient(const Edge& edge, Tensor grad) {
  GRADWIRE_CHECK_ARG(edge.is_valid()) << "GraphTask::add_gradient: the edge has no function";
  check_external_gradient(edge, grad);
  Impl& d = *impl_;
  MutexLock lock(d.mutex);
  d.check_usable("add_gradient");
  auto it = d.states.find(edge.function.get());
  GRADWIRE_CHECK_ARG(it != d.states.end() && it->second.expected > 0)
      << "GraphTask::add_gradient: no " << (it == d.states.end() ? "" : "more ")
      << "gradient is expected for input " << edge.input_nr << " of " << edge.function->name();
  NodeState& s = it->second;
  --s.expected;
  --s.dependencies;
  if (grad.defined() && s.useful) add_to_buffer(s, edge.input_nr, std::move(grad));
  d.push_if_ready(edge.function.get(), s);
}

size_t GraphTask::run_ready() {
  Impl& d = *impl_;
  // Formulas compute plain gradients: nothing they do is recorded (no higher-order graphs).
  AutoGradMode no_grad(false);
  CurrentTaskGuard current(this);
  size_t ran = 0;
  for (;;) {
    Node* node = nullptr;
    std::vector<Tensor> inputs;
    std::vector<size_t> captures;
    bool runs = true;
    bool finish = false;
    {
      MutexLock lock(d.mutex);
      d.check_usable("run_ready");
      if (!d.sealed) d.seal();
      while (!d.ready.empty() && node == nullptr) {
        Node* top = d.ready.top();
        d.ready.pop();
        NodeState& s = d.states.at(top);
        s.queued = false;
        if (s.dependencies > 0) continue;      // expect() added gradients after it was queued
        if (d.held.count(top) != 0) continue;  // held after it was queued
        node = top;
        s.phase = Phase::kRunning;
        inputs = std::move(s.buffer);
        captures = s.captures;
        runs = s.runs;
        ++d.running;
      }
      if (node == nullptr) {
        if (d.pending == 0 && d.running == 0 && !d.finishing && !d.holding) {
          d.finishing = true;
          finish = true;
        }
        if (!finish) return ran;
      }
    }
    if (finish) {
      d.finish_or_fail();
      return ran;
    }
    std::vector<Tensor> outputs;
    try {
      outputs = d.run_node(node, inputs, captures, runs);
    } catch (...) {
      d.fail(std::current_exception());
      throw;
    }
    ++ran;
    MutexLock lock(d.mutex);
    if (d.error) std::rethrow_exception(d.error);
    const auto& edges = node->next_edges();
    for (size_t i = 0; i < outputs.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.is_valid()) continue;
      NodeState& c = d.states.at(e.function.get());
      if (!c.useful) continue;
      if (outputs[i].defined()) add_to_buffer(c, e.input_nr, std::move(outputs[i]));
      --c.dependencies;
      d.push_if_ready(e.function.get(), c);
    }
    d.states.at(node).phase = Phase::kDone;
    --d.running;
    --d.pending;
  }
}

bool GraphTask::finish_if_idle() {
  Impl& d = *impl_;
  {
    MutexLock lock(d.mutex);
    d.check_usable("finish_if_idle");
    if (!d.sealed || !d.ready.empty() || d.pending != 0 || d.running != 0 || d.finishing ||
        d.holding || !d.callbacks.empty()) {
      return false;
    }
    d.finishing = true;
  }
  d.finish_or_fail();
  return true;
}

bool GraphTask::completed() const {
  MutexLock lock(impl_->mutex);
  return impl_->completed;
}

Future<void> GraphTask::completion() const {
  return impl_->done;
}

std::vector<Tensor> GraphTask::captured() const {
  MutexLock lock(impl_->mutex);
  return impl_->captured;
}

void GraphTask::hold(std::unordered_set<const Node*> nodes) {
  Impl& d = *impl_;
  MutexLock lock(d.mutex);
  if (d.hold_ended || d.released) return;
  d.holding = true;
  std::vector<const Node*> freed;
  for (const Node* n : d.held) {
    if (nodes.count(n) == 0) freed.push_back(n);
  }
  d.held = std::move(nodes);
  for (const Node* n : freed) {
    auto it = d.states.find(const_cast<Node*>(n));
    if (it != d.states.end()) d.push_if_ready(it->first, it->second);
  }
}

void GraphTask::release_hold() {
  Impl& d = *impl_;
  MutexLock lock(d.mutex);
  if (d.hold_ended) return;
  d.hold_ended = true;
  d.holding = false;
  std::unordered_set<const Node*> freed = std::move(d.held);
  d.held.clear();
  for (const Node* n : freed) {
    auto it = d.states.find(const_cast<Node*>(n));
    if (it != d.states.end()) d.push_if_ready(it->first, it->second);
  }
}

void GraphTask::queue_callback(std::function<void()> callback) {
  GRADWIRE_CHECK_ARG(callback != nullptr) << "queue_callback: empty callback";
  Impl& d = *impl_;
  MutexLock lock(d.mutex);
  d.check_usable("queue_callback");
  GRADWIRE_CHECK_ARG(!d.completed) << "queue_callback: the backward pass has already finished";
  d.callbacks.push_back(std::move(callback));
}

void GraphTask::release() {
  Impl& d = *impl_;
  bool was_complete = false;
  {
    MutexLock lock(d.mutex);
    if (d.released) return;
    d.released = true;
    was_complete = d.completed || d.error != nullptr;
    d.states.clear();
    d.ready = {};
    d.callbacks.clear();
  }
  if (!was_complete) {
    d.done.try_set_error(std::make_exception_ptr(
        InvalidArgument("GraphTask: released before every expected gradient had arrived")));
  }
}

GraphTask* GraphTask::current() {
  return t_current_task;
}

void queue_callback(std::function<void()> callback) {
  GraphTask* task = GraphTask::current();
  GRADWIRE_CHECK_ARG(task != nullptr)
      << "queue_callback: no backward pass is running on this thread (call it from a hook, a "
         "node or another callback)";
  task->queue_callback(std::move(callback));
}

}  // namespace gradwire::autograd
