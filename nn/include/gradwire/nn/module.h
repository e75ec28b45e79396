// Module: the base of every layer: named parameters, buffers and submodules, train/eval
// mode, and the state dict (PyTorch's torch.nn.Module, minus hooks).
//
// A module owns its tensors through handles: register_parameter() returns the Tensor it
// stores, and a layer keeps that handle (Linear::weight()). load_state_dict() copies into
// those tensors in place, so handles held by an optimizer stay valid after a load.
//
// Names: a parameter, buffer or submodule name is non-empty, has no '.', and is unique
// within its module. Nested names join with '.', as in PyTorch ("0.weight", "encoder.bias").
// state_dict() lists a module's own parameters, then its buffers (registration order), then
// each submodule's entries, recursively -- the order PyTorch uses.
//
// UnaryModule adds `Tensor forward(const Tensor&)`, the shape Sequential chains; modules
// with other signatures (EmbeddingBag with offsets, the losses) define their own forward.
//
// Errors: InvalidArgument for a bad or duplicate name, an undefined tensor, and from
// load_state_dict() for missing or unexpected keys (strict), dtype or shape mismatches;
// every mismatch is listed by name in one message, and nothing is copied unless all match.
//
// Thread-safety: building a module (register_*, train/eval, load_state_dict) is not
// thread-safe. Concurrent forward() calls on one module are safe when nothing mutates it
// (parameters updated by an optimizer step race with a concurrent forward, as in PyTorch).
//
// Example:
//   class Net : public gradwire::nn::UnaryModule {
//    public:
//     Net() : UnaryModule("Net") {
//       fc_ = register_module("fc", std::make_shared<nn::Linear>(nn::LinearOptions{4, 2}));
//     }
//     Tensor forward(const Tensor& x) override { return relu(fc_->forward(x)); }
//    private:
//     std::shared_ptr<nn::Linear> fc_;
//   };
//   auto net = std::make_shared<Net>();
//   nn::save(*net, "net.gw");  // nn/serialize.h
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/tensor/state_dict.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::nn {

// Named tensors in a fixed order (tensor/state_dict.h): a module's or an optimizer's
// state, so nn::save() stores both.
using StateDict = gradwire::StateDict;

class Module {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The kind of module ("Linear", "Sequential"), for messages and printing.
  const std::string& type_name() const { return type_name_; }

  // ---- registration. Each returns what it stored.
  // Stores `tensor` (detached when it has history) as a leaf with requires_grad set.
  Tensor register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  // Stores `tensor` as state that is saved but not trained (running statistics, masks).
  Tensor register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- access. `recurse` includes submodules' entries under dotted names. A tensor
  // registered under two names (shared weights) is listed once, under its first name.
  std::vector<Tensor> parameters(bool recurse = true) const;
  StateDict named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  StateDict named_buffers(bool recurse = true) const;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_children() const;
  // Every submodule, recursively, under dotted names (this module itself is not listed).
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> named_modules() const;

  // ---- mode. train(false) == eval(); both apply to every submodule.
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Clears every parameter's gradient (set_to_none) or zeroes it in place
  // (gradwire::zero_grad over parameters()).
  void zero_grad(bool set_to_none = true);

  // ---- state. The entries share storage with the module's tensors (no copy) and do not
  // require grad.
  StateDict state_dict() const;
  // Copies `state` into this module's parameters and buffers (see the header comment for
  // the checks). With strict == false, missing and unexpected keys are ignored, but every
  // key present on both sides must still match in dtype and shape.
  void load_state_dict(const StateDict& state, bool strict = true);

 private:
  struct Entry {
    std::string name;
    Tensor tensor;
  };
  void check_new_name(const std::string& name, const char* what) const;
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  void collect(const std::string& prefix, bool params, bool buffers, bool recurse,
               StateDict& out) const;

  std::string type_name_;
  bool training_ = true;
  std::vector<Entry> parameters_;
  std::vector<Entry> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

// A module with one tensor in and one tensor out: what Sequential chains.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& input) = 0;
  Tensor operator()(const Tensor& input) { return forward(input); }
};

}  // namespace gradwire::nn
