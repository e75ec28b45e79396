// Backward formulas of views, copies, conversions and in-place methods.
//
// Views are recorded like other ops (their gradient is mapped back to the input's shape)
// and marked as views, because autograd does not rebase views: an in-place write through a
// recorded view, or using such a view after its storage changed, is refused with an
// InvalidArgument rather than giving silently wrong gradients (docs/autograd.md).
#include "formula_helpers.h"
#include "gradwire/core/check.h"

namespace gradwire::autograd::detail {

namespace {
Tensor view_record(const char* name, const char* op, const Tensor& a,
                   const std::function<Tensor()>& forward,
                   std::function<Tensor(const Tensor& g)> grad_of) {
  Recorder rec(name, {a});
  Tensor out = raw(forward);
  if (!rec) return out;
  return rec.finish_view(
      out, op, GRADWIRE_FORMULA(grad_of) { return {grad_of(g[0])}; });
}

// Storage element index of every element of a (sizes, strides, offset) geometry, flattened.
Tensor positions(const Shape& sizes, const Shape& strides, int64_t offset) {
  Tensor pos = gw::full({}, offset, kInt64);
  for (size_t d = 0; d < sizes.size(); ++d) {
    Shape shape(sizes.size(), 1);
    shape[d] = sizes[d];
    pos = pos + (gw::arange(sizes[d]) * strides[d]).reshape(shape);
  }
  return pos.expand(sizes).reshape({-1});
}
}  // namespace

Tensor AutogradHooksImpl::view(const Tensor& a, const Shape& shape) {
  return view_record(
      "ViewBackward", "view", a, [&] { return a.view(shape); },
      [sa = a.sizes()](const Tensor& g) { return g.reshape(sa); });
}

Tensor AutogradHooksImpl::transpose(const Tensor& a, int64_t dim0, int64_t dim1) {
  return view_record(
      "TransposeBackward", "transpose", a, [&] { return a.transpose(dim0, dim1); },
      [dim0, dim1](const Tensor& g) { return g.transpose(dim0, dim1); });
}

Tensor AutogradHooksImpl::permute(const Tensor& a, const Shape& dims) {
  Shape inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    inverse[static_cast<size_t>(a.wrap_dim(dims[i], "permute"))] = static_cast<int64_t>(i);
  }
  return view_record(
      "PermuteBackward", "permute", a, [&] { return a.permute(dims); },
      [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor AutogradHooksImpl::slice(const Tensor& a, int64_t dim, int64_t start, int64_t end,
                                int64_t step) {
  // The same slice of a zero tensor shaped like the input receives the gradient (slice's
  // clamping of start/end is deterministic, so it selects the same elements).
  return view_record(
      "SliceBackward", "slice", a, [&] { return a.slice(dim, start, end, step); },
      [=, sa = a.sizes()](const Tensor& g) {
        Tensor r = gw::zeros(sa, g.options());
        r.slice(dim, start, end, step).copy_(g);
        return r;
      });
}

Tensor AutogradHooksImpl::select(const Tensor& a, int64_t dim, int64_t index) {
  return view_record(
      "SelectBackward", "select", a, [&] { return a.select(dim, index); },
      [=, sa = a.sizes()](const Tensor& g) {
        Tensor r = gw::zeros(sa, g.options());
        r.select(dim, index).copy_(g);
        return r;
      });
}

Tensor AutogradHooksImpl::expand(const Tensor& a, const Shape& shape) {
  return view_record(
      "ExpandBackward", "expand", a, [&] { return a.expand(shape); },
      [sa = a.sizes()](const Tensor& g) { return sum_to(g, sa); });
}

Tensor AutogradHooksImpl::squeeze(const Tensor& a, std::optional<int64_t> dim) {
  return view_record(
      "SqueezeBackward", "squeeze", a, [&] { return dim ? a.squeeze(*dim) : a.squeeze(); },
      [sa = a.sizes()](const Tensor& g) { return g.reshape(sa); });
}

Tensor AutogradHooksImpl::unsqueeze(const Tensor& a, int64_t dim) {
  return view_record(
      "UnsqueezeBackward", "unsqueeze", a, [&] { return a.unsqueeze(dim); },
      [sa = a.sizes()](const Tensor& g) { return g.reshape(sa); });
}

Tensor AutogradHooksImpl::as_strided(const Tensor& a, const Shape& sizes, const Shape& strides,
                                     std::optional<int64_t> storage_offset) {
  // General rule: scatter the gradient onto the storage positions the output reads, then
  // read them back at the input's positions. Only inputs whose elements occupy distinct
  // memory have a well-defined gradient here (an expanded input does not).
  const int64_t offset = storage_offset.value_or(a.storage_offset());
  return view_record(
      "AsStridedBackward", "as_strided", a,
      [&] { return a.as_strided(sizes, strides, storage_offset); },
      [=, sa = a.sizes(), sta = a.strides(), oa = a.storage_offset()](const Tensor& g) {
        Tensor in_pos = positions(sa, sta, oa);
        Tensor out_pos = positions(sizes, strides, offset);
        int64_t len = 1;
        if (in_pos.numel() > 0) len = std::max(len, gw::amax(in_pos).item<int64_t>() + 1);
        if (out_pos.numel() > 0) len = std::max(len, gw::amax(out_pos).item<int64_t>() + 1);
        Tensor count = gw::index_add(gw::zeros({len}, kFloat64), 0, in_pos,
                                     gw::ones({in_pos.numel()}, kFloat64));
        GRADWIRE_CHECK_ARG(in_pos.numel() == 0 || gw::amax(count).item<double>() <= 1.0)
            << "as_strided backward: the input of shape " << shape_to_string(sa) << " and strides "
            << shape_to_string(sta)
            << " has elements sharing memory (an expanded tensor), so its gradient through "
               "as_strided is not defined; call contiguous() on it first";
        Tensor buf = gw::index_add(gw::zeros({len}, g.options()), 0, out_pos, g.reshape({-1}));
        return gw::index_select(buf, 0, in_pos).reshape(sa);
      });
}

Tensor AutogradHooksImpl::clone(const Tensor& a) {
  return unary_op(
      "CloneBackward", a, [&] { return a.clone(); }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return g; });
}

Tensor AutogradHooksImpl::to(const Tensor& a, DType dtype) {
  if (a.dtype() == dtype) return a;
  // The gradient is cast back to the input's dtype by the engine (input metadata).
  return unary_op(
      "ToCopyBackward", a, [&] { return a.to(dtype); }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return g; });
}

Tensor AutogradHooksImpl::to(const Tensor& a, Device device) {
  if (a.device() == device) return a;
  return unary_op(
      "ToCopyBackward", a, [&] { return a.to(device); }, Save::kNone,
      [](const Tensor& g, const Tensor&) { return g; });
}

// ---- in-place methods: record a node whose first next edge is self's previous history,
// and make it self's grad_fn (Recorder's in-place form refuses the unsupported cases).

Tensor& AutogradHooksImpl::copy_(Tensor& self, const Tensor& src) {
  Recorder rec("CopyBackward", "copy_", self, {self, src});
  raw([&] { return self.copy_(src); });
  rec.finish_inplace(
      self, GRADWIRE_FORMULA(ss = src.sizes()) {
        return {maybe(n.needs(0), [&] { return gw::zeros_like(g[0]); }),
                maybe(n.needs(1), [&] { return sum_to(g[0], ss); })};
      });
  return self;
}

Tensor& AutogradHooksImpl::fill_(Tensor& self, Scalar value) {
  Recorder rec("FillBackward", "fill_", self, {self});
  raw([&] { return self.fill_(value); });
  rec.finish_inplace(
      self, GRADWIRE_FORMULA() { return {gw::zeros_like(g[0])}; });
  return self;
}

namespace {
Tensor& inplace_binary(const char* name, const char* op, Tensor& self, const Tensor& other,
                       bool save_old_self, bool save_other, bool save_result,
                       const std::function<void()>& forward,
                       std::function<std::vector<Tensor>(FormulaNode&, const Tensor&)> grads) {
  Recorder rec(name, op, self, {self, other});
  if (rec && save_old_self) rec.save(raw([&] { return self.clone(); }));
  if (rec && save_other) rec.save(other);
  raw([&] {
    forward();
    return 0;
  });
  if (rec && save_result) rec.save(self);
  rec.finish_inplace(
      self, GRADWIRE_FORMULA(grads, so = other.sizes()) {
        std::vector<Tensor> r = grads(n, g[0]);
        if (r[1].defined()) r[1] = sum_to(r[1], so);
        return r;
      });
  return self;
}

Tensor& inplace_unary(const char* name, const char* op, Tensor& self, bool save_old_self,
                      bool save_result, const std::function<void()>& forward,
                      std::function<Tensor(const Tensor& g, const Tensor& saved)> grad_of) {
  Recorder rec(name, op, self, {self});
  if (rec && save_old_self) rec.save(raw([&] { return self.clone(); }));
  raw([&] {
    forward();
    return 0;
  });
  if (rec && save_result) rec.save(self);
  const bool saves = save_old_self || save_result;
  rec.finish_inplace(
      self,
      GRADWIRE_FORMULA(grad_of, saves) { return {grad_of(g[0], saves ? n.saved(0) : Tensor())}; });
  return self;
}
}  // namespace

Tensor& AutogradHooksImpl::add_(Tensor& self, const Tensor& other, Scalar alpha) {
  return inplace_binary(
      "AddBackward", "add_", self, other, false, false, false, [&] { self.add_(other, alpha); },
      [alpha](FormulaNode& n, const Tensor& g) {
        return std::vector<Tensor>{n.needs(0) ? g : Tensor(),
                                   maybe(n.needs(1), [&] { return g * alpha; })};
      });
}

Tensor& AutogradHooksImpl::sub_(Tensor& self, const Tensor& other, Scalar alpha) {
  return inplace_binary(
      "SubBackward", "sub_", self, other, false, false, false, [&] { self.sub_(other, alpha); },
      [alpha](FormulaNode& n, const Tensor& g) {
        return std::vector<Tensor>{n.needs(0) ? g : Tensor(),
                                   maybe(n.needs(1), [&] { return g * (-alpha.to_double()); })};
      });
}

Tensor& AutogradHooksImpl::mul_(Tensor& self, const Tensor& other) {
  // saved: 0 = self before the op (only when other needs a gradient), 1 = other.
  const bool other_needs = requires_grad(other);
  return inplace_binary(
      "MulBackward", "mul_", self, other, other_needs, true, false, [&] { self.mul_(other); },
      [other_needs](FormulaNode& n, const Tensor& g) {
        const size_t o = other_needs ? 1 : 0;
        return std::vector<Tensor>{maybe(n.needs(0), [&] { return g * n.saved(o); }),
                                   maybe(n.needs(1), [&] { return g * n.saved(0); })};
      });
}

Tensor& AutogradHooksImpl::div_(Tensor& self, const Tensor& other) {
  // saved: 0 = other, 1 = the result; d/dother (self / other) = -result / other.
  return inplace_binary(
      "DivBackward", "div_", self, other, false, true, true, [&] { self.div_(other); },
      [](FormulaNode& n, const Tensor& g) {
        Tensor o = n.saved(0);
        return std::vector<Tensor>{maybe(n.needs(0), [&] { return g / o; }),
                                   maybe(n.needs(1), [&] { return -g * n.saved(1) / o; })};
      });
}

Tensor& AutogradHooksImpl::add_(Tensor& self, Scalar other) {
  return inplace_unary(
      "AddBackward", "add_", self, false, false, [&] { self.add_(other); },
      [](const Tensor& g, const Tensor&) { return g; });
}
Tensor& AutogradHooksImpl::sub_(Tensor& self, Scalar other) {
  return inplace_unary(
      "SubBackward", "sub_", self, false, false, [&] { self.sub_(other); },
      [](const Tensor& g, const Tensor&) { return g; });
}
Tensor& AutogradHooksImpl::mul_(Tensor& self, Scalar other) {
  return inplace_unary(
      "MulBackward", "mul_", self, false, false, [&] { self.mul_(other); },
      [other](const Tensor& g, const Tensor&) { return g * other; });
}
Tensor& AutogradHooksImpl::div_(Tensor& self, Scalar other) {
  return inplace_unary(
      "DivBackward", "div_", self, false, false, [&] { self.div_(other); },
      [other](const Tensor& g, const Tensor&) { return g / other; });
}
Tensor& AutogradHooksImpl::pow_(Tensor& self, Scalar exponent) {
  const double e = exponent.to_double();
  return inplace_unary(
      "PowBackward", "pow_", self, true, false, [&] { self.pow_(exponent); },
      [e](const Tensor& g, const Tensor& x) {
        if (e == 0) return gw::zeros_like(g);
        return g * e * gw::pow(x, e - 1);
      });
}
Tensor& AutogradHooksImpl::neg_(Tensor& self) {
  return inplace_unary(
      "NegBackward", "neg_", self, false, false, [&] { self.neg_(); },
      [](const Tensor& g, const Tensor&) { return -g; });
}
Tensor& AutogradHooksImpl::relu_(Tensor& self) {
  return inplace_unary(
      "ReluBackward", "relu_", self, false, true, [&] { self.relu_(); },
      [](const Tensor& g, const Tensor& out) { return gw::where(gw::gt(out, 0), g, 0.0); });
}
Tensor& AutogradHooksImpl::clamp_(Tensor& self, std::optional<Scalar> min,
                                  std::optional<Scalar> max) {
  return inplace_unary(
      "ClampBackward", "clamp_", self, true, false, [&] { self.clamp_(min, max); },
      [min, max](const Tensor& g, const Tensor& x) {
        Tensor pass = gw::ones_like(x).to(kBool);
        if (min) pass = gw::logical_and(pass, gw::ge(x, *min));
        if (max) pass = gw::logical_and(pass, gw::le(x, *max));
        return gw::where(pass, g, 0.0);
      });
}

}  // namespace gradwire::autograd::detail
