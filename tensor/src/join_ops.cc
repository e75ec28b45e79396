// Joining and splitting (cat, stack, split, split_with_sizes, chunk) and the flat buffers
// DDP buckets use (flatten_dense_tensors / unflatten_dense_tensors).
//
// Joins write each input into a narrowed view of the output with copy_, which converts
// dtypes and works on any device; splits and unflatten return views, never copies.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "autograd_dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {

namespace {

// PyTorch still accepts a 1-d tensor of size 0 as a placeholder in cat, whatever the
// other inputs' shapes; it contributes nothing.
bool is_legacy_empty(const Tensor& t) {
  return t.dim() == 1 && t.size(0) == 0;
}

void check_list(const char* op, const std::vector<Tensor>& tensors) {
  GRADWIRE_CHECK_ARG(!tensors.empty()) << op << ": expected a non-empty list of tensors";
  for (size_t i = 0; i < tensors.size(); ++i) {
    GRADWIRE_CHECK_ARG(tensors[i].defined()) << op << ": tensor " << i << " is undefined";
    GRADWIRE_CHECK_ARG(tensors[i].device() == tensors[0].device())
        << op << ": expected all tensors on one device, got " << tensors[0].device().str()
        << " (tensor 0) and " << tensors[i].device().str() << " (tensor " << i << ")";
  }
}

}  // namespace

Tensor cat(const std::vector<Tensor>& tensors, int64_t dim) {
  if (detail::autograd_dispatch_list(tensors)) return autograd_hooks()->cat(tensors, dim);
  check_list("cat", tensors);
  DType dtype = tensors[0].dtype();
  for (const Tensor& t : tensors)
    dtype = promote_types(dtype, t.dtype());
  const Tensor* ref = nullptr;
  for (const Tensor& t : tensors) {
    if (!is_legacy_empty(t)) {
      ref = &t;
      break;
    }
  }
  if (ref == nullptr) return empty({0}, tensors[0].options().dtype(dtype));
  GRADWIRE_CHECK_ARG(ref->dim() > 0) << "cat: zero-dimensional tensor (shape "
                                     << ref->shape_string() << ") cannot be concatenated";
  const int64_t d = ref->wrap_dim(dim, "cat");
  Shape out_shape = ref->sizes();
  out_shape[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (is_legacy_empty(t)) continue;
    bool ok = t.dim() == ref->dim();
    for (int64_t k = 0; ok && k < t.dim(); ++k)
      ok = k == d || t.size(k) == ref->size(k);
    GRADWIRE_CHECK_ARG(ok) << "cat: sizes must match except in dim " << d << ": tensor "
                           << (ref - tensors.data()) << " has shape " << ref->shape_string()
                           << " and tensor " << i << " has shape " << t.shape_string();
    out_shape[d] += t.size(d);
  }
  Tensor out = empty(out_shape, ref->options().dtype(dtype));
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    if (is_legacy_empty(t)) continue;
    out.narrow(d, offset, t.size(d)).copy_(t);
    offset += t.size(d);
  }
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors, int64_t dim) {
  check_list("stack", tensors);
  const Tensor& first = tensors[0];
  for (size_t i = 1; i < tensors.size(); ++i) {
    GRADWIRE_CHECK_ARG(tensors[i].sizes() == first.sizes())
        << "stack: expected tensors of one shape, got " << first.shape_string()
        << " (tensor 0) and " << tensors[i].shape_string() << " (tensor " << i << ")";
  }
  const int64_t d = first.wrap_dim(dim, "stack", /*for_insert=*/true);
  std::vector<Tensor> parts;
  parts.reserve(tensors.size());
  for (const Tensor& t : tensors)
    parts.push_back(t.unsqueeze(d));
  return cat(parts, d);
}

std::vector<Tensor> split(const Tensor& a, int64_t split_size, int64_t dim) {
  GRADWIRE_CHECK_ARG(a.defined()) << "split: input tensor is undefined";
  GRADWIRE_CHECK_ARG(a.dim() > 0) << "split: expected a tensor with at least 1 dim, got shape "
                                  << a.shape_string();
  const int64_t d = a.wrap_dim(dim, "split");
  const int64_t n = a.size(d);
  GRADWIRE_CHECK_ARG(split_size > 0 || (split_size == 0 && n == 0))
      << "split: split_size must be positive, got " << split_size << " for dim " << d
      << " of shape " << a.shape_string();
  std::vector<Tensor> out;
  if (n == 0) {
    out.push_back(a);
    return out;
  }
  for (int64_t start = 0; start < n; start += split_size) {
    out.push_back(a.narrow(d, start, std::min(split_size, n - start)));
  }
  return out;
}

std::vector<Tensor> split_with_sizes(const Tensor& a, const Shape& sizes, int64_t dim) {
  GRADWIRE_CHECK_ARG(a.defined()) << "split_with_sizes: input tensor is undefined";
  GRADWIRE_CHECK_ARG(a.dim() > 0)
      << "split_with_sizes: expected a tensor with at least 1 dim, got shape " << a.shape_string();
  const int64_t d = a.wrap_dim(dim, "split_with_sizes");
  int64_t total = 0;
  for (int64_t s : sizes) {
    GRADWIRE_CHECK_ARG(s >= 0) << "split_with_sizes: negative size " << s << " in "
                               << shape_to_string(sizes);
    total += s;
  }
  GRADWIRE_CHECK_ARG(total == a.size(d))
      << "split_with_sizes: sizes " << shape_to_string(sizes) << " add up to " << total
      << " but dim " << d << " of shape " << a.shape_string() << " has size " << a.size(d);
  std::vector<Tensor> out;
  out.reserve(sizes.size());
  int64_t start = 0;
  for (int64_t s : sizes) {
    out.push_back(a.narrow(d, start, s));
    start += s;
  }
  return out;
}

std::vector<Tensor> chunk(const Tensor& a, int64_t chunks, int64_t dim) {
  GRADWIRE_CHECK_ARG(a.defined()) << "chunk: input tensor is undefined";
  GRADWIRE_CHECK_ARG(a.dim() > 0) << "chunk: expected a tensor with at least 1 dim, got shape "
                                  << a.shape_string();
  GRADWIRE_CHECK_ARG(chunks > 0) << "chunk: chunks must be positive, got " << chunks;
  const int64_t d = a.wrap_dim(dim, "chunk");
  const int64_t n = a.size(d);
  // An empty dim still yields `chunks` empty pieces, as PyTorch.
  if (n == 0) return split_with_sizes(a, Shape(static_cast<size_t>(chunks), 0), d);
  return split(a, (n + chunks - 1) / chunks, d);
}

Tensor flatten_dense_tensors(const std::vector<Tensor>& tensors) {
  if (detail::autograd_dispatch_list(tensors)) {
    return autograd_hooks()->flatten_dense_tensors(tensors);
  }
  check_list("flatten_dense_tensors", tensors);
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    GRADWIRE_CHECK_ARG(tensors[i].dtype() == tensors[0].dtype())
        << "flatten_dense_tensors: expected one dtype, got " << dtype_name(tensors[0].dtype())
        << " (tensor 0) and " << dtype_name(tensors[i].dtype()) << " (tensor " << i << ")";
    total += tensors[i].numel();
  }
  Tensor flat = empty({total}, tensors[0].options());
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    flat.narrow(0, offset, t.numel()).view(t.sizes()).copy_(t);
    offset += t.numel();
  }
  return flat;
}

std::vector<Tensor> unflatten_dense_tensors(const Tensor& flat, const std::vector<Tensor>& like) {
  GRADWIRE_CHECK_ARG(flat.defined()) << "unflatten_dense_tensors: flat tensor is undefined";
  GRADWIRE_CHECK_ARG(flat.dim() == 1)
      << "unflatten_dense_tensors: flat must be 1-d, got shape " << flat.shape_string();
  int64_t total = 0;
  for (size_t i = 0; i < like.size(); ++i) {
    const Tensor& t = like[i];
    GRADWIRE_CHECK_ARG(t.defined()) << "unflatten_dense_tensors: tensor " << i << " is undefined";
    GRADWIRE_CHECK_ARG(t.dtype() == flat.dtype() && t.device() == flat.device())
        << "unflatten_dense_tensors: tensor " << i << " is " << dtype_name(t.dtype()) << " on "
        << t.device().str() << " but flat is " << dtype_name(flat.dtype()) << " on "
        << flat.device().str();
    total += t.numel();
  }
  GRADWIRE_CHECK_ARG(total == flat.numel())
      << "unflatten_dense_tensors: the tensors hold " << total << " elements but flat of shape "
      << flat.shape_string() << " has " << flat.numel();
  std::vector<Tensor> out;
  out.reserve(like.size());
  int64_t offset = 0;
  for (const Tensor& t : like) {
    out.push_back(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
  return out;
}

}  // namespace gradwire
