// DType helpers, the float16 and bfloat16 formats, promotion and casting tables, and the
// parsers for dtype and device names.
//
// Bit patterns are worked out by hand from the IEEE layouts:
//   float16:  1 sign, 5 exponent (bias 15), 10 mantissa bits
//   bfloat16: 1 sign, 8 exponent (bias 127), 7 mantissa bits (the top half of a float32)
// All conversions are exact or correctly rounded, so every check is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/device.h"
#include "gradwire/tensor/dtype.h"

namespace gradwire {
namespace {

float from_bits32(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
uint32_t bits32(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}
uint16_t half_bits(double v) {
  return Half(static_cast<float>(v)).bits;
}
uint16_t bf16_bits(double v) {
  return BFloat16(static_cast<float>(v)).bits;
}

template <typename Fn>
void expect_invalid(Fn&& fn, const std::vector<std::string>& pieces) {
  try {
    fn();
    ADD_FAILURE() << "expected InvalidArgument containing '" << pieces.front() << "'";
  } catch (const InvalidArgument& e) {
    for (const std::string& p : pieces) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message '" << e.what() << "' lacks '" << p << "'";
    }
  }
}

// ---------------------------------------------------------------- float16

TEST(DTypeHalf, KnownValues) {
  EXPECT_EQ(half_bits(0.0), 0x0000);
  EXPECT_EQ(half_bits(-0.0), 0x8000);
  EXPECT_EQ(half_bits(1.0), 0x3C00);                          // exponent 15, mantissa 0
  EXPECT_EQ(half_bits(-2.0), 0xC000);                         // sign, exponent 16
  EXPECT_EQ(half_bits(0.5), 0x3800);                          // exponent 14
  EXPECT_EQ(half_bits(1.5), 0x3E00);                          // mantissa 0x200
  EXPECT_EQ(half_bits(65504.0), 0x7BFF);                      // largest finite: (2 - 2^-10) * 2^15
  EXPECT_EQ(half_bits(std::ldexp(1.0, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(half_bits(std::ldexp(1.0, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(half_bits(1023 * std::ldexp(1.0, -24)), 0x03FF);  // largest subnormal
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x3555)), 0.333251953125f);  // 1365 * 2^-12
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x0001)), std::ldexp(1.0f, -24));
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x0200)), std::ldexp(1.0f, -15));
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x83FF)), -1023 * std::ldexp(1.0f, -24));
  EXPECT_EQ(static_cast<float>(Half::from_bits(0x7BFF)), 65504.0f);
}

TEST(DTypeHalf, EveryNonNanBitPatternRoundTrips) {
  int nans = 0;
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const Half h = Half::from_bits(static_cast<uint16_t>(b));
    const float f = h;
    const bool is_nan = ((b >> 10) & 0x1F) == 0x1F && (b & 0x3FF) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << b;
      EXPECT_TRUE(std::isnan(static_cast<float>(Half(f)))) << std::hex << b;
      ++nans;
      continue;
    }
    ASSERT_EQ(Half(f).bits, b) << std::hex << "bits 0x" << b << " -> " << f;
  }
  EXPECT_EQ(nans, 2 * 1023);
}

TEST(DTypeHalf, RoundsToNearestEvenAtHalfway) {
  // Between 1 (0x3C00) and 1 + 2^-10 (0x3C01) the halfway point 1 + 2^-11 goes to the even
  // 0x3C00; between 0x3C01 and 0x3C02 the halfway 1 + 3 * 2^-11 goes to the even 0x3C02.
  EXPECT_EQ(half_bits(1 + std::ldexp(1.0, -11)), 0x3C00);
  EXPECT_EQ(half_bits(1 + 3 * std::ldexp(1.0, -11)), 0x3C02);
  // Just off halfway rounds to the nearer neighbour.
  EXPECT_EQ(half_bits(1 + std::ldexp(1.0, -11) + std::ldexp(1.0, -20)), 0x3C01);
  EXPECT_EQ(half_bits(1 + std::ldexp(1.0, -11) - std::ldexp(1.0, -20)), 0x3C00);
  // Rounding up may carry into the exponent: 2 - 2^-11 is halfway between 0x3BFF (odd)
  // and 2.0 (0x4000).
  EXPECT_EQ(half_bits(2 - std::ldexp(1.0, -11)), 0x4000);
  // Negative values mirror positive ones.
  EXPECT_EQ(half_bits(-(1 + 3 * std::ldexp(1.0, -11))), 0xBC02);
}

TEST(DTypeHalf, SubnormalsRoundToNearestEven) {
  const double tiny = std::ldexp(1.0, -24);  // one subnormal step
  EXPECT_EQ(half_bits(tiny / 2), 0x0000);    // halfway 0 / 0x0001: even 0
  EXPECT_EQ(half_bits(tiny / 2 * 1.0001), 0x0001);
  EXPECT_EQ(half_bits(3 * tiny / 2), 0x0002);  // halfway 0x0001 / 0x0002: even 2
  EXPECT_EQ(half_bits(5 * tiny / 2), 0x0002);  // halfway 0x0002 / 0x0003: even 2
  EXPECT_EQ(half_bits(tiny / 4), 0x0000);
  EXPECT_EQ(half_bits(-3 * tiny / 2), 0x8002);
  // The largest subnormal plus half a step rounds up into the smallest normal (even).
  EXPECT_EQ(half_bits(1023.5 * tiny), 0x0400);
  EXPECT_EQ(half_bits(std::ldexp(1.0, -30)), 0x0000);
}

TEST(DTypeHalf, InfinityNanAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Half(inf).bits, 0x7C00);
  EXPECT_EQ(Half(-inf).bits, 0xFC00);
  EXPECT_TRUE(std::isinf(static_cast<float>(Half::from_bits(0x7C00))));
  EXPECT_TRUE(std::isnan(static_cast<float>(Half(std::nanf("")))));
  // 65520 is halfway between 65504 (0x7BFF, odd) and 65536, which is out of range: it
  // rounds to the even neighbour, infinity. Just below stays finite.
  EXPECT_EQ(half_bits(65519.0), 0x7BFF);
  EXPECT_EQ(half_bits(65520.0), 0x7C00);
  EXPECT_EQ(half_bits(1e6), 0x7C00);
  EXPECT_EQ(half_bits(-1e6), 0xFC00);
  EXPECT_EQ(Half(std::numeric_limits<float>::max()).bits, 0x7C00);
}

// ---------------------------------------------------------------- bfloat16

TEST(DTypeBFloat16, KnownValues) {
  EXPECT_EQ(bf16_bits(1.0), 0x3F80);
  EXPECT_EQ(bf16_bits(-2.0), 0xC000);
  EXPECT_EQ(bf16_bits(0.0), 0x0000);
  EXPECT_EQ(bf16_bits(-0.0), 0x8000);
  EXPECT_EQ(bf16_bits(3.0), 0x4040);
  EXPECT_EQ(static_cast<float>(BFloat16::from_bits(0x3FC0)), 1.5f);
  EXPECT_EQ(static_cast<float>(BFloat16::from_bits(0x7F7F)), from_bits32(0x7F7F0000));
  // 1/3 = 0x3EAAAAAB as float32; the dropped half 0xAAAB is above 0x8000: round up.
  EXPECT_EQ(bf16_bits(1.0 / 3.0), 0x3EAB);
}

TEST(DTypeBFloat16, EveryNonNanBitPatternRoundTrips) {
  for (uint32_t b = 0; b <= 0xFFFF; ++b) {
    const float f = BFloat16::from_bits(static_cast<uint16_t>(b));
    EXPECT_EQ(bits32(f), b << 16);
    const bool is_nan = ((b >> 7) & 0xFF) == 0xFF && (b & 0x7F) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(f)))) << std::hex << b;
    } else {
      ASSERT_EQ(BFloat16(f).bits, b) << std::hex << b;
    }
  }
}

TEST(DTypeBFloat16, RoundsToNearestEvenAtHalfway) {
  // float32 0x3F808000 = 1 + 2^-8 lies halfway between 0x3F80 (even) and 0x3F81.
  EXPECT_EQ(BFloat16(from_bits32(0x3F808000)).bits, 0x3F80);
  // 0x3F818000 = 1 + 3 * 2^-8 lies halfway between 0x3F81 (odd) and 0x3F82 (even).
  EXPECT_EQ(BFloat16(from_bits32(0x3F818000)).bits, 0x3F82);
  EXPECT_EQ(BFloat16(from_bits32(0x3F808001)).bits, 0x3F81);
  EXPECT_EQ(BFloat16(from_bits32(0x3F807FFF)).bits, 0x3F80);
  // Carry into the exponent: 0x3FFF8000 is halfway between 0x3FFF (odd) and 0x4000.
  EXPECT_EQ(BFloat16(from_bits32(0x3FFF8000)).bits, 0x4000);
  EXPECT_EQ(BFloat16(from_bits32(0xBF818000)).bits, 0xBF82);
}

TEST(DTypeBFloat16, SubnormalsInfinityNanOverflow) {
  // float32 subnormals keep their top bits: 0x000116C2 -> 0x0001 (dropped half below 0x8000).
  EXPECT_EQ(BFloat16(from_bits32(0x000116C2)).bits, 0x0001);
  EXPECT_EQ(BFloat16(from_bits32(0x00018000)).bits, 0x0002);  // halfway, odd 1 -> even 2
  EXPECT_EQ(BFloat16(from_bits32(0x00008000)).bits, 0x0000);  // halfway, even 0
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(BFloat16(inf).bits, 0x7F80);
  EXPECT_EQ(BFloat16(-inf).bits, 0xFF80);
  // float32's largest finite value 0x7F7FFFFF drops 0xFFFF > 0x8000: rounds up to inf.
  EXPECT_EQ(BFloat16(std::numeric_limits<float>::max()).bits, 0x7F80);
  // The largest finite bfloat16 survives.
  EXPECT_EQ(BFloat16(from_bits32(0x7F7F0000)).bits, 0x7F7F);
  // NaN stays NaN, including a NaN whose payload lives only in the dropped low bits.
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(std::nanf("")))));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(from_bits32(0x7F800001)))));
  EXPECT_TRUE(std::isnan(static_cast<float>(BFloat16(from_bits32(0xFF800001)))));
}

// ---------------------------------------------------------------- sizes and categories

TEST(DTypeBasics, SizesAndCategories) {
  const std::map<DType, int64_t> sizes = {{kFloat32, 4},  {kFloat64, 8}, {kFloat16, 2},
                                          {kBFloat16, 2}, {kInt32, 4},   {kInt64, 8},
                                          {kUInt8, 1},    {kBool, 1}};
  for (const auto& [t, s] : sizes)
    EXPECT_EQ(element_size(t), s) << dtype_name(t);
  EXPECT_EQ(sizeof(Half), 2u);
  EXPECT_EQ(sizeof(BFloat16), 2u);
  for (DType t : {kFloat32, kFloat64, kFloat16, kBFloat16}) {
    EXPECT_TRUE(is_floating_point(t));
    EXPECT_FALSE(is_integral(t, true));
  }
  for (DType t : {kInt32, kInt64, kUInt8}) {
    EXPECT_FALSE(is_floating_point(t));
    EXPECT_TRUE(is_integral(t));
  }
  EXPECT_FALSE(is_integral(kBool));
  EXPECT_TRUE(is_integral(kBool, /*include_bool=*/true));
  EXPECT_FALSE(is_floating_point(kBool));
  EXPECT_EQ(dtype_of<float>, kFloat32);
  EXPECT_EQ(dtype_of<Half>, kFloat16);
  EXPECT_EQ(dtype_of<BFloat16>, kBFloat16);
  EXPECT_EQ(dtype_of<uint8_t>, kUInt8);
  EXPECT_EQ(dtype_of<bool>, kBool);
}

// ---------------------------------------------------------------- promotion and casting

TEST(DTypePromotion, FullTable) {
  // Rows and columns in the order f32, f64, f16, bf16, i32, i64, u8, b, written out by hand
  // from the lattice b < u8 < i32 < i64 < {f16, bf16} < f32 < f64 (f16 with bf16 is f32).
  const std::vector<DType> order = {kFloat32, kFloat64, kFloat16, kBFloat16,
                                    kInt32,   kInt64,   kUInt8,   kBool};
  const DType f = kFloat32, d = kFloat64, h = kFloat16, bf = kBFloat16, i = kInt32, l = kInt64,
              u = kUInt8, b = kBool;
  const std::vector<std::vector<DType>> table = {
      /* f32  */ {f, d, f, f, f, f, f, f},
      /* f64  */ {d, d, d, d, d, d, d, d},
      /* f16  */ {f, d, h, f, h, h, h, h},
      /* bf16 */ {f, d, f, bf, bf, bf, bf, bf},
      /* i32  */ {f, d, h, bf, i, l, i, i},
      /* i64  */ {f, d, h, bf, l, l, l, l},
      /* u8   */ {f, d, h, bf, i, l, u, u},
      /* bool */ {f, d, h, bf, i, l, u, b},
  };
  for (size_t r = 0; r < order.size(); ++r) {
    for (size_t c = 0; c < order.size(); ++c) {
      EXPECT_EQ(promote_types(order[r], order[c]), table[r][c])
          << dtype_name(order[r]) << " with " << dtype_name(order[c]);
    }
  }
}

TEST(DTypePromotion, CanCast) {
  const std::vector<DType> floats = {kFloat32, kFloat64, kFloat16, kBFloat16};
  const std::vector<DType> ints = {kInt32, kInt64, kUInt8};
  for (DType from : floats) {
    for (DType to : floats)
      EXPECT_TRUE(can_cast(from, to));  // narrowing within a kind is fine
    for (DType to : ints)
      EXPECT_FALSE(can_cast(from, to));
    EXPECT_FALSE(can_cast(from, kBool));
  }
  for (DType from : ints) {
    for (DType to : floats)
      EXPECT_TRUE(can_cast(from, to));
    for (DType to : ints)
      EXPECT_TRUE(can_cast(from, to));
    EXPECT_FALSE(can_cast(from, kBool));
  }
  for (DType to : {kFloat32, kFloat64, kFloat16, kBFloat16, kInt32, kInt64, kUInt8, kBool}) {
    EXPECT_TRUE(can_cast(kBool, to));
  }
}

// ---------------------------------------------------------------- names

TEST(DTypeNames, NamesParseBack) {
  const std::map<DType, std::string> names = {
      {kFloat32, "float32"}, {kFloat64, "float64"}, {kFloat16, "float16"}, {kBFloat16, "bfloat16"},
      {kInt32, "int32"},     {kInt64, "int64"},     {kUInt8, "uint8"},     {kBool, "bool"}};
  for (const auto& [t, name] : names) {
    EXPECT_EQ(dtype_name(t), name);
    EXPECT_EQ(parse_dtype(name), t);
    std::ostringstream os;
    os << t;
    EXPECT_EQ(os.str(), name);
    EXPECT_EQ(dtype_from_index(static_cast<int>(t)), t);
  }
  EXPECT_EQ(parse_dtype("float"), kFloat32);
  EXPECT_EQ(parse_dtype("double"), kFloat64);
  EXPECT_EQ(parse_dtype("half"), kFloat16);
  EXPECT_EQ(parse_dtype("long"), kInt64);
  EXPECT_EQ(parse_dtype("int"), kInt32);
}

TEST(DTypeNames, BadNamesAndCodes) {
  expect_invalid([] { parse_dtype("float33"); }, {"float33", "float32", "bool"});
  expect_invalid([] { parse_dtype(""); }, {"unknown dtype"});
  expect_invalid([] { parse_dtype("Float32"); }, {"Float32"});
  expect_invalid([] { dtype_from_index(8); }, {"8"});
  expect_invalid([] { dtype_from_index(-1); }, {"-1"});
}

// ---------------------------------------------------------------- devices

TEST(DeviceParse, GoodAndBad) {
  EXPECT_EQ(parse_device("cpu"), Device::cpu());
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(parse_device("cuda:32767"), Device::cuda(32767));
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_EQ(Device::cpu().str(), "cpu");
  std::ostringstream os;
  os << Device::cuda(1) << " " << Device::cpu();
  EXPECT_EQ(os.str(), "cuda:1 cpu");
  EXPECT_TRUE(parse_device("cpu").is_cpu());
  EXPECT_TRUE(parse_device("cuda:1").is_cuda());
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  for (const char* bad :
       {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda:99999", "CPU", "cpu:0", "cuda:1a", ""}) {
    expect_invalid([&] { parse_device(bad); }, {"'" + std::string(bad) + "'", "cuda:N"});
  }
}

}  // namespace
}  // namespace gradwire
