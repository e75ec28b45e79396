// Sparse-rows tensors (sparse.h): construction, coalescing, densifying, and the sparse
// branches of the Tensor methods and arithmetic that accept them.
#include "gradwire/tensor/sparse.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <vector>

#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

SparseRowsData& parts(const Tensor& t, const char* op) {
  SparseRowsData* s = t.impl().sparse();
  GRADWIRE_CHECK_ARG(s != nullptr)
      << op << ": expected a sparse-rows tensor, got a strided one of shape " << t.shape_string();
  return *s;
}

// The shape of values for `rows` rows of a tensor of dense shape `sizes`.
Shape values_shape(int64_t rows, const Shape& sizes) {
  Shape out = sizes;
  out[0] = rows;
  return out;
}

// The row numbers as int64 values, each checked against the table's row count.
std::vector<int64_t> read_rows(const char* op, const Tensor& indices, int64_t rows) {
  const Tensor i64 = indices.to(kInt64).contiguous();
  const int64_t* p = i64.data<int64_t>();
  std::vector<int64_t> out(p, p + i64.numel());
  for (size_t k = 0; k < out.size(); ++k) {
    if (out[k] < 0 || out[k] >= rows) {
      GRADWIRE_THROW(InvalidArgument) << op << ": row index " << out[k] << " (entry " << k
                                      << ") is out of range for " << rows << " rows";
    }
  }
  return out;
}

Tensor make(Tensor indices, Tensor values, const Shape& sizes, bool coalesced) {
  auto data = std::make_shared<SparseRowsData>();
  const DType dtype = values.dtype();
  const Device device = values.device();
  data->indices = std::move(indices);
  data->values = std::move(values);
  data->coalesced = coalesced;
  return Tensor(std::make_shared<TensorImpl>(std::move(data), sizes, dtype, device));
}

void check_compatible(const char* op, const Tensor& a, const Tensor& b) {
  GRADWIRE_CHECK_ARG(a.sizes() == b.sizes())
      << op << ": shapes " << a.shape_string() << " and " << b.shape_string()
      << " differ (a sparse-rows operand does not broadcast)";
  GRADWIRE_CHECK_ARG(a.dtype() == b.dtype()) << op << ": dtypes " << dtype_name(a.dtype())
                                             << " and " << dtype_name(b.dtype()) << " differ";
  GRADWIRE_CHECK_ARG(a.device() == b.device())
      << op << ": devices " << a.device().str() << " and " << b.device().str() << " differ";
}

}  // namespace

const char* layout_name(Layout layout) {
  return layout == Layout::kSparseRows ? "sparse_rows" : "strided";
}

TensorImpl::TensorImpl(std::shared_ptr<SparseRowsData> sparse, Shape sizes, DType dtype,
                       Device device)
    : sizes_(std::move(sizes)),
      strides_(contiguous_strides(sizes_)),
      storage_offset_(0),
      dtype_(dtype),
      numel_(shape_numel(sizes_)),
      contiguous_(false),
      sparse_(std::move(sparse)),
      sparse_device_(device) {}

void TensorImpl::throw_no_storage() const {
  GRADWIRE_THROW(InvalidArgument)
      << "a sparse-rows tensor of shape " << shape_to_string(sizes_) << " ("
      << sparse_->indices.numel()
      << " rows stored) has no strided storage: this operation needs a dense tensor; call "
         "to_dense(), or use its indices() and values()";
}

Tensor sparse_rows(const Tensor& indices, const Tensor& values, const Shape& sizes) {
  GRADWIRE_CHECK_ARG(indices.defined() && values.defined())
      << "sparse_rows: indices and values must be defined";
  GRADWIRE_CHECK_ARG(!indices.is_sparse() && !values.is_sparse())
      << "sparse_rows: indices and values must be strided tensors";
  GRADWIRE_CHECK_ARG(!sizes.empty()) << "sparse_rows: the dense shape needs at least one dim";
  (void)shape_numel(sizes);  // negative sizes and overflow
  GRADWIRE_CHECK_ARG(indices.dim() == 1)
      << "sparse_rows: indices must be 1-d, got shape " << indices.shape_string();
  GRADWIRE_CHECK_ARG(indices.dtype() == kInt64 || indices.dtype() == kInt32)
      << "sparse_rows: indices must be int64 (or int32), got " << dtype_name(indices.dtype());
  GRADWIRE_CHECK_ARG(values.is_floating_point())
      << "sparse_rows: values must be floating point, got " << dtype_name(values.dtype());
  GRADWIRE_CHECK_ARG(values.sizes() == values_shape(indices.numel(), sizes))
      << "sparse_rows: values of shape " << values.shape_string() << " do not fit "
      << indices.numel() << " rows of a tensor of shape " << shape_to_string(sizes) << " (expected "
      << shape_to_string(values_shape(indices.numel(), sizes)) << ")";
  const std::vector<int64_t> rows = read_rows("sparse_rows", indices, sizes[0]);
  const bool sorted_unique = std::adjacent_find(rows.begin(), rows.end(), [](int64_t a, int64_t b) {
                               return a >= b;
                             }) == rows.end();
  Tensor idx = indices.dtype() == kInt64 ? indices : indices.to(kInt64);
  return make(idx.detach(), values.detach(), sizes, sorted_unique);
}

Tensor sparse_rows_zeros(const Shape& sizes, TensorOptions options) {
  GRADWIRE_CHECK_ARG(!sizes.empty()) << "sparse_rows_zeros: the dense shape needs at least one dim";
  (void)shape_numel(sizes);
  return make(empty({0}, TensorOptions(kInt64)), empty(values_shape(0, sizes), options), sizes,
              true);
}

Tensor Tensor::indices() const {
  return parts(*this, "indices").indices;
}
Tensor Tensor::values() const {
  return parts(*this, "values").values;
}
int64_t Tensor::nnz() const {
  return parts(*this, "nnz").indices.numel();
}
bool Tensor::is_coalesced() const {
  return parts(*this, "is_coalesced").coalesced;
}

Tensor Tensor::coalesce() const {
  const SparseRowsData& s = parts(*this, "coalesce");
  if (s.coalesced) return *this;
  const std::vector<int64_t> rows = read_rows("coalesce", s.indices, sizes()[0]);
  std::vector<int64_t> order(rows.size());
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return rows[static_cast<size_t>(a)] < rows[static_cast<size_t>(b)];
  });
  // unique[k]: the k-th distinct row; slot[j]: where entry j's values go.
  std::vector<int64_t> unique, slot(rows.size());
  for (int64_t j : order) {
    const int64_t r = rows[static_cast<size_t>(j)];
    if (unique.empty() || unique.back() != r) unique.push_back(r);
    slot[static_cast<size_t>(j)] = static_cast<int64_t>(unique.size()) - 1;
  }
  const int64_t n = static_cast<int64_t>(unique.size());
  Tensor summed = zeros(values_shape(n, sizes()), s.values.options());
  index_add_(summed, 0, tensor<int64_t>(slot), s.values);
  return make(tensor<int64_t>(unique), summed, sizes(), true);
}

Tensor Tensor::to_dense() const {
  if (!is_sparse()) return *this;
  const SparseRowsData& s = parts(*this, "to_dense");
  Tensor dense = zeros(sizes(), s.values.options());
  index_add_(dense, 0, s.indices, s.values);
  return dense;
}

namespace detail {

Tensor sparse_clone(const Tensor& t) {
  const SparseRowsData& s = parts(t, "clone");
  return make(s.indices.clone(), s.values.clone(), t.sizes(), s.coalesced);
}

Tensor sparse_detach(const Tensor& t) {
  // Shares the parts, as a strided detach shares the storage.
  return Tensor(
      std::make_shared<TensorImpl>(t.impl().sparse_ptr(), t.sizes(), t.dtype(), t.device()));
}

Tensor sparse_shallow_copy(const Tensor& t) {
  const SparseRowsData& s = parts(t, "copy");
  return make(s.indices, s.values, t.sizes(), s.coalesced);
}

Tensor sparse_to(const Tensor& t, DType dtype) {
  const SparseRowsData& s = parts(t, "to");
  GRADWIRE_CHECK_ARG(is_floating_point(dtype))
      << "to: a sparse-rows tensor holds floating-point values, not " << dtype_name(dtype);
  return make(s.indices, s.values.to(dtype), t.sizes(), s.coalesced);
}

void sparse_zero_(const Tensor& t) {
  SparseRowsData& s = parts(t, "zero_");
  s.indices = empty({0}, TensorOptions(kInt64));
  s.values = empty(values_shape(0, t.sizes()), s.values.options());
  s.coalesced = true;
}

void sparse_scale_(const Tensor& t, double factor) {
  SparseRowsData& s = parts(t, "mul_");
  s.values = mul(s.values, factor);  // new values: the old ones may be shared
}

Tensor sparse_scale(const Tensor& t, double factor) {
  const SparseRowsData& s = parts(t, "mul");
  return make(s.indices, mul(s.values, factor), t.sizes(), s.coalesced);
}

Tensor sparse_add(const Tensor& a, const Tensor& b, double alpha) {
  check_compatible("add", a, b);
  if (a.is_sparse() && b.is_sparse()) {
    const SparseRowsData& sa = parts(a, "add");
    const SparseRowsData& sb = parts(b, "add");
    if (sb.indices.numel() == 0) return make(sa.indices, sa.values, a.sizes(), sa.coalesced);
    const Tensor vb = alpha == 1.0 ? sb.values : mul(sb.values, alpha);
    if (sa.indices.numel() == 0) return make(sb.indices, vb, a.sizes(), sb.coalesced);
    return make(cat({sa.indices, sb.indices}), cat({sa.values, vb}), a.sizes(), false);
  }
  Tensor out = a.is_sparse() ? a.to_dense() : a.clone();
  if (b.is_sparse()) {
    index_add_(out, 0, b.indices(), b.values(), alpha);
  } else {
    out.add_(b, alpha);
  }
  return out;
}

void sparse_add_(Tensor& a, const Tensor& b, double alpha) {
  check_compatible("add_", a, b);
  if (a.is_sparse()) {
    GRADWIRE_CHECK_ARG(b.is_sparse())
        << "add_: a sparse-rows tensor cannot take a dense one in place (the sum is dense); "
           "use add(a, b)";
    SparseRowsData& sa = parts(a, "add_");
    const Tensor sum = sparse_add(a, b, alpha);
    const SparseRowsData& ss = parts(sum, "add_");
    sa.indices = ss.indices;
    sa.values = ss.values;
    sa.coalesced = ss.coalesced;
    return;
  }
  index_add_(a, 0, b.indices(), b.values(), alpha);
}

std::string sparse_to_string(const Tensor& t) {
  const SparseRowsData& s = parts(t, "to_string");
  std::ostringstream os;
  os << "sparse_rows(size=" << t.shape_string() << ", nnz=" << s.indices.numel()
     << ", dtype=" << dtype_name(t.dtype()) << ",\n  indices=" << s.indices.to_string()
     << ",\n  values=" << s.values.to_string() << ")";
  return os.str();
}

}  // namespace detail
}  // namespace gradwire
