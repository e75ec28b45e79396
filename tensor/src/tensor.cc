#include "gradwire/tensor/tensor.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <sstream>

#include "autograd_dispatch.h"
#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "kernels.h"
#include "loop.h"

namespace gradwire {

using detail::byte_ptr;

// ---------------------------------------------------------------- shape helpers

std::string shape_to_string(const Shape& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

Shape contiguous_strides(const Shape& sizes) {
  Shape strides(sizes.size());
  int64_t s = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    strides[d] = s;
    // An empty dimension makes the tensor empty, but the strides of the others still
    // multiply: [0, 2^40, 2^40] must be refused, not overflow.
    if (__builtin_mul_overflow(s, std::max<int64_t>(sizes[d], 1), &s)) {
      GRADWIRE_THROW(InvalidArgument)
          << "shape " << shape_to_string(sizes) << " is too large: its strides overflow int64";
    }
  }
  return strides;
}

int64_t shape_numel(const Shape& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    GRADWIRE_CHECK_ARG(s >= 0) << "negative size in shape " << shape_to_string(sizes);
    if (s != 0 && n > std::numeric_limits<int64_t>::max() / s) {
      GRADWIRE_THROW(InvalidArgument)
          << "shape " << shape_to_string(sizes) << " has more elements than int64 can count";
    }
    n *= s;
  }
  return n;
}

namespace {
bool compute_contiguous(const Shape& sizes, const Shape& strides) {
  // An empty tensor is contiguous, whatever its other sizes (which may multiply past int64:
  // [0, 2^31, 2^40] is a valid empty shape; found by fuzz_tensor_meta).
  for (const int64_t s : sizes) {
    if (s == 0) return true;
  }
  int64_t expected = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    if (__builtin_mul_overflow(expected, sizes[d], &expected)) return false;
  }
  return true;
}
}  // namespace

// ---------------------------------------------------------------- TensorImpl

TensorImpl::TensorImpl(Storage storage, Shape sizes, Shape strides, int64_t storage_offset,
                       DType dtype)
    : storage_(std::move(storage)),
      sizes_(std::move(sizes)),
      strides_(std::move(strides)),
      storage_offset_(storage_offset),
      dtype_(dtype),
      numel_(shape_numel(sizes_)),
      contiguous_(compute_contiguous(sizes_, strides_)) {}

Tensor::Tensor(Storage storage, Shape sizes, Shape strides, int64_t storage_offset, DType dtype) {
  GRADWIRE_CHECK_ARG(sizes.size() == strides.size())
      << "tensor: " << sizes.size() << " sizes but " << strides.size() << " strides";
  GRADWIRE_CHECK_ARG(storage_offset >= 0) << "tensor: negative storage offset " << storage_offset;
  int64_t numel = shape_numel(sizes);
  if (numel > 0) {
    // The lowest and highest element addressed must both lie inside the storage.
    int64_t lo = storage_offset, hi = storage_offset;
    for (size_t d = 0; d < sizes.size(); ++d) {
      int64_t reach = strides[d] * (sizes[d] - 1);
      (reach < 0 ? lo : hi) += reach;
    }
    const int64_t capacity = static_cast<int64_t>(storage.nbytes()) / gradwire::element_size(dtype);
    GRADWIRE_CHECK_ARG(lo >= 0 && hi < capacity)
        << "tensor: sizes " << shape_to_string(sizes) << " with strides "
        << shape_to_string(strides) << " and offset " << storage_offset
        << " reach outside a storage of " << capacity << " " << dtype_name(dtype) << " elements";
  }
  impl_ = std::make_shared<TensorImpl>(std::move(storage), std::move(sizes), std::move(strides),
                                       storage_offset, dtype);
}

TensorImpl& Tensor::impl() const {
  GRADWIRE_CHECK_ARG(impl_ != nullptr) << "use of an undefined tensor";
  return *impl_;
}

int64_t Tensor::wrap_dim(int64_t d, const char* op, bool for_insert) const {
  // A 0-dim tensor accepts dim 0 and -1, as PyTorch.
  const int64_t n = std::max<int64_t>(dim() + (for_insert ? 1 : 0), 1);
  const int64_t wrapped = d < 0 ? d + n : d;
  if (wrapped < 0 || wrapped >= n) {
    GRADWIRE_THROW(InvalidArgument) << op << ": dim " << d << " is out of range for a tensor of "
                                    << dim() << " dims (shape " << shape_string() << ")";
  }
  return wrapped;
}

namespace {
// wrap_dim accepts dim 0 of a 0-dim tensor (as PyTorch does for reductions), but ops that
// index sizes() need at least one real dim.
void require_dims(const Tensor& t, const char* op) {
  GRADWIRE_CHECK_ARG(t.dim() > 0) << op
                                  << ": expects a tensor with at least 1 dim, got a 0-dim tensor";
}
}  // namespace

int64_t Tensor::size(int64_t d) const {
  require_dims(*this, "size");
  return sizes()[wrap_dim(d, "size")];
}
int64_t Tensor::stride(int64_t d) const {
  require_dims(*this, "stride");
  return strides()[wrap_dim(d, "stride")];
}

void* Tensor::data_ptr() const {
  return static_cast<char*>(storage().data()) + storage_offset() * element_size();
}

void Tensor::check_dtype_for_access(DType expected, const char* what) const {
  GRADWIRE_CHECK_ARG(dtype() == expected) << what << ": tensor has dtype " << dtype_name(dtype())
                                          << ", accessed as " << dtype_name(expected);
}

Scalar Tensor::item_scalar() const {
  GRADWIRE_CHECK_ARG(numel() == 1) << "item: tensor of shape " << shape_string() << " has "
                                   << numel() << " elements, expected 1";
  Tensor host = is_cuda() ? to(Device::cpu()) : *this;
  return detail::dispatch_all(dtype(), "item", [&](auto tag) -> Scalar {
    using T = typename decltype(tag)::type;
    return Scalar(*static_cast<const T*>(host.data_ptr()));
  });
}

double Tensor::at(const Shape& index) const {
  GRADWIRE_CHECK_ARG(static_cast<int64_t>(index.size()) == dim())
      << "at: index " << shape_to_string(index) << " for a tensor of shape " << shape_string();
  int64_t offset = 0;
  for (size_t d = 0; d < index.size(); ++d) {
    int64_t i = index[d] < 0 ? index[d] + sizes()[d] : index[d];
    GRADWIRE_CHECK_ARG(i >= 0 && i < sizes()[d])
        << "at: index " << index[d] << " is out of range for dim " << d << " of size "
        << sizes()[d];
    offset += i * strides()[d];
  }
  Tensor element(storage(), {}, {}, storage_offset() + offset, dtype());
  return element.item_scalar().to_double();
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor src = to(Device::cpu()).to(dtype_of<T>).contiguous();
  const T* p = static_cast<const T*>(src.data_ptr());
  return std::vector<T>(p, p + src.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

// ---------------------------------------------------------------- views

Tensor Tensor::as_strided(const Shape& sizes, const Shape& strides,
                          std::optional<int64_t> storage_offset) const {
  if (detail::autograd_dispatch(*this)) {
    return autograd_hooks()->as_strided(*this, sizes, strides, storage_offset);
  }
  Tensor out(storage(), sizes, strides, storage_offset.value_or(this->storage_offset()), dtype());
  return out;
}

namespace {
// Resolves a single -1 in `shape` against numel; throws naming the op otherwise.
Shape infer_shape(const Shape& shape, int64_t numel, const char* op, const Shape& from) {
  Shape out = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      GRADWIRE_CHECK_ARG(infer < 0)
          << op << ": only one dimension can be -1, got " << shape_to_string(shape);
      infer = static_cast<int>(i);
    } else {
      GRADWIRE_CHECK_ARG(out[i] >= 0)
          << op << ": invalid size " << out[i] << " in " << shape_to_string(shape);
      known *= out[i];
    }
  }
  if (infer >= 0) {
    GRADWIRE_CHECK_ARG(known != 0 && numel % known == 0)
        << op << ": shape " << shape_to_string(shape) << " is invalid for a tensor of shape "
        << shape_to_string(from) << " (" << numel << " elements)";
    out[infer] = numel / known;
  } else {
    GRADWIRE_CHECK_ARG(known == numel)
        << op << ": shape " << shape_to_string(shape) << " is invalid for a tensor of shape "
        << shape_to_string(from) << " (" << numel << " elements)";
  }
  return out;
}

// Strides for viewing (sizes, strides) as new_sizes without copying, if possible: each
// run of old dims that is contiguous in memory may be split or merged freely.
std::optional<Shape> view_strides(const Shape& sizes, const Shape& strides,
                                  const Shape& new_sizes) {
  Shape out(new_sizes.size());
  int64_t numel = shape_numel(sizes);
  // No elements, or the single element of a 0-dim tensor: any layout addresses them.
  if (numel == 0 || sizes.empty()) return contiguous_strides(new_sizes);
  int64_t view_d = static_cast<int64_t>(new_sizes.size()) - 1;
  int64_t chunk_base_stride = strides.empty() ? 1 : strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
    tensor_numel *= sizes[d];
    // The end of a contiguous chunk of old dims.
    if (d == 0 || (sizes[d - 1] != 1 && strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || new_sizes[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= new_sizes[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return out;
}
}  // namespace

Tensor Tensor::view(const Shape& shape) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->view(*this, shape);
  Shape new_sizes = infer_shape(shape, numel(), "view", sizes());
  auto strides_opt = view_strides(sizes(), strides(), new_sizes);
  GRADWIRE_CHECK_ARG(strides_opt.has_value())
      << "view: cannot view a tensor of shape " << shape_string() << " and strides "
      << shape_to_string(strides()) << " as " << shape_to_string(new_sizes)
      << " without copying; use reshape() or contiguous() first";
  return as_strided(new_sizes, *strides_opt);
}

Tensor Tensor::reshape(const Shape& shape) const {
  Shape new_sizes = infer_shape(shape, numel(), "reshape", sizes());
  // Through view(), not as_strided(), so that autograd records a view it can invert.
  if (view_strides(sizes(), strides(), new_sizes)) return view(new_sizes);
  return contiguous().view(new_sizes);
}

Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->transpose(*this, dim0, dim1);
  if (dim() == 0) return *this;
  int64_t a = wrap_dim(dim0, "transpose"), b = wrap_dim(dim1, "transpose");
  Shape sz = sizes(), st = strides();
  std::swap(sz[a], sz[b]);
  std::swap(st[a], st[b]);
  return as_strided(sz, st);
}

Tensor Tensor::t() const {
  GRADWIRE_CHECK_ARG(dim() <= 2) << "t: expects a tensor with at most 2 dims, got shape "
                                 << shape_string();
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const Shape& dims) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->permute(*this, dims);
  GRADWIRE_CHECK_ARG(static_cast<int64_t>(dims.size()) == dim())
      << "permute: " << dims.size() << " dims given for a tensor of shape " << shape_string();
  Shape sz(dims.size()), st(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = wrap_dim(dims[i], "permute");
    GRADWIRE_CHECK_ARG(!seen[d]) << "permute: dim " << dims[i] << " repeated in "
                                 << shape_to_string(dims);
    seen[d] = true;
    sz[i] = sizes()[d];
    st[i] = strides()[d];
  }
  return as_strided(sz, st);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->slice(*this, d, start, end, step);
  require_dims(*this, "slice");
  int64_t w = wrap_dim(d, "slice");
  GRADWIRE_CHECK_ARG(step > 0) << "slice: step must be positive, got " << step;
  const int64_t n = sizes()[w];
  auto clamp = [n](int64_t i) {
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  start = clamp(start);
  end = std::max(clamp(end), start);
  Shape sz = sizes(), st = strides();
  sz[w] = (end - start + step - 1) / step;
  st[w] = strides()[w] * step;
  return as_strided(sz, st, storage_offset() + start * strides()[w]);
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->select(*this, d, index);
  require_dims(*this, "select");
  int64_t w = wrap_dim(d, "select");
  const int64_t n = sizes()[w];
  GRADWIRE_CHECK_ARG(index >= -n && index < n)
      << "select: index " << index << " is out of range for dim " << d << " of size " << n
      << " (shape " << shape_string() << ")";
  if (index < 0) index += n;
  Shape sz = sizes(), st = strides();
  sz.erase(sz.begin() + w);
  st.erase(st.begin() + w);
  return as_strided(sz, st, storage_offset() + index * strides()[w]);
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  require_dims(*this, "narrow");
  int64_t w = wrap_dim(d, "narrow");
  const int64_t n = sizes()[w];
  if (start < 0) start += n;
  GRADWIRE_CHECK_ARG(start >= 0 && length >= 0 && start + length <= n)
      << "narrow: start " << start << " and length " << length << " are out of range for dim " << d
      << " of size " << n;
  return slice(w, start, start + length);
}

Tensor Tensor::expand(const Shape& shape) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->expand(*this, shape);
  GRADWIRE_CHECK_ARG(shape.size() >= sizes().size())
      << "expand: target " << shape_to_string(shape) << " has fewer dims than the tensor's "
      << shape_string();
  const size_t lead = shape.size() - sizes().size();
  Shape sz(shape.size()), st(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i < lead) {
      GRADWIRE_CHECK_ARG(shape[i] >= 0)
          << "expand: size -1 is not allowed for a new leading dim in " << shape_to_string(shape);
      sz[i] = shape[i];
      st[i] = 0;
      continue;
    }
    const int64_t have = sizes()[i - lead];
    const int64_t want = shape[i] == -1 ? have : shape[i];
    if (have == want) {
      sz[i] = have;
      st[i] = strides()[i - lead];
    } else {
      GRADWIRE_CHECK_ARG(have == 1)
          << "expand: cannot expand shape " << shape_string() << " to " << shape_to_string(shape)
          << " (dim " << i << " has size " << have << ", not 1)";
      sz[i] = want;
      st[i] = 0;
    }
  }
  return as_strided(sz, st);
}

Tensor Tensor::squeeze() const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->squeeze(*this, std::nullopt);
  Shape sz, st;
  for (int64_t d = 0; d < dim(); ++d) {
    if (sizes()[d] != 1) {
      sz.push_back(sizes()[d]);
      st.push_back(strides()[d]);
    }
  }
  return as_strided(sz, st);
}

Tensor Tensor::squeeze(int64_t d) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->squeeze(*this, d);
  if (dim() == 0) return *this;
  int64_t w = wrap_dim(d, "squeeze");
  if (sizes()[w] != 1) return *this;
  Shape sz = sizes(), st = strides();
  sz.erase(sz.begin() + w);
  st.erase(st.begin() + w);
  return as_strided(sz, st);
}

Tensor Tensor::unsqueeze(int64_t d) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->unsqueeze(*this, d);
  int64_t w = wrap_dim(d, "unsqueeze", /*for_insert=*/true);
  Shape sz = sizes(), st = strides();
  int64_t stride = w < dim() ? sizes()[w] * strides()[w] : 1;
  sz.insert(sz.begin() + w, 1);
  st.insert(st.begin() + w, stride);
  return as_strided(sz, st);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  int64_t s = wrap_dim(start_dim, "flatten"), e = wrap_dim(end_dim, "flatten");
  GRADWIRE_CHECK_ARG(s <= e) << "flatten: start_dim " << start_dim << " is after end_dim "
                             << end_dim;
  Shape sz(sizes().begin(), sizes().begin() + s);
  int64_t n = 1;
  for (int64_t d = s; d <= e; ++d)
    n *= sizes()[d];
  sz.push_back(n);
  sz.insert(sz.end(), sizes().begin() + e + 1, sizes().end());
  return reshape(sz);
}

Tensor Tensor::unflatten(int64_t d, const Shape& new_sizes) const {
  require_dims(*this, "unflatten");
  int64_t w = wrap_dim(d, "unflatten");
  Shape inner = infer_shape(new_sizes, sizes()[w], "unflatten", sizes());
  Shape sz(sizes().begin(), sizes().begin() + w);
  sz.insert(sz.end(), inner.begin(), inner.end());
  sz.insert(sz.end(), sizes().begin() + w + 1, sizes().end());
  return view(sz);
}

// ---------------------------------------------------------------- copies

namespace {
// Strided copy with dtype conversion between two CPU tensors of the same shape.
void cpu_copy(const Tensor& dst, const Tensor& src) {
  auto plan = detail::make_plan<2>(dst.sizes(), {detail::broadcast_byte_strides(dst, dst.sizes()),
                                                 detail::broadcast_byte_strides(src, dst.sizes())});
  detail::dispatch_all(dst.dtype(), "copy_", [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    detail::dispatch_all(src.dtype(), "copy_", [&](auto stag) {
      using S = typename decltype(stag)::type;
      detail::run_plan<2>(plan, {byte_ptr(dst), byte_ptr(src)},
                          [](std::array<char*, 2> p, std::array<int64_t, 2> s, int64_t n) {
                            if constexpr (std::is_same_v<D, S>) {
                              if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
                                std::memcpy(p[0], p[1], n * sizeof(D));
                                return;
                              }
                            }
                            if (s[0] == sizeof(D) && s[1] == sizeof(S)) {
                              D* d = reinterpret_cast<D*>(p[0]);
                              const S* x = reinterpret_cast<const S*>(p[1]);
                              for (int64_t i = 0; i < n; ++i)
                                d[i] = detail::convert<D>(x[i]);
                              return;
                            }
                            if (s[0] == sizeof(D) && s[1] == 0) {
                              // A broadcast source (an expand, such as a sum's gradient):
                              // one value along the run, so a fill, which writes the run
                              // contiguously instead of element by element.
                              D* d = reinterpret_cast<D*>(p[0]);
                              std::fill(d, d + n,
                                        detail::convert<D>(*reinterpret_cast<const S*>(p[1])));
                              return;
                            }
                            for (int64_t i = 0; i < n; ++i) {
                              *reinterpret_cast<D*>(p[0] + i * s[0]) =
                                  detail::convert<D>(*reinterpret_cast<const S*>(p[1] + i * s[1]));
                            }
                          });
    });
  });
}

bool overlaps(const Tensor& a, const Tensor& b) {
  if (!a.storage().is_same(b.storage()) || a.numel() == 0 || b.numel() == 0) return false;
  auto range = [](const Tensor& t) {
    int64_t lo = t.storage_offset(), hi = t.storage_offset();
    for (int64_t d = 0; d < t.dim(); ++d) {
      int64_t reach = t.strides()[d] * (t.sizes()[d] - 1);
      (reach < 0 ? lo : hi) += reach;
    }
    return std::pair<int64_t, int64_t>((lo)*t.element_size(), (hi + 1) * t.element_size());
  };
  auto [alo, ahi] = range(a);
  auto [blo, bhi] = range(b);
  return alo < bhi && blo < ahi;
}
}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  if (detail::autograd_dispatch(*this, src)) return autograd_hooks()->copy_(*this, src);
  GRADWIRE_CHECK_ARG(src.defined()) << "copy_: source tensor is undefined";
  GRADWIRE_CHECK_ARG(broadcast_shapes(sizes(), src.sizes(), "copy_") == sizes())
      << "copy_: source of shape " << src.shape_string()
      << " does not broadcast to the destination's shape " << shape_string();
  Tensor source = src.expand(sizes());
  // Copying between views of one storage that overlap would read elements already
  // overwritten: copy the source out first.
  if (overlaps(*this, source) && !(is_same(source))) source = source.clone();
  if (is_cuda() || source.is_cuda()) {
#if GRADWIRE_HAS_CUDA
    detail::cuda::copy(*this, source);
#endif
  } else {
    cpu_copy(*this, source);
  }
  storage().bump_version();
  return *this;
}

Tensor& Tensor::fill_(Scalar value) {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->fill_(*this, value);
  if (is_cuda()) {
#if GRADWIRE_HAS_CUDA
    detail::cuda::fill(*this, value);
#endif
  } else {
    detail::dispatch_all(dtype(), "fill_", [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T v = value.to<T>();
      auto plan = detail::make_plan<1>(sizes(), {detail::broadcast_byte_strides(*this, sizes())});
      detail::run_plan<1>(plan, {byte_ptr(*this)},
                          [v](std::array<char*, 1> p, std::array<int64_t, 1> s, int64_t n) {
                            if (s[0] == sizeof(T)) {
                              T* d = reinterpret_cast<T*>(p[0]);
                              std::fill(d, d + n, v);
                            } else {
                              for (int64_t i = 0; i < n; ++i)
                                *reinterpret_cast<T*>(p[0] + i * s[0]) = v;
                            }
                          });
    });
  }
  storage().bump_version();
  return *this;
}

Tensor& Tensor::zero_() {
  if (is_sparse()) {
    detail::sparse_zero_(*this);
    return *this;
  }
  return fill_(0);
}

Tensor Tensor::contiguous() const {
  return is_contiguous() ? *this : clone();
}

Tensor Tensor::clone() const {
  if (is_sparse()) return detail::sparse_clone(*this);
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->clone(*this);
  Tensor out = empty(sizes(), options());
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(DType t) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->to(*this, t);
  if (t == dtype()) return *this;
  if (is_sparse()) return detail::sparse_to(*this, t);
  Tensor out = empty(sizes(), options().dtype(t));
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  if (detail::autograd_dispatch(*this)) return autograd_hooks()->to(*this, device);
  if (device == this->device()) return *this;
  GRADWIRE_CHECK_ARG(!is_sparse())
      << "to: sparse-rows tensors stay on the CPU (asked to move one of shape " << shape_string()
      << " to " << device.str() << ")";
  Tensor out = empty(sizes(), options().device(device));
  out.copy_(*this);
  return out;
}

Tensor Tensor::to(Device device, DType t) const {
  return to(t).to(device);
}

// Built directly (not through as_strided) so that the result never has autograd state.
Tensor Tensor::detach() const {
  if (is_sparse()) return detail::sparse_detach(*this);
  return Tensor(
      std::make_shared<TensorImpl>(storage(), sizes(), strides(), storage_offset(), dtype()));
}

namespace detail {
Shape broadcast_byte_strides(const Tensor& t, const Shape& shape) {
  Shape out(shape.size(), 0);
  const size_t lead = shape.size() - t.sizes().size();
  const int64_t es = t.element_size();
  for (size_t i = 0; i < t.sizes().size(); ++i) {
    out[lead + i] = t.sizes()[i] == 1 ? 0 : t.strides()[i] * es;
  }
  return out;
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) {
      first = t;
    } else if (t->device() != first->device()) {
      GRADWIRE_THROW(InvalidArgument) << op << ": expected all tensors on one device, got "
                                      << first->device().str() << " and " << t->device().str();
    }
  }
}
}  // namespace detail

}  // namespace gradwire
