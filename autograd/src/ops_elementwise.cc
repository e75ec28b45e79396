// Backward formulas of the elementwise ops. Broadcast inputs get sum_to(grad, shape).
#include <cmath>

#include "formula_helpers.h"

namespace gradwire::autograd::detail {

namespace {
Tensor binary_record(const char* name, const Tensor& a, const Tensor& b,
                     const std::function<Tensor()>& forward, bool save_inputs, bool save_out,
                     std::function<std::vector<Tensor>(FormulaNode&, const Tensor&)> grads) {
  Recorder rec(name, {a, b});
  Tensor out = raw(forward);
  if (!rec) return out;
  if (save_inputs) {
    rec.save(a);
    rec.save(b);
  }
  if (save_out) rec.save(out);
  return rec.finish(
      out, GRADWIRE_FORMULA(grads, sa = a.sizes(), sb = b.sizes()) {
        std::vector<Tensor> r = grads(n, g[0]);
        if (r[0].defined()) r[0] = sum_to(r[0], sa);
        if (r[1].defined()) r[1] = sum_to(r[1], sb);
        return r;
      });
}
}  // namespace

Tensor AutogradHooksImpl::add(const Tensor& a, const Tensor& b, Scalar alpha) {
  return binary_record(
      "AddBackward", a, b, [&] { return gw::add(a, b, alpha); }, false, false,
      [alpha](FormulaNode& n, const Tensor& g) {
        return std::vector<Tensor>{n.needs(0) ? g : Tensor(), maybe(n.needs(1), [&] {
                                     return alpha.to_double() == 1 ? g : g * alpha;
                                   })};
      });
}

Tensor AutogradHooksImpl::sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  return binary_record(
      "SubBackward", a, b, [&] { return gw::sub(a, b, alpha); }, false, false,
      [alpha](FormulaNode& n, const Tensor& g) {
        return std::vector<Tensor>{n.needs(0) ? g : Tensor(),
                                   maybe(n.needs(1), [&] { return g * (-alpha.to_double()); })};
      });
}

Tensor AutogradHooksImpl::mul(const Tensor& a, const Tensor& b) {
  return binary_record(
      "MulBackward", a, b, [&] { return gw::mul(a, b); }, true, false,
      [](FormulaNode& n, const Tensor& g) {
        return std::vector<Tensor>{maybe(n.needs(0), [&] { return g * n.saved(1); }),
                                   maybe(n.needs(1), [&] { return g * n.saved(0); })};
      });
}

Tensor AutogradHooksImpl::div(const Tensor& a, const Tensor& b) {
  return binary_record(
      "DivBackward", a, b, [&] { return gw::div(a, b); }, true, false,
      [](FormulaNode& n, const Tensor& g) {
        Tensor bv = n.saved(1);
        return std::vector<Tensor>{maybe(n.needs(0), [&] { return g / bv; }),
                                   maybe(n.needs(1), [&] { return -g * n.saved(0) / (bv * bv); })};
      });
}

Tensor AutogradHooksImpl::pow(const Tensor& a, const Tensor& exponent) {
  return binary_record(
      "PowBackward", a, exponent, [&] { return gw::pow(a, exponent); }, true, true,
      [](FormulaNode& n, const Tensor& g) {
        Tensor x = n.saved(0), e = n.saved(1), out = n.saved(2);
        return std::vector<Tensor>{maybe(n.needs(0), [&] { return g * e * gw::pow(x, e - 1.0); }),
                                   // d/de x^e = x^e log x; 0 where x == 0 and e >= 0, as PyTorch.
                                   maybe(n.needs(1), [&] {
                                     Tensor d = g * out * gw::log(x);
                                     return gw::where(gw::logical_and(gw::eq(x, 0), gw::ge(e, 0)),
                                                      gw::zeros_like(d), d);
                                   })};
      });
}

Tensor AutogradHooksImpl::maximum(const Tensor& a, const Tensor& b) {
  // Ties split the gradient evenly between the two inputs, as PyTorch.
  return binary_record(
      "MaximumBackward", a, b, [&] { return gw::maximum(a, b); }, true, false,
      [](FormulaNode& n, const Tensor& g) {
        Tensor x = n.saved(0), y = n.saved(1);
        Tensor wa = gw::gt(x, y).to(g.dtype()) + gw::eq(x, y).to(g.dtype()) * 0.5;
        return std::vector<Tensor>{maybe(n.needs(0), [&] { return g * wa; }),
                                   maybe(n.needs(1), [&] { return g * (1.0 - wa); })};
      });
}

Tensor AutogradHooksImpl::minimum(const Tensor& a, const Tensor& b) {
  return binary_record(
      "MinimumBackward", a, b, [&] { return gw::minimum(a, b); }, true, false,
      [](FormulaNode& n, const Tensor& g) {
        Tensor x = n.saved(0), y = n.saved(1);
        Tensor wa = gw::lt(x, y).to(g.dtype()) + gw::eq(x, y).to(g.dtype()) * 0.5;
        return std::vector<Tensor>{maybe(n.needs(0), [&] { return g * wa; }),
                                   maybe(n.needs(1), [&] { return g * (1.0 - wa); })};
      });
}

Tensor AutogradHooksImpl::where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  Recorder rec("WhereBackward", {a, b});
  Tensor out = raw([&] { return gw::where(cond, a, b); });
  if (!rec) return out;
  rec.save(cond);
  return rec.finish(
      out, GRADWIRE_FORMULA(sa = a.sizes(), sb = b.sizes()) {
        Tensor c = n.saved(0);
        return {maybe(n.needs(0), [&] { return sum_to(gw::where(c, g[0], 0.0), sa); }),
                maybe(n.needs(1),
                      [&] { return sum_to(gw::where(gw::logical_not(c), g[0], 0.0), sb); })};
      });
}

Tensor AutogradHooksImpl::where(const Tensor& cond, const Tensor& a, Scalar b) {
  Recorder rec("WhereBackward", {a});
  Tensor out = raw([&] { return gw::where(cond, a, b); });
  if (!rec) return out;
  rec.save(cond);
  return rec.finish(
      out,
      GRADWIRE_FORMULA(sa = a.sizes()) { return {sum_to(gw::where(n.saved(0), g[0], 0.0), sa)}; });
}

// ---- scalar forms

Tensor AutogradHooksImpl::add(const Tensor& a, Scalar b) {
  return unary_op(
      "AddBackward", a, [&] { return gw::add(a, b); }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return g; });
}
Tensor AutogradHooksImpl::sub(const Tensor& a, Scalar b) {
  return unary_op(
      "SubBackward", a, [&] { return gw::sub(a, b); }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return g; });
}
Tensor AutogradHooksImpl::rsub(Scalar a, const Tensor& b) {
  return unary_op(
      "RsubBackward", b, [&] { return a - b; }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return -g; });
}
Tensor AutogradHooksImpl::mul(const Tensor& a, Scalar b) {
  return unary_op(
      "MulBackward", a, [&] { return gw::mul(a, b); }, Save::kNone,
      [b](const Tensor& g, const Tensor&) { return g * b; });
}
Tensor AutogradHooksImpl::div(const Tensor& a, Scalar b) {
  return unary_op(
      "DivBackward", a, [&] { return gw::div(a, b); }, Save::kNone,
      [b](const Tensor& g, const Tensor&) { return g / b; });
}
Tensor AutogradHooksImpl::rdiv(Scalar a, const Tensor& b) {
  // d(a / b)/db = -a / b^2 = -out / b
  Recorder rec("RdivBackward", {b});
  Tensor out = raw([&] { return a / b; });
  if (!rec) return out;
  rec.save(b);
  rec.save(out);
  return rec.finish(
      out, GRADWIRE_FORMULA() { return {-g[0] * n.saved(1) / n.saved(0)}; });
}
Tensor AutogradHooksImpl::pow(const Tensor& a, Scalar exponent) {
  const double e = exponent.to_double();
  return unary_op(
      "PowBackward", a, [&] { return gw::pow(a, exponent); }, Save::kInput,
      [e](const Tensor& g, const Tensor& x) {
        if (e == 0) return gw::zeros_like(g);
        return g * e * gw::pow(x, e - 1);
      });
}

Tensor AutogradHooksImpl::clamp(const Tensor& a, std::optional<Scalar> min,
                                std::optional<Scalar> max) {
  return unary_op(
      "ClampBackward", a, [&] { return gw::clamp(a, min, max); }, Save::kInput,
      [min, max](const Tensor& g, const Tensor& x) {
        // The gradient passes where min <= x <= max, as PyTorch.
        Tensor pass = gw::ones_like(x).to(kBool);
        if (min) pass = gw::logical_and(pass, gw::ge(x, *min));
        if (max) pass = gw::logical_and(pass, gw::le(x, *max));
        return gw::where(pass, g, 0.0);
      });
}

// ---- unary math

Tensor AutogradHooksImpl::exp(const Tensor& a) {
  return unary_op(
      "ExpBackward", a, [&] { return gw::exp(a); }, Save::kOutput,
      [](const Tensor& g, const Tensor& out) { return g * out; });
}
Tensor AutogradHooksImpl::log(const Tensor& a) {
  return unary_op(
      "LogBackward", a, [&] { return gw::log(a); }, Save::kInput,
      [](const Tensor& g, const Tensor& x) { return g / x; });
}
Tensor AutogradHooksImpl::sqrt(const Tensor& a) {
  return unary_op(
      "SqrtBackward", a, [&] { return gw::sqrt(a); }, Save::kOutput,
      [](const Tensor& g, const Tensor& out) { return g / (out * 2.0); });
}
Tensor AutogradHooksImpl::rsqrt(const Tensor& a) {
  return unary_op(
      "RsqrtBackward", a, [&] { return gw::rsqrt(a); }, Save::kOutput,
      [](const Tensor& g, const Tensor& out) { return g * (out * out * out) * -0.5; });
}
Tensor AutogradHooksImpl::abs(const Tensor& a) {
  return unary_op(
      "AbsBackward", a, [&] { return gw::abs(a); }, Save::kInput,
      [](const Tensor& g, const Tensor& x) { return g * gw::sign(x); });
}
Tensor AutogradHooksImpl::neg(const Tensor& a) {
  return unary_op(
      "NegBackward", a, [&] { return gw::neg(a); }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return -g; });
}
Tensor AutogradHooksImpl::relu(const Tensor& a) {
  return unary_op(
      "ReluBackward", a, [&] { return gw::relu(a); }, Save::kOutput,
      [](const Tensor& g, const Tensor& out) { return gw::where(gw::gt(out, 0), g, 0.0); });
}
Tensor AutogradHooksImpl::sigmoid(const Tensor& a) {
  return unary_op(
      "SigmoidBackward", a, [&] { return gw::sigmoid(a); }, Save::kOutput,
      [](const Tensor& g, const Tensor& out) { return g * out * (1.0 - out); });
}
Tensor AutogradHooksImpl::tanh(const Tensor& a) {
  return unary_op(
      "TanhBackward", a, [&] { return gw::tanh(a); }, Save::kOutput,
      [](const Tensor& g, const Tensor& out) { return g * (1.0 - out * out); });
}
Tensor AutogradHooksImpl::sign(const Tensor& a) {
  return unary_op(
      "SignBackward", a, [&] { return gw::sign(a); }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return gw::zeros_like(g); });
}
Tensor AutogradHooksImpl::square(const Tensor& a) {
  return unary_op(
      "SquareBackward", a, [&] { return gw::square(a); }, Save::kInput,
      [](const Tensor& g, const Tensor& x) { return g * x * 2.0; });
}
Tensor AutogradHooksImpl::reciprocal(const Tensor& a) {
  return unary_op(
      "ReciprocalBackward", a, [&] { return gw::reciprocal(a); }, Save::kOutput,
      [](const Tensor& g, const Tensor& out) { return -g * out * out; });
}

}  // namespace gradwire::autograd::detail
