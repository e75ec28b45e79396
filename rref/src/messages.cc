// The message helpers of messages.h.
#include "messages.h"

#include "gradwire/core/printable.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/ids.h"
#include "gradwire/rpc/registry.h"
#include "proto/rref.pb.h"

namespace gradwire::rref {

namespace {

// How much of a type name refused for its bytes the refusal quotes (escaped).
constexpr size_t kQuotedTypeNameBytes = 128;

uint64_t local_part(uint64_t id) {
  return id & ((uint64_t{1} << rpc::kIdMinterShift) - 1);
}

}  // namespace

bool has_descriptor(const rpc::Value& value) {
  bool found = false;
  for_each_descriptor(value, [&](const rpc::RRefDescriptor&) { found = true; });
  return found;
}

std::string parse_error(std::string_view what) {
  return "malformed rref message: " + std::string(what);
}

std::string bad_type_name(std::string_view name) {
  if (name.empty()) return "is empty";
  if (name.size() > kMaxTypeNameBytes) {
    return "of " + std::to_string(name.size()) + " bytes exceeds the limit of " +
           std::to_string(kMaxTypeNameBytes);
  }
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c > 0x7e) {
      static constexpr char kHex[] = "0123456789abcdef";
      return "'" + printable(name, kQuotedTypeNameBytes) + "' holds byte 0x" + kHex[c >> 4] +
             kHex[c & 0xf] + " at offset " + std::to_string(i) +
             " (a type name is printable ASCII)";
    }
  }
  return {};
}

void check_type_name(std::string_view name, std::string_view field) {
  const std::string why = bad_type_name(name);
  if (!why.empty())
    throw rpc::CallRejected(parse_error(std::string(field) + ": the type name " + why));
}

TracedOp traced_op(const wire::RRefMessage& message) {
  switch (message.op_case()) {
    case wire::RRefMessage::kCreate:
      return {"create", message.create().rref_id()};
    case wire::RRefMessage::kFetch:
      return {"fetch", message.fetch().rref_id()};
    case wire::RRefMessage::kCallMethod:
      return {"call_method", message.call_method().rref_id()};
    case wire::RRefMessage::kAddFork:
      return {"add_fork", message.add_fork().rref_id()};
    case wire::RRefMessage::kLost:
      return {"lost", 0};
    case wire::RRefMessage::kChildAccepted:
      return {"child_accepted", 0};
    case wire::RRefMessage::kDeleteFork:
      return {"delete", message.delete_fork().rref_id()};
    case wire::RRefMessage::OP_NOT_SET:
      break;
  }
  return {"none", 0};
}

void record_message(const char* name, int64_t start_ns, const TracedOp& op, int peer,
                    const char* outcome) {
  trace::complete(name, "rref", start_ns, trace::now_ns(),
                  {trace::Arg("op", op.op), trace::Arg("rref_worker", rpc::minter_of(op.rref_id)),
                   trace::Arg("rref_local", local_part(op.rref_id)), trace::Arg("peer", peer),
                   trace::Arg("outcome", outcome)});
}

const char* handled_outcome(const Future<rpc::Value>& reply) {
  if (!reply.completed()) return "running";
  return reply.has_error() ? "error" : "ok";
}

}  // namespace gradwire::rref
