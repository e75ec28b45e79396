// libFuzzer target: the tensor wire metadata decoder (<gradwire/tensor/wire.h>). Anything
// malformed is an InvalidArgument; a metadata that decodes survives a round trip through
// the encoder unchanged, and its buffer is only allocated within the limit.
#include <cstddef>
#include <cstdint>
#include <string>

#include "gradwire/core/error.h"
#include "gradwire/tensor/wire.h"

using namespace gradwire;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    size_t consumed = 0;
    const TensorMeta meta = decode_tensor_meta(data, size, &consumed, /*max_bytes=*/1 << 20);
    if (consumed > size) __builtin_trap();
    std::string again;
    encode_tensor_meta(meta, again);
    size_t used = 0;
    if (!(decode_tensor_meta(again.data(), again.size(), &used, 1 << 20) == meta) ||
        used != again.size()) {
      __builtin_trap();
    }
    if (meta.span_bytes() > (1 << 20)) __builtin_trap();
    Tensor buffer = empty_for_meta(meta);
    (void)buffer;
  } catch (const InvalidArgument&) {
  }
  return 0;
}
