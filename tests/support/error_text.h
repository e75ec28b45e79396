// error_text<E>(f): the message of the E that f() throws, for checking what an error names.
// Another exception type gives "wrong exception type: <its message>"; none gives
// "(no exception)", so a test that expects a substring fails with what happened instead.
#pragma once

#include <exception>
#include <string>
#include <utility>

namespace gradwire::test {

template <typename E, typename F>
std::string error_text(F&& f) {
  try {
    std::forward<F>(f)();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "(no exception)";
}

}  // namespace gradwire::test
