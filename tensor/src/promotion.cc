// result_type and broadcast_shapes: the dtype and shape rules every op shares.
#include "gradwire/core/check.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {

namespace {
int category(DType t) { return t == kBool ? 0 : is_floating_point(t) ? 2 : 1; }
}  // namespace

DType result_type(const Tensor& a, const Tensor& b) {
  // Dimensioned tensors decide; a 0-dim tensor only lifts the category.
  const bool a_dim = a.dim() > 0, b_dim = b.dim() > 0;
  if (a_dim == b_dim) return promote_types(a.dtype(), b.dtype());
  const Tensor& big = a_dim ? a : b;
  const Tensor& small = a_dim ? b : a;
  if (category(small.dtype()) > category(big.dtype())) {
    return promote_types(big.dtype(), small.dtype());
  }
  return big.dtype();
}

DType result_type(const Tensor& a, Scalar b) {
  const int scalar_category = b.is_bool() ? 0 : b.is_integral() ? 1 : 2;
  if (scalar_category > category(a.dtype())) return b.default_dtype();
  return a.dtype();
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x == y || y == 1) {
      out[i] = x;
    } else if (x == 1) {
      out[i] = y;
    } else {
      GRADWIRE_THROW(InvalidArgument) << op << ": shapes " << shape_to_string(a) << " and "
                                      << shape_to_string(b) << " do not broadcast";
    }
  }
  return out;
}

}  // namespace gradwire
