// libFuzzer target: the rpc envelope decoder (rpc/src/wire.h) on arbitrary payloads, as a
// receiver runs it: peek the header, parse, allocate what the payload announces, decode.
// The contract: anything malformed is an InvalidArgument; no other exception, crash, leak
// or allocation beyond the limits.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/tensor/factory.h"
#include "wire.h"

using namespace gradwire;
using namespace gradwire::rpc;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string payload(reinterpret_cast<const char*>(data), size);
  // The limits every agent runs with by default: what is reachable here is what a peer can
  // reach. Tensors up to max_tensor_bytes (2 GiB) are allocated as a receiver would, but
  // never written, so they cost address space, not memory.
  const EnvelopeLimits limits;
  (void)peek_header(payload, limits);
  try {
    ParsedEnvelope parsed(payload, limits);
    std::vector<Tensor> received;
    for (const IncomingTensor& t : peek_tensors(parsed, limits)) {
      // What a receiver does: a CPU buffer of the announced dtype and shape.
      received.push_back(empty(t.sizes, TensorOptions{t.dtype}));
    }
    Envelope e = decode(parsed, received, limits);
    (void)e;
  } catch (const InvalidArgument&) {
  }
  return 0;
}
