// Indexing: index_select, gather, scatter_add(_), index_add, masked_fill, one_hot.
//
// CPU only: these serve embedding lookups, their backward passes and loss masks, which
// run where the data lives; a CUDA tensor gets a clear InvalidArgument instead of a
// silent round trip through the host. Every index is validated before it is used, so a
// bad index is an InvalidArgument naming the op, the index and the size, never a stray
// read or write.
#include <algorithm>
#include <cstring>
#include <vector>

#include "autograd_dispatch.h"
#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "loop.h"

namespace gradwire {

namespace {

using detail::byte_ptr;

void require_cpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) {
    GRADWIRE_CHECK_ARG(t->defined()) << op << ": input tensor is undefined";
    GRADWIRE_CHECK_ARG(!t->is_cuda())
        << op << ": CUDA tensors are not supported; move to cpu first (got a tensor on "
        << t->device().str() << ")";
  }
}

inline int64_t checked_index(const char* op, int64_t v, int64_t dim, int64_t size) {
  if (v < 0 || v >= size) {
    GRADWIRE_THROW(InvalidArgument)
        << op << ": index " << v << " is out of range for dim " << dim << " of size " << size;
  }
  return v;
}

void check_index_dtype(const char* op, const Tensor& index) {
  detail::dispatch_index(index.dtype(), op, [](auto) {});
}

// An index tensor's values as int64, validated against `size`.
std::vector<int64_t> read_indices(const char* op, const Tensor& index, int64_t dim, int64_t size) {
  const Tensor ic = index.contiguous();
  std::vector<int64_t> out(static_cast<size_t>(ic.numel()));
  detail::dispatch_index(index.dtype(), op, [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* p = static_cast<const I*>(ic.data_ptr());
    for (size_t i = 0; i < out.size(); ++i)
      out[i] = checked_index(op, p[i], dim, size);
  });
  return out;
}

// Sizes of the dims before `dim` and after it, multiplied out.
std::pair<int64_t, int64_t> outer_inner(const Tensor& t, int64_t dim) {
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d)
    outer *= t.size(d);
  for (int64_t d = dim + 1; d < t.dim(); ++d)
    inner *= t.size(d);
  return {outer, inner};
}

// gather moves values without looking at them: one instantiation per element size, not
// per dtype, is enough.
template <typename F>
void dispatch_bits(int64_t element_size, F&& f) {
  switch (element_size) {
    case 1:
      return f(detail::TypeTag<uint8_t>{});
    case 2:
      return f(detail::TypeTag<uint16_t>{});
    case 4:
      return f(detail::TypeTag<uint32_t>{});
    default:
      return f(detail::TypeTag<uint64_t>{});
  }
}

// Checks the shape rules gather and scatter_add share with PyTorch: the same number of
// dims, and index no larger than `a` outside `dim` (and no larger than src anywhere).
void check_scatter_shapes(const char* op, const Tensor& a, int64_t dim, const Tensor& index,
                          const Tensor* src) {
  GRADWIRE_CHECK_ARG(index.dim() == a.dim())
      << op << ": index of shape " << index.shape_string() << " must have as many dims as "
      << "the input of shape " << a.shape_string();
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (d != dim && index.size(d) > a.size(d)) {
      GRADWIRE_THROW(InvalidArgument)
          << op << ": index of shape " << index.shape_string() << " is larger than the input "
          << "of shape " << a.shape_string() << " at dim " << d << " (" << index.size(d) << " > "
          << a.size(d) << ")";
    }
  }
  if (src == nullptr) return;
  GRADWIRE_CHECK_ARG(src->dim() == a.dim())
      << op << ": src of shape " << src->shape_string() << " must have as many dims as the "
      << "input of shape " << a.shape_string();
  for (int64_t d = 0; d < a.dim(); ++d) {
    if (index.size(d) > src->size(d)) {
      GRADWIRE_THROW(InvalidArgument)
          << op << ": index of shape " << index.shape_string() << " is larger than src of "
          << "shape " << src->shape_string() << " at dim " << d << " (" << index.size(d) << " > "
          << src->size(d) << ")";
    }
  }
}

// Byte strides of `a` over index's shape, 0 along `dim`, whose position comes from the
// index values instead.
Shape strides_except(const Tensor& a, int64_t dim) {
  Shape s(a.dim());
  for (int64_t d = 0; d < a.dim(); ++d)
    s[d] = d == dim ? 0 : a.stride(d) * a.element_size();
  return s;
}

Shape byte_strides(const Tensor& t) {
  Shape s(t.dim());
  for (int64_t d = 0; d < t.dim(); ++d)
    s[d] = t.stride(d) * t.element_size();
  return s;
}

// `src` in a's dtype, refusing conversions an in-place op may not do.
Tensor source_as(const char* op, const Tensor& src, const Tensor& a) {
  GRADWIRE_CHECK_ARG(can_cast(src.dtype(), a.dtype()))
      << op << ": src of dtype " << dtype_name(src.dtype()) << " cannot be added into a "
      << dtype_name(a.dtype()) << " tensor";
  Tensor s = src.to(a.dtype());
  // Reading src while writing a view of the same memory would see partial sums.
  if (s.storage().is_same(a.storage())) s = s.clone();
  return s;
}

}  // namespace

Tensor embedding_rows(const Tensor& weight, const Tensor& index, bool sparse_grad) {
  if (detail::autograd_dispatch(weight)) {
    return autograd_hooks()->embedding_rows(weight, index, sparse_grad);
  }
  GRADWIRE_CHECK_ARG(weight.defined() && weight.dim() >= 1)
      << "embedding_rows: the table must be at least 1-d";
  return index_select(weight, 0, index);
}

Tensor index_select(const Tensor& a, int64_t dim, const Tensor& index) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->index_select(a, dim, index);
  require_cpu("index_select", {&a, &index});
  GRADWIRE_CHECK_ARG(index.dim() <= 1)
      << "index_select: index must be 1-d, got shape " << index.shape_string();
  const Tensor in = a.dim() == 0 ? a.reshape({1}) : a.contiguous();
  const int64_t d = in.wrap_dim(dim, "index_select");
  const std::vector<int64_t> idx = read_indices("index_select", index, d, in.size(d));
  // Plain variables, not a structured binding: the kernels below capture them, which
  // clang before 16 refuses for bindings.
  const auto shape_in = outer_inner(in, d);
  const int64_t outer = shape_in.first, inner = shape_in.second;
  const int64_t n = in.size(d), k = static_cast<int64_t>(idx.size());
  Shape out_shape = in.sizes();
  out_shape[d] = k;
  Tensor out = empty(out_shape, in.options());
  const int64_t row_bytes = inner * in.element_size();
  const char* src = byte_ptr(in);
  char* dst = byte_ptr(out);
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(dst + (o * k + j) * row_bytes, src + (o * n + idx[j]) * row_bytes,
                  static_cast<size_t>(row_bytes));
    }
  }
  return a.dim() == 0 ? out.reshape(index.sizes()) : out;
}

Tensor gather(const Tensor& a, int64_t dim, const Tensor& index) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->gather(a, dim, index);
  require_cpu("gather", {&a, &index});
  const int64_t d = a.wrap_dim(dim, "gather");
  check_index_dtype("gather", index);
  check_scatter_shapes("gather", a, d, index, nullptr);
  Tensor out = empty(index.sizes(), a.options());
  if (out.numel() == 0) return out;
  const int64_t size = a.dim() == 0 ? 1 : a.size(d);
  const int64_t dim_bytes = a.dim() == 0 ? 0 : a.stride(d) * a.element_size();
  auto plan = detail::make_plan<3>(index.sizes(),
                                   {byte_strides(out), byte_strides(index), strides_except(a, d)});
  detail::dispatch_index(index.dtype(), "gather", [&](auto itag) {
    using I = typename decltype(itag)::type;
    dispatch_bits(a.element_size(), [&](auto btag) {
      using B = typename decltype(btag)::type;
      detail::run_plan<3>(
          plan, {byte_ptr(out), byte_ptr(index), byte_ptr(a)},
          [&](std::array<char*, 3> p, std::array<int64_t, 3> s, int64_t n) {
            for (int64_t t = 0; t < n; ++t) {
              const int64_t i =
                  checked_index("gather", *reinterpret_cast<const I*>(p[1] + t * s[1]), d, size);
              std::memcpy(p[0] + t * s[0], p[2] + t * s[2] + i * dim_bytes, sizeof(B));
            }
          });
    });
  });
  return out;
}

Tensor& scatter_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  if (detail::autograd_dispatch(a, src)) return autograd_hooks()->scatter_add_(a, dim, index, src);
  require_cpu("scatter_add_", {&a, &index, &src});
  const int64_t d = a.wrap_dim(dim, "scatter_add_");
  check_index_dtype("scatter_add_", index);
  // Checked up front so that an empty index does not hide an unsupported dtype.
  detail::dispatch_numeric(a.dtype(), "scatter_add_", [](auto) {});
  check_scatter_shapes("scatter_add_", a, d, index, &src);
  const Tensor s = source_as("scatter_add_", src, a);
  if (index.numel() > 0) {
    const int64_t size = a.dim() == 0 ? 1 : a.size(d);
    const int64_t dim_bytes = a.dim() == 0 ? 0 : a.stride(d) * a.element_size();
    auto plan = detail::make_plan<3>(index.sizes(),
                                     {strides_except(a, d), byte_strides(index), byte_strides(s)});
    detail::dispatch_index(index.dtype(), "scatter_add_", [&](auto itag) {
      using I = typename decltype(itag)::type;
      detail::dispatch_numeric(a.dtype(), "scatter_add_", [&](auto tag) {
        using T = typename decltype(tag)::type;
        using C = detail::compute_t<T>;
        detail::run_plan<3>(plan, {byte_ptr(a), byte_ptr(index), byte_ptr(s)},
                            [&](std::array<char*, 3> p, std::array<int64_t, 3> st, int64_t n) {
                              for (int64_t t = 0; t < n; ++t) {
                                const int64_t i = checked_index(
                                    "scatter_add_", *reinterpret_cast<const I*>(p[1] + t * st[1]),
                                    d, size);
                                T* dst = reinterpret_cast<T*>(p[0] + t * st[0] + i * dim_bytes);
                                const T v = *reinterpret_cast<const T*>(p[2] + t * st[2]);
                                *dst = static_cast<T>(static_cast<C>(*dst) + static_cast<C>(v));
                              }
                            });
      });
    });
  }
  a.storage().bump_version();
  return a;
}

Tensor scatter_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  if (detail::autograd_dispatch(a, src)) return autograd_hooks()->scatter_add(a, dim, index, src);
  require_cpu("scatter_add", {&a, &index, &src});
  Tensor out = a.clone();
  return scatter_add_(out, dim, index, src);
}

namespace {

// out.select(d, idx[j]) += alpha * src.select(d, j) for every j, in index order; `out` is
// contiguous and on the CPU, `src` fits it (checked by the callers).
void index_add_into(Tensor& out, int64_t d, const std::vector<int64_t>& idx, const Tensor& src,
                    Scalar alpha) {
  const Tensor s = source_as("index_add", src, out).contiguous();
  // Plain variables, not a structured binding: the kernels below capture them, which
  // clang before 16 refuses for bindings.
  const auto shape_out = outer_inner(out, d);
  const int64_t outer = shape_out.first, inner = shape_out.second;
  const int64_t n = out.size(d), k = static_cast<int64_t>(idx.size());
  detail::dispatch_numeric(out.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = detail::compute_t<T>;
    const C a = alpha.to<C>();
    const bool unit = alpha.to_double() == 1.0;
    T* po = static_cast<T*>(out.data_ptr());
    const T* ps = static_cast<const T*>(s.data_ptr());
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t j = 0; j < k; ++j) {
        T* dst = po + (o * n + idx[static_cast<size_t>(j)]) * inner;
        const T* row = ps + (o * k + j) * inner;
        if (unit) {
          for (int64_t e = 0; e < inner; ++e)
            dst[e] = static_cast<T>(static_cast<C>(dst[e]) + static_cast<C>(row[e]));
        } else {
          for (int64_t e = 0; e < inner; ++e)
            dst[e] = static_cast<T>(static_cast<C>(dst[e]) + a * static_cast<C>(row[e]));
        }
      }
    }
  });
}

// The indices of an index_add, checked against `a` and `src` (0-d tensors as 1-element
// vectors).
std::vector<int64_t> index_add_indices(const char* op, const Tensor& a1, int64_t d,
                                       const Tensor& index, const Tensor& src1, const Tensor& src) {
  GRADWIRE_CHECK_ARG(index.dim() <= 1)
      << op << ": index must be 1-d, got shape " << index.shape_string();
  bool shapes_ok = src1.dim() == a1.dim() && src1.size(d) == index.numel();
  for (int64_t i = 0; shapes_ok && i < a1.dim(); ++i) {
    shapes_ok = i == d || src1.size(i) == a1.size(i);
  }
  GRADWIRE_CHECK_ARG(shapes_ok) << op << ": src of shape " << src.shape_string()
                                << " does not fit input of shape " << a1.shape_string() << " with "
                                << index.numel() << " indices along dim " << d
                                << " (src must match the input except at dim " << d
                                << ", where it has one entry per index)";
  return read_indices(op, index, d, a1.size(d));
}

}  // namespace

Tensor index_add(const Tensor& a, int64_t dim, const Tensor& index, const Tensor& src) {
  if (detail::autograd_dispatch(a, src)) return autograd_hooks()->index_add(a, dim, index, src);
  require_cpu("index_add", {&a, &index, &src});
  const int64_t d = a.wrap_dim(dim, "index_add");
  // A 0-d input and src behave as 1-element vectors.
  const Tensor a1 = a.dim() == 0 ? a.reshape({1}) : a;
  const Tensor src1 = src.dim() == 0 ? src.reshape({1}) : src;
  const std::vector<int64_t> idx = index_add_indices("index_add", a1, d, index, src1, src);
  Tensor out = a1.clone();
  index_add_into(out, d, idx, src1, 1);
  return a.dim() == 0 ? out.reshape({}) : out;
}

Tensor& index_add_(Tensor& a, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha) {
  require_cpu("index_add_", {&a, &index, &src});
  GRADWIRE_CHECK_ARG(!a.requires_grad() || !is_grad_enabled())
      << "index_add_: the input requires grad; run it under a NoGradGuard (it is not recorded)";
  const int64_t d = a.wrap_dim(dim, "index_add_");
  Tensor a1 = a.dim() == 0 ? a.reshape({1}) : a;
  const Tensor src1 = src.dim() == 0 ? src.reshape({1}) : src;
  const std::vector<int64_t> idx = index_add_indices("index_add_", a1, d, index, src1, src);
  if (a1.is_contiguous()) {
    index_add_into(a1, d, idx, src1, alpha);
  } else {
    Tensor packed = a1.contiguous();
    index_add_into(packed, d, idx, src1, alpha);
    a1.copy_(packed);
  }
  a.storage().bump_version();
  return a;
}

Tensor masked_fill(const Tensor& a, const Tensor& mask, Scalar value) {
  if (detail::autograd_dispatch(a)) return autograd_hooks()->masked_fill(a, mask, value);
  require_cpu("masked_fill", {&a, &mask});
  GRADWIRE_CHECK_ARG(mask.dtype() == kBool)
      << "masked_fill: mask must be bool, got " << dtype_name(mask.dtype());
  GRADWIRE_CHECK_ARG(broadcast_shapes(a.sizes(), mask.sizes(), "masked_fill") == a.sizes())
      << "masked_fill: mask of shape " << mask.shape_string()
      << " does not broadcast to the input's shape " << a.shape_string();
  Tensor out = a.clone();
  auto plan = detail::make_plan<2>(
      out.sizes(), {byte_strides(out), detail::broadcast_byte_strides(mask, out.sizes())});
  detail::dispatch_all(out.dtype(), "masked_fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = value.to<T>();
    detail::run_plan<2>(plan, {byte_ptr(out), byte_ptr(mask)},
                        [&](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
                          for (int64_t t = 0; t < n; ++t) {
                            if (*reinterpret_cast<const bool*>(p[1] + t * s[1])) {
                              *reinterpret_cast<T*>(p[0] + t * s[0]) = v;
                            }
                          }
                        });
  });
  return out;
}

Tensor one_hot(const Tensor& labels, int64_t num_classes) {
  require_cpu("one_hot", {&labels});
  GRADWIRE_CHECK_ARG(num_classes > 0 || num_classes == -1)
      << "one_hot: num_classes must be positive, or -1 to use max(labels) + 1; got " << num_classes;
  const Tensor lc = labels.contiguous();
  std::vector<int64_t> values(static_cast<size_t>(lc.numel()));
  detail::dispatch_index(labels.dtype(), "one_hot", [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* p = static_cast<const I*>(lc.data_ptr());
    for (size_t i = 0; i < values.size(); ++i)
      values[i] = p[i];
  });
  if (num_classes == -1) {
    GRADWIRE_CHECK_ARG(!values.empty())
        << "one_hot: cannot infer num_classes from empty labels of shape " << labels.shape_string();
    num_classes = *std::max_element(values.begin(), values.end()) + 1;
  }
  Shape shape = labels.sizes();
  shape.push_back(num_classes);
  Tensor out = zeros(shape, kFloat32);
  float* po = out.data<float>();
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] < 0 || values[i] >= num_classes) {
      GRADWIRE_THROW(InvalidArgument)
          << "one_hot: label " << values[i] << " is out of range for " << num_classes << " classes";
    }
    po[static_cast<int64_t>(i) * num_classes + values[i]] = 1.0f;
  }
  return out;
}

}  // namespace gradwire
