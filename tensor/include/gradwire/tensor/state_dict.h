// StateDict: named tensors in a fixed order -- the saved state of a module (nn/) or of an
// optimizer (optim/).
//
// It lives in tensor/ because nn/ and optim/ are siblings (both sit on autograd/) and
// both produce and consume it: one definition here lets a module's and an optimizer's
// state travel through the same file functions (nn::save / nn::load) and, later, the
// same wire. gradwire::nn::StateDict and gradwire::optim::StateDict name this type.
//
// A vector of pairs rather than a map: the order is part of the state (PyTorch's order
// for modules, parameter order for optimizers), and a name may be looked up linearly --
// state dicts hold tens to thousands of entries, read once per load.
//
// Thread-safety: a plain value type.
//
// Example:
//   StateDict sd{{"weight", zeros({2, 3})}, {"bias", zeros({2})}};
//   for (const auto& [name, t] : sd) std::cout << name << " " << t.shape_string() << "\n";
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "gradwire/tensor/tensor.h"

namespace gradwire {

using StateDict = std::vector<std::pair<std::string, Tensor>>;

}  // namespace gradwire
