// Backward formulas of indexing and joining ops.
#include "formula_helpers.h"
#include "gradwire/tensor/sparse.h"

namespace gradwire::autograd::detail {

Tensor AutogradHooksImpl::index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  Recorder rec("IndexSelectBackward", {a});
  Tensor out = raw([&] { return gw::index_select(a, dim, index); });
  if (!rec) return out;
  rec.save(index);
  return rec.finish(
      out, GRADWIRE_FORMULA(dim, sa = a.sizes()) {
        // Duplicate indices accumulate (the embedding backward).
        Tensor idx = n.saved(0).reshape({-1});
        return {gw::index_add(gw::zeros(sa, g[0].options()), dim, idx, g[0])};
      });
}

Tensor AutogradHooksImpl::embedding_rows(const Tensor& weight, const Tensor& index,
                                         bool sparse_grad) {
  Recorder rec(sparse_grad ? "EmbeddingSparseBackward" : "EmbeddingBackward", {weight});
  Tensor out = raw([&] { return gw::embedding_rows(weight, index, sparse_grad); });
  if (!rec) return out;
  rec.save(index);
  return rec.finish(
      out, GRADWIRE_FORMULA(sparse_grad, sw = weight.sizes()) {
        Tensor idx = n.saved(0).reshape({-1});
        // Sparse: only the rows looked up, duplicates kept (coalesced on demand); the rows
        // are copied so that no later in-place use of g[0] can reach the gradient.
        if (sparse_grad) return {gw::sparse_rows(idx, g[0].clone(), sw)};
        return {gw::index_add(gw::zeros(sw, g[0].options()), 0, idx, g[0])};
      });
}

Tensor AutogradHooksImpl::gather(const Tensor& a, int64_t dim, const Tensor& index) {
  Recorder rec("GatherBackward", {a});
  Tensor out = raw([&] { return gw::gather(a, dim, index); });
  if (!rec) return out;
  rec.save(index);
  return rec.finish(
      out, GRADWIRE_FORMULA(dim, sa = a.sizes()) {
        return {gw::scatter_add(gw::zeros(sa, g[0].options()), dim, n.saved(0), g[0])};
      });
}

namespace {
// out = a with src's elements added at index along dim: d/da = g; d/dsrc = g at index.
Formula scatter_add_formula(int64_t dim) {
  return GRADWIRE_FORMULA(dim) {
    return {maybe(n.needs(0), [&] { return g[0]; }),
            maybe(n.needs(1), [&] { return gw::gather(g[0], dim, n.saved(0)); })};
  };
}
}  // namespace

Tensor AutogradHooksImpl::scatter_add(const Tensor& a, int64_t dim, const Tensor& index,
                                      const Tensor& src) {
  Recorder rec("ScatterAddBackward", {a, src});
  Tensor out = raw([&] { return gw::scatter_add(a, dim, index, src); });
  if (!rec) return out;
  rec.save(index);
  return rec.finish(out, scatter_add_formula(dim));
}

Tensor& AutogradHooksImpl::scatter_add_(Tensor& a, int64_t dim, const Tensor& index,
                                        const Tensor& src) {
  Recorder rec("ScatterAddBackward", "scatter_add_", a, {a, src});
  if (rec) rec.save(index);
  raw([&] { return gw::scatter_add_(a, dim, index, src); });
  rec.finish_inplace(a, scatter_add_formula(dim));
  return a;
}

Tensor AutogradHooksImpl::index_add(const Tensor& a, int64_t dim, const Tensor& index,
                                    const Tensor& src) {
  Recorder rec("IndexAddBackward", {a, src});
  Tensor out = raw([&] { return gw::index_add(a, dim, index, src); });
  if (!rec) return out;
  rec.save(index);
  return rec.finish(
      out, GRADWIRE_FORMULA(dim, ss = src.sizes()) {
        return {maybe(n.needs(0), [&] { return g[0]; }), maybe(n.needs(1), [&] {
                  return gw::index_select(g[0], dim, n.saved(0).reshape({-1})).reshape(ss);
                })};
      });
}

Tensor AutogradHooksImpl::masked_fill(const Tensor& a, const Tensor& mask, Scalar value) {
  Recorder rec("MaskedFillBackward", {a});
  Tensor out = raw([&] { return gw::masked_fill(a, mask, value); });
  if (!rec) return out;
  rec.save(mask);
  return rec.finish(
      out, GRADWIRE_FORMULA() { return {gw::masked_fill(g[0], n.saved(0), 0)}; });
}

Tensor AutogradHooksImpl::cat(const std::vector<Tensor>& tensors, int64_t dim) {
  Recorder rec("CatBackward", tensors);
  Tensor out = raw([&] { return gw::cat(tensors, dim); });
  if (!rec) return out;
  std::vector<Shape> shapes;
  for (const Tensor& t : tensors)
    shapes.push_back(t.sizes());
  return rec.finish(
      out, GRADWIRE_FORMULA(shapes, dim) {
        std::vector<Tensor> r;
        const int64_t d = g[0].wrap_dim(dim, "cat");
        int64_t offset = 0;
        for (size_t i = 0; i < shapes.size(); ++i) {
          // cat skips 1-d empty tensors whatever the dim (PyTorch's legacy rule).
          if (shapes[i].size() == 1 && shapes[i][0] == 0 && g[0].dim() != 1) {
            r.push_back(gw::zeros(shapes[i], g[0].options()));
            continue;
          }
          const int64_t len = shapes[i][d];
          r.push_back(n.needs(i) ? g[0].narrow(d, offset, len) : Tensor());
          offset += len;
        }
        return r;
      });
}

Tensor AutogradHooksImpl::flatten_dense_tensors(const std::vector<Tensor>& tensors) {
  Recorder rec("FlattenDenseTensorsBackward", tensors);
  Tensor out = raw([&] { return gw::flatten_dense_tensors(tensors); });
  if (!rec) return out;
  std::vector<Shape> shapes;
  for (const Tensor& t : tensors)
    shapes.push_back(t.sizes());
  return rec.finish(
      out, GRADWIRE_FORMULA(shapes) {
        std::vector<Tensor> r;
        int64_t offset = 0;
        for (const Shape& s : shapes) {
          const int64_t numel = shape_numel(s);
          r.push_back(g[0].narrow(0, offset, numel).view(s));
          offset += numel;
        }
        return r;
      });
}

}  // namespace gradwire::autograd::detail
