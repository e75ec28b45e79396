#include "grad_utils.h"

#include <algorithm>

namespace gradwire::autograd::detail {

bool broadcasts_to(const Shape& from, const Shape& to) {
  if (from.size() > to.size()) return false;
  const size_t lead = to.size() - from.size();
  for (size_t i = 0; i < from.size(); ++i) {
    if (from[i] != 1 && from[i] != to[lead + i]) return false;
  }
  return true;
}

Tensor sum_to(const Tensor& g, const Shape& shape) {
  if (g.sizes() == shape) return g;
  const int64_t lead = g.dim() - static_cast<int64_t>(shape.size());
  Shape dims;
  for (int64_t i = 0; i < lead; ++i)
    dims.push_back(i);
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1 && g.sizes()[lead + i] != 1) dims.push_back(lead + static_cast<int64_t>(i));
  }
  Tensor r = dims.empty() ? g : sum(g, dims, /*keepdim=*/true);
  return r.reshape(shape);
}

namespace {
Shape wrapped_sorted(const Shape& dims, int64_t ndim) {
  Shape out;
  const int64_t n = std::max<int64_t>(ndim, 1);
  for (int64_t d : dims)
    out.push_back(d < 0 ? d + n : d);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}
}  // namespace

Tensor unsqueeze_reduced(const Tensor& g, const Shape& dims, int64_t ndim, bool keepdim) {
  if (keepdim || ndim == 0) return g;
  if (dims.empty()) return g.reshape(Shape(static_cast<size_t>(ndim), 1));
  Tensor r = g;
  for (int64_t d : wrapped_sorted(dims, ndim))
    r = r.unsqueeze(d);
  return r;
}

int64_t reduced_count(const Shape& sizes, const Shape& dims) {
  int64_t n = 1;
  if (dims.empty()) {
    for (int64_t s : sizes)
      n *= s;
    return n;
  }
  for (int64_t d : wrapped_sorted(dims, static_cast<int64_t>(sizes.size()))) {
    if (!sizes.empty()) n *= sizes[d];
  }
  return n;
}

}  // namespace gradwire::autograd::detail
