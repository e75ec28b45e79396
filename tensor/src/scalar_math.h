// Scalar arithmetic shared by the CPU kernels and the CUDA kernels, so that both devices
// give bit-identical integer results.
#pragma once

#include <cstdint>
#include <type_traits>

#include "gradwire/tensor/dtype.h"

namespace gradwire::detail {

// Integer power by squaring modulo 2^64 (whose low bits are those of the power modulo
// 2^bits, so it wraps like repeated multiplication). A negative exponent gives the
// truncated real power: 1 for base 1, +-1 for base -1, 0 otherwise.
template <typename C>
GRADWIRE_HOST_DEVICE inline C int_pow(C base, int64_t exponent) {
  if constexpr (std::is_same_v<C, bool>) {
    return base || exponent == 0;
  } else {
    if (exponent < 0) {
      if (base == C(1)) return C(1);
      if constexpr (std::is_signed_v<C>) {
        if (base == C(-1)) return (exponent % 2 != 0) ? C(-1) : C(1);
      }
      return C(0);
    }
    uint64_t result = 1;
    uint64_t b = static_cast<uint64_t>(static_cast<int64_t>(base));
    uint64_t e = static_cast<uint64_t>(exponent);
    while (e != 0) {
      if (e & 1u) result *= b;
      b *= b;
      e >>= 1;
    }
    return static_cast<C>(result);
  }
}

}  // namespace gradwire::detail
