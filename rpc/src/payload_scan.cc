// count_repeated (gradwire/rpc/payload_scan.h): Protobuf's wire format walked by hand, as
// envelope_scan.cc walks the envelope, along one path of field numbers.
#include "gradwire/rpc/payload_scan.h"

#include "wire_reader.h"

namespace gradwire::rpc {
namespace {

using detail::kFixed32;
using detail::kFixed64;
using detail::kLengthDelimited;
using detail::kVarint;
using detail::read_varint;

// The elements of one packed run of `size` bytes at `p`.
size_t packed_elements(const uint8_t* p, size_t size, RepeatedKind kind) {
  switch (kind) {
    case RepeatedKind::kVarint: {
      size_t n = 0;  // one per byte that ends a varint
      for (size_t i = 0; i < size; ++i)
        n += (p[i] & 0x80) == 0 ? 1 : 0;
      return n;
    }
    case RepeatedKind::kFixed32:
      return (size + 3) / 4;
    case RepeatedKind::kFixed64:
      return (size + 7) / 8;
    case RepeatedKind::kLengthDelimited:
      break;
  }
  return 1;  // one message, string or bytes
}

// Adds to `n` the elements of path.back() in the message [p, end) (at path's first level);
// false when that message is not well-formed wire format.
bool walk(const uint8_t* p, const uint8_t* end, std::span<const uint32_t> path, RepeatedKind kind,
          size_t& n) {
  const bool last = path.size() == 1;
  while (p < end) {
    uint64_t tag = 0;
    if (!read_varint(p, end, tag)) return false;
    const uint64_t field = tag >> 3;
    const auto type = static_cast<uint32_t>(tag & 7);
    if (field == 0) return false;
    const bool counted = last && field == path[0];
    switch (type) {
      case kVarint: {
        uint64_t v = 0;
        if (!read_varint(p, end, v)) return false;
        if (counted && kind == RepeatedKind::kVarint) ++n;
        break;
      }
      case kFixed64:
        if (end - p < 8) return false;
        p += 8;
        if (counted && kind == RepeatedKind::kFixed64) ++n;
        break;
      case kFixed32:
        if (end - p < 4) return false;
        p += 4;
        if (counted && kind == RepeatedKind::kFixed32) ++n;
        break;
      case kLengthDelimited: {
        uint64_t len = 0;
        if (!read_varint(p, end, len) || len > static_cast<uint64_t>(end - p)) return false;
        const uint8_t* body = p;
        p += len;
        if (field != path[0]) break;
        if (last) {
          n += packed_elements(body, static_cast<size_t>(len), kind);
        } else if (!walk(body, p, path.subspan(1), kind, n)) {
          return false;
        }
        break;
      }
      default:
        return false;  // groups and the unused wire types
    }
  }
  return true;
}

}  // namespace

std::optional<size_t> count_repeated(std::string_view payload, std::span<const uint32_t> path,
                                     RepeatedKind kind) {
  if (path.empty()) return 0;
  const auto* p = reinterpret_cast<const uint8_t*>(payload.data());
  size_t n = 0;
  if (!walk(p, p + payload.size(), path, kind, n)) return std::nullopt;
  return n;
}

}  // namespace gradwire::rpc
