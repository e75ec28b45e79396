#include "trace_job.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

namespace gradwire::tools::trace {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMergedFormat = "gradwire-trace merged 1";

std::optional<int64_t> as_int(const json& j) {
  if (j.is_number_integer() || j.is_number_unsigned()) return j.get<int64_t>();
  return std::nullopt;
}

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw TraceInputError(file + ": " + what);
}

json parse_file(const std::string& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) fail(file, "no such file or directory");
  if (fs::is_directory(file, ec)) fail(file, "is a directory, expected a trace file");
  std::ifstream in(file, std::ios::binary);
  if (!in) fail(file, "cannot be opened for reading");
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return json::parse(buffer.str());
  } catch (const json::parse_error& e) {
    // e.what() names the byte and what was expected there.
    fail(file, std::string("malformed JSON: ") + e.what());
  }
}

// Bounds that keep every sum of a time, a duration and an offset inside int64: times and
// durations within 10^15 us (about 31 years) of 0, offsets within 2^62 ns.
constexpr double kMaxMicros = 1e15;
constexpr int64_t kMaxOffsetNs = int64_t{1} << 62;

// Microseconds (a JSON number, checked against kMaxMicros by the caller) to ns.
int64_t micros_to_ns(const json& v) {
  return static_cast<int64_t>(std::llround(v.get<double>() * 1000.0));
}

// obj[key] when obj is an object and it is an integer within 2^62 of 0.
std::optional<int64_t> bounded_int(const json& obj, const char* key) {
  if (!obj.is_object() || !obj.contains(key)) return std::nullopt;
  const auto v = as_int(obj[key]);
  if (!v) return std::nullopt;
  const int64_t x = v.value_or(0);
  if (x > kMaxOffsetNs || x < -kMaxOffsetNs) return std::nullopt;
  return x;
}

bool in_range(const json& v) {
  const double d = v.get<double>();
  return std::isfinite(d) && std::fabs(d) <= kMaxMicros;
}

const json& other_data(const json& doc, const std::string& file) {
  if (!doc.is_object()) fail(file, "not a trace file: the top level is not a JSON object");
  if (!doc.contains("traceEvents") || !doc["traceEvents"].is_array()) {
    fail(file, "not a trace file: no \"traceEvents\" array");
  }
  static const json kEmpty = json::object();
  if (!doc.contains("otherData")) return kEmpty;
  if (!doc["otherData"].is_object()) fail(file, "\"otherData\" is not an object");
  return doc["otherData"];
}

// Reads the events of `doc` into workers keyed by their pid in the file (one for a
// worker's file; one per process for a merged file). `shift_ns` is added to every time.
void read_events(const json& doc, const std::string& file, std::map<int64_t, Worker>& by_pid,
                 int64_t shift_ns) {
  const json& events = doc["traceEvents"];
  for (size_t i = 0; i < events.size(); ++i) {
    const json& e = events[i];
    const std::string where = "event #" + std::to_string(i);
    if (!e.is_object()) fail(file, where + " is not an object");
    if (!e.contains("ph") || !e["ph"].is_string() || e["ph"].get<std::string>().size() != 1) {
      fail(file, where + ": \"ph\" is missing or not a one-letter string");
    }
    const char phase = e["ph"].get<std::string>()[0];
    if (phase != 'X' && phase != 'i' && phase != 'M') continue;  // flows are rebuilt
    const auto pid = e.contains("pid") ? as_int(e["pid"]) : std::nullopt;
    const auto tid = e.contains("tid") ? as_int(e["tid"]) : std::nullopt;
    if (!pid || !tid) fail(file, where + ": \"pid\" or \"tid\" is missing or not an integer");
    if (!e.contains("name") || !e["name"].is_string()) {
      fail(file, where + ": \"name\" is missing or not a string");
    }
    Worker& w = by_pid[*pid];
    w.source_pid = *pid;
    const std::string name = e["name"].get<std::string>();
    if (phase == 'M') {
      const json* label = nullptr;
      if (e.contains("args") && e["args"].is_object() && e["args"].contains("name") &&
          e["args"]["name"].is_string()) {
        label = &e["args"]["name"];
      }
      if (name == "process_name" && label != nullptr) w.name = label->get<std::string>();
      if (name == "thread_name" && label != nullptr) w.threads[*tid] = label->get<std::string>();
      continue;
    }
    if (!e.contains("ts") || !e["ts"].is_number()) {
      fail(file, where + " (" + name + "): \"ts\" is missing or not a number");
    }
    if (!in_range(e["ts"])) fail(file, where + " (" + name + "): \"ts\" is out of range");
    Event ev;
    ev.name = name;
    ev.category = e.contains("cat") && e["cat"].is_string() ? e["cat"].get<std::string>() : "";
    ev.phase = phase;
    ev.tid = *tid;
    ev.ts_ns = micros_to_ns(e["ts"]) + shift_ns;
    if (phase == 'X') {
      if (!e.contains("dur") || !e["dur"].is_number() || e["dur"].get<double>() < 0) {
        fail(file, where + " (" + name + "): \"dur\" is missing, negative or not a number");
      }
      if (!in_range(e["dur"])) fail(file, where + " (" + name + "): \"dur\" is out of range");
      ev.dur_ns = micros_to_ns(e["dur"]);
    }
    if (e.contains("args")) {
      if (!e["args"].is_object()) fail(file, where + " (" + name + "): \"args\" is not an object");
      ev.args = e["args"];
    }
    if (!w.threads.count(ev.tid)) w.threads[ev.tid] = std::to_string(ev.tid);
    w.events.push_back(std::move(ev));
  }
}

// One worker's file: its events on its own steady clock, and how to align it.
Worker read_worker_file(const std::string& file, const json& doc, std::vector<std::string>& notes) {
  const json& other = other_data(doc, file);
  std::map<int64_t, Worker> by_pid;
  read_events(doc, file, by_pid, 0);
  if (by_pid.size() > 1) {
    fail(file, "holds " + std::to_string(by_pid.size()) +
                   " processes; a worker's trace file holds one (merge a directory of them)");
  }
  Worker w = by_pid.empty() ? Worker{} : std::move(by_pid.begin()->second);
  w.file = file;
  if (other.contains("process_name") && other["process_name"].is_string()) {
    w.name = other["process_name"].get<std::string>();
  }
  if (w.name.empty()) w.name = fs::path(file).filename().string();
  if (other.contains("worker_id")) {
    w.worker_id = as_int(other["worker_id"]);
    if (!w.worker_id) fail(file, "otherData.worker_id is not an integer");
  }
  if (other.contains("clock_offset")) {
    const json& c = other["clock_offset"];
    const auto offset = bounded_int(c, "offset_ns");
    const auto rtt = bounded_int(c, "rtt_ns");
    if (!offset || !rtt || rtt.value_or(-1) < 0) {
      fail(file,
           "otherData.clock_offset needs integers offset_ns (within 2^62) and rtt_ns "
           "(0 .. 2^62)");
    }
    w.offset_ns = offset.value_or(0);
    w.rtt_ns = rtt;
    w.aligned_by = "store";
  } else if (other.contains("clock_sync")) {
    const json& c = other["clock_sync"];
    const auto steady = bounded_int(c, "steady_ns");
    const auto system = bounded_int(c, "system_ns");
    if (!steady || !system) {
      fail(file, "otherData.clock_sync needs integers steady_ns and system_ns (within 2^62)");
    }
    w.offset_ns = system.value_or(0) - steady.value_or(0);
    w.aligned_by = "system_clock";
    notes.push_back(file +
                    ": no clock_offset (the process had no TCP store while tracing); "
                    "aligned by its own system clock (clock_sync), uncertainty unknown");
  } else {
    fail(file,
         "not a gradwire trace: otherData has neither clock_offset nor clock_sync, so "
         "its times cannot be aligned");
  }
  for (Event& e : w.events)
    e.ts_ns += w.offset_ns;
  return w;
}

void find_flows(Job& job) {
  // (callee id, caller id, request id) -> the rpc.serve events of that request.
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<std::pair<size_t, size_t>>> serves;
  std::map<int64_t, size_t> by_id;
  for (size_t w = 0; w < job.workers.size(); ++w) {
    const Worker& worker = job.workers[w];
    if (!worker.worker_id) continue;
    by_id[*worker.worker_id] = w;
    for (size_t i = 0; i < worker.events.size(); ++i) {
      const Event& e = worker.events[i];
      if (e.phase != 'X' || e.name != "rpc.serve") continue;
      const auto peer = e.int_arg("peer");
      const auto request = e.int_arg("request_id");
      if (peer && request) serves[{*worker.worker_id, *peer, *request}].emplace_back(w, i);
    }
  }
  for (size_t w = 0; w < job.workers.size(); ++w) {
    const Worker& worker = job.workers[w];
    if (!worker.worker_id) continue;
    for (size_t i = 0; i < worker.events.size(); ++i) {
      const Event& e = worker.events[i];
      if (e.phase != 'X' || e.name != "rpc.call") continue;
      const auto peer = e.int_arg("peer");
      const auto request = e.int_arg("request_id");
      if (!peer || !request) continue;
      auto it = serves.find({*peer, *worker.worker_id, *request});
      if (it == serves.end() || it->second.empty()) continue;
      // A request id may come back after a restart: the serve nearest the call's start.
      auto best = it->second.begin();
      for (auto s = it->second.begin(); s != it->second.end(); ++s) {
        const int64_t d = std::llabs(job.workers[s->first].events[s->second].ts_ns - e.ts_ns);
        const int64_t bd =
            std::llabs(job.workers[best->first].events[best->second].ts_ns - e.ts_ns);
        if (d < bd) best = s;
      }
      job.flows.push_back(Flow{w, i, best->first, best->second});
      it->second.erase(best);
    }
  }
}

// Moves every time so that the earliest event is at 0.
void rebase(Job& job) {
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const Worker& w : job.workers) {
    for (const Event& e : w.events)
      origin = std::min(origin, e.ts_ns);
  }
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;
  job.origin_ns += origin;
  for (Worker& w : job.workers) {
    for (Event& e : w.events)
      e.ts_ns -= origin;
  }
}

Job load_merged(const std::string& file, const json& doc) {
  const json& other = other_data(doc, file);
  Job job;
  const auto origin = other.contains("origin_ns") ? as_int(other["origin_ns"]) : std::nullopt;
  if (!origin || *origin > kMaxOffsetNs || *origin < -kMaxOffsetNs) {
    fail(file, "a merged trace without an integer otherData.origin_ns (within 2^62)");
  }
  job.origin_ns = *origin;
  std::map<int64_t, Worker> by_pid;
  read_events(doc, file, by_pid, 0);
  if (other.contains("workers") && other["workers"].is_array()) {
    for (const json& info : other["workers"]) {
      if (!info.is_object() || !info.contains("pid")) continue;
      const auto pid = as_int(info["pid"]);
      if (!pid) continue;
      Worker& w = by_pid[*pid];
      if (info.contains("worker_id")) w.worker_id = as_int(info["worker_id"]);
      if (info.contains("rtt_ns")) w.rtt_ns = as_int(info["rtt_ns"]);
      if (info.contains("offset_ns") && as_int(info["offset_ns"])) {
        w.offset_ns = *as_int(info["offset_ns"]);
      }
      if (info.contains("aligned_by") && info["aligned_by"].is_string()) {
        w.aligned_by = info["aligned_by"].get<std::string>();
      }
      if (info.contains("file") && info["file"].is_string()) {
        w.file = info["file"].get<std::string>();
      }
    }
  }
  for (auto& [pid, w] : by_pid) {
    w.pid = pid;
    if (w.name.empty()) w.name = "pid" + std::to_string(pid);
    if (w.file.empty()) w.file = file;
    job.workers.push_back(std::move(w));
  }
  find_flows(job);
  return job;
}

}  // namespace

std::optional<int64_t> Event::int_arg(const char* key) const {
  if (!args.is_object() || !args.contains(key)) return std::nullopt;
  return as_int(args[key]);
}

Job load_directory(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw TraceInputError(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) throw TraceInputError(dir + ": not a directory");
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::string suffix = ".trace.json";
    if (name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
        it->is_regular_file()) {
      files.push_back(it->path().string());
    }
  }
  if (ec) throw TraceInputError(dir + ": cannot be read: " + ec.message());
  if (files.empty()) throw TraceInputError(dir + ": no *.trace.json files in it");
  std::sort(files.begin(), files.end());
  Job job;
  for (const std::string& file : files) {
    const json doc = parse_file(file);
    job.workers.push_back(read_worker_file(file, doc, job.notes));
  }
  // Workers by name, so that rows come out in the same order every time.
  std::stable_sort(job.workers.begin(), job.workers.end(),
                   [](const Worker& a, const Worker& b) { return a.name < b.name; });
  for (size_t i = 0; i < job.workers.size(); ++i)
    job.workers[i].pid = static_cast<int64_t>(i) + 1;
  rebase(job);
  find_flows(job);
  return job;
}

Job load(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw TraceInputError(path + ": no such file or directory");
  if (fs::is_directory(path, ec)) return load_directory(path);
  const json doc = parse_file(path);
  const json& other = other_data(doc, path);
  if (other.contains("format") && other["format"] == kMergedFormat) return load_merged(path, doc);
  Job job;
  job.workers.push_back(read_worker_file(path, doc, job.notes));
  job.workers[0].pid = 1;
  rebase(job);
  find_flows(job);
  return job;
}

json merged_json(const Job& job) {
  json events = json::array();
  json workers = json::array();
  for (const Worker& w : job.workers) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", w.pid},
                      {"tid", 0},
                      {"args", {{"name", w.name}}}});
    events.push_back({{"name", "process_sort_index"},
                      {"ph", "M"},
                      {"pid", w.pid},
                      {"tid", 0},
                      {"args", {{"sort_index", w.pid}}}});
    for (const auto& [tid, name] : w.threads) {
      events.push_back({{"name", "thread_name"},
                        {"ph", "M"},
                        {"pid", w.pid},
                        {"tid", tid},
                        {"args", {{"name", name}}}});
    }
    for (const Event& e : w.events) {
      json j = {{"name", e.name},
                {"cat", e.category},
                {"ph", std::string(1, e.phase)},
                {"ts", static_cast<double>(e.ts_ns) / 1000.0},
                {"pid", w.pid},
                {"tid", e.tid},
                {"args", e.args}};
      if (e.phase == 'X') j["dur"] = static_cast<double>(e.dur_ns) / 1000.0;
      if (e.phase == 'i') j["s"] = "t";
      events.push_back(std::move(j));
    }
    json info = {{"name", w.name},
                 {"pid", w.pid},
                 {"source_pid", w.source_pid},
                 {"file", w.file},
                 {"offset_ns", w.offset_ns},
                 {"aligned_by", w.aligned_by}};
    if (w.worker_id) info["worker_id"] = *w.worker_id;
    if (w.rtt_ns) info["rtt_ns"] = *w.rtt_ns;
    if (auto r = w.residual_ns()) info["residual_ns"] = *r;
    workers.push_back(std::move(info));
  }
  int64_t id = 0;
  for (const Flow& f : job.flows) {
    const Worker& caller = job.workers[f.caller];
    const Worker& callee = job.workers[f.callee];
    const Event& call = caller.events[f.call];
    const Event& serve = callee.events[f.serve];
    ++id;
    events.push_back({{"name", "rpc"},
                      {"cat", "rpc.flow"},
                      {"ph", "s"},
                      {"id", id},
                      {"pid", caller.pid},
                      {"tid", call.tid},
                      {"ts", static_cast<double>(call.ts_ns) / 1000.0}});
    events.push_back({{"name", "rpc"},
                      {"cat", "rpc.flow"},
                      {"ph", "f"},
                      {"bp", "e"},
                      {"id", id},
                      {"pid", callee.pid},
                      {"tid", serve.tid},
                      {"ts", static_cast<double>(serve.ts_ns) / 1000.0}});
  }
  return {{"traceEvents", std::move(events)},
          {"displayTimeUnit", "ns"},
          {"otherData",
           {{"format", kMergedFormat},
            {"origin_ns", job.origin_ns},
            {"clock", "the store's system clock: ts 0 is origin_ns ns since the Unix epoch"},
            {"flows", job.flows.size()},
            {"workers", std::move(workers)}}}};
}

}  // namespace gradwire::tools::trace
