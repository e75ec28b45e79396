// How rpc/ names durations and calls in its messages, so that every part of the agent says
// them the same way (tests and users match on these words).
//
// Thread-safety: pure functions.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "gradwire/core/printable.h"
#include "gradwire/rpc/envelope.h"

namespace gradwire::rpc::detail {

// "200 ms"
inline std::string ms_text(std::chrono::milliseconds t) {
  return std::to_string(t.count()) + " ms";
}

// How much of a function name or a request's description a message shows: every name the
// envelope admits (EnvelopeLimits::max_function_name_bytes, 1024 by default) and the words
// around it.
inline constexpr size_t kShownFunctionBytes = 2048;

// "call 'add'"; for another handler its request's own description when it gives one in
// Request::function ("to_here of RRef 1:7"), else "request to handler 3". Built only for
// messages. The name is escaped (printable()): on a receiving worker it is the sender's.
inline std::string describe_call(uint32_t handler, const std::string& function) {
  if (handler == kCallHandler) return "call '" + printable(function, kShownFunctionBytes) + "'";
  if (!function.empty()) return printable(function, kShownFunctionBytes);
  return "request to handler " + std::to_string(handler);
}

}  // namespace gradwire::rpc::detail
