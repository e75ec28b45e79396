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

// "call 'add'"; for another handler its request's own description when it gives one in
// Request::function ("to_here of RRef 1:7"), else "request to handler 3". Built only for
// messages.
inline std::string describe_call(uint32_t handler, const std::string& function) {
  if (handler == kCallHandler) return "call '" + function + "'";
  if (!function.empty()) return function;
  return "request to handler " + std::to_string(handler);
}

}  // namespace gradwire::rpc::detail
