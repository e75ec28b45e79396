#include "rref_scan.h"

#include <optional>
#include <string>

#include "gradwire/rpc/payload_scan.h"
#include "gradwire/rpc/registry.h"

namespace gradwire::rref {

void check_message_counts(std::string_view payload) {
  // RRefMessage.child_accepted (5), then ChildAccepted.fork_ids (1).
  constexpr uint32_t kForkIds[] = {5, 1};
  const std::optional<size_t> forks =
      rpc::count_repeated(payload, kForkIds, rpc::RepeatedKind::kVarint);
  if (!forks) throw rpc::CallRejected("malformed rref message: the payload does not parse");
  if (*forks > kMaxAcceptedForks) {
    throw rpc::CallRejected("malformed rref message: ChildAccepted.fork_ids holds more than " +
                            std::to_string(kMaxAcceptedForks) + " fork ids");
  }
}

}  // namespace gradwire::rref
