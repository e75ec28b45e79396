// Peer-supplied text made safe to put in a log line or an error message.
//
// A name a peer claims (a worker name in a handshake, a store key, a function name) may be
// any bytes and up to a frame long. Logged verbatim it could forge log lines (newlines,
// terminal escapes) or flood the log. printable() keeps printable ASCII as it is, writes
// every other byte as \xNN (and a backslash as \\), and cuts the result after `max_bytes`
// input bytes with a note of how many were left out.
//
// Thread-safety: pure functions.
// Errors: none.
//
// printable_relayed() is the same for text a peer passes on that may already hold such
// escapes (another worker's error message, which quotes the names it escaped): it keeps a
// backslash as it is, so that text escaped once is not escaped again on each worker it
// crosses. Every byte outside printable ASCII is still written as \xNN.
//
// Example:
//   GRADWIRE_LOG(kWarning) << "refused a peer calling itself '" << printable(claimed) << "'";
//   // "refused a peer calling itself 'w\x0aERROR forged' ... (+65000 bytes)"
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace gradwire {

inline constexpr size_t kPrintableDefaultBytes = 64;

// `text` escaped and truncated to its first `max_bytes` bytes (see above).
std::string printable(std::string_view text, size_t max_bytes = kPrintableDefaultBytes);

// `text` escaped as printable() does, but with its backslashes kept (see above).
std::string printable_relayed(std::string_view text, size_t max_bytes);

}  // namespace gradwire
