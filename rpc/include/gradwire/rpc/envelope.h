// The rpc envelope in C++ terms: what one request or response carries, and its encoding.
//
// A message is a payload (the Protobuf envelope of rpc/proto/envelope.proto) plus a list
// of tensors that travel beside it (TensorPipe tensors, zero-copy from contiguous
// storage). encode() turns a Request or Response into both; decode() checks a received
// payload against EnvelopeLimits and the received tensor buffers before building anything,
// so that a hostile or corrupt message is an InvalidArgument naming what was wrong, never
// a crash or an unbounded allocation.
//
// Thread-safety: plain values and pure functions.
// Errors: encode throws InvalidArgument for a value that cannot travel (an undefined tensor);
// decode throws InvalidArgument("malformed rpc envelope: ...") for anything that does not
// parse or exceeds a limit, and for an unknown version.
//
// Example:
//   EncodedMessage m = encode(Envelope{Request{.id = 7, .function = "add",
//                                             .args = {Value(a), Value(b)}}});
//   ... m.payload and m.tensors travel ...
//   Envelope e = decode(payload, received_buffers);
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/value.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::rpc {

inline constexpr uint32_t kEnvelopeVersion = 1;

// Handler ids: who on the receiving worker handles a request. rpc/ owns kCall; the modules
// above register their own (see the agent's handler registry).
inline constexpr uint32_t kCallHandler = 1;

struct EnvelopeLimits {
  size_t max_payload_bytes{64u << 20};
  int max_depth{64};            // nesting of lists and maps
  size_t max_values{1u << 20};  // Values in one message, all levels together
  size_t max_tensors{1u << 16};
  size_t max_tensor_dims{64};
  size_t max_function_name_bytes{1024};
  size_t max_tensor_bytes{size_t{16} << 30};  // all tensors of one message together
};

struct Request {
  uint64_t id{0};
  uint32_t handler{kCallHandler};
  std::string function;
  std::vector<Value> args;
  uint64_t autograd_context_id{0};
  uint64_t autograd_message_id{0};
  std::chrono::milliseconds timeout{0};  // 0: none given
  Bytes payload;                         // a handler's own encoded message, if any
};

struct ErrorReply {
  ErrorKind kind{ErrorKind::kError};
  std::string message;
  std::string worker;  // where it was raised
  // Refused by the receiving worker's rpc machinery before any user code ran (unknown
  // function, wrong arguments): the caller rethrows it as `kind`, not as a RemoteError.
  bool rejected{false};
};

struct Response {
  uint64_t id{0};
  std::variant<Value, ErrorReply> result;
  Bytes payload;
  // The request's, echoed back (interceptors may change them).
  uint64_t autograd_context_id{0};
  uint64_t autograd_message_id{0};
};

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

struct Envelope {
  std::variant<Request, Response, Release> body;
};

// Where a tensor that lives on `source` should land on the receiver (the sender's device
// map); it throws InvalidArgument for a device it has no entry for. Without one, every
// tensor lands on the CPU.
using DeviceMapper = std::function<Device(const Device& source)>;

// What travels. `tensors` are the tensors that travel beside the payload (the small ones
// are inside it): contiguous CPU tensors, made so by encode (CUDA tensors are staged
// through host memory); `targets[i]` is the device tensor i lands on, which the payload
// announces too.
struct EncodedMessage {
  std::string payload;
  std::vector<Tensor> tensors;  // not those lent
  std::vector<Device> targets;
  DeviceMapper target_device;  // used while encoding only
};

// Offered each tensor that does not travel inline (contiguous, on the CPU): a Loan it
// returns makes the tensor travel as that loan, and the lender keeps the tensor alive
// until the receiver releases it. nullopt: the tensor travels beside the payload.
using Lender = std::function<std::optional<Loan>(const Tensor& tensor)>;

// Tensors of at most `inline_tensor_bytes` travel inside the payload (up to
// kMaxInlineBytesPerMessage in all); `lender` may take the others; the rest are
// EncodedMessage::tensors.
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
  bool is_inline{false};
  std::optional<Loan> loan;  // lent: to be copied from the sender's loan table
  size_t nbytes() const;
};
std::vector<IncomingTensor> peek_tensors(const std::string& payload,
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
// said), lent ones included. Tensors announced on a CUDA device are moved there.
Envelope decode(const std::string& payload, const std::vector<Tensor>& tensors,
                const EnvelopeLimits& limits = {});

}  // namespace gradwire::rpc
