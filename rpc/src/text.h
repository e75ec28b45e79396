// How rpc/ names durations and calls in its messages, so that every part of the agent says
// them the same way (tests and users match on these words).
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "gradwire/rpc/envelope.h"

namespace gradwire::rpc::detail {

// "200 ms"
inline std::string ms_text(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

// "call 'add'" or "request to handler 3"; built only for messages.
inline std::string describe_call(uint32_t handler, const std::string& function) {
  if (handler == kCallHandler) return "call '" + function + "'";
  return "request to handler " + std::to_string(handler);
}

}  // namespace gradwire::rpc::detail
