// What every part of the RRef context needs of a protocol message or a Value: the checks a
// peer's type name must pass, how a message appears in trace spans, and the RRef
// descriptors a Value holds.
//
// Thread-safety: free functions over their arguments; none keeps state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gradwire/core/future.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/value_walk.h"

namespace gradwire::rref {

namespace wire {
class RRefMessage;
}  // namespace wire

// A type name a peer sends is at most this many bytes.
inline constexpr size_t kMaxTypeNameBytes = 1024;

// Visits every RRef descriptor inside a Value tree.
template <typename F>
void for_each_descriptor(const rpc::Value& value, F&& fn) {
  rpc::for_each_leaf(value, [&](const rpc::Value& leaf) {
    if (leaf.type() == rpc::ValueType::kRRef) fn(leaf.as_rref());
  });
}

bool has_descriptor(const rpc::Value& value);

// The text of a CallRejected for a message that is not a well-formed rref message.
std::string parse_error(std::string_view what);

// Why `name` is not a type name a peer may send; empty when it is one. Every worker names a
// type alike (a registered class's name, a value type's name): printable ASCII, never empty,
// at most kMaxTypeNameBytes. Anything else is refused where it arrives, so that no reference
// keeps it and no error or log line quotes it unescaped.
std::string bad_type_name(std::string_view name);

// Refuses a peer's message whose `field` holds no type name (bad_type_name).
void check_type_name(std::string_view name, std::string_view field);

// A protocol message as trace spans name it: its operation and the reference it is about
// (0 when it names none: a loss notice, an accept of forks).
struct TracedOp {
  const char* op;
  uint64_t rref_id;
};

TracedOp traced_op(const wire::RRefMessage& message);

// Records a span of a protocol message (rref.send on its sender, rref.handle on its
// receiver), whose `op` is known.
void record_message(const char* name, int64_t start_ns, const TracedOp& op, int peer,
                    const char* outcome);

// What a handled message's reply says: done (ok or error), or still running (a creation or
// a call whose user code runs on).
const char* handled_outcome(const Future<rpc::Value>& reply);

}  // namespace gradwire::rref
