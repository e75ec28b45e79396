// Reading the trace files tests write (gradwire::trace, Chrome trace-event JSON) back with
// nlohmann-json: the events of a file by name, an event's argument, and a wait for events
// that are recorded on another thread (a continuation that runs after the waiter woke).
//
//   trace::ScopedCapture capture;
//   ... run the operation ...
//   nlohmann::json file = test::wait_for_trace(dir + "/t.json", [](const nlohmann::json& f) {
//     return !test::trace_events(f, "c10d.all_reduce").empty();
//   });
//
// Thread-safety: the functions read files and the process's trace; call them from one
// thread. Errors: a file that cannot be read or parsed throws (std::runtime_error,
// nlohmann::json::exception); wait_for_trace returns the last file read when the
// predicate never holds, for the caller's expectations to report.
#pragma once

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "gradwire/core/trace.h"
#include "support/eventually.h"

namespace gradwire::test {

inline nlohmann::json read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in.good()) throw std::runtime_error("cannot read trace file " + path);
  return nlohmann::json::parse(in);
}

// The events of `file` that are not metadata and are named `name`, in file order.
inline std::vector<nlohmann::json> trace_events(const nlohmann::json& file, std::string_view name) {
  std::vector<nlohmann::json> out;
  for (const auto& e : file.at("traceEvents")) {
    if (e.at("ph") != "M" && e.at("name") == name) out.push_back(e);
  }
  return out;
}

// Every event of `file` that is not metadata.
inline std::vector<nlohmann::json> trace_events(const nlohmann::json& file) {
  std::vector<nlohmann::json> out;
  for (const auto& e : file.at("traceEvents")) {
    if (e.at("ph") != "M") out.push_back(e);
  }
  return out;
}

// Writes what this process recorded so far to `path` and reads it back, again until
// `done(file)` holds or `deadline` passes (polling with a short back-off); returns the
// last file read.
inline nlohmann::json wait_for_trace(
    const std::string& path, const std::function<bool(const nlohmann::json&)>& done,
    std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
  nlohmann::json file;
  gradwire::testing::eventually(
      [&] {
        trace::write(path);
        file = read_trace(path);
        return done(file);
      },
      deadline);
  return file;
}

// Start and end (microseconds) of a complete event.
inline double trace_begin(const nlohmann::json& e) {
  return e.at("ts").get<double>();
}
inline double trace_end(const nlohmann::json& e) {
  return e.at("ts").get<double>() + e.value("dur", 0.0);
}

}  // namespace gradwire::test
