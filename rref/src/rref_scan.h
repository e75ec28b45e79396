// What a peer's rref message may name, counted on its wire format before Protobuf parses it
// (gradwire/rpc/payload_scan.h): a packed run of N one-byte ids would otherwise become N
// 8-byte integers. Every repeated field of rref/proto/rref.proto has its limit here;
// tests/security/peer_message_scan_test.cc sends too many of each field the .proto has, so
// a field added there without one here fails it.
//
// Thread-safety: a pure function.
// Errors: check_message_counts throws CallRejected("malformed rref message: ...") naming
// the field and its limit, or saying that the payload does not parse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradwire::rref {

// ChildAccepted.fork_ids: a worker sends one per message; the rest is room for batches.
inline constexpr size_t kMaxAcceptedForks = size_t{1} << 16;

// The largest count any repeated field may reach (the tests send one more).
inline constexpr size_t kMaxRepeatedElements = kMaxAcceptedForks;

// Refuses `payload` (an RRefMessage) when a repeated field holds more elements than its
// limit, or when it is not well-formed wire format.
void check_message_counts(std::string_view payload);

}  // namespace gradwire::rref
