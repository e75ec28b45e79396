// FormulaNode and Recorder: how the op hooks record backward nodes.
//
// Each differentiable op is recorded as a FormulaNode holding a backward lambda, its saved
// tensors (SavedVariable: version-checked, freed after backward) and one next edge per
// differentiable input. Recorder collects the input edges, decides whether anything
// requires grad, saves tensors and attaches the node to the outputs.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/autograd/node.h"
#include "gradwire/autograd/saved_variable.h"
#include "gradwire/tensor/autograd_hooks.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::autograd::detail {

class FormulaNode;
// Gradients of the inputs (one per next edge; undefined for inputs that need none) from
// the gradients of the outputs (all defined: the engine fills missing ones with zeros).
using Formula = std::function<std::vector<Tensor>(FormulaNode& node, std::vector<Tensor>& grads)>;

class FormulaNode final : public Node {
 public:
  FormulaNode(std::string name, Formula formula)
      : name_(std::move(name)), formula_(std::move(formula)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return formula_(*this, grads); }
  std::string name() const override { return name_; }
  void release_variables() override {
    for (SavedVariable& s : saved_)
      s.reset();
  }

  // Saved tensor i (version-checked; throws once the graph is freed).
  Tensor saved(size_t i) const { return saved_.at(i).unpack(*this); }
  bool needs(size_t i) const { return should_compute_output(i); }
  void save(const Tensor& t) { saved_.emplace_back(t); }
  void set_formula(Formula formula) { formula_ = std::move(formula); }

 private:
  std::string name_;
  Formula formula_;
  std::vector<SavedVariable> saved_;
};

// Runs `f` with recording suppressed (the raw tensor op).
template <typename F>
auto raw(F&& f) {
  BelowAutogradGuard guard;
  return f();
}

class Recorder {
 public:
  // `inputs`: the differentiable inputs, in the order the formula returns gradients.
  Recorder(const char* name, const std::vector<Tensor>& inputs);
  // In-place form: self is modified by `op` (e.g. "mul_"); inputs[0] must be self. Refuses
  // (InvalidArgument) leaves that require grad, views and untracked aliases, as documented.
  Recorder(const char* name, const char* op, const Tensor& self, const std::vector<Tensor>& inputs);

  // Whether any input requires grad (and so a node is recorded).
  explicit operator bool() const { return active_; }
  void save(const Tensor& t) { node_->save(t); }

  // Attaches the node to `out` (a floating result) and returns it.
  Tensor finish(Tensor out, Formula formula);
  // Marks `out` as a view of the input (see meta.h) as well.
  Tensor finish_view(Tensor out, const char* op, Formula formula);
  // Multi-output form: each floating output in `outs` gets an input slot of the node.
  std::vector<Tensor> finish_many(std::vector<Tensor> outs, Formula formula);
  // In-place form: `self` (already modified) gets the node as its new grad_fn.
  void finish_inplace(const Tensor& self, Formula formula);

 private:
  bool active_ = false;
  std::shared_ptr<FormulaNode> node_;
  std::vector<Edge> edges_;
};

}  // namespace gradwire::autograd::detail
