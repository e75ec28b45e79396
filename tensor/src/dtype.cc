#include "gradwire/tensor/dtype.h"

#include <array>

#include "dispatch.h"
#include "gradwire/core/check.h"
#include "gradwire/tensor/device.h"
#include "gradwire/tensor/scalar.h"
#include "kernels.h"

namespace gradwire {

namespace {
constexpr std::array<std::string_view, kNumDTypes> kNames = {
    "float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8", "bool"};

// Rank on the promotion lattice; float16 and bfloat16 share a rank.
int rank(DType t) {
  switch (t) {
    case DType::kBool: return 0;
    case DType::kUInt8: return 1;
    case DType::kInt32: return 2;
    case DType::kInt64: return 3;
    case DType::kFloat16:
    case DType::kBFloat16: return 4;
    case DType::kFloat32: return 5;
    case DType::kFloat64: return 6;
  }
  return 0;
}
}  // namespace

std::string_view dtype_name(DType t) { return kNames[static_cast<size_t>(t)]; }

std::ostream& operator<<(std::ostream& os, DType t) { return os << dtype_name(t); }

DType parse_dtype(std::string_view name) {
  for (size_t i = 0; i < kNames.size(); ++i) {
    if (kNames[i] == name) return static_cast<DType>(i);
  }
  if (name == "float" ) return kFloat32;
  if (name == "double") return kFloat64;
  if (name == "half") return kFloat16;
  if (name == "long") return kInt64;
  if (name == "int") return kInt32;
  GRADWIRE_THROW(InvalidArgument)
      << "unknown dtype '" << name
      << "': expected one of float32, float64, float16, bfloat16, int32, int64, uint8, bool";
}

DType dtype_from_index(int value) {
  GRADWIRE_CHECK_ARG(value >= 0 && value < kNumDTypes)
      << "dtype code " << value << " is out of range [0, " << kNumDTypes << ")";
  return static_cast<DType>(value);
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == kFloat16 && b == kBFloat16) || (a == kBFloat16 && b == kFloat16)) return kFloat32;
  return rank(a) >= rank(b) ? a : b;
}

bool can_cast(DType from, DType to) {
  if (is_floating_point(from) && !is_floating_point(to)) return false;
  if (from != kBool && to == kBool) return false;
  return true;
}

std::ostream& operator<<(std::ostream& os, const Scalar& s) {
  switch (s.kind()) {
    case Scalar::Kind::kBool: return os << (s.to_bool() ? "true" : "false");
    case Scalar::Kind::kInt: return os << s.to_int();
    case Scalar::Kind::kFloat: return os << s.to_double();
  }
  return os;
}

std::string Device::str() const {
  return is_cpu() ? std::string("cpu") : "cuda:" + std::to_string(index);
}

std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

Device parse_device(std::string_view text) {
  if (text == "cpu") return Device::cpu();
  if (text == "cuda") return Device::cuda(0);
  if (text.substr(0, 5) == "cuda:" && text.size() > 5 && text.size() <= 10) {
    int index = 0;
    for (char c : text.substr(5)) {
      if (c < '0' || c > '9') {
        index = -1;
        break;
      }
      index = index * 10 + (c - '0');
    }
    if (index >= 0 && index <= 32767) return Device::cuda(index);
  }
  GRADWIRE_THROW(InvalidArgument) << "bad device '" << text
                                  << "': expected 'cpu', 'cuda' or 'cuda:N'";
}

int cuda_device_count() {
#if GRADWIRE_HAS_CUDA
  return detail::cuda::device_count();
#else
  return 0;
#endif
}

namespace detail {
void throw_unsupported_dtype(const char* op, DType t, const char* accepted) {
  GRADWIRE_THROW(InvalidArgument) << op << ": dtype " << dtype_name(t)
                                  << " is not supported (accepts " << accepted << ")";
}
}  // namespace detail

}  // namespace gradwire
