// The rpc envelope in C++ terms: what one request or response carries, as handlers and
// interceptors see it, and the limits a receiver holds every received message to.
//
// A message travels as a Protobuf payload (rpc/proto/envelope.proto) plus the tensors of
// its values; rpc/ encodes and checks it (docs/wire-format.md). Modules above rpc/ carry
// their own data in a Request's `payload` (a handler's own message) and in the small
// `extensions` map of a Request or Response (ids that ride along with any call, set by
// interceptors), instead of growing the envelope.
//
// Thread-safety: plain values; EnvelopeLimits is read-only once given to an agent.
// Errors: a received message that breaks a limit is an InvalidArgument("malformed rpc
// envelope: ...") at the receiver, which answers a request with an error reply (the caller
// sees an InvalidArgument naming the worker that refused it).
//
// Example (an interceptor tagging every call with its module's id):
//   std::shared_ptr<void> on_outgoing_request(const WorkerInfo& to, Request& r) override {
//     r.extensions["dist_autograd.ctx"] = encode_id(context_id);
//     return nullptr;
//   }
//   std::shared_ptr<ServeScope> on_incoming_request(const WorkerInfo& from, Request& r) override {
//     if (auto it = r.extensions.find("dist_autograd.ctx"); it != r.extensions.end()) ...
//   }
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/rpc/value.h"

namespace gradwire::rpc {

// Version 2: tensors carry requires_grad, requests and responses extensions, responses no
// payload. A worker refuses every other version, naming both.
inline constexpr uint32_t kEnvelopeVersion = 2;

// Handler ids: who on the receiving worker handles a request. rpc/ owns kCall; the modules
// above register their own (see the agent's handler registry).
inline constexpr uint32_t kCallHandler = 1;
// An elastic group's membership notices (a joiner announcing itself, a worker leaving);
// served by the agent itself, only for workers of the group.
inline constexpr uint32_t kMembershipHandler = 6;

// What a received message may hold; everything is checked before anything is built from
// it. The defaults suit training traffic; AgentOptions::limits sets an agent's.
struct EnvelopeLimits {
  size_t max_payload_bytes{64u << 20};
  int max_depth{64};            // nesting of lists and maps
  size_t max_values{1u << 20};  // Values in one message, all levels together
  size_t max_tensors{1u << 16};
  size_t max_tensor_dims{64};
  size_t max_function_name_bytes{1024};
  // All tensors of one message together: what one message from an unauthenticated peer can
  // make this worker allocate (several messages are bounded by the agent's in-flight budget).
  size_t max_tensor_bytes{size_t{2} << 30};
  size_t max_worker_name_bytes{128};  // ErrorReply::worker
  // Request::extensions and Response::extensions: small ids for the modules above, not a
  // second payload.
  size_t max_extensions{16};
  size_t max_extension_key_bytes{64};
  size_t max_extension_bytes{64u << 10};  // all values of one message's extensions together
};

// Extension fields: keyed by a name the owning module chooses ("rref.fork",
// "dist_autograd.ctx"), each value that module's own encoding.
using Extensions = std::map<std::string, Bytes>;

struct Request {
  uint64_t id{0};
  uint32_t handler{kCallHandler};
  std::string
      function;  // the registered function; for other handlers, what messages call the request
  std::vector<Value> args;
  uint64_t autograd_context_id{0};
  uint64_t autograd_message_id{0};
  std::chrono::milliseconds timeout{0};  // 0: none given
  Bytes payload;                         // a handler's own encoded message, if any
  Extensions extensions;
};

struct ErrorReply {
  ErrorKind kind{ErrorKind::kError};
  std::string message;
  std::string worker;  // where it was raised (a nested call's error keeps its origin)
  // Refused by the receiving worker's rpc machinery before any user code ran (unknown
  // function, wrong arguments): the caller rethrows it as `kind`, not as a RemoteError.
  bool rejected{false};
};

struct Response {
  uint64_t id{0};
  std::variant<Value, ErrorReply> result;
  // The request's, echoed back (interceptors may change them).
  uint64_t autograd_context_id{0};
  uint64_t autograd_message_id{0};
  // Not echoed: a response carries only what interceptors of the replying worker set.
  Extensions extensions;
};

}  // namespace gradwire::rpc
