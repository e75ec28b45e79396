// Sequential (torch.nn.Sequential) and the MLP helper built on it.
//
// Sequential runs its modules in order, each one's output feeding the next. Modules are
// registered as submodules named "0", "1", ... in the order added, so state-dict keys
// ("0.weight", "2.bias") match a torch.nn.Sequential of the same layers.
//
// MLP(sizes = {784, 1024, 10}) is Sequential(Linear(784, 1024), ReLU, Linear(1024, 10)):
// a Linear between each pair of sizes, the activation (and Dropout when dropout > 0) after
// every Linear but the last.
//
// Errors: InvalidArgument for a null module; for MLP, fewer than two sizes or a
// non-positive size; errors of the layers propagate from forward().
//
// Thread-safety: as Module; push_back() must not race with forward().
//
// Example:
//   Generator gen(0);
//   nn::MLP net(nn::MLPOptions{.sizes = {2, 32, 3}, .generator = &gen});
//   Tensor logits = net(x);   // [N, 2] -> [N, 3]
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gradwire/nn/module.h"
#include "gradwire/tensor/generator.h"

namespace gradwire::nn {

class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> modules);

  // Appends `module` as submodule number size().
  void push_back(std::shared_ptr<UnaryModule> module);
  Tensor forward(const Tensor& input) override;

  size_t size() const { return modules_.size(); }
  const std::shared_ptr<UnaryModule>& operator[](size_t i) const { return modules_.at(i); }

 protected:
  explicit Sequential(std::string type_name) : UnaryModule(std::move(type_name)) {}

 private:
  std::vector<std::shared_ptr<UnaryModule>> modules_;
};

enum class Activation { kReLU, kSigmoid, kTanh };

struct MLPOptions {
  std::vector<int64_t> sizes;  // input, hidden..., output; at least two
  Activation activation = Activation::kReLU;
  double dropout = 0.0;  // a Dropout after each hidden activation when > 0
  bool bias = true;
  DType dtype = kFloat32;
  Generator* generator = nullptr;  // initial weights and dropout masks
  void validate() const;
};

class MLP : public Sequential {
 public:
  explicit MLP(const MLPOptions& options);
  const MLPOptions& options() const { return options_; }

 private:
  MLPOptions options_;
};

}  // namespace gradwire::nn
