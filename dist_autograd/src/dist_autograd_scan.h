// What a peer's dist_autograd message may name, counted on its wire format before Protobuf
// parses it (gradwire/rpc/payload_scan.h): a packed run of N one-byte ids would otherwise
// become N 8-byte integers. Every repeated field of dist_autograd/proto/dist_autograd.proto
// has its limit here; tests/security/peer_message_scan_test.cc sends too many of each field
// the .proto has, so a field added there without one here fails it.
//
// Thread-safety: a pure function.
// Errors: check_message_counts throws CallRejected("malformed dist_autograd message: ...")
// naming the field and its limit, or saying that the payload does not parse.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace gradwire::dist_autograd::internal {

// Discover.message_ids: the sends one worker made to another in a context, as many as rpc/
// allows values in one message.
inline constexpr size_t kMaxDiscoveredSends = size_t{1} << 20;

// The largest count any repeated field may reach (the tests send one more).
inline constexpr size_t kMaxRepeatedElements = kMaxDiscoveredSends;

// Refuses `payload` (a DistAutogradMessage) when a repeated field holds more elements than
// its limit, or when it is not well-formed wire format.
void check_message_counts(std::string_view payload);

}  // namespace gradwire::dist_autograd::internal
