// Scalar: a C++ number passed to a tensor op (a + 2.5, x.fill_(0), full(shape, 7)).
//
// A Scalar remembers whether it came from a bool, an integer or a floating-point value,
// because type promotion uses that category (int32 tensor + 2.5 is float32, int32 tensor +
// 2 stays int32; see dtype.h).
//
// Thread-safety: a plain value.
#pragma once

#include <cstdint>
#include <ostream>
#include <type_traits>

#include "gradwire/tensor/dtype.h"

namespace gradwire {

class Scalar {
 public:
  enum class Kind : uint8_t { kBool, kInt, kFloat };

  Scalar() : Scalar(int64_t{0}) {}
  Scalar(bool v) : kind_(Kind::kBool), i_(v ? 1 : 0), d_(v ? 1.0 : 0.0) {}  // NOLINT
  template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>,
                                         int> = 0>
  Scalar(T v)  // NOLINT
      : kind_(Kind::kInt), i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)) {}
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v)  // NOLINT
      : kind_(Kind::kFloat), i_(static_cast<int64_t>(v)), d_(static_cast<double>(v)) {}
  Scalar(Half v) : Scalar(static_cast<float>(v)) {}       // NOLINT
  Scalar(BFloat16 v) : Scalar(static_cast<float>(v)) {}   // NOLINT

  Kind kind() const { return kind_; }
  bool is_floating_point() const { return kind_ == Kind::kFloat; }
  bool is_integral() const { return kind_ == Kind::kInt; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }
  bool to_bool() const { return kind_ == Kind::kFloat ? d_ != 0.0 : i_ != 0; }

  // The value converted to element type T (integers exactly, floats by static_cast).
  template <typename T>
  T to() const {
    if constexpr (std::is_same_v<T, bool>) {
      return to_bool();
    } else if constexpr (std::is_integral_v<T>) {
      return kind_ == Kind::kFloat ? static_cast<T>(d_) : static_cast<T>(i_);
    } else if constexpr (std::is_same_v<T, double>) {
      return kind_ == Kind::kFloat ? d_ : static_cast<double>(i_);
    } else {
      return T(static_cast<float>(kind_ == Kind::kFloat ? d_ : static_cast<double>(i_)));
    }
  }

  // The dtype a tensor made from this scalar alone gets: bool, int64 or float32.
  DType default_dtype() const {
    return kind_ == Kind::kBool ? kBool : kind_ == Kind::kInt ? kInt64 : kFloat32;
  }

 private:
  Kind kind_;
  int64_t i_;
  double d_;
};

std::ostream& operator<<(std::ostream& os, const Scalar& s);

}  // namespace gradwire
