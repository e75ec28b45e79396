// Element types of tensors, the two 16-bit float formats, and type promotion.
//
// DType names the eight element types gradwire supports. Arithmetic between tensors of
// different dtypes promotes to a common type along this lattice (the same rules PyTorch
// documents for torch.result_type):
//
//   bool < uint8 < int32 < int64 < float16, bfloat16 < float32 < float64
//   float16 with bfloat16 gives float32.
//
// Categories rank bool < integral < floating. When operands of different kinds meet
// (see result_type in ops.h): tensors with one or more dimensions decide the dtype; a
// zero-dimensional tensor or a C++ scalar only changes it when its category is higher
// (then a scalar gives the default of its category: float32 or int64).
//
// Half and BFloat16 are storage types: arithmetic converts them to float, computes, and
// rounds back to nearest-even.
//
// Thread-safety: all functions here are pure.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string>
#include <string_view>

#if defined(__CUDACC__)
#define GRADWIRE_HOST_DEVICE __host__ __device__
#else
#define GRADWIRE_HOST_DEVICE
#endif

namespace gradwire {

enum class DType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kBool = 7,
};
inline constexpr int kNumDTypes = 8;

constexpr DType kFloat32 = DType::kFloat32;
constexpr DType kFloat64 = DType::kFloat64;
constexpr DType kFloat16 = DType::kFloat16;
constexpr DType kBFloat16 = DType::kBFloat16;
constexpr DType kInt32 = DType::kInt32;
constexpr DType kInt64 = DType::kInt64;
constexpr DType kUInt8 = DType::kUInt8;
constexpr DType kBool = DType::kBool;

// IEEE 754 binary16.
struct Half {
  uint16_t bits = 0;
  Half() = default;
  GRADWIRE_HOST_DEVICE Half(float value) : bits(from_float(value)) {}  // NOLINT
  GRADWIRE_HOST_DEVICE operator float() const { return to_float(bits); }  // NOLINT
  static constexpr Half from_bits(uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }

  GRADWIRE_HOST_DEVICE static float to_float(uint16_t h) {
    uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    uint32_t out;
    if (exp == 0) {
      if (mant == 0) {
        out = sign;
      } else {  // subnormal: normalise
        exp = 127 - 15 + 1;
        while ((mant & 0x400u) == 0) {
          mant <<= 1;
          --exp;
        }
        mant &= 0x3FFu;
        out = sign | (exp << 23) | (mant << 13);
      }
    } else if (exp == 0x1F) {
      out = sign | 0x7F800000u | (mant << 13);  // inf or nan
    } else {
      out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &out, sizeof f);
    return f;
  }

  GRADWIRE_HOST_DEVICE static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7FFFFFFFu;
    if (absx >= 0x7F800000u) {  // inf or nan
      return static_cast<uint16_t>(sign | 0x7C00u | (absx > 0x7F800000u ? 0x200u : 0u));
    }
    if (absx >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // overflow
    if (absx < 0x38800000u) {  // result is subnormal or zero
      if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
      // value = M * 2^(e-150) and a half subnormal counts units of 2^-24.
      uint32_t exp = absx >> 23;
      uint32_t mant = (absx & 0x7FFFFFu) | 0x800000u;
      uint32_t shift = 126 - exp;  // 14..24
      uint32_t result = mant >> shift;
      uint32_t rem = mant & ((1u << shift) - 1);
      uint32_t halfway = 1u << (shift - 1);
      if (rem > halfway || (rem == halfway && (result & 1u))) ++result;
      return static_cast<uint16_t>(sign | result);
    }
    uint32_t result = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (result & 1u))) ++result;
    return static_cast<uint16_t>(sign | result);
  }
};

// bfloat16: the upper half of an IEEE binary32.
struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  GRADWIRE_HOST_DEVICE BFloat16(float value) : bits(from_float(value)) {}  // NOLINT
  GRADWIRE_HOST_DEVICE operator float() const { return to_float(bits); }  // NOLINT
  static constexpr BFloat16 from_bits(uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }
  GRADWIRE_HOST_DEVICE static float to_float(uint16_t b) {
    uint32_t x = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &x, sizeof f);
    return f;
  }
  GRADWIRE_HOST_DEVICE static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof x);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
    uint32_t rounding = 0x7FFFu + ((x >> 16) & 1u);
    return static_cast<uint16_t>((x + rounding) >> 16);
  }
};

// Bytes per element.
constexpr int64_t element_size(DType t) {
  switch (t) {
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kUInt8:
    case DType::kBool:
      return 1;
  }
  return 1;
}

constexpr bool is_floating_point(DType t) {
  return t == DType::kFloat32 || t == DType::kFloat64 || t == DType::kFloat16 ||
         t == DType::kBFloat16;
}
constexpr bool is_integral(DType t, bool include_bool = false) {
  return t == DType::kInt32 || t == DType::kInt64 || t == DType::kUInt8 ||
         (include_bool && t == DType::kBool);
}

// "float32", "int64", ... (also the spelling parse_dtype accepts).
std::string_view dtype_name(DType t);
std::ostream& operator<<(std::ostream& os, DType t);
// Parses a dtype name; throws InvalidArgument naming the text and the accepted names.
DType parse_dtype(std::string_view name);
// The dtype for a raw wire value; throws InvalidArgument when out of range.
DType dtype_from_index(int value);

// The smallest dtype both a and b convert to without losing their category.
DType promote_types(DType a, DType b);
// Whether a value computed in `from` may be written into a tensor of dtype `to` by an
// in-place op (no float -> integral, no non-bool -> bool), as PyTorch allows.
bool can_cast(DType from, DType to);

// C++ element type <-> DType.
template <typename T>
struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::kFloat32; };
template <> struct DTypeOf<double> { static constexpr DType value = DType::kFloat64; };
template <> struct DTypeOf<Half> { static constexpr DType value = DType::kFloat16; };
template <> struct DTypeOf<BFloat16> { static constexpr DType value = DType::kBFloat16; };
template <> struct DTypeOf<int32_t> { static constexpr DType value = DType::kInt32; };
template <> struct DTypeOf<int64_t> { static constexpr DType value = DType::kInt64; };
template <> struct DTypeOf<uint8_t> { static constexpr DType value = DType::kUInt8; };
template <> struct DTypeOf<bool> { static constexpr DType value = DType::kBool; };
template <typename T>
inline constexpr DType dtype_of = DTypeOf<T>::value;

}  // namespace gradwire
