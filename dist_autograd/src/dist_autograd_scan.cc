#include "dist_autograd_scan.h"

#include <optional>
#include <string>

#include "gradwire/rpc/payload_scan.h"
#include "gradwire/rpc/registry.h"

namespace gradwire::dist_autograd::internal {

void check_message_counts(std::string_view payload) {
  // DistAutogradMessage.discover (1), then Discover.message_ids (3).
  constexpr uint32_t kMessageIds[] = {1, 3};
  const std::optional<size_t> sends =
      rpc::count_repeated(payload, kMessageIds, rpc::RepeatedKind::kVarint);
  if (!sends) {
    throw rpc::CallRejected("malformed dist_autograd message: the payload does not parse");
  }
  if (*sends > kMaxDiscoveredSends) {
    throw rpc::CallRejected(
        "malformed dist_autograd message: Discover.message_ids holds more than " +
        std::to_string(kMaxDiscoveredSends) + " message ids");
  }
}

}  // namespace gradwire::dist_autograd::internal
