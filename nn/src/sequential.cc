#include "gradwire/nn/sequential.h"

#include <string>

#include "gradwire/core/check.h"
#include "gradwire/nn/activation.h"
#include "gradwire/nn/dropout.h"
#include "gradwire/nn/linear.h"

namespace gradwire::nn {

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> modules) : Sequential() {
  for (auto& m : modules)
    push_back(std::move(m));
}

void Sequential::push_back(std::shared_ptr<UnaryModule> module) {
  GRADWIRE_CHECK_ARG(module != nullptr)
      << type_name() << ": cannot add a null module at position " << modules_.size();
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (const auto& m : modules_)
    x = m->forward(x);
  return x;
}

void MLPOptions::validate() const {
  GRADWIRE_CHECK_ARG(sizes.size() >= 2)
      << "MLPOptions: sizes needs an input and an output size, got " << sizes.size() << " size(s)";
  for (size_t i = 0; i < sizes.size(); ++i) {
    GRADWIRE_CHECK_ARG(sizes[i] > 0)
        << "MLPOptions: sizes[" << i << "] must be positive, got " << sizes[i];
  }
  GRADWIRE_CHECK_ARG(dropout >= 0.0 && dropout < 1.0)
      << "MLPOptions: dropout must be in [0, 1), got " << dropout;
}

namespace {
std::shared_ptr<UnaryModule> make_activation(Activation a) {
  switch (a) {
    case Activation::kReLU:
      return std::make_shared<ReLU>();
    case Activation::kSigmoid:
      return std::make_shared<Sigmoid>();
    case Activation::kTanh:
      return std::make_shared<Tanh>();
  }
  GRADWIRE_THROW(InvalidArgument) << "MLPOptions: unknown activation " << static_cast<int>(a);
}
}  // namespace

MLP::MLP(const MLPOptions& options) : Sequential("MLP"), options_(options) {
  options_.validate();
  const size_t layers = options_.sizes.size() - 1;
  for (size_t i = 0; i < layers; ++i) {
    push_back(
        std::make_shared<Linear>(LinearOptions{options_.sizes[i], options_.sizes[i + 1],
                                               options_.bias, options_.dtype, options_.generator}));
    if (i + 1 == layers) break;
    push_back(make_activation(options_.activation));
    if (options_.dropout > 0) {
      push_back(std::make_shared<Dropout>(DropoutOptions{options_.dropout, options_.generator}));
    }
  }
}

}  // namespace gradwire::nn
