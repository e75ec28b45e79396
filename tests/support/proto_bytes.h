// Protobuf's wire format written by hand, for tests that send what a hostile or confused
// peer would: bytes no generated encoder would produce (empty repeated fields by the
// million, lengths past their message, groups), or a module's message built without its
// private generated header.
//
// Thread-safety: pure functions.
//
// Example:
//   std::string m;
//   proto_bytes::tag(m, 4, proto_bytes::kLengthDelimited);
//   proto_bytes::varint(m, 0);   // an empty field 4
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace gradwire::test::proto_bytes {

inline constexpr uint32_t kVarint = 0;
inline constexpr uint32_t kLengthDelimited = 2;

inline void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

inline void tag(std::string& out, uint32_t field, uint32_t wire_type) {
  varint(out, (uint64_t{field} << 3) | wire_type);
}

inline void length_delimited(std::string& out, uint32_t field, const std::string& body) {
  tag(out, field, kLengthDelimited);
  varint(out, body.size());
  out += body;
}

// A message whose field `field` is a sub-message of varint fields (number, value): the
// shape of dist_autograd's and rref's oneof messages.
inline std::string oneof_message(uint32_t field,
                                 const std::vector<std::pair<uint32_t, uint64_t>>& fields) {
  std::string body;
  for (const auto& [number, value] : fields) {
    tag(body, number, kVarint);
    varint(body, value);
  }
  std::string out;
  length_delimited(out, field, body);
  return out;
}

}  // namespace gradwire::test::proto_bytes
