// The one error hierarchy of gradwire.
//
// Every public blocking call (rpc_sync, to_here, Store::get, Work::wait, ...) reports
// failure by throwing one of these. Across threads and across the wire an error travels
// as a value (an std::exception_ptr inside a Future, or an error reply); it is turned back
// into one of these types where a caller blocks. Catch `gradwire::Error` to catch them all.
//
//   Error            base class; also used for broken internal invariants (GRADWIRE_CHECK)
//   InvalidArgument  the caller passed something wrong (shape, dtype, name, option value)
//   TimeoutError     a wait ran past its deadline
//   NetworkError     a peer or server could not be reached, or was lost
//   StoreError       a key-value store operation failed for a reason other than the above
//   RemoteError      the remote side raised an error; carries its type and worker name
//   BusyError        a server refused work because it is at one of its limits (queued
//                    requests, in-flight bytes); nothing of the request ran, retry later
//
// Thread-safety: these are immutable values once built; copy and share them freely.
//
// Example:
//   try { store.get("key"); }
//   catch (const gradwire::TimeoutError& e) { /* e.what() names the missing keys */ }
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

namespace gradwire {

// What kind of error an Error is, so that an error can be sent as a value (kind + message)
// and rebuilt as the same C++ type on the other side.
enum class ErrorKind {
  kError,
  kInvalidArgument,
  kTimeout,
  kNetwork,
  kStore,
  kRemote,
  kBusy,
};

// Name of an ErrorKind as it appears in messages and on the wire ("TimeoutError", ...).
std::string_view error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : Error(ErrorKind::kError, message) {}
  ErrorKind kind() const noexcept { return kind_; }

 protected:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}

 private:
  ErrorKind kind_;
};

class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message)
      : Error(ErrorKind::kInvalidArgument, message) {}
};

class TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& message) : Error(ErrorKind::kTimeout, message) {}
};

class NetworkError : public Error {
 public:
  explicit NetworkError(const std::string& message) : Error(ErrorKind::kNetwork, message) {}
};

class StoreError : public Error {
 public:
  explicit StoreError(const std::string& message) : Error(ErrorKind::kStore, message) {}
};

// A peer refused a request because it is at one of its limits (AgentOptions'
// max_queued_requests, max_inflight_bytes, ...); the message names the worker and the limit.
// Nothing of the request ran, so it is safe to send again later.
class BusyError : public Error {
 public:
  explicit BusyError(const std::string& message) : Error(ErrorKind::kBusy, message) {}
};

// An error raised on another worker. what() reads
// "<remote_type> on worker '<worker>': <message>"; the parts are kept separately too.
class RemoteError : public Error {
 public:
  RemoteError(std::string worker, std::string remote_type, std::string message);
  const std::string& worker() const noexcept { return worker_; }
  const std::string& remote_type() const noexcept { return remote_type_; }
  const std::string& remote_message() const noexcept { return remote_message_; }

 private:
  std::string worker_;
  std::string remote_type_;
  std::string remote_message_;
};

// Rebuilds an error of the given kind as the matching exception type and throws it.
// kRemote needs the worker and type and so cannot be rebuilt here: it becomes an Error.
[[noreturn]] void throw_error(ErrorKind kind, const std::string& message);

}  // namespace gradwire
