// SavedVariable: a tensor a Node keeps from the forward pass for its backward formula.
//
// It stores the tensor's data (detached: no autograd state, so saving an op's own output
// makes no reference cycle) and the storage version at save time. unpack() refuses, with
// an InvalidArgument naming the node, when the graph was freed by an earlier backward
// pass without retain_graph, or when the tensor was modified in place after it was saved
// (the values the formula needs are gone), exactly the two errors PyTorch gives.
//
// Thread-safety: unpack() may run concurrently with other unpack() calls; reset() (graph
// freeing) is called by the engine while it holds the owning node's mutex.
#pragma once

#include <cstdint>

#include "gradwire/tensor/tensor.h"

namespace gradwire::autograd {

class Node;

class SavedVariable {
 public:
  SavedVariable() = default;
  // Saves `t` (an undefined tensor saves "nothing", and unpacks as undefined).
  explicit SavedVariable(const Tensor& t);

  // The saved data. Throws InvalidArgument when released or modified in place since.
  Tensor unpack(const Node& owner) const;
  // Frees the data; later unpack() calls throw the freed-graph error.
  void reset();
  bool was_released() const { return released_; }

 private:
  Tensor data_;
  uint64_t saved_version_ = 0;
  bool released_ = false;
};

}  // namespace gradwire::autograd
