// Shorthands for the op recordings in ops_*.cc.
#pragma once

#include <functional>
#include <vector>

#include "functions.h"
#include "grad_utils.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "hooks_impl.h"

// The backward lambda of an op: `n` is the node (saved tensors, needs(i)), `g` the output
// gradients. Member functions of AutogradHooksImpl shadow the free ops, so the formulas
// call them as gw::op.
#define GRADWIRE_FORMULA(...)                                  \
  [__VA_ARGS__](::gradwire::autograd::detail::FormulaNode & n, \
                std::vector<::gradwire::Tensor> & g) -> std::vector<::gradwire::Tensor>

namespace gradwire::autograd::detail {

namespace gw = ::gradwire;

enum class Save { kNone, kInput, kOutput };

// A one-input, one-output op whose input gradient is grad_of(g, saved), where `saved`
// is the input or the output.
inline Tensor unary_op(const char* name, const Tensor& a, const std::function<Tensor()>& forward,
                       Save which, std::function<Tensor(const Tensor&, const Tensor&)> grad_of) {
  Recorder rec(name, {a});
  Tensor out = raw(forward);
  if (!rec) return out;
  if (which == Save::kNone) {
    return rec.finish(
        out, GRADWIRE_FORMULA(grad_of) { return {grad_of(g[0], Tensor())}; });
  }
  rec.save(which == Save::kInput ? a : out);
  return rec.finish(
      out, GRADWIRE_FORMULA(grad_of) { return {grad_of(g[0], n.saved(0))}; });
}

inline Tensor maybe(bool needed, const std::function<Tensor()>& f) {
  return needed ? f() : Tensor();
}

}  // namespace gradwire::autograd::detail
