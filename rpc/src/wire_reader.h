// Reading Protobuf's wire format by hand, for the pre-scans that walk a payload before
// Protobuf parses it (envelope_scan.cc, payload_scan.cc).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>

namespace gradwire::rpc::detail {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Reads one varint at `p` (advanced past it) into `out`; false when it runs past `end` or
// takes more than ten bytes.
inline bool read_varint(const uint8_t*& p, const uint8_t* end, uint64_t& out) {
  out = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (p == end) return false;
    const uint8_t b = *p++;
    out |= uint64_t{b & 0x7fu} << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

}  // namespace gradwire::rpc::detail
