// Matrix products: mm, bmm, matmul, addmm_, dot, outer.
//
// Everything funnels into one batched product out[B, n, m] = alpha * a @ b + beta * out.
// float32/float64 go to device_gemm (CBLAS on the CPU) with operands passed as views
// whenever BLAS can read them in place; float16/bfloat16 are computed in float32 and
// rounded back; integer dtypes use a loop written here, accumulating in 64 bits (moved
// through the host for CUDA tensors, since the device kernels are float only).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "autograd_dispatch.h"
#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "kernels.h"

namespace gradwire {

namespace {

// Mirrors the layouts cpu::gemm hands to BLAS: unit stride in the last dim (row-major,
// leading dim rs >= cols) or in dim -2 (transposed, leading dim cs >= rows). A size-1
// dim's stride is never read.
bool blas_readable(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if ((cs == 1 || cols == 1) && (rows == 1 || rs >= std::max<int64_t>(1, cols))) return true;
  if ((rs == 1 || rows == 1) && (cols == 1 || cs >= std::max<int64_t>(1, rows))) return true;
  return false;
}

Tensor gemm_operand(const Tensor& t) {
  return blas_readable(t.size(1), t.size(2), t.stride(1), t.stride(2)) ? t : t.contiguous();
}

// out (+)= a @ b for integer dtypes, in wrapping 64-bit arithmetic (so overflow behaves
// like the two's complement result, not undefined behaviour). The p loop is outermost
// within a row so that b and out are streamed along contiguous rows.
template <typename T>
void integer_product(const Tensor& out, const Tensor& a, const Tensor& b, int64_t alpha,
                     int64_t beta) {
  const int64_t batch = out.size(0), n = out.size(1), m = out.size(2), k = a.size(2);
  const Tensor bc = b.contiguous();
  const T* pa = static_cast<const T*>(a.data_ptr());
  const T* pb = static_cast<const T*>(bc.data_ptr());
  T* pc = static_cast<T*>(out.data_ptr());
  const int64_t sa0 = a.stride(0), sa1 = a.stride(1), sa2 = a.stride(2);
  std::vector<uint64_t> acc(static_cast<size_t>(m));
  const auto u = [](T v) { return static_cast<uint64_t>(static_cast<int64_t>(v)); };
  for (int64_t bi = 0; bi < batch; ++bi) {
    for (int64_t i = 0; i < n; ++i) {
      std::fill(acc.begin(), acc.end(), 0);
      const T* arow = pa + bi * sa0 + i * sa1;
      for (int64_t p = 0; p < k; ++p) {
        const uint64_t av = u(arow[p * sa2]);
        if (av == 0) continue;
        const T* brow = pb + (bi * k + p) * m;
        for (int64_t j = 0; j < m; ++j)
          acc[j] += av * u(brow[j]);
      }
      T* crow = pc + (bi * n + i) * m;
      for (int64_t j = 0; j < m; ++j) {
        uint64_t v = static_cast<uint64_t>(alpha) * acc[j];
        if (beta != 0) v += static_cast<uint64_t>(beta) * u(crow[j]);
        crow[j] = static_cast<T>(static_cast<int64_t>(v));
      }
    }
  }
}

// out [B, n, m] contiguous = alpha * a @ b + beta * out, with a [B, n, k], b [B, k, m] all
// of out's dtype and device; beta == 0 ignores out's prior contents.
void batched_product(Tensor out, const Tensor& a, const Tensor& b, Scalar alpha, Scalar beta) {
  const DType t = out.dtype();
  if (t == kFloat32 || t == kFloat64) {
    detail::device_gemm(out, gemm_operand(a), gemm_operand(b), alpha.to_double(), beta.to_double());
  } else if (t == kFloat16 || t == kBFloat16) {
    Tensor out32 = beta.to_double() == 0.0 ? empty(out.sizes(), out.options().dtype(kFloat32))
                                           : out.to(kFloat32);
    detail::device_gemm(out32, a.to(kFloat32), b.to(kFloat32), alpha.to_double(), beta.to_double());
    out.copy_(out32);
  } else if (out.is_cuda()) {
    Tensor host = out.to(Device::cpu());
    batched_product(host, a.to(Device::cpu()), b.to(Device::cpu()), alpha, beta);
    out.copy_(host);
  } else {
    detail::dispatch_numeric(t, "matmul", [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_integral_v<T>) {
        integer_product<T>(out, a, b, alpha.to_int(), beta.to_int());
      }
    });
  }
}

// The dtype a product of a and b computes in; bool has no product.
DType product_dtype(const char* op, const Tensor& a, const Tensor& b) {
  GRADWIRE_CHECK_ARG(a.defined() && b.defined()) << op << ": input tensor is undefined";
  detail::check_same_device(op, {&a, &b});
  const DType t = result_type(a, b);
  GRADWIRE_CHECK_ARG(t != kBool) << op << ": dtype bool is not supported (shapes "
                                 << a.shape_string() << " and " << b.shape_string()
                                 << "); convert to a numeric dtype first";
  return t;
}

[[noreturn]] void throw_inner_mismatch(const char* op, const Tensor& a, const Tensor& b, int64_t ka,
                                       int64_t kb) {
  GRADWIRE_THROW(InvalidArgument) << op << ": shapes " << a.shape_string() << " and "
                                  << b.shape_string() << " cannot be multiplied (" << ka
                                  << " != " << kb << ")";
}

// a [n, k] @ b [k, m] with a and b already of dtype t; checks done by the caller.
Tensor matrix_product(const Tensor& a, const Tensor& b, DType t) {
  const int64_t n = a.size(0), m = b.size(1);
  Tensor out = empty({n, m}, a.options().dtype(t));
  batched_product(out.unsqueeze(0), a.to(t).unsqueeze(0), b.to(t).unsqueeze(0), 1, 0);
  return out;
}

int64_t product_of(const Shape& s) {
  int64_t p = 1;
  for (int64_t v : s)
    p *= v;
  return p;
}

}  // namespace

Tensor mm(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->mm(a, b);
  const DType t = product_dtype("mm", a, b);
  GRADWIRE_CHECK_ARG(a.dim() == 2 && b.dim() == 2)
      << "mm: expected 2-d tensors, got shapes " << a.shape_string() << " and " << b.shape_string();
  if (a.size(1) != b.size(0)) throw_inner_mismatch("mm", a, b, a.size(1), b.size(0));
  return matrix_product(a, b, t);
}

Tensor bmm(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->bmm(a, b);
  const DType t = product_dtype("bmm", a, b);
  GRADWIRE_CHECK_ARG(a.dim() == 3 && b.dim() == 3)
      << "bmm: expected 3-d tensors, got shapes " << a.shape_string() << " and "
      << b.shape_string();
  GRADWIRE_CHECK_ARG(a.size(0) == b.size(0))
      << "bmm: batch sizes differ in shapes " << a.shape_string() << " and " << b.shape_string()
      << " (" << a.size(0) << " != " << b.size(0) << ")";
  if (a.size(2) != b.size(1)) throw_inner_mismatch("bmm", a, b, a.size(2), b.size(1));
  Tensor out = empty({a.size(0), a.size(1), b.size(2)}, a.options().dtype(t));
  batched_product(out, a.to(t), b.to(t), 1, 0);
  return out;
}

Tensor matmul(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->matmul(a, b);
  const DType t = product_dtype("matmul", a, b);
  const int64_t da = a.dim(), db = b.dim();
  GRADWIRE_CHECK_ARG(da >= 1 && db >= 1)
      << "matmul: both arguments need at least 1 dim, got shapes " << a.shape_string() << " and "
      << b.shape_string();
  // 1-d operands become a row (left) or a column (right) matrix, removed again at the end.
  const Tensor lhs = da == 1 ? a.unsqueeze(0) : a;
  const Tensor rhs = db == 1 ? b.unsqueeze(1) : b;
  const int64_t n = lhs.size(-2), k = lhs.size(-1), m = rhs.size(-1);
  if (k != rhs.size(-2)) throw_inner_mismatch("matmul", a, b, k, rhs.size(-2));

  Tensor out;
  if (lhs.dim() == 2 && rhs.dim() == 2) {
    out = matrix_product(lhs, rhs, t);
  } else if (rhs.dim() == 2) {
    // A stack of matrices times one matrix is one tall product: fold the batch into rows.
    Shape batch(lhs.sizes().begin(), lhs.sizes().end() - 2);
    const int64_t rows = product_of(batch) * n;
    Shape out_shape = batch;
    out_shape.push_back(n);
    out_shape.push_back(m);
    out = matrix_product(lhs.reshape({rows, k}), rhs, t).view(out_shape);
  } else {
    const Shape batch_a(lhs.sizes().begin(), lhs.sizes().end() - 2);
    const Shape batch_b(rhs.sizes().begin(), rhs.sizes().end() - 2);
    Shape batch;
    try {
      batch = broadcast_shapes(batch_a, batch_b, "matmul");
    } catch (const InvalidArgument&) {
      GRADWIRE_THROW(InvalidArgument) << "matmul: batch dims of shapes " << a.shape_string()
                                      << " and " << b.shape_string() << " do not broadcast";
    }
    const int64_t nb = product_of(batch);
    Shape ea = batch, eb = batch, out_shape = batch;
    ea.insert(ea.end(), {n, k});
    eb.insert(eb.end(), {k, m});
    out_shape.insert(out_shape.end(), {n, m});
    out = empty(out_shape, a.options().dtype(t));
    // Broadcast batch dims stay stride-0 views when they merge into one batch stride;
    // reshape copies only when they cannot.
    batched_product(out.view({nb, n, m}), lhs.to(t).expand(ea).reshape({nb, n, k}),
                    rhs.to(t).expand(eb).reshape({nb, k, m}), 1, 0);
  }
  if (db == 1) out = out.squeeze(-1);
  if (da == 1) out = out.squeeze(db == 1 ? -1 : -2);
  return out;
}

Tensor& addmm_(Tensor& out, const Tensor& a, const Tensor& b, Scalar beta, Scalar alpha) {
  if (detail::autograd_dispatch(out, a, b)) return autograd_hooks()->addmm_(out, a, b, beta, alpha);
  GRADWIRE_CHECK_ARG(out.defined()) << "addmm_: out tensor is undefined";
  const DType t = product_dtype("addmm_", a, b);
  detail::check_same_device("addmm_", {&out, &a, &b});
  GRADWIRE_CHECK_ARG(a.dim() == 2 && b.dim() == 2)
      << "addmm_: expected 2-d matrices, got shapes " << a.shape_string() << " and "
      << b.shape_string();
  if (a.size(1) != b.size(0)) throw_inner_mismatch("addmm_", a, b, a.size(1), b.size(0));
  const Shape want{a.size(0), b.size(1)};
  GRADWIRE_CHECK_ARG(out.sizes() == want)
      << "addmm_: out has shape " << out.shape_string() << " but " << a.shape_string() << " @ "
      << b.shape_string() << " has shape " << shape_to_string(want);
  GRADWIRE_CHECK_ARG(out.is_contiguous())
      << "addmm_: out must be contiguous, got shape " << out.shape_string() << " with strides "
      << shape_to_string(out.strides());
  GRADWIRE_CHECK_ARG(out.dtype() != kBool && can_cast(t, out.dtype()))
      << "addmm_: the product of " << dtype_name(a.dtype()) << " and " << dtype_name(b.dtype())
      << " cannot be written into out of dtype " << dtype_name(out.dtype());
  if (!out.is_floating_point()) {
    GRADWIRE_CHECK_ARG(!alpha.is_floating_point() && !beta.is_floating_point())
        << "addmm_: alpha " << alpha << " and beta " << beta << " must be integers for an "
        << dtype_name(out.dtype()) << " out";
  }
  const DType ct = out.dtype();
  // BLAS would read operand elements already overwritten through `out`.
  auto unaliased = [&](const Tensor& x) {
    Tensor y = x.to(ct);
    return y.storage().is_same(out.storage()) ? y.clone() : y;
  };
  batched_product(out.unsqueeze(0), unaliased(a).unsqueeze(0), unaliased(b).unsqueeze(0), alpha,
                  beta);
  out.storage().bump_version();
  return out;
}

Tensor dot(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->dot(a, b);
  const DType t = product_dtype("dot", a, b);
  GRADWIRE_CHECK_ARG(a.dim() == 1 && b.dim() == 1)
      << "dot: expected 1-d tensors, got shapes " << a.shape_string() << " and "
      << b.shape_string();
  GRADWIRE_CHECK_ARG(a.size(0) == b.size(0))
      << "dot: shapes " << a.shape_string() << " and " << b.shape_string()
      << " have different lengths (" << a.size(0) << " != " << b.size(0) << ")";
  return matrix_product(a.unsqueeze(0), b.unsqueeze(1), t).view({});
}

Tensor outer(const Tensor& a, const Tensor& b) {
  if (detail::autograd_dispatch(a, b)) return autograd_hooks()->outer(a, b);
  const DType t = product_dtype("outer", a, b);
  GRADWIRE_CHECK_ARG(a.dim() == 1 && b.dim() == 1)
      << "outer: expected 1-d tensors, got shapes " << a.shape_string() << " and "
      << b.shape_string();
  return matrix_product(a.unsqueeze(1), b.unsqueeze(0), t);
}

}  // namespace gradwire
