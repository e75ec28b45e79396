// Elementwise frontends of ops.h and the in-place Tensor methods of tensor.h.
//
// Each frontend checks its arguments, works out the result shape (broadcast_shapes) and
// dtype, allocates the output, converts the inputs to the compute dtype, expands them to
// the output shape (stride 0 where broadcast) and calls the device kernel.
//
// Promotion rules implemented here (on top of result_type, see dtype.h):
//   - add, sub, mul, maximum, minimum, pow, where, clamp: result_type of the operands
//     (for clamp, of the tensor with each given bound). A C++ scalar operand becomes a
//     0-dim tensor of the result dtype, broadcast with stride 0.
//   - div and the float functions (exp, log, sqrt, rsqrt, sigmoid, tanh, reciprocal):
//     bool and integral results become float32, so integer division never happens.
//   - comparisons compute in result_type and write bool; logical_* convert every operand
//     to bool (nonzero is true) and write bool.
//   - square(bool) is pow(bool, 2) and so int64; sign keeps its dtype (bool included).
//   - refused: bool - bool (sub), -bool (neg), abs/relu of bool, pow and clamp computing in
//     bool, an integral base to a negative integral scalar power (PyTorch: "Integers to
//     negative integer powers are not allowed"), a floating alpha for an integral result.
//   - in-place forms (add_, ..., clamp_) and add_out/mul_out compute in the same dtype as
//     the out-of-place op; the result dtype must can_cast() to the destination's dtype,
//     and the other operand must broadcast to the destination's shape, which never
//     changes. They write straight into a contiguous destination of the compute dtype
//     when no input partially overlaps it, and otherwise compute into a temporary and
//     copy_() it over (a non-contiguous or differently typed destination, or aliasing).
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "autograd_dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "kernels.h"

namespace gradwire {

using detail::BinaryOp;
using detail::UnaryOp;

namespace {

void check_defined(const char* op, const Tensor& t, const char* what) {
  GRADWIRE_CHECK_ARG(t.defined()) << op << ": " << what << " is an undefined tensor";
}

// The byte range [lo, hi) of storage that a tensor's elements occupy.
std::pair<int64_t, int64_t> byte_range(const Tensor& t) {
  int64_t lo = t.storage_offset(), hi = t.storage_offset();
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = t.strides()[d] * (t.sizes()[d] - 1);
    (reach < 0 ? lo : hi) += reach;
  }
  return {lo * t.element_size(), (hi + 1) * t.element_size()};
}

// Whether writing `out` elementwise while reading `in` (both of one shape) could read an
// element already overwritten: they share memory without being exactly the same view.
bool unsafe_alias(const Tensor& out, const Tensor& in) {
  if (!out.storage().is_same(in.storage()) || out.numel() == 0 || in.numel() == 0) {
    return false;
  }
  const auto [olo, ohi] = byte_range(out);
  const auto [ilo, ihi] = byte_range(in);
  if (ohi <= ilo || ihi <= olo) return false;
  if (out.data_ptr() != in.data_ptr() || out.dtype() != in.dtype()) return true;
  for (int64_t d = 0; d < out.dim(); ++d) {
    if (out.sizes()[d] != 1 && out.strides()[d] != in.strides()[d]) return true;
  }
  return false;
}

// A destination in which several elements share one memory location (an expanded view)
// cannot be written elementwise with a defined result; PyTorch refuses it too.
void check_writable(const char* op, const Tensor& t) {
  for (int64_t d = 0; d < t.dim(); ++d) {
    GRADWIRE_CHECK_ARG(t.sizes()[d] <= 1 || t.strides()[d] != 0)
        << op << ": cannot write into a tensor of shape " << t.shape_string() << " and strides "
        << shape_to_string(t.strides())
        << " whose elements share memory (an expanded view); clone() it first";
  }
}

DType floating_or_float32(DType t) {
  return is_floating_point(t) ? t : kFloat32;
}

// The dtype a binary op computes in, given result_type of its operands.
DType binary_compute_dtype(const char* op, BinaryOp kind, DType promoted) {
  switch (kind) {
    case BinaryOp::kDiv:
      return floating_or_float32(promoted);
    case BinaryOp::kSub:
      GRADWIRE_CHECK_ARG(promoted != kBool)
          << op << ": subtracting bool tensors is not supported; use ne() for exclusive or "
          << "or logical_not() to invert";
      return promoted;
    case BinaryOp::kPow:
      GRADWIRE_CHECK_ARG(promoted != kBool) << op << ": dtype bool is not supported";
      return promoted;
    case BinaryOp::kLogicalAnd:
    case BinaryOp::kLogicalOr:
      return kBool;
    default:
      return promoted;
  }
}

DType binary_out_dtype(BinaryOp kind, DType compute) {
  return detail::is_comparison(kind) ? kBool : compute;
}

void check_alpha(const char* op, Scalar alpha, DType compute) {
  GRADWIRE_CHECK_ARG(!(is_integral(compute, /*include_bool=*/true) && alpha.is_floating_point()))
      << op << ": alpha " << alpha << " is floating point but the result dtype "
      << dtype_name(compute) << " is not";
  GRADWIRE_CHECK_ARG(!(alpha.is_bool() && compute != kBool))
      << op << ": a bool alpha needs a bool result, not " << dtype_name(compute);
}

// The kernel call shared by every out-of-place binary op; a and b are the operands
// (already checked), compute the dtype they are converted to.
Tensor run_binary(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b, DType compute,
                  Scalar alpha = 1) {
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  Tensor out = empty(shape, TensorOptions(binary_out_dtype(kind, compute)).device(a.device()));
  // An operand already of the result's shape is read as it is: no view to make.
  auto operand = [&](const Tensor& t) {
    Tensor as = t.to(compute);
    return as.sizes() == shape ? as : as.expand(shape);
  };
  detail::device_binary(kind, out, operand(a), operand(b), alpha);
  return out;
}

Tensor binary(const char* op, BinaryOp kind, const Tensor& a, const Tensor& b, Scalar alpha = 1) {
  check_defined(op, a, "first argument");
  check_defined(op, b, "second argument");
  detail::check_same_device(op, {&a, &b});
  const DType compute = binary_compute_dtype(op, kind, result_type(a, b));
  if (kind == BinaryOp::kAdd || kind == BinaryOp::kSub) check_alpha(op, alpha, compute);
  return run_binary(op, kind, a, b, compute, alpha);
}

// A binary op with a C++ scalar operand on the right (or, with scalar_first, the left).
Tensor binary_scalar(const char* op, BinaryOp kind, const Tensor& a, Scalar s,
                     bool scalar_first = false) {
  check_defined(op, a, "tensor argument");
  const DType compute = binary_compute_dtype(op, kind, result_type(a, s));
  const Tensor st = scalar_tensor(s, TensorOptions(compute).device(a.device()));
  return scalar_first ? run_binary(op, kind, st, a, compute) : run_binary(op, kind, a, st, compute);
}

Tensor unary(const char* op, UnaryOp kind, const Tensor& a, DType compute, double p0 = 0,
             double p1 = 0) {
  check_defined(op, a, "argument");
  Tensor out = empty(a.sizes(), TensorOptions(compute).device(a.device()));
  detail::device_unary(kind, out, a.to(compute), p0, p1);
  return out;
}

Tensor float_unary(const char* op, UnaryOp kind, const Tensor& a) {
  check_defined(op, a, "argument");
  return unary(op, kind, a, floating_or_float32(a.dtype()));
}

void refuse_bool(const char* op, DType t, const char* hint) {
  GRADWIRE_CHECK_ARG(t != kBool) << op << ": dtype bool is not supported" << hint;
}

// ---- in-place cores

// self = self `kind` other, with other already a tensor (a 0-dim one for scalars).
Tensor& inplace_binary(Tensor& self, const char* op, BinaryOp kind, const Tensor& other,
                       DType compute, Scalar alpha) {
  GRADWIRE_CHECK_ARG(can_cast(compute, self.dtype()))
      << op << ": result type " << dtype_name(compute)
      << " can't be cast to the desired output type " << dtype_name(self.dtype());
  GRADWIRE_CHECK_ARG(broadcast_shapes(self.sizes(), other.sizes(), op) == self.sizes())
      << op << ": other of shape " << other.shape_string() << " does not broadcast to self's shape "
      << self.shape_string();
  check_writable(op, self);
  const Tensor b = other.to(compute).expand(self.sizes());
  if (self.dtype() == compute && self.is_contiguous() && !unsafe_alias(self, b)) {
    detail::device_binary(kind, self, self, b, alpha);
    self.storage().bump_version();
  } else {
    Tensor tmp = empty(self.sizes(), TensorOptions(compute).device(self.device()));
    detail::device_binary(kind, tmp, self.to(compute), b, alpha);
    self.copy_(tmp);
  }
  return self;
}

Tensor& inplace_binary(Tensor& self, const char* op, BinaryOp kind, const Tensor& other,
                       Scalar alpha) {
  check_defined(op, self, "self");
  check_defined(op, other, "other");
  detail::check_same_device(op, {&self, &other});
  const DType compute = binary_compute_dtype(op, kind, result_type(self, other));
  if (kind == BinaryOp::kAdd || kind == BinaryOp::kSub) check_alpha(op, alpha, compute);
  return inplace_binary(self, op, kind, other, compute, alpha);
}

Tensor& inplace_binary_scalar(Tensor& self, const char* op, BinaryOp kind, Scalar other) {
  check_defined(op, self, "self");
  const DType compute = binary_compute_dtype(op, kind, result_type(self, other));
  const Tensor st = scalar_tensor(other, TensorOptions(compute).device(self.device()));
  return inplace_binary(self, op, kind, st, compute, 1);
}

Tensor& inplace_unary(Tensor& self, const char* op, UnaryOp kind, DType compute, double p0 = 0,
                      double p1 = 0) {
  GRADWIRE_CHECK_ARG(can_cast(compute, self.dtype()))
      << op << ": result type " << dtype_name(compute)
      << " can't be cast to the desired output type " << dtype_name(self.dtype());
  check_writable(op, self);
  if (self.dtype() == compute && self.is_contiguous()) {
    detail::device_unary(kind, self, self, p0, p1);
    self.storage().bump_version();
  } else {
    Tensor tmp = empty(self.sizes(), TensorOptions(compute).device(self.device()));
    detail::device_unary(kind, tmp, self.to(compute), p0, p1);
    self.copy_(tmp);
  }
  return self;
}

// pow with a scalar exponent: the compute dtype, after refusing what PyTorch refuses.
DType pow_scalar_dtype(const char* op, const Tensor& a, Scalar exponent) {
  const DType compute = result_type(a, exponent);
  refuse_bool(op, compute, "");
  GRADWIRE_CHECK_ARG(
      !(is_integral(compute) && !exponent.is_floating_point() && exponent.to_int() < 0))
      << op << ": integers to negative integer powers are not allowed (base dtype "
      << dtype_name(a.dtype()) << ", exponent " << exponent << ")";
  return compute;
}

// clamp's compute dtype: result_type of the tensor with each given bound.
DType clamp_dtype(const char* op, const Tensor& a, const std::optional<Scalar>& min,
                  const std::optional<Scalar>& max) {
  GRADWIRE_CHECK_ARG(min.has_value() || max.has_value())
      << op << ": at least one of min and max must be given";
  DType compute = a.dtype();
  if (min) compute = promote_types(compute, result_type(a, *min));
  if (max) compute = promote_types(compute, result_type(a, *max));
  refuse_bool(op, compute, " (give integer or floating bounds)");
  return compute;
}

// Bounds as the kernel's doubles; an open side is infinite. int64 bounds beyond 2^53
// round to the nearest double.
std::pair<double, double> clamp_bounds(const std::optional<Scalar>& min,
                                       const std::optional<Scalar>& max) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  return {min ? min->to_double() : -inf, max ? max->to_double() : inf};
}

Tensor& binary_out(const char* op, BinaryOp kind, Tensor& out, const Tensor& a, const Tensor& b) {
  check_defined(op, out, "out");
  check_defined(op, a, "first argument");
  check_defined(op, b, "second argument");
  detail::check_same_device(op, {&out, &a, &b});
  const Shape shape = broadcast_shapes(a.sizes(), b.sizes(), op);
  GRADWIRE_CHECK_ARG(out.sizes() == shape)
      << op << ": out has shape " << out.shape_string() << " but the inputs of shapes "
      << a.shape_string() << " and " << b.shape_string() << " broadcast to "
      << shape_to_string(shape);
  const DType compute = binary_compute_dtype(op, kind, result_type(a, b));
  GRADWIRE_CHECK_ARG(can_cast(compute, out.dtype()))
      << op << ": result type " << dtype_name(compute)
      << " can't be cast to the desired output type " << dtype_name(out.dtype());
  check_writable(op, out);
  const Tensor x = a.to(compute).expand(shape);
  const Tensor y = b.to(compute).expand(shape);
  if (out.dtype() == compute && out.is_contiguous() && !unsafe_alias(out, x) &&
      !unsafe_alias(out, y)) {
    detail::device_binary(kind, out, x, y, 1);
    out.storage().bump_version();
  } else {
    Tensor tmp = empty(shape, TensorOptions(compute).device(out.device()));
    detail::device_binary(kind, tmp, x, y, 1);
    out.copy_(tmp);
  }
  return out;
}

std::optional<Shape> try_broadcast(const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[i] = x == 1 ? y : x;
  }
  return out;
}

Tensor where_impl(const Tensor& cond, const Tensor& a, const Tensor& b, DType compute) {
  std::optional<Shape> shape = try_broadcast(cond.sizes(), a.sizes());
  if (shape) shape = try_broadcast(*shape, b.sizes());
  GRADWIRE_CHECK_ARG(shape.has_value())
      << "where: shapes " << cond.shape_string() << " (condition), " << a.shape_string() << " and "
      << b.shape_string() << " do not broadcast";
  Tensor out = empty(*shape, TensorOptions(compute).device(a.device()));
  detail::device_where(out, cond.expand(*shape), a.to(compute).expand(*shape),
                       b.to(compute).expand(*shape));
  return out;
}

void check_where_cond(const Tensor& cond) {
  GRADWIRE_CHECK_ARG(cond.dtype() == kBool)
      << "where: condition must be a bool tensor, got " << dtype_name(cond.dtype())
      << " (compare with ne(cond, 0) first)";
}

}  // namespace

// ---------------------------------------------------------------- binary

Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->add(a, b, alpha);
  if (a.defined() && b.defined() && (a.is_sparse() || b.is_sparse()))
    return detail::sparse_add(a, b, alpha.to_double());
  return binary("add", BinaryOp::kAdd, a, b, alpha);
}
Tensor add(const Tensor& a, Scalar b) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->add(a, b);
  return binary_scalar("add", BinaryOp::kAdd, a, b);
}
Tensor sub(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->sub(a, b, alpha);
  if (a.defined() && b.defined() && (a.is_sparse() || b.is_sparse()))
    return detail::sparse_add(a, b, -alpha.to_double());
  return binary("sub", BinaryOp::kSub, a, b, alpha);
}
Tensor sub(const Tensor& a, Scalar b) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->sub(a, b);
  return binary_scalar("sub", BinaryOp::kSub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->mul(a, b);
  return binary("mul", BinaryOp::kMul, a, b);
}
Tensor mul(const Tensor& a, Scalar b) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->mul(a, b);
  if (a.defined() && a.is_sparse()) return detail::sparse_scale(a, b.to_double());
  return binary_scalar("mul", BinaryOp::kMul, a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->div(a, b);
  return binary("div", BinaryOp::kDiv, a, b);
}
Tensor div(const Tensor& a, Scalar b) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->div(a, b);
  if (a.defined() && a.is_sparse()) return detail::sparse_scale(a, 1.0 / b.to_double());
  return binary_scalar("div", BinaryOp::kDiv, a, b);
}
Tensor pow(const Tensor& a, const Tensor& exponent) {
  if (detail::autograd_dispatch(a, exponent)) return autograd_hooks()->pow(a, exponent);
  return binary("pow", BinaryOp::kPow, a, exponent);
}
Tensor pow(const Tensor& a, Scalar exponent) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->pow(a, exponent);
  check_defined("pow", a, "argument");
  return unary("pow", UnaryOp::kPowScalar, a, pow_scalar_dtype("pow", a, exponent),
               exponent.to_double());
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->maximum(a, b);
  return binary("maximum", BinaryOp::kMaximum, a, b);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->minimum(a, b);
  return binary("minimum", BinaryOp::kMinimum, a, b);
}

Tensor& add_out(Tensor& out, const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(out, a, b)) {
    autograd_hooks()->check_out_op("add_out", {&out, &a, &b});
  }
  return binary_out("add_out", BinaryOp::kAdd, out, a, b);
}
Tensor& mul_out(Tensor& out, const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(out, a, b)) {
    autograd_hooks()->check_out_op("mul_out", {&out, &a, &b});
  }
  return binary_out("mul_out", BinaryOp::kMul, out, a, b);
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator+(const Tensor& a, Scalar b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, Scalar b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, Scalar b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, Scalar b) {
  return div(a, b);
}
Tensor operator+(Scalar a, const Tensor& b) {
  if (detail::autograd_dispatch(b)) return autograd_hooks()->add(b, a);
  return binary_scalar("add", BinaryOp::kAdd, b, a, /*scalar_first=*/true);
}
Tensor operator-(Scalar a, const Tensor& b) {
  if (detail::autograd_dispatch(b)) return autograd_hooks()->rsub(a, b);
  return binary_scalar("sub", BinaryOp::kSub, b, a, /*scalar_first=*/true);
}
Tensor operator*(Scalar a, const Tensor& b) {
  if (detail::autograd_dispatch(b)) return autograd_hooks()->mul(b, a);
  return binary_scalar("mul", BinaryOp::kMul, b, a, /*scalar_first=*/true);
}
Tensor operator/(Scalar a, const Tensor& b) {
  if (detail::autograd_dispatch(b)) return autograd_hooks()->rdiv(a, b);
  return binary_scalar("div", BinaryOp::kDiv, b, a, /*scalar_first=*/true);
}
Tensor operator-(const Tensor& a) {
  return neg(a);
}
Tensor& operator+=(Tensor& a, const Tensor& b) {
  return a.add_(b);
}
Tensor& operator-=(Tensor& a, const Tensor& b) {
  return a.sub_(b);
}
Tensor& operator*=(Tensor& a, const Tensor& b) {
  return a.mul_(b);
}
Tensor& operator/=(Tensor& a, const Tensor& b) {
  return a.div_(b);
}
Tensor& operator+=(Tensor& a, Scalar b) {
  return a.add_(b);
}
Tensor& operator-=(Tensor& a, Scalar b) {
  return a.sub_(b);
}
Tensor& operator*=(Tensor& a, Scalar b) {
  return a.mul_(b);
}
Tensor& operator/=(Tensor& a, Scalar b) {
  return a.div_(b);
}

// ---------------------------------------------------------------- comparisons

Tensor eq(const Tensor& a, const Tensor& b) {
  return binary("eq", BinaryOp::kEq, a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return binary("ne", BinaryOp::kNe, a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return binary("lt", BinaryOp::kLt, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return binary("le", BinaryOp::kLe, a, b);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return binary("gt", BinaryOp::kGt, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return binary("ge", BinaryOp::kGe, a, b);
}
Tensor eq(const Tensor& a, Scalar b) {
  return binary_scalar("eq", BinaryOp::kEq, a, b);
}
Tensor ne(const Tensor& a, Scalar b) {
  return binary_scalar("ne", BinaryOp::kNe, a, b);
}
Tensor lt(const Tensor& a, Scalar b) {
  return binary_scalar("lt", BinaryOp::kLt, a, b);
}
Tensor le(const Tensor& a, Scalar b) {
  return binary_scalar("le", BinaryOp::kLe, a, b);
}
Tensor gt(const Tensor& a, Scalar b) {
  return binary_scalar("gt", BinaryOp::kGt, a, b);
}
Tensor ge(const Tensor& a, Scalar b) {
  return binary_scalar("ge", BinaryOp::kGe, a, b);
}

Tensor logical_not(const Tensor& a) {
  check_defined("logical_not", a, "argument");
  Tensor out = empty(a.sizes(), TensorOptions(kBool).device(a.device()));
  detail::device_unary(UnaryOp::kLogicalNot, out, a);
  return out;
}
Tensor logical_and(const Tensor& a, const Tensor& b) {
  return binary("logical_and", BinaryOp::kLogicalAnd, a, b);
}
Tensor logical_or(const Tensor& a, const Tensor& b) {
  return binary("logical_or", BinaryOp::kLogicalOr, a, b);
}

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->where(cond, a, b);
  check_defined("where", cond, "condition");
  check_defined("where", a, "first value argument");
  check_defined("where", b, "second value argument");
  detail::check_same_device("where", {&cond, &a, &b});
  check_where_cond(cond);
  return where_impl(cond, a, b, result_type(a, b));
}

Tensor where(const Tensor& cond, const Tensor& a, Scalar b) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->where(cond, a, b);
  check_defined("where", cond, "condition");
  check_defined("where", a, "value argument");
  detail::check_same_device("where", {&cond, &a});
  check_where_cond(cond);
  const DType compute = result_type(a, b);
  return where_impl(cond, a, scalar_tensor(b, TensorOptions(compute).device(a.device())), compute);
}

Tensor clamp(const Tensor& a, std::optional<Scalar> min, std::optional<Scalar> max) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->clamp(a, min, max);
  check_defined("clamp", a, "argument");
  const DType compute = clamp_dtype("clamp", a, min, max);
  const auto [lo, hi] = clamp_bounds(min, max);
  return unary("clamp", UnaryOp::kClamp, a, compute, lo, hi);
}

// ---------------------------------------------------------------- unary

Tensor exp(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->exp(a);
  return float_unary("exp", UnaryOp::kExp, a);
}
Tensor log(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->log(a);
  return float_unary("log", UnaryOp::kLog, a);
}
Tensor sqrt(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->sqrt(a);
  return float_unary("sqrt", UnaryOp::kSqrt, a);
}
Tensor rsqrt(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->rsqrt(a);
  return float_unary("rsqrt", UnaryOp::kRsqrt, a);
}
Tensor sigmoid(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->sigmoid(a);
  return float_unary("sigmoid", UnaryOp::kSigmoid, a);
}
Tensor tanh(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->tanh(a);
  return float_unary("tanh", UnaryOp::kTanh, a);
}
Tensor reciprocal(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->reciprocal(a);
  return float_unary("reciprocal", UnaryOp::kReciprocal, a);
}

Tensor abs(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->abs(a);
  check_defined("abs", a, "argument");
  refuse_bool("abs", a.dtype(), "");
  return unary("abs", UnaryOp::kAbs, a, a.dtype());
}
Tensor neg(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->neg(a);
  check_defined("neg", a, "argument");
  refuse_bool("neg", a.dtype(), " (negating a bool tensor; use logical_not() instead)");
  return unary("neg", UnaryOp::kNeg, a, a.dtype());
}
Tensor relu(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->relu(a);
  check_defined("relu", a, "argument");
  refuse_bool("relu", a.dtype(), "");
  return unary("relu", UnaryOp::kRelu, a, a.dtype());
}
Tensor sign(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->sign(a);
  check_defined("sign", a, "argument");
  return unary("sign", UnaryOp::kSign, a, a.dtype());
}
Tensor square(const Tensor& a) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->square(a);
  check_defined("square", a, "argument");
  return unary("square", UnaryOp::kSquare, a, a.dtype() == kBool ? kInt64 : a.dtype());
}

// ---------------------------------------------------------------- in-place methods

Tensor& Tensor::add_(const Tensor& other, Scalar alpha) {
  if (detail::autograd_dispatch(*this, other)) return autograd_hooks()->add_(*this, other, alpha);
  if (defined() && other.defined() && (is_sparse() || other.is_sparse())) {
    detail::sparse_add_(*this, other, alpha.to_double());
    return *this;
  }
  return inplace_binary(*this, "add_", BinaryOp::kAdd, other, alpha);
}
Tensor& Tensor::add_(Scalar other) {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->add_(*this, other);
  return inplace_binary_scalar(*this, "add_", BinaryOp::kAdd, other);
}
Tensor& Tensor::sub_(const Tensor& other, Scalar alpha) {
  if (detail::autograd_dispatch(*this, other)) return autograd_hooks()->sub_(*this, other, alpha);
  if (defined() && other.defined() && (is_sparse() || other.is_sparse())) {
    detail::sparse_add_(*this, other, -alpha.to_double());
    return *this;
  }
  return inplace_binary(*this, "sub_", BinaryOp::kSub, other, alpha);
}
Tensor& Tensor::sub_(Scalar other) {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->sub_(*this, other);
  return inplace_binary_scalar(*this, "sub_", BinaryOp::kSub, other);
}
Tensor& Tensor::mul_(const Tensor& other) {
  if (detail::autograd_dispatch(*this, other)) return autograd_hooks()->mul_(*this, other);
  return inplace_binary(*this, "mul_", BinaryOp::kMul, other, 1);
}
Tensor& Tensor::mul_(Scalar other) {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->mul_(*this, other);
  if (defined() && is_sparse()) {
    detail::sparse_scale_(*this, other.to_double());
    return *this;
  }
  return inplace_binary_scalar(*this, "mul_", BinaryOp::kMul, other);
}
Tensor& Tensor::div_(const Tensor& other) {
  if (detail::autograd_dispatch(*this, other)) return autograd_hooks()->div_(*this, other);
  return inplace_binary(*this, "div_", BinaryOp::kDiv, other, 1);
}
Tensor& Tensor::div_(Scalar other) {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->div_(*this, other);
  if (defined() && is_sparse()) {
    detail::sparse_scale_(*this, 1.0 / other.to_double());
    return *this;
  }
  return inplace_binary_scalar(*this, "div_", BinaryOp::kDiv, other);
}
Tensor& Tensor::pow_(Scalar exponent) {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->pow_(*this, exponent);
  check_defined("pow_", *this, "self");
  return inplace_unary(*this, "pow_", UnaryOp::kPowScalar,
                       pow_scalar_dtype("pow_", *this, exponent), exponent.to_double());
}
Tensor& Tensor::neg_() {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->neg_(*this);
  check_defined("neg_", *this, "self");
  refuse_bool("neg_", dtype(), " (negating a bool tensor; use logical_not() instead)");
  return inplace_unary(*this, "neg_", UnaryOp::kNeg, dtype());
}
Tensor& Tensor::relu_() {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->relu_(*this);
  check_defined("relu_", *this, "self");
  refuse_bool("relu_", dtype(), "");
  return inplace_unary(*this, "relu_", UnaryOp::kRelu, dtype());
}
Tensor& Tensor::clamp_(std::optional<Scalar> min, std::optional<Scalar> max) {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->clamp_(*this, min, max);
  check_defined("clamp_", *this, "self");
  const DType compute = clamp_dtype("clamp_", *this, min, max);
  const auto [lo, hi] = clamp_bounds(min, max);
  return inplace_unary(*this, "clamp_", UnaryOp::kClamp, compute, lo, hi);
}

}  // namespace gradwire
