#include "gradwire/core/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <pthread.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/core/env.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"

namespace gradwire::trace {

namespace detail {
std::atomic<bool> g_enabled{false};
}  // namespace detail

namespace {

constexpr size_t kDefaultRingEvents = 16384;

// One thread's ring. Only its thread writes events; a reader (flush, clear) copies or resets
// it under a Dekker-style handshake with sequentially consistent flags: the writer raises
// `writing` and then looks at `reading`; the reader raises `reading` and then waits for
// `writing` to fall. Either the reader sees the writer's flag (and waits for the event to
// be complete), or the writer sees the reader's (and drops its event, counting it). The
// writer never waits.
struct Ring {
  explicit Ring(size_t capacity) : events(capacity) {}
  std::vector<Event> events;
  std::atomic<uint64_t> head{0};  // events ever written (next slot: head % capacity)
  std::atomic<bool> writing{false};
  std::atomic<bool> reading{false};
  std::atomic<uint64_t> dropped{0};
  int64_t tid{0};
  std::string thread_name;
};

// Process-wide state; leaked on purpose so that the exit write and threads still recording
// during exit never see it destroyed.
struct State {
  std::mutex mutex;       // rings, name and directory
  std::mutex read_mutex;  // one reader (flush, clear) at a time
  std::vector<std::shared_ptr<Ring>> rings;
  std::string process_name;
  std::string directory;
  // set_metadata's values, already parsed.
  std::vector<std::pair<std::string, nlohmann::json>> metadata;
  bool exit_write_registered{false};
};

State& state() {
  static State* s = new State();
  return *s;
}

thread_local Ring* t_ring = nullptr;

std::string default_name() {
  return "pid" + std::to_string(::getpid());
}

Ring* make_ring() {
  auto ring = std::make_shared<Ring>(ring_capacity());
  ring->tid = static_cast<int64_t>(::syscall(SYS_gettid));
  char name[32] = {0};
  if (::pthread_getname_np(::pthread_self(), name, sizeof(name)) == 0) ring->thread_name = name;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.rings.push_back(ring);
  return ring.get();
}

// Runs `fn(ring)` on every ring with its writer kept out (see Ring).
template <typename F>
void for_each_ring_exclusive(F&& fn) {
  State& s = state();
  std::lock_guard<std::mutex> reading(s.read_mutex);
  std::vector<std::shared_ptr<Ring>> rings;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    rings = s.rings;
  }
  for (const auto& ring : rings) {
    ring->reading.store(true, std::memory_order_seq_cst);
    for (int spins = 0; ring->writing.load(std::memory_order_seq_cst); ++spins) {
      // The writer is copying one event in: a few nanoseconds, unless it lost its core in
      // the middle; then it may be waiting for this very core, so give it up between looks.
      if (spins >= 64) std::this_thread::yield();
    }
    // fn may let the writer go early itself, once it has copied what it needs.
    fn(*ring);
    ring->reading.store(false, std::memory_order_release);
  }
}

void exit_write() {
  if (directory().empty()) return;
  try {
    flush();
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kError) << "trace: could not write the trace at exit: " << e.what();
  }
}

void use_directory(const std::string& dir) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.directory = dir;
  if (!s.exit_write_registered) {
    s.exit_write_registered = true;
    std::atexit(exit_write);
  }
}

// GRADWIRE_TRACE=DIR, read once as the library loads.
const bool g_from_environment = [] {
  const char* dir = std::getenv("GRADWIRE_TRACE");
  if (dir == nullptr || *dir == '\0') return false;
  use_directory(dir);
  detail::g_enabled.store(true, std::memory_order_relaxed);
  return true;
}();

nlohmann::json arg_value(const Arg& a) {
  switch (a.type) {
    case Arg::Type::kInt:
      return a.i;
    case Arg::Type::kDouble:
      return a.d;
    case Arg::Type::kString:
      return a.s != nullptr ? a.s : "";
  }
  return nullptr;
}

}  // namespace

namespace detail {

void record(const Event& event) {
  Ring* ring = t_ring;
  if (ring == nullptr) ring = t_ring = make_ring();
  ring->writing.store(true, std::memory_order_seq_cst);
  if (ring->reading.load(std::memory_order_seq_cst)) {
    ring->writing.store(false, std::memory_order_release);
    ring->dropped.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  const uint64_t head = ring->head.load(std::memory_order_relaxed);
  ring->events[head % ring->events.size()] = event;
  ring->head.store(head + 1, std::memory_order_relaxed);
  ring->writing.store(false, std::memory_order_release);
}

}  // namespace detail

void Span::end() {
  Event e;
  e.name = name_;
  e.category = category_;
  e.phase = 'X';
  e.ts_ns = start_ns_;
  e.dur_ns = now_ns() - start_ns_;
  e.nargs = nargs_;
  const Arg* args = std::launder(reinterpret_cast<const Arg*>(storage_));
  for (uint8_t i = 0; i < nargs_; ++i)
    e.args[i] = args[i];
  detail::record(e);
}

size_t ring_capacity() {
  static const size_t capacity = [] {
    try {
      return static_cast<size_t>(
          env_int("GRADWIRE_TRACE_EVENTS", static_cast<int64_t>(kDefaultRingEvents), 16, 1 << 24));
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "trace: " << e.what() << "; using " << kDefaultRingEvents;
      return kDefaultRingEvents;
    }
  }();
  return capacity;
}

void start(const std::string& dir) {
  if (!dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      throw InvalidArgument("trace::start: cannot create the trace directory '" + dir +
                            "': " + ec.message());
    }
    use_directory(dir);
  }
  detail::g_enabled.store(true, std::memory_order_relaxed);
}

void stop() {
  detail::g_enabled.store(false, std::memory_order_relaxed);
}

void clear() {
  for_each_ring_exclusive([](Ring& ring) {
    ring.head.store(0, std::memory_order_relaxed);
    ring.dropped.store(0, std::memory_order_relaxed);
  });
}

void set_process_name(const std::string& name) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.process_name = name;
}

std::string process_name() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.process_name.empty() ? default_name() : s.process_name;
}

void set_directory(const std::string& dir) {
  use_directory(dir);
}

std::string directory() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.directory;
}

namespace {
bool reserved_key(const std::string& key) {
  for (const char* k : {"format", "process_name", "pid", "clock_sync", "ts_clock",
                        "overwritten_events", "dropped_events", "ring_capacity"}) {
    if (key == k) return true;
  }
  return false;
}
}  // namespace

void set_metadata(const std::string& key, const std::string& json) {
  if (key.empty()) throw InvalidArgument("trace::set_metadata: the key is empty");
  if (reserved_key(key)) {
    throw InvalidArgument("trace::set_metadata: '" + key +
                          "' is written by the trace file itself and cannot be set");
  }
  nlohmann::json value = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) {
    throw InvalidArgument("trace::set_metadata: the value of '" + key +
                          "' is not JSON: " + json.substr(0, 64));
  }
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (auto& [k, v] : s.metadata) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  s.metadata.emplace_back(key, std::move(value));
}

std::string metadata(const std::string& key) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (const auto& [k, v] : s.metadata) {
    if (k == key) return v.dump();
  }
  return "";
}

uint64_t overwritten() {
  uint64_t total = 0;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (const auto& ring : s.rings) {
    const uint64_t head = ring->head.load(std::memory_order_relaxed);
    if (head > ring->events.size()) total += head - ring->events.size();
  }
  return total;
}

uint64_t dropped() {
  uint64_t total = 0;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  for (const auto& ring : s.rings)
    total += ring->dropped.load(std::memory_order_relaxed);
  return total;
}

namespace {

// One event in the Trace Event Format.
nlohmann::json event_json(const Event& e, int64_t pid, int64_t tid) {
  nlohmann::json j = {{"name", e.name != nullptr ? e.name : ""},
                      {"cat", e.category != nullptr ? e.category : ""},
                      {"ph", std::string(1, e.phase)},
                      {"ts", static_cast<double>(e.ts_ns) / 1000.0},
                      {"pid", pid},
                      {"tid", tid}};
  if (e.phase == 'X') j["dur"] = static_cast<double>(e.dur_ns) / 1000.0;
  if (e.phase == 'i') j["s"] = "t";
  nlohmann::json args = nlohmann::json::object();
  for (uint8_t i = 0; i < e.nargs && i < kMaxArgs; ++i) {
    if (e.args[i].key != nullptr) args[e.args[i].key] = arg_value(e.args[i]);
  }
  if (e.text_key != nullptr) args[e.text_key] = std::string(e.text);
  j["args"] = std::move(args);
  return j;
}

void write_whole(const std::string& path, const nlohmann::json& file, int64_t pid) {
  // Written whole to a temporary file and renamed, so a reader never sees half a file.
  const std::string tmp = path + ".tmp" + std::to_string(pid);
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw Error("trace::write: cannot open '" + tmp + "': " + std::strerror(errno));
    }
    // Text an event keeps may be a peer's (a function name a request named), and is cut at
    // kTextBytes wherever that falls: bytes that are not UTF-8 are written as U+FFFD rather
    // than make the whole file unwritable.
    out << file.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace);
    out.flush();
    if (!out) throw Error("trace::write: writing '" + tmp + "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw Error("trace::write: cannot rename to '" + path + "'");
  }
}

}  // namespace

void write(const std::string& path) {
  if (path.empty()) throw InvalidArgument("trace::write: the path is empty");
  const int64_t pid = ::getpid();
  const std::string name = process_name();
  // The clock pair, read back to back, for putting several files on one time line.
  const int64_t steady_ns = now_ns();
  const int64_t system_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{"name", name}}}});
  uint64_t overwritten_events = 0;
  uint64_t dropped_events = 0;
  std::vector<Event> copy;
  for_each_ring_exclusive([&](Ring& ring) {
    const uint64_t head = ring.head.load(std::memory_order_relaxed);
    const uint64_t capacity = ring.events.size();
    const uint64_t first = head > capacity ? head - capacity : 0;
    overwritten_events += first;
    dropped_events += ring.dropped.load(std::memory_order_relaxed);
    copy.clear();
    for (uint64_t i = first; i < head; ++i)
      copy.push_back(ring.events[i % capacity]);
    const int64_t tid = ring.tid;
    const std::string thread_name = ring.thread_name;
    // The writer is let go before the JSON is built from the copy.
    ring.reading.store(false, std::memory_order_release);
    events.push_back(
        {{"name", "thread_name"},
         {"ph", "M"},
         {"pid", pid},
         {"tid", tid},
         {"args", {{"name", thread_name.empty() ? std::to_string(tid) : thread_name}}}});
    for (const Event& e : copy)
      events.push_back(event_json(e, pid, tid));
  });
  nlohmann::json file = {{"traceEvents", std::move(events)},
                         {"displayTimeUnit", "ns"},
                         {"otherData",
                          {{"format", "gradwire-trace 1"},
                           {"process_name", name},
                           {"pid", pid},
                           {"clock_sync", {{"steady_ns", steady_ns}, {"system_ns", system_ns}}},
                           {"ts_clock", "steady"},
                           {"overwritten_events", overwritten_events},
                           {"dropped_events", dropped_events},
                           {"ring_capacity", ring_capacity()}}}};
  {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const auto& [key, value] : s.metadata)
      file["otherData"][key] = value;
  }
  write_whole(path, file, pid);
}

std::string flush() {
  const std::string dir = directory();
  if (dir.empty()) {
    throw InvalidArgument(
        "trace::flush: no trace directory (set GRADWIRE_TRACE=DIR or call trace::start(DIR))");
  }
  // GRADWIRE_TRACE may name a directory that does not exist yet; if it cannot be made,
  // write() says so.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  const std::string path = (std::filesystem::path(dir) / (process_name() + ".trace.json")).string();
  write(path);
  return path;
}

}  // namespace gradwire::trace
