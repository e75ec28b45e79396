// Node and Edge: the recorded backward graph.
//
// Every differentiable op that sees an input requiring grad records one Node (its
// "backward function", named like PyTorch's: MulBackward, MmBackward, ...). A Node's
// inputs are the gradients of the forward op's outputs (input_nr i = output i); its
// outputs are the gradients of the forward op's inputs, each sent along next_edges()[i]
// to the node that produced that input (an Edge names the node and which of its inputs
// receives the gradient). Leaves that require grad end in an AccumulateGrad node.
//
// Extension: a Node kind may be defined outside autograd/ (dist_autograd's send/recv
// functions, a test's custom function): derive from Node, implement apply() and name(),
// describe each input with add_input_metadata() and connect next edges with
// add_next_edge() / collect_next_edges() (variable.h); set_history() (variable.h) makes it
// the grad_fn of a tensor. The engine runs apply() with grad mode off, the node's mutex
// held (so one node never runs twice at once), and every input gradient present: a
// gradient that no consumer produced is materialised as zeros from the input metadata.
// Pre-hooks run before that, outside the mutex. Gradients given to a pass from outside
// (roots, GraphTask::add_gradient) are checked against the input metadata, so a node that
// can be a root must describe its inputs.
//
// Thread-safety: the edges and input metadata are set while recording (by one thread)
// and read-only afterwards. Pre-hooks may be added and removed from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::autograd {

class Node;

// Where a gradient goes: input `input_nr` of `function`. An edge without a function is
// invalid: the corresponding forward input did not require grad.
struct Edge {
  std::shared_ptr<Node> function;
  uint32_t input_nr = 0;

  Edge() = default;
  Edge(std::shared_ptr<Node> fn, uint32_t nr) : function(std::move(fn)), input_nr(nr) {}
  bool is_valid() const { return function != nullptr; }
  bool operator==(const Edge& other) const {
    return function == other.function && input_nr == other.input_nr;
  }
};

// Shape, dtype and device of one input gradient: used to validate what the producer
// returns and to materialise zeros when nothing flowed into the input.
struct InputMetadata {
  Shape shape;
  DType dtype = kFloat32;
  Device device = Device::cpu();
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  // Nodes are numbered in creation order; the engine runs ready nodes with the highest
  // sequence number first (reverse creation order), as PyTorch does.
  Node();
  explicit Node(uint64_t sequence_nr);
  virtual ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Computes the gradients of the forward op's inputs from the gradients of its outputs.
  // grads.size() == num_inputs(); returns one tensor per next edge (an undefined tensor
  // means "no gradient", e.g. for an input that does not require grad).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grads) = 0;
  // A name for errors and debugging, e.g. "MulBackward".
  virtual std::string name() const = 0;
  // Frees what apply() needs from the forward pass (saved tensors). Called by the engine
  // after apply() unless retain_graph; a later apply() must fail with a clear error.
  virtual void release_variables() {}

  // ---- inputs (one per differentiable output of the forward op)
  uint32_t add_input_metadata(const Tensor& t);
  uint32_t add_input_metadata(InputMetadata meta);
  size_t num_inputs() const { return input_metadata_.size(); }
  const InputMetadata& input_metadata(size_t i) const { return input_metadata_.at(i); }

  // ---- outputs (one per input of the forward op)
  void add_next_edge(Edge edge) { next_edges_.push_back(std::move(edge)); }
  void set_next_edges(std::vector<Edge> edges) { next_edges_ = std::move(edges); }
  const std::vector<Edge>& next_edges() const { return next_edges_; }
  const Edge& next_edge(size_t i) const { return next_edges_.at(i); }
  size_t num_outputs() const { return next_edges_.size(); }
  // Whether output i is wanted: apply() may skip computing the others.
  bool should_compute_output(size_t i) const {
    return i < next_edges_.size() && next_edges_[i].is_valid();
  }

  uint64_t sequence_nr() const { return sequence_nr_; }

  // ---- pre-hooks: run on input `input_nr`'s complete gradient before apply() (not when no
  // gradient flowed into it); a hook returning a defined tensor replaces the gradient.
  // Tensor::register_hook on a non-leaf adds one to its grad_fn. Returns a handle (unique in the
  // process).
  uint64_t add_pre_hook(uint32_t input_nr, TensorHook hook);
  bool remove_pre_hook(uint64_t handle);
  // Applies the pre-hooks to `grads` in registration order (the engine calls this).
  virtual void run_pre_hooks(std::vector<Tensor>& grads);

  // Serialises apply() of this node across concurrent backward passes (engine-held).
  Mutex& mutex() { return mutex_; }

 protected:
  // Handles for hooks and nodes come from one process counter (ids only, no state).
  static uint64_t next_hook_handle();

 private:
  struct PreHook {
    uint64_t handle;
    uint32_t input_nr;
    TensorHook fn;
  };

  const uint64_t sequence_nr_;
  std::vector<InputMetadata> input_metadata_;
  std::vector<Edge> next_edges_;
  Mutex mutex_;
  Mutex hooks_mutex_;
  std::vector<PreHook> pre_hooks_ GRADWIRE_GUARDED_BY(hooks_mutex_);
};

}  // namespace gradwire::autograd
