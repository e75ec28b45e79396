// A bounded pre-scan of a TensorPipe control frame (libnop's encoding), run before libnop
// decodes it.
//
// libnop allocates for what a frame names, not for what it weighs: a Descriptor's tensor
// or payload entry is a few bytes on the wire and a hundred or more in memory (a struct
// with strings, a device, an optional), so a frame under the transport's size limit could
// decode into ten times its size. scan_nop walks the encoding without allocating, counts
// every value it holds (each container element, structure member, map key and map value)
// and the nesting, and refuses the frame when the count is over `max_values`, the nesting
// over kMaxNopDepth, or it uses an encoding no TensorPipe control message has (tables,
// handles, errors, extensions, reserved prefixes, an empty binary: libnop would read it
// with a memcpy into a null pointer). A frame that passes decodes into at most
// a bounded multiple of max_values plus its own bytes.
//
// Thread-safety: a pure function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradwire::rpc::transport {

// Deepest nesting of containers a control frame may use (TensorPipe's use three or four).
inline constexpr int kMaxNopDepth = 16;

// "" when `data[0, size)` is one libnop value of at most `max_values` values, else why not
// (a sentence fragment naming the count and the limit, or what is malformed).
std::string scan_nop(const uint8_t* data, size_t size, size_t max_values);

}  // namespace gradwire::rpc::transport
