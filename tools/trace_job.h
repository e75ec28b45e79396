// gradwire-trace's model of a job's traces: the workers' trace files (gradwire::trace's
// Chrome trace-event files, one per process) read, checked, and put on one clock, and the
// flows from each rpc.call to the rpc.serve that answered it. See docs/observability.md.
//
// Errors: every problem with an input (a missing directory, no trace files, JSON that
// does not parse, a file that is not a trace, an event without its fields) throws
// TraceInputError with a message naming the file and what is wrong.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace gradwire::tools::trace {

class TraceInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// One event of a worker: a complete span ('X') or an instant ('i'). Times are ns on the
// job's clock (the store's system clock), relative to Job::origin_ns once a job is built.
struct Event {
  std::string name;
  std::string category;
  char phase{'X'};
  int64_t ts_ns{0};
  int64_t dur_ns{0};
  int64_t tid{0};
  nlohmann::json args = nlohmann::json::object();
  // An integer argument, or nullopt when absent or not an integer.
  std::optional<int64_t> int_arg(const char* key) const;
};

struct Worker {
  std::string name;  // process_name
  std::string file;  // where it was read from
  int64_t pid{0};    // unique within the job (1, 2, ...)
  int64_t source_pid{0};
  std::optional<int64_t> worker_id;
  // Added to the file's steady-clock times to put them on the store's clock.
  int64_t offset_ns{0};
  // The probe's round trip (clock_offset.rtt_ns); nullopt when aligned by the system clock.
  std::optional<int64_t> rtt_ns;
  std::string aligned_by;  // "store" or "system_clock"
  std::map<int64_t, std::string> threads;
  std::vector<Event> events;
  // Half the best round trip: how far this worker's times may be off the store's clock
  // (nullopt: unknown, aligned by its system clock).
  std::optional<int64_t> residual_ns() const {
    if (!rtt_ns) return std::nullopt;
    return *rtt_ns / 2;
  }
};

// An rpc.call (the caller's) and the rpc.serve (the callee's) of the same request.
struct Flow {
  size_t caller{0}, call{0};  // worker index, event index
  size_t callee{0}, serve{0};
};

struct Job {
  std::vector<Worker> workers;
  // The store-clock time (ns since the Unix epoch) that event time 0 stands for.
  int64_t origin_ns{0};
  std::vector<Flow> flows;
  // Things worth telling the user (a file aligned by its system clock), one per line.
  std::vector<std::string> notes;
};

// Reads every *.trace.json of `dir`, aligns them and finds the flows.
Job load_directory(const std::string& dir);
// A directory (as load_directory), a merged file (written by write_merged), or a single
// worker's trace file.
Job load(const std::string& path);
// The Chrome/Perfetto trace of `job`: one process per worker, flow events.
nlohmann::json merged_json(const Job& job);

}  // namespace gradwire::tools::trace
