// Tensor printing in PyTorch's format (torch/_tensor_str.py with default print options:
// precision 4, threshold 1000, edgeitems 3, linewidth 80), so that output reads the same
// as what users know:
//
//   tensor([[1., 2.],
//           [3., 4.]], dtype=float64)
//
// Floating tensors print in one of three modes chosen from the nonzero finite values: all
// integers ("1.", "2."), fixed with 4 decimals, or scientific when the largest magnitude
// exceeds 1e8, the ratio of largest to smallest exceeds 1000, or (for non-integers) the
// smallest is below 1e-4. Every element is right-aligned to the widest; rows wrap at 80
// columns. Above 1000 elements only the first and last 3 of each dim are shown, around
// "...". The dtype is shown unless it is float32, int64 or bool (for an empty tensor,
// unless float32), the device unless it is the CPU.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/tensor/sparse.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire {

namespace {

constexpr int kPrecision = 4;
constexpr int64_t kThreshold = 1000;
constexpr int64_t kEdgeItems = 3;
constexpr int64_t kLineWidth = 80;

// One element as printed: integral dtypes keep the exact int64 (a double would round
// values beyond 2^53), floating ones the value as a double.
struct Element {
  double d = 0;
  int64_t i = 0;
};

// How elements are written: decided once from the (shown) values.
class Formatter {
 public:
  Formatter(DType dtype, const std::vector<Element>& values) : dtype_(dtype) {
    if (is_floating_point(dtype)) {
      std::vector<double> finite;
      for (const Element& e : values) {
        if (std::isfinite(e.d) && e.d != 0) finite.push_back(std::abs(e.d));
      }
      if (finite.empty()) return;  // nothing to size: zeros, nan and inf print bare
      const double lo = *std::min_element(finite.begin(), finite.end());
      const double hi = *std::max_element(finite.begin(), finite.end());
      int_mode_ =
          std::all_of(finite.begin(), finite.end(), [](double v) { return v == std::ceil(v); });
      sci_mode_ = hi / lo > 1000.0 || hi > 1.0e8 || (!int_mode_ && lo < 1.0e-4);
    }
    for (const Element& e : values) {
      // PyTorch sizes floating columns by their nonzero finite values only.
      if (is_floating_point(dtype) && (!std::isfinite(e.d) || e.d == 0)) continue;
      width_ = std::max<int64_t>(width_, static_cast<int64_t>(unpadded(e).size()));
    }
  }

  int64_t width() const { return width_; }

  std::string format(const Element& e) const {
    std::string s = unpadded(e);
    const int64_t len = static_cast<int64_t>(s.size());
    if (len < width_) s.insert(0, static_cast<size_t>(width_ - len), ' ');
    return s;
  }

 private:
  std::string unpadded(const Element& e) const {
    if (dtype_ == kBool) return e.i != 0 ? "True" : "False";
    if (!is_floating_point(dtype_)) return std::to_string(e.i);
    const double v = e.d;
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    char buf[512];  // %.0f of the largest double has 309 digits
    if (sci_mode_) {
      std::snprintf(buf, sizeof buf, "%.*e", kPrecision, v);
      return buf;
    }
    if (int_mode_) {
      std::snprintf(buf, sizeof buf, "%.0f.", v);
      return buf;
    }
    std::snprintf(buf, sizeof buf, "%.*f", kPrecision, v);
    return buf;
  }

  DType dtype_;
  bool int_mode_ = true;
  bool sci_mode_ = false;
  int64_t width_ = 1;
};

// Row-major elements of a CPU tensor, gathered through its strides.
std::vector<Element> values_of(const Tensor& t) {
  std::vector<Element> out(static_cast<size_t>(t.numel()));
  if (t.is_floating_point()) {
    const std::vector<double> v = t.to_vector<double>();
    for (size_t k = 0; k < v.size(); ++k)
      out[k].d = v[k];
  } else {
    const std::vector<int64_t> v = t.to_vector<int64_t>();
    for (size_t k = 0; k < v.size(); ++k)
      out[k].i = v[k];
  }
  return out;
}

// Indices shown along a dim of size n.
std::vector<int64_t> shown_indices(int64_t n, bool summarize) {
  std::vector<int64_t> idx;
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i)
      idx.push_back(i);
    for (int64_t i = n - kEdgeItems; i < n; ++i)
      idx.push_back(i);
  } else {
    for (int64_t i = 0; i < n; ++i)
      idx.push_back(i);
  }
  return idx;
}

// The shown values of `t` (all of them unless summarizing), for the formatter.
void collect_shown(const Tensor& t, bool summarize, std::vector<Element>& out) {
  if (t.dim() <= 1) {
    const std::vector<Element> all = values_of(t);
    if (t.dim() == 0) {
      out.push_back(all[0]);
      return;
    }
    for (int64_t i : shown_indices(t.size(0), summarize))
      out.push_back(all[i]);
    return;
  }
  for (int64_t i : shown_indices(t.size(0), summarize))
    collect_shown(t.select(0, i), summarize, out);
}

std::string vector_str(const Tensor& t, int64_t indent, bool summarize, const Formatter& fmt) {
  const int64_t element_length = fmt.width() + 2;
  const int64_t per_line = std::max<int64_t>(1, (kLineWidth - indent) / element_length);
  const std::vector<Element> values = values_of(t);
  std::vector<std::string> data;
  const int64_t n = t.size(0);
  if (summarize && n > 2 * kEdgeItems) {
    for (int64_t i = 0; i < kEdgeItems; ++i)
      data.push_back(fmt.format(values[i]));
    data.push_back(" ...");
    for (int64_t i = n - kEdgeItems; i < n; ++i)
      data.push_back(fmt.format(values[i]));
  } else {
    for (const Element& e : values)
      data.push_back(fmt.format(e));
  }
  std::string out = "[";
  for (size_t i = 0; i < data.size(); ++i) {
    if (i > 0) {
      if (static_cast<int64_t>(i) % per_line == 0) {
        out.append(",\n").append(static_cast<size_t>(indent + 1), ' ');
      } else {
        out.append(", ");
      }
    }
    out += data[i];
  }
  return out + "]";
}

std::string tensor_str(const Tensor& t, int64_t indent, bool summarize, const Formatter& fmt) {
  if (t.dim() == 0) return fmt.format(values_of(t)[0]);
  if (t.dim() == 1) return vector_str(t, indent, summarize, fmt);
  std::vector<std::string> slices;
  const int64_t n = t.size(0);
  const bool cut = summarize && n > 2 * kEdgeItems;
  for (int64_t i : shown_indices(n, summarize)) {
    if (cut && i == n - kEdgeItems) slices.push_back("...");
    slices.push_back(tensor_str(t.select(0, i), indent + 1, summarize, fmt));
  }
  std::string sep(",");
  sep.append(static_cast<size_t>(t.dim() - 1), '\n').append(static_cast<size_t>(indent + 1), ' ');
  std::string out = "[";
  for (size_t i = 0; i < slices.size(); ++i) {
    if (i > 0) out += sep;
    out += slices[i];
  }
  return out + "]";
}

// Appends ", suffix" or, past the line width, ",\n<indent>suffix" (as _add_suffixes).
std::string add_suffixes(std::string body, const std::vector<std::string>& suffixes,
                         int64_t indent) {
  const size_t nl = body.rfind('\n');
  // PyTorch counts the last line as len - rfind + 1, where rfind is -1 without a newline.
  int64_t last_line_len = static_cast<int64_t>(body.size()) -
                          (nl == std::string::npos ? -1 : static_cast<int64_t>(nl)) + 1;
  for (const std::string& suffix : suffixes) {
    const int64_t len = static_cast<int64_t>(suffix.size());
    if (last_line_len + len + 2 > kLineWidth) {
      body.append(",\n").append(static_cast<size_t>(indent), ' ').append(suffix);
      last_line_len = indent + len;
    } else {
      body.append(", ").append(suffix);
      last_line_len += len + 2;
    }
  }
  return body + ")";
}

}  // namespace

std::string Tensor::shape_string() const {
  return defined() ? shape_to_string(sizes()) : std::string("(undefined)");
}

std::string Tensor::to_string() const {
  if (!defined()) return "Tensor(undefined)";
  if (is_sparse()) return detail::sparse_to_string(*this);
  const Tensor host = is_cuda() ? to(Device::cpu()) : *this;
  const std::string prefix = "tensor(";
  const int64_t indent = static_cast<int64_t>(prefix.size());
  std::vector<std::string> suffixes;
  if (!device().is_cpu())
    suffixes.push_back(std::string("device='").append(device().str()).append("'"));
  std::string body;
  if (numel() == 0) {
    if (dim() != 1) {
      // A Python tuple: "(0, 3)", and "(0,)" for one dim is never needed here.
      std::string size = "size=(";
      for (int64_t d = 0; d < dim(); ++d)
        size += (d ? ", " : "") + std::to_string(sizes()[d]);
      suffixes.push_back(size + ")");
    }
    if (dtype() != kFloat32) suffixes.push_back(std::string("dtype=").append(dtype_name(dtype())));
    body = "[]";
  } else {
    const bool summarize = numel() > kThreshold;
    std::vector<Element> shown;
    collect_shown(host, summarize, shown);
    const Formatter fmt(dtype(), shown);
    if (dtype() != kFloat32 && dtype() != kInt64 && dtype() != kBool) {
      suffixes.push_back(std::string("dtype=").append(dtype_name(dtype())));
    }
    body = tensor_str(host, indent, summarize, fmt);
  }
  return add_suffixes(prefix + body, suffixes, indent);
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.to_string();
}

}  // namespace gradwire
