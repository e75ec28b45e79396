// Tensor: an n-dimensional, strided view of a Storage with one element type.
//
// A Tensor is a cheap handle (a shared pointer to a TensorImpl): copying the handle shares
// the same tensor, as in PyTorch. A view (view, transpose, slice, expand, ...) is a new
// TensorImpl over the same Storage with other sizes, strides and offset, so writes through
// a view are seen by the base. `clone()` and `contiguous()` (when needed) copy.
//
// Shapes and indices are int64_t. Negative dims count from the end (-1 is the last dim).
// A zero-dimensional tensor holds one element (a scalar tensor); its shape is {}.
//
// The free functions of ops.h do the arithmetic; this class holds metadata, views,
// element access, copies and the in-place forms (add_, mul_, ...). The autograd module
// attaches its per-tensor state through the opaque `autograd_meta` slot.
//
// Errors: a bad shape, dim, index or dtype throws InvalidArgument naming the op and the
// shapes or dtypes involved; accessing an undefined tensor throws InvalidArgument.
//
// Thread-safety: const methods may be called concurrently. Mutating the same tensor (or
// views of one storage) from several threads without synchronisation is a data race.
//
// Example:
//   Tensor a = arange(6).reshape({2, 3});      // [[0,1,2],[3,4,5]] int64
//   Tensor b = a.transpose(0, 1).contiguous();  // 3x2 copy
//   float f = ones({2, 2}).sum().item<float>(); // 4
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "gradwire/tensor/device.h"
#include "gradwire/tensor/dtype.h"
#include "gradwire/tensor/scalar.h"
#include "gradwire/tensor/storage.h"

namespace gradwire {

using Shape = std::vector<int64_t>;

namespace autograd {
class Node;  // defined by gradwire::autograd (autograd/node.h)
}  // namespace autograd

class Tensor;
// A tensor hook: receives the gradient of a tensor during backward and returns either an
// undefined Tensor (keep the gradient) or a replacement gradient of the same shape.
using TensorHook = std::function<Tensor(const Tensor& grad)>;
// Runs after a leaf's .grad has been updated by a backward pass; receives the leaf.
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

// dtype and device of a new tensor. Chainable: TensorOptions().dtype(kInt64).device(d).
struct TensorOptions {
  DType dtype_ = kFloat32;
  Device device_ = Device::cpu();

  TensorOptions() = default;
  TensorOptions(DType t) : dtype_(t) {}    // NOLINT: kInt64 where options are expected
  TensorOptions(Device d) : device_(d) {}  // NOLINT
  TensorOptions dtype(DType t) const {
    TensorOptions o = *this;
    o.dtype_ = t;
    return o;
  }
  TensorOptions device(Device d) const {
    TensorOptions o = *this;
    o.device_ = d;
    return o;
  }
};

// How a tensor's elements are stored. kStrided: a strided view of a Storage (every tensor
// but one kind). kSparseRows: a row-sparse tensor (sparse.h) -- the rows `indices()` of a
// dense shape hold `values()`, every other row is zero; it is what an embedding's sparse
// backward produces (PyTorch's sparse COO layout with one sparse dimension).
enum class Layout : uint8_t { kStrided, kSparseRows };
const char* layout_name(Layout layout);

struct SparseRowsData;  // defined below Tensor

// Per-tensor state owned by a module above tensor/ (autograd). tensor/ never looks inside.
class AutogradMetaInterface {
 public:
  virtual ~AutogradMetaInterface() = default;
};

class TensorImpl {
 public:
  TensorImpl(Storage storage, Shape sizes, Shape strides, int64_t storage_offset, DType dtype);
  // A sparse-rows tensor of dense shape `sizes` (sparse.h builds and checks these).
  TensorImpl(std::shared_ptr<SparseRowsData> sparse, Shape sizes, DType dtype, Device device);

  // The strided storage; a sparse-rows tensor has none (InvalidArgument naming its shape
  // and what to call instead), so every strided op refuses one before touching memory.
  const Storage& storage() const {
    if (sparse_ != nullptr) [[unlikely]]
      throw_no_storage();
    return storage_;
  }
  Device device() const { return sparse_ != nullptr ? sparse_device_ : storage_.device(); }
  Layout layout() const { return sparse_ != nullptr ? Layout::kSparseRows : Layout::kStrided; }
  // The rows and values of a sparse-rows tensor; null for a strided one.
  SparseRowsData* sparse() const { return sparse_.get(); }
  const std::shared_ptr<SparseRowsData>& sparse_ptr() const { return sparse_; }
  const Shape& sizes() const { return sizes_; }
  const Shape& strides() const { return strides_; }
  int64_t storage_offset() const { return storage_offset_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  bool is_contiguous() const { return contiguous_; }

  AutogradMetaInterface* autograd_meta() const { return autograd_meta_.get(); }
  void set_autograd_meta(std::unique_ptr<AutogradMetaInterface> meta) {
    autograd_meta_ = std::move(meta);
  }

 private:
  Storage storage_;
  Shape sizes_;
  Shape strides_;
  int64_t storage_offset_;
  DType dtype_;
  int64_t numel_;
  bool contiguous_;
  std::unique_ptr<AutogradMetaInterface> autograd_meta_;
  std::shared_ptr<SparseRowsData> sparse_;
  Device sparse_device_ = Device::cpu();
  [[noreturn]] void throw_no_storage() const;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // A tensor over `storage` with explicit geometry. Throws InvalidArgument when the
  // geometry reaches outside the storage or a size is negative.
  Tensor(Storage storage, Shape sizes, Shape strides, int64_t storage_offset, DType dtype);

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& sizes() const { return impl().sizes(); }
  const Shape& shape() const { return impl().sizes(); }
  const Shape& strides() const { return impl().strides(); }
  int64_t size(int64_t dim) const;
  int64_t stride(int64_t dim) const;
  int64_t dim() const { return static_cast<int64_t>(impl().sizes().size()); }
  int64_t numel() const { return impl().numel(); }
  DType dtype() const { return impl().dtype(); }
  Device device() const { return impl().device(); }
  Layout layout() const { return impl().layout(); }
  // True for a sparse-rows tensor (sparse.h); every strided op refuses one.
  bool is_sparse() const { return impl().sparse() != nullptr; }
  TensorOptions options() const { return TensorOptions(dtype()).device(device()); }
  int64_t element_size() const { return gradwire::element_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel() * element_size()); }
  const Storage& storage() const { return impl().storage(); }
  int64_t storage_offset() const { return impl().storage_offset(); }
  bool is_contiguous() const { return impl().is_contiguous(); }
  bool is_cuda() const { return device().is_cuda(); }
  bool is_floating_point() const { return gradwire::is_floating_point(dtype()); }
  // The storage version: bumped by every in-place write through any view.
  uint64_t version() const { return storage().version(); }
  // Wraps a possibly negative dim into [0, dim()) (or [0, dim()] when `for_insert`);
  // throws InvalidArgument naming `op` when out of range.
  int64_t wrap_dim(int64_t dim, const char* op, bool for_insert = false) const;

  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- raw element access (CPU). data_ptr points at the first element of this view.
  void* data_ptr() const;
  // Typed pointer; throws InvalidArgument when T does not match dtype().
  template <typename T>
  T* data() const {
    check_dtype_for_access(dtype_of<T>, "data");
    return static_cast<T*>(data_ptr());
  }
  // The single element of a one-element tensor, converted to T (copies from a device).
  template <typename T>
  T item() const {
    return item_scalar().to<T>();
  }
  Scalar item_scalar() const;
  // Element at a multi-index (CPU or device), converted to double; for tests and printing.
  double at(const Shape& index) const;
  // All elements in row-major order converted to T (copies from a device).
  template <typename T>
  std::vector<T> to_vector() const;

  // ---- views (share storage)
  Tensor view(const Shape& shape) const;     // -1 infers one size; must be viewable
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor t() const;  // transpose of a 2-d tensor
  Tensor permute(const Shape& dims) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;  // clamps
  Tensor select(int64_t dim, int64_t index) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor expand(const Shape& shape) const;  // -1 keeps a size; new leading dims allowed
  Tensor expand_as(const Tensor& other) const { return expand(other.sizes()); }
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor unflatten(int64_t dim, const Shape& sizes) const;
  Tensor as_strided(const Shape& sizes, const Shape& strides,
                    std::optional<int64_t> storage_offset = std::nullopt) const;
  Tensor operator[](int64_t index) const { return select(0, index); }

  // ---- copies and conversions
  Tensor contiguous() const;     // this tensor if already contiguous, else a packed copy
  Tensor clone() const;          // always a packed copy
  Tensor to(DType dtype) const;  // this tensor when already of that dtype
  Tensor to(Device device) const;
  Tensor to(Device device, DType dtype) const;
  Tensor detach() const;  // same data, no autograd state

  // ---- autograd. These forward to gradwire::autograd (tensor/autograd_hooks.h explains
  // the layering; docs/autograd.md the semantics, which follow PyTorch). Without
  // gradwire::autograd linked, the queries answer "no gradient" and set_requires_grad(true),
  // backward() and the hook registrations throw InvalidArgument.
  bool requires_grad() const;
  // Makes this tensor a leaf that records operations on it (floating dtypes only).
  Tensor& set_requires_grad(bool requires_grad = true);
  // The accumulated gradient of a leaf (or of a non-leaf after retain_grad()); undefined
  // until a backward pass reaches it. Shares storage with the stored gradient.
  Tensor grad() const;
  // Replaces the stored gradient (undefined clears it, as optimizers' zero_grad does).
  void set_grad(const Tensor& grad) const;
  // The node that produced this tensor; null for leaves and tensors without history.
  std::shared_ptr<autograd::Node> grad_fn() const;
  // True for tensors without a grad_fn (every tensor that does not require grad is a leaf).
  bool is_leaf() const;
  // Keeps the gradient of a non-leaf in grad() after backward (a no-op on leaves).
  void retain_grad() const;
  bool retains_grad() const;
  // Backpropagates from this tensor. `gradient` may be omitted for a one-element tensor.
  // Frees the graph's saved tensors unless retain_graph.
  void backward(const Tensor& gradient = {}, bool retain_graph = false) const;
  // Calls `hook` with this tensor's gradient during each backward pass; it may return a
  // replacement. Returns a handle for remove_hook().
  uint64_t register_hook(TensorHook hook) const;
  // Calls `hook` after each backward pass has accumulated into this leaf's grad().
  uint64_t register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;
  bool remove_hook(uint64_t handle) const;

  // ---- in-place (return *this); bump the storage version
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype and device
  Tensor& fill_(Scalar value);
  Tensor& zero_();
  Tensor& add_(const Tensor& other, Scalar alpha = 1);
  Tensor& add_(Scalar other);
  Tensor& sub_(const Tensor& other, Scalar alpha = 1);
  Tensor& sub_(Scalar other);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(Scalar other);
  Tensor& div_(const Tensor& other);
  Tensor& div_(Scalar other);
  Tensor& pow_(Scalar exponent);
  Tensor& neg_();
  Tensor& relu_();
  Tensor& clamp_(std::optional<Scalar> min, std::optional<Scalar> max);

  // ---- sparse rows (sparse.h). Each throws InvalidArgument on a strided tensor.
  // The row numbers, a 1-d int64 tensor of nnz() entries (duplicates allowed unless
  // coalesced). PyTorch's _indices() is the same numbers as a [1, nnz] matrix.
  Tensor indices() const;
  // The rows, shape [nnz(), sizes()[1:]...]; row i belongs at dense row indices()[i].
  Tensor values() const;
  // How many rows are stored (duplicates counted).
  int64_t nnz() const;
  // True when the rows are sorted and unique (coalesce() makes it so).
  bool is_coalesced() const;
  // Sorted unique rows, duplicates summed; this tensor when already coalesced.
  Tensor coalesce() const;
  // The dense tensor it stands for (zeros elsewhere); a strided tensor returns itself.
  Tensor to_dense() const;

  // ---- printing
  std::string to_string() const;
  std::string shape_string() const;  // "[2, 3]"

 private:
  void check_dtype_for_access(DType expected, const char* what) const;
  std::shared_ptr<TensorImpl> impl_;
};

// The parts of a sparse-rows tensor (sparse.h): shared by the tensor and its detach()es,
// replaced whole by its in-place ops (zero_, add_, mul_).
struct SparseRowsData {
  Tensor indices;  // 1-d int64, nnz entries, each in [0, sizes[0])
  Tensor values;   // [nnz, sizes[1:]...], the tensor's dtype and device
  bool coalesced = false;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
// "[2, 3]"
std::string shape_to_string(const Shape& shape);
// Row-major strides for a shape.
Shape contiguous_strides(const Shape& sizes);
// Product of sizes; throws InvalidArgument on a negative size or overflow.
int64_t shape_numel(const Shape& sizes);

extern template std::vector<float> Tensor::to_vector<float>() const;
extern template std::vector<double> Tensor::to_vector<double>() const;
extern template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
extern template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
extern template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
extern template std::vector<bool> Tensor::to_vector<bool>() const;

}  // namespace gradwire
