// A bounded pre-scan of a received envelope, run before Protobuf parses it.
//
// Protobuf's parser allocates for what a payload *names*, not for what it weighs: an empty
// repeated Value is two bytes on the wire and ~50 bytes in memory, so a 64 MiB payload of
// them would become gigabytes (and deeply nested ones would recurse). scan_envelope walks
// the payload's wire format against rpc/proto/envelope.proto's schema without allocating,
// counts every repeated element the parse would build (values, map entries, tensor
// descriptions, their dims and broadcast shapes, sparse tensors' dense shapes, extensions,
// loans) and the nesting, and
// refuses the payload when a count breaks EnvelopeLimits. Only then is it parsed, once. The
// scan also yields the header (request or response, and its id), so a refused message is
// answered without parsing it at all.
//
// tests/security/peer_message_scan_test.cc sends the scan too many elements of every
// repeated field envelope.proto has: a field added there without a count here fails it.
//
// What is counted is an upper bound of what the parse builds: Protobuf merges a repeated
// sub-message field seen twice, so the scan's totals are never below the parse's.
//
// Thread-safety: pure functions.
// Errors: scan_envelope throws InvalidArgument("malformed rpc envelope: ...") naming the
// limit and the count; scan_header never throws.
#pragma once

#include <cstdint>
#include <string_view>

#include "gradwire/rpc/envelope.h"

namespace gradwire::rpc {

// What the scan saw of a payload.
struct EnvelopeShape {
  bool is_request{false};
  bool is_response{false};
  bool is_release{false};
  uint64_t id{0};  // the request's or response's id (the last one seen, as Protobuf)
  bool id_seen{false};
  size_t values{0};      // Values and map entries, all levels together
  size_t tensors{0};     // tensor descriptions
  size_t extensions{0};  // extension entries
  int depth{0};          // deepest Value nesting (arguments and results are at 1)
};

// Walks `payload` (see above) into `shape`; throws InvalidArgument when it breaks `limits`
// or is not well-formed Protobuf wire format. What was seen before the failure stays in
// `shape` (a refused request is answered with the id read so far).
void scan_envelope(std::string_view payload, const EnvelopeLimits& limits, EnvelopeShape& shape);

}  // namespace gradwire::rpc
