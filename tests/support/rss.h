// The process's peak resident memory, for tests that bound what an attack makes a process
// hold. Header-only.
//
// Thread-safety: call from the test's thread.
#pragma once

#include <cstddef>
#include <fstream>
#include <string>

namespace gradwire::test {

// Resets the peak (VmHWM) to the current resident size.
inline void reset_peak_rss() {
  std::ofstream("/proc/self/clear_refs") << "5";
}

// The peak resident size since the last reset, in bytes (0 if the kernel does not say).
inline size_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
  }
  return 0;
}

}  // namespace gradwire::test
