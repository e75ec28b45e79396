// error_kind_of: which kind of gradwire error an exception_ptr holds.
//
// The protocols use it to decide whether a failed message is sent again: a timeout leaves
// it open whether the peer acted, a network error says the connection went.
//
// Thread-safety: a pure function. Errors: none (noexcept).
//
// Example:
//   if (error_kind_of(reply.error()) == ErrorKind::kTimeout) resend();
#pragma once

#include <exception>

#include "gradwire/core/error.h"

namespace gradwire {

// An Error's own kind (kTimeout for a TimeoutError, kNetwork for a NetworkError, ...);
// kError for any other exception or a null pointer.
ErrorKind error_kind_of(const std::exception_ptr& error) noexcept;

}  // namespace gradwire
