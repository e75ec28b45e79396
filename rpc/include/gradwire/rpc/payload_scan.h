// Counting what Protobuf would build from a module's own message (Request::payload) before
// it is parsed.
//
// Protobuf allocates for what a payload names, not for what it weighs: a packed repeated
// uint64 of N one-byte varints becomes N 8-byte integers, and N empty repeated sub-messages
// become N objects. rpc/ scans its envelope that way before parsing it; a module above that
// parses a payload of its own counts the elements of each repeated field with
// count_repeated first, and refuses a message that names more than it will build.
// count_repeated walks the payload's wire format without allocating.
//
// Thread-safety: a pure function.
// Errors: none thrown; nullopt for a payload that is not well-formed wire format (a length
// past its message, a group, a truncated field), which Protobuf would refuse too.
//
// Example:
//   // Message { Discover discover = 1; }  Discover { repeated uint64 message_ids = 3; }
//   constexpr uint32_t kMessageIds[] = {1, 3};
//   std::optional<size_t> n = rpc::count_repeated(payload, kMessageIds,
//   rpc::RepeatedKind::kVarint); if (!n || *n > kMaxMessageIds) ... refuse it ...
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace gradwire::rpc {

// How the counted field's elements travel: varint scalars (int32, int64, uint32, uint64,
// sint32, sint64, bool, enums), fixed-width ones (fixed32, sfixed32, float; fixed64,
// sfixed64, double), or length-delimited elements (messages, strings, bytes).
enum class RepeatedKind { kVarint, kFixed32, kFixed64, kLengthDelimited };

// The elements of the repeated field at `path` in `payload`: path[0] is a field of the top
// message, path[1] a field of that sub-message, and so on; the last is the repeated field,
// of `kind`, packed or not. Every occurrence of each message on the way is walked (Protobuf
// merges a sub-message seen twice, appending the elements of each), so the count is never
// below what the parse builds. An empty path counts nothing.
std::optional<size_t> count_repeated(std::string_view payload, std::span<const uint32_t> path,
                                     RepeatedKind kind);

}  // namespace gradwire::rpc
