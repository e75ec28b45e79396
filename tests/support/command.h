// Runs a shell command for the tests that drive the built programs (the examples under the
// launcher): its standard output and error together, and its exit status.
#pragma once

#include <cstdio>
#include <string>

namespace gradwire::test {

// Runs `command` with its stderr joined to its stdout; returns what it printed, and the
// status pclose() gives (or -1 when it could not be started) in `status`.
inline std::string run_command(const std::string& command, int& status) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  std::string out;
  char buf[4096];
  while (pipe != nullptr && std::fgets(buf, sizeof(buf), pipe) != nullptr)
    out += buf;
  status = pipe == nullptr ? -1 : ::pclose(pipe);
  return out;
}

}  // namespace gradwire::test
