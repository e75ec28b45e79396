// Checks that throw typed errors with a streamed message.
//
//   GRADWIRE_CHECK(cond) << "detail";      // broken invariant: throws gradwire::Error
//   GRADWIRE_CHECK_ARG(cond) << "detail";  // bad input: throws gradwire::InvalidArgument
//   GRADWIRE_THROW(TimeoutError) << "...";  // always throws the named error type
//
// The message is built only when the condition fails, so a passing check costs one branch.
// A failed GRADWIRE_CHECK names the condition, file and line: it means gradwire itself is
// wrong, and it throws rather than aborting so that a long-running job can report it.
//
// Thread-safety: stateless; usable from any thread.
#pragma once

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

#include "gradwire/core/error.h"

namespace gradwire::detail {

// Collects a message with operator<< and throws E from its destructor-free `raise`.
// Used through the macros only: `ErrorBuilder<E>(prefix) << ...` is converted to void by
// the ThrowVoidify helper, which performs the throw.
template <typename E>
class ErrorBuilder {
 public:
  explicit ErrorBuilder(std::string prefix = {}) { stream_ << prefix; }
  template <typename T>
  ErrorBuilder& operator<<(const T& value) {
    stream_ << value;
    return *this;
  }
  [[noreturn]] void raise() const { throw E(stream_.str()); }

 private:
  std::ostringstream stream_;
};

struct ThrowVoidify {
  template <typename E>
  [[noreturn]] void operator&(const ErrorBuilder<E>& builder) const {
    builder.raise();
  }
};

std::string check_prefix(const char* condition, const char* file, int line);

}  // namespace gradwire::detail

#define GRADWIRE_THROW(ErrorType) \
  ::gradwire::detail::ThrowVoidify() & ::gradwire::detail::ErrorBuilder<::gradwire::ErrorType>()

#define GRADWIRE_CHECK(cond)                                  \
  if (__builtin_expect(static_cast<bool>(cond), 1)) {         \
  } else                                                      \
    ::gradwire::detail::ThrowVoidify() &                      \
        ::gradwire::detail::ErrorBuilder<::gradwire::Error>(  \
            ::gradwire::detail::check_prefix(#cond, __FILE__, __LINE__))

#define GRADWIRE_CHECK_ARG(cond)                                  \
  if (__builtin_expect(static_cast<bool>(cond), 1)) {             \
  } else                                                          \
    ::gradwire::detail::ThrowVoidify() &                          \
        ::gradwire::detail::ErrorBuilder<::gradwire::InvalidArgument>()
