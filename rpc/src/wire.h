// The envelope's codec and what only a transport needs of it: how a Request or Response
// becomes a Protobuf payload plus the tensors that travel beside it, how a receiver learns
// what to allocate before any tensor byte arrives, and the loans and releases of tensors
// lent between processes of one host. Private to rpc/: handlers and interceptors see only
// the messages (gradwire/rpc/envelope.h); the TensorPipe agent and rpc/'s tests use this.
//
// decode() checks a received payload against EnvelopeLimits and the received tensor
// buffers before building anything, so a hostile or corrupt message is an InvalidArgument
// naming what was wrong, never a crash or an unbounded allocation. The format is in
// docs/wire-format.md.
//
// Thread-safety: plain values and pure functions (a Lender or DeviceMapper is called on the
// encoding thread only).
// Errors: encode throws InvalidArgument for a value that cannot travel (an undefined
// tensor), and whatever target_device or the lender throw; peek_tensors and decode throw
// InvalidArgument("malformed rpc envelope: ...") for anything that does not parse or
// exceeds a limit, and for an unknown version; peek_header never throws.
//
// Example:
//   EncodedMessage m = encode(Envelope{Request{.id = 7, .function = "add",
//                                             .args = {Value(a), Value(b)}}});
//   ... m.payload and m.tensors travel ...
//   std::vector<Tensor> received;                        // the receiver allocates first
//   for (const IncomingTensor& t : peek_tensors(m.payload)) received.push_back(empty(t.sizes,
//   t.dtype));
//   ... the tensor bytes arrive in `received` ...
//   Envelope e = decode(m.payload, received);
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "gradwire/rpc/envelope.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::rpc {

namespace wire {
class Envelope;  // the generated Protobuf message (rpc/proto/envelope.proto)
}  // namespace wire

// A tensor lent instead of sent (between processes of one host): entry `slot` of the
// sender's loan table, valid while it holds `token`. The receiver copies the bytes out of
// the sender's memory and answers with a Release. See docs/wire-format.md.
struct Loan {
  uint32_t slot{0};
  uint64_t token{0};
  bool operator==(const Loan&) const = default;
};

// The receiver is done with these loans; the sender may reuse their memory.
struct Release {
  std::vector<Loan> loans;
};

// One message: a call, its reply, or the end of some loans.
struct Envelope {
  std::variant<Request, Response, Release> body;
};

// Where a tensor that lives on `source` should land on the receiver (the sender's device
// map); it throws InvalidArgument for a device it has no entry for. Without one, every
// tensor lands on the CPU.
using DeviceMapper = std::function<Device(const Device& source)>;

// What travels. `tensors` are the tensors that travel beside the payload (the small ones
// are inside it): contiguous CPU tensors without autograd history, made so by encode (CUDA
// tensors are staged through host memory); `targets[i]` is the device tensor i lands on,
// which the payload announces too.
struct EncodedMessage {
  std::string payload;
  std::vector<Tensor> tensors;  // not those lent
  std::vector<Device> targets;
};

// Offered each tensor that does not travel inline (contiguous, on the CPU): a Loan it
// returns makes the tensor travel as that loan, and the lender keeps the tensor alive
// until the receiver releases it. nullopt: the tensor travels beside the payload.
using Lender = std::function<std::optional<Loan>(const Tensor& tensor)>;

// Tensors of at most `inline_tensor_bytes` travel inside the payload (up to
// kMaxInlineBytesPerMessage in all); `lender` may take the others; the rest are
// EncodedMessage::tensors. Each tensor's requires_grad() travels as a flag; its data is
// taken detached, so encoding records nothing in an autograd graph. The payload is written
// directly in Protobuf's wire format (no message objects are built), byte for byte what
// Protobuf's serializer writes for the same envelope.
inline constexpr size_t kDefaultInlineTensorBytes = 16 * 1024;
inline constexpr size_t kMaxInlineBytesPerMessage = 1 << 20;
EncodedMessage encode(const Envelope& envelope, const DeviceMapper& target_device = nullptr,
                      size_t inline_tensor_bytes = kDefaultInlineTensorBytes,
                      const Lender& lender = nullptr);

// The descriptions of the tensors that do not travel inside a payload (those beside it and
// those lent, in message order), checked against `limits`, so the receiver can allocate
// buffers of the right size before the tensor data arrives.
struct IncomingTensor {
  DType dtype{kFloat32};
  Shape sizes;
  Device device{Device::cpu()};
  bool requires_grad{false};  // as the sender's tensor; decode applies it
  bool is_inline{false};
  std::optional<Loan> loan;       // lent: to be copied from the sender's loan table
  Shape expand_to;                // not empty: a broadcast tensor, expanded to this on arrival
  size_t nbytes() const;          // the data that travels (of `sizes`)
  size_t logical_nbytes() const;  // the tensor the receiver ends with (of expand_to, if set)
};
std::vector<IncomingTensor> peek_tensors(const std::string& payload,
                                         const EnvelopeLimits& limits = {});

// A payload parsed once. A receiver parses the payload when its descriptor arrives (to
// allocate the tensors), keeps the result while the tensor data is read, and decodes from
// it: one Protobuf parse per message. Checked like peek_tensors (size, version, tensor
// count); InvalidArgument("malformed rpc envelope: ...") otherwise.
class ParsedEnvelope {
 public:
  ParsedEnvelope(const std::string& payload, const EnvelopeLimits& limits);
  ~ParsedEnvelope();
  ParsedEnvelope(ParsedEnvelope&&) noexcept;
  ParsedEnvelope& operator=(ParsedEnvelope&&) noexcept;
  const wire::Envelope& message() const { return *message_; }
  // The body's kind, and the request's or response's id (0 for a release).
  bool is_request() const;
  bool is_response() const;
  uint64_t id() const;

 private:
  // The message lives on an arena that starts in a block allocated with it: parsing a
  // small message costs one allocation, and dropping it frees that block alone.
  struct Storage;
  std::unique_ptr<Storage> storage_;
  const wire::Envelope* message_ = nullptr;
};
std::vector<IncomingTensor> peek_tensors(const ParsedEnvelope& parsed,
                                         const EnvelopeLimits& limits = {});

// Whether a payload is a request or a response, and its id, when the envelope parses at
// all: what a receiver needs to answer a message that fails decode's checks.
struct EnvelopeHeader {
  bool is_request{false};
  uint64_t id{0};
};
std::optional<EnvelopeHeader> peek_header(const std::string& payload,
                                          const EnvelopeLimits& limits = {});

// `tensors[i]` must be the i-th tensor peek_tensors described (dtype and shape as it
// said), lent ones included. Tensors announced on a CUDA device are moved there. A tensor
// sent with requires_grad comes back as a fresh leaf that requires grad when
// gradwire::autograd is linked into the process (autograd_hooks() is set); without it the
// flag is dropped, since rpc/ does not depend on autograd and nothing here could record.
Envelope decode(const std::string& payload, const std::vector<Tensor>& tensors,
                const EnvelopeLimits& limits = {});
Envelope decode(const ParsedEnvelope& parsed, const std::vector<Tensor>& tensors,
                const EnvelopeLimits& limits = {});

}  // namespace gradwire::rpc
