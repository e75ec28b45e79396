// Backward formulas of reductions, matrix products and the softmax family.
#include "formula_helpers.h"

namespace gradwire::autograd::detail {

Tensor AutogradHooksImpl::sum(const Tensor& a, const Shape& dims, bool keepdim,
                              std::optional<DType> dtype) {
  Recorder rec("SumBackward", {a});
  Tensor out = raw([&] { return gw::sum(a, dims, keepdim, dtype); });
  if (!rec) return out;
  return rec.finish(
      out, GRADWIRE_FORMULA(dims, keepdim, sa = a.sizes()) {
        const int64_t nd = static_cast<int64_t>(sa.size());
        return {unsqueeze_reduced(g[0], dims, nd, keepdim).expand(sa)};
      });
}

Tensor AutogradHooksImpl::mean(const Tensor& a, const Shape& dims, bool keepdim) {
  Recorder rec("MeanBackward", {a});
  Tensor out = raw([&] { return gw::mean(a, dims, keepdim); });
  if (!rec) return out;
  return rec.finish(
      out, GRADWIRE_FORMULA(dims, keepdim, sa = a.sizes()) {
        const int64_t nd = static_cast<int64_t>(sa.size());
        const double count = static_cast<double>(reduced_count(sa, dims));
        return {unsqueeze_reduced(g[0], dims, nd, keepdim).expand(sa) / count};
      });
}

Tensor AutogradHooksImpl::prod(const Tensor& a, int64_t dim, bool keepdim) {
  Recorder rec("ProdBackward", {a});
  Tensor out = raw([&] { return gw::prod(a, dim, keepdim); });
  if (!rec) return out;
  rec.save(a);
  rec.save(out);
  return rec.finish(
      out, GRADWIRE_FORMULA(dim, keepdim) {
        Tensor x = n.saved(0);
        const int64_t d = x.dim() == 0 ? 0 : x.wrap_dim(dim, "prod");
        Tensor gu = unsqueeze_reduced(g[0], {d}, x.dim(), keepdim);
        Tensor pu = unsqueeze_reduced(n.saved(1), {d}, x.dim(), keepdim);
        if (x.dim() == 0) return {g[0]};
        if (gw::sum(gw::eq(x, 0)).item<int64_t>() == 0) return {gu * pu / x};
        // With zeros, out / x is undefined: form each element's product of the others directly.
        const int64_t len = x.size(d);
        std::vector<Tensor> others;
        for (int64_t i = 0; i < len; ++i) {
          std::vector<Tensor> parts;
          if (i > 0) parts.push_back(x.narrow(d, 0, i));
          if (i + 1 < len) parts.push_back(x.narrow(d, i + 1, len - i - 1));
          others.push_back(parts.empty() ? gw::ones_like(x.narrow(d, 0, 1))
                                         : gw::prod(gw::cat(parts, d), d, /*keepdim=*/true));
        }
        return {gu * gw::cat(others, d)};
      });
}

namespace {
// amax/amin/max/min over `dims`: the gradient is shared evenly among the elements equal to
// the extreme, as PyTorch.
Tensor extreme_record(const char* name, const Tensor& a, const Shape& dims, bool keepdim,
                      const std::function<Tensor()>& forward) {
  Recorder rec(name, {a});
  Tensor out = raw(forward);
  if (!rec) return out;
  rec.save(a);
  rec.save(out);
  return rec.finish(
      out, GRADWIRE_FORMULA(dims, keepdim) {
        Tensor x = n.saved(0);
        Tensor ou = unsqueeze_reduced(n.saved(1), dims, x.dim(), keepdim);
        Tensor mask = gw::eq(x, ou).to(g[0].dtype());
        Tensor count = dims.empty() ? gw::sum(mask) : gw::sum(mask, dims, true);
        if (dims.empty()) count = count.reshape(Shape(static_cast<size_t>(x.dim()), 1));
        return {unsqueeze_reduced(g[0], dims, x.dim(), keepdim) * mask / count};
      });
}

std::pair<Tensor, Tensor> extreme_dim_record(const char* name, const Tensor& a, int64_t dim,
                                             bool keepdim,
                                             const std::function<std::pair<Tensor, Tensor>()>& f) {
  Recorder rec(name, {a});
  auto [values, indices] = raw(f);
  if (!rec) return {values, indices};
  rec.save(indices);
  Tensor v = rec.finish(
      values, GRADWIRE_FORMULA(dim, keepdim, sa = a.sizes()) {
        const int64_t nd = static_cast<int64_t>(sa.size());
        if (nd == 0) return {g[0]};
        const int64_t d = dim < 0 ? dim + nd : dim;
        Tensor idx = unsqueeze_reduced(n.saved(0), {d}, nd, keepdim);
        Tensor gu = unsqueeze_reduced(g[0], {d}, nd, keepdim);
        return {gw::scatter_add(gw::zeros(sa, g[0].options()), d, idx, gu)};
      });
  return {v, indices};
}
}  // namespace

Tensor AutogradHooksImpl::amax(const Tensor& a, const Shape& dims, bool keepdim) {
  return extreme_record("AmaxBackward", a, dims, keepdim,
                        [&] { return gw::amax(a, dims, keepdim); });
}
Tensor AutogradHooksImpl::amin(const Tensor& a, const Shape& dims, bool keepdim) {
  return extreme_record("AminBackward", a, dims, keepdim,
                        [&] { return gw::amin(a, dims, keepdim); });
}
Tensor AutogradHooksImpl::max(const Tensor& a) {
  return extreme_record("MaxBackward", a, {}, false, [&] { return gw::max(a); });
}
Tensor AutogradHooksImpl::min(const Tensor& a) {
  return extreme_record("MinBackward", a, {}, false, [&] { return gw::min(a); });
}
std::pair<Tensor, Tensor> AutogradHooksImpl::max(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_dim_record("MaxBackward", a, dim, keepdim,
                            [&] { return gw::max(a, dim, keepdim); });
}
std::pair<Tensor, Tensor> AutogradHooksImpl::min(const Tensor& a, int64_t dim, bool keepdim) {
  return extreme_dim_record("MinBackward", a, dim, keepdim,
                            [&] { return gw::min(a, dim, keepdim); });
}

Tensor AutogradHooksImpl::norm(const Tensor& a) {
  Recorder rec("NormBackward", {a});
  Tensor out = raw([&] { return gw::norm(a); });
  if (!rec) return out;
  rec.save(a);
  rec.save(out);
  return rec.finish(
      out, GRADWIRE_FORMULA() {
        Tensor x = n.saved(0);
        const double r = n.saved(1).item<double>();
        // The subgradient 0 at the origin, as PyTorch.
        if (r == 0) return {gw::zeros_like(x).to(g[0].dtype())};
        return {x * (g[0] / r)};
      });
}

// ---- matrix products

namespace {
// The gradients of x y (matrices) for the output's gradient g, each produced in its
// operand's layout: for a column-major operand (typically a weight used as W.t()) the
// transposed product is computed and its transpose returned, so the gradient reaches the
// weight's accumulator contiguous instead of being copied into shape there on every step.
std::vector<Tensor> mm_gradients(FormulaNode& n, const Tensor& x, const Tensor& y,
                                 const Tensor& g) {
  auto column_major = [](const Tensor& t) {
    return t.dim() == 2 && t.stride(0) == 1 && t.stride(1) != 1;
  };
  return {
      maybe(n.needs(0), [&] { return column_major(x) ? gw::mm(y, g.t()).t() : gw::mm(g, y.t()); }),
      maybe(n.needs(1), [&] { return column_major(y) ? gw::mm(g.t(), x).t() : gw::mm(x.t(), g); })};
}
}  // namespace

Tensor AutogradHooksImpl::mm(const Tensor& a, const Tensor& b) {
  Recorder rec("MmBackward", {a, b});
  Tensor out = raw([&] { return gw::mm(a, b); });
  if (!rec) return out;
  rec.save(a);
  rec.save(b);
  return rec.finish(
      out, GRADWIRE_FORMULA() { return mm_gradients(n, n.saved(0), n.saved(1), g[0]); });
}

Tensor AutogradHooksImpl::bmm(const Tensor& a, const Tensor& b) {
  Recorder rec("BmmBackward", {a, b});
  Tensor out = raw([&] { return gw::bmm(a, b); });
  if (!rec) return out;
  rec.save(a);
  rec.save(b);
  return rec.finish(
      out, GRADWIRE_FORMULA() {
        return {maybe(n.needs(0), [&] { return gw::bmm(g[0], n.saved(1).transpose(1, 2)); }),
                maybe(n.needs(1), [&] { return gw::bmm(n.saved(0).transpose(1, 2), g[0]); })};
      });
}

Tensor AutogradHooksImpl::matmul(const Tensor& a, const Tensor& b) {
  Recorder rec("MatmulBackward", {a, b});
  Tensor out = raw([&] { return gw::matmul(a, b); });
  if (!rec) return out;
  rec.save(a);
  rec.save(b);
  return rec.finish(
      out, GRADWIRE_FORMULA() {
        // Lift 1-d operands to matrices (as matmul does), use the batched rule, then reduce
        // broadcast batch dims and drop the lifted dims again.
        Tensor x = n.saved(0), y = n.saved(1);
        // Two matrices: mm's gradients, in the operands' layouts (x W.t(), a linear layer,
        // gives W a contiguous gradient).
        if (x.dim() == 2 && y.dim() == 2) return mm_gradients(n, x, y, g[0]);
        Tensor x2 = x.dim() == 1 ? x.unsqueeze(0) : x;
        Tensor y2 = y.dim() == 1 ? y.unsqueeze(1) : y;
        Tensor g2 = g[0];
        if (y.dim() == 1) g2 = g2.unsqueeze(g2.dim());
        if (x.dim() == 1) g2 = g2.unsqueeze(g2.dim() - 1);
        return {
            maybe(n.needs(0),
                  [&] {
                    return sum_to(gw::matmul(g2, y2.transpose(-1, -2)), x2.sizes())
                        .reshape(x.sizes());
                  }),
            maybe(n.needs(1), [&] {
              return sum_to(gw::matmul(x2.transpose(-1, -2), g2), y2.sizes()).reshape(y.sizes());
            })};
      });
}

Tensor& AutogradHooksImpl::addmm_(Tensor& out, const Tensor& a, const Tensor& b, Scalar beta,
                                  Scalar alpha) {
  Recorder rec("AddmmBackward", "addmm_", out, {out, a, b});
  if (rec) {
    rec.save(a);
    rec.save(b);
  }
  raw([&] { return gw::addmm_(out, a, b, beta, alpha); });
  rec.finish_inplace(
      out, GRADWIRE_FORMULA(beta, alpha) {
        const double al = alpha.to_double();
        return {maybe(n.needs(0), [&] { return g[0] * beta; }),
                maybe(n.needs(1), [&] { return gw::mm(g[0], n.saved(1).t()) * al; }),
                maybe(n.needs(2), [&] { return gw::mm(n.saved(0).t(), g[0]) * al; })};
      });
  return out;
}

Tensor AutogradHooksImpl::dot(const Tensor& a, const Tensor& b) {
  Recorder rec("DotBackward", {a, b});
  Tensor out = raw([&] { return gw::dot(a, b); });
  if (!rec) return out;
  rec.save(a);
  rec.save(b);
  return rec.finish(
      out, GRADWIRE_FORMULA() {
        return {maybe(n.needs(0), [&] { return n.saved(1) * g[0]; }),
                maybe(n.needs(1), [&] { return n.saved(0) * g[0]; })};
      });
}

Tensor AutogradHooksImpl::outer(const Tensor& a, const Tensor& b) {
  Recorder rec("OuterBackward", {a, b});
  Tensor out = raw([&] { return gw::outer(a, b); });
  if (!rec) return out;
  rec.save(a);
  rec.save(b);
  return rec.finish(
      out, GRADWIRE_FORMULA() {
        return {maybe(n.needs(0), [&] { return gw::matmul(g[0], n.saved(1)); }),
                maybe(n.needs(1), [&] { return gw::matmul(g[0].t(), n.saved(0)); })};
      });
}

// ---- softmax family

Tensor AutogradHooksImpl::softmax(const Tensor& a, int64_t dim) {
  Recorder rec("SoftmaxBackward", {a});
  Tensor out = raw([&] { return gw::softmax(a, dim); });
  if (!rec) return out;
  rec.save(out);
  return rec.finish(
      out, GRADWIRE_FORMULA(dim) {
        Tensor y = n.saved(0);
        return {y * (g[0] - gw::sum(g[0] * y, {dim}, true))};
      });
}

Tensor AutogradHooksImpl::log_softmax(const Tensor& a, int64_t dim) {
  Recorder rec("LogSoftmaxBackward", {a});
  Tensor out = raw([&] { return gw::log_softmax(a, dim); });
  if (!rec) return out;
  rec.save(out);
  return rec.finish(
      out,
      GRADWIRE_FORMULA(dim) { return {g[0] - gw::exp(n.saved(0)) * gw::sum(g[0], {dim}, true)}; });
}

Tensor AutogradHooksImpl::logsumexp(const Tensor& a, int64_t dim, bool keepdim) {
  Recorder rec("LogsumexpBackward", {a});
  Tensor out = raw([&] { return gw::logsumexp(a, dim, keepdim); });
  if (!rec) return out;
  rec.save(a);
  rec.save(out);
  return rec.finish(
      out, GRADWIRE_FORMULA(dim, keepdim) {
        Tensor x = n.saved(0);
        Tensor ou = unsqueeze_reduced(n.saved(1), {dim}, x.dim(), keepdim);
        return {unsqueeze_reduced(g[0], {dim}, x.dim(), keepdim) * gw::exp(x - ou)};
      });
}

}  // namespace gradwire::autograd::detail
