#include "gradwire/core/error.h"
#include "gradwire/core/error_kind_of.h"

#include "gradwire/core/check.h"

namespace gradwire {

std::string_view error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kError:
      return "Error";
    case ErrorKind::kInvalidArgument:
      return "InvalidArgument";
    case ErrorKind::kTimeout:
      return "TimeoutError";
    case ErrorKind::kNetwork:
      return "NetworkError";
    case ErrorKind::kStore:
      return "StoreError";
    case ErrorKind::kRemote:
      return "RemoteError";
    case ErrorKind::kBusy:
      return "BusyError";
  }
  return "Error";
}

RemoteError::RemoteError(std::string worker, std::string remote_type, std::string message)
    : Error(ErrorKind::kRemote, remote_type + " on worker '" + worker + "': " + message),
      worker_(std::move(worker)),
      remote_type_(std::move(remote_type)),
      remote_message_(std::move(message)) {}

void throw_error(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      throw InvalidArgument(message);
    case ErrorKind::kTimeout:
      throw TimeoutError(message);
    case ErrorKind::kNetwork:
      throw NetworkError(message);
    case ErrorKind::kStore:
      throw StoreError(message);
    case ErrorKind::kBusy:
      throw BusyError(message);
    case ErrorKind::kError:
    case ErrorKind::kRemote:
      break;
  }
  throw Error(message);
}

namespace detail {
std::string check_prefix(const char* condition, const char* file, int line) {
  std::string out = "internal check failed: (";
  out += condition;
  out += ") at ";
  out += file;
  out += ":";
  out += std::to_string(line);
  out += ": ";
  return out;
}
}  // namespace detail

ErrorKind error_kind_of(const std::exception_ptr& error) noexcept {
  if (error == nullptr) return ErrorKind::kError;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    return e.kind();
  } catch (...) {
    return ErrorKind::kError;
  }
}

}  // namespace gradwire
