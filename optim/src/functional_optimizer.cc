#include "gradwire/optim/functional_optimizer.h"

#include "gradwire/core/check.h"
#include "gradwire/optim/adagrad.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/optim/sparse_adam.h"

namespace gradwire::optim {

std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const SGDOptions& options) {
  return std::make_unique<FunctionalSGD>(options);
}
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const AdamOptions& options) {
  return std::make_unique<FunctionalAdam>(options);
}
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const AdamWOptions& options) {
  return std::make_unique<FunctionalAdamW>(options);
}
std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const AdagradOptions& options) {
  return std::make_unique<FunctionalAdagrad>(options);
}

std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const SparseAdamOptions& options) {
  return std::make_unique<FunctionalSparseAdam>(options);
}

std::unique_ptr<FunctionalOptimizer> make_functional_optimizer(const StateDict& saved,
                                                               const std::vector<Tensor>& params) {
  const Tensor* type = nullptr;
  for (const auto& [key, t] : saved) {
    if (key == "type") type = &t;
  }
  GRADWIRE_CHECK_ARG(type != nullptr)
      << "make_functional_optimizer: the state dict has no 'type' entry (not a whole "
         "optimizer's state dict?)";
  GRADWIRE_CHECK_ARG(type->defined() && type->dtype() == kUInt8 && type->dim() == 1)
      << "make_functional_optimizer: 'type' must be a 1-d uint8 tensor holding the "
         "optimizer's name";
  const Tensor chars = type->contiguous();
  const std::string name(static_cast<const char*>(chars.data_ptr()), chars.nbytes());
  // Built with default options, then given the saved hyperparameters and state by
  // load_state_dict, which checks them all.
  std::unique_ptr<FunctionalOptimizer> opt;
  if (name == "SGD") {
    opt = std::make_unique<FunctionalSGD>();
  } else if (name == "Adam") {
    opt = std::make_unique<FunctionalAdam>();
  } else if (name == "AdamW") {
    opt = std::make_unique<FunctionalAdamW>();
  } else if (name == "Adagrad") {
    opt = std::make_unique<FunctionalAdagrad>();
  } else if (name == "SparseAdam") {
    opt = std::make_unique<FunctionalSparseAdam>();
  } else {
    GRADWIRE_THROW(InvalidArgument) << "make_functional_optimizer: unknown optimizer type '" << name
                                    << "' (expected SGD, Adam, AdamW, Adagrad or SparseAdam)";
  }
  opt->load_state_dict(saved, params);
  return opt;
}

}  // namespace gradwire::optim
