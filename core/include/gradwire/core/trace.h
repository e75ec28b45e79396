// gradwire::trace: spans and instant events recorded into per-thread ring buffers and
// written as a Chrome trace-event JSON file (chrome://tracing, Perfetto), so a worker's
// time can be looked at.
//
// Recording. An event has a name and a category (the module: "rpc", "c10d", ...), both
// `const char*` with static storage (string literals: nothing is copied), and up to
// kMaxArgs typed arguments (int64, double, or a static string), plus at most one dynamic
// string (Text) copied into the event, truncated to kTextBytes - 1 bytes. Each thread
// records into its own ring of ring_capacity() events; when it is full the oldest event is
// overwritten and counted (overwritten()). A thread's ring is allocated at its first event
// while tracing is enabled (registering it takes a lock once); after that recording takes
// no lock and allocates nothing. Rings outlive their threads, so a flush at exit still
// sees what finished threads recorded (one ring per thread that ever recorded).
//
// Cost. Every recording entry point first calls enabled(): one relaxed atomic load. While
// tracing is off nothing else happens (gradwire-bench: core.trace_span_disabled_ns).
//
// Enabling. GRADWIRE_TRACE=DIR, read once when the library loads, turns tracing on for
// the whole process and makes it write DIR/<name>.trace.json at exit (and on each flush()),
// where <name> is set_process_name()'s (the rpc agent sets its worker name), default
// "pid<N>". start() / stop() (or a ScopedCapture) turn it on and off for a scope from code.
//
// The file: {"traceEvents": [...], "displayTimeUnit": "ns", "otherData": {...}}. Spans are
// complete events ("ph": "X", "ts" and "dur" in microseconds of the steady clock), instants
// "ph": "i"; "pid" is the process id, "tid" the thread's kernel id; metadata events name
// the process and each thread. otherData holds one reading of the steady and the system
// clock taken together (clock_sync: steady_ns, system_ns) so files of several processes
// can be put on one time line, and the counts of overwritten and dropped events.
//
// Thread-safety: everything may be called from any thread. flush() and write() may run
// while other threads record: each ring is read under a flag its writer checks, and an
// event that a thread records during that copy is dropped and counted (dropped()), never
// half written; the writer never waits.
//
// Errors: write() and flush() throw InvalidArgument for an empty path or when no
// directory is set, and Error naming the file when it cannot be written.
//
// Example:
//   {
//     trace::Span span("step", "examples", trace::Arg("epoch", epoch));
//     ...
//     span.arg(trace::Arg("loss", loss));
//   }
//   trace::instant("checkpoint", "examples");
//   trace::flush();   // DIR/<name>.trace.json now
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>

namespace gradwire::trace {

inline constexpr int kMaxArgs = 5;
// Bytes of a Text argument's inline copy, its terminating zero included.
inline constexpr size_t kTextBytes = 48;

// One typed argument: a static key and an int64, a double or a static string.
struct Arg {
  enum class Type : uint8_t { kInt, kDouble, kString };
  const char* key{nullptr};
  Type type{Type::kInt};
  union {
    int64_t i;
    double d;
    const char* s;
  };
  constexpr Arg() : i(0) {}
  constexpr Arg(const char* k, int64_t v) : key(k), type(Type::kInt), i(v) {}
  constexpr Arg(const char* k, int v) : key(k), type(Type::kInt), i(v) {}
  constexpr Arg(const char* k, uint64_t v) : key(k), type(Type::kInt), i(static_cast<int64_t>(v)) {}
  constexpr Arg(const char* k, double v) : key(k), type(Type::kDouble), d(v) {}
  constexpr Arg(const char* k, const char* v) : key(k), type(Type::kString), s(v) {}
};

static_assert(std::is_trivially_copyable_v<Arg> && std::is_trivially_destructible_v<Arg>);

// A dynamic string argument (a function name): copied, truncated to kTextBytes - 1 bytes.
struct Text {
  const char* key{nullptr};
  std::string_view value;
};

// One recorded event, as it sits in a ring.
struct Event {
  const char* name{nullptr};
  const char* category{nullptr};
  int64_t ts_ns{0};   // steady clock
  int64_t dur_ns{0};  // complete events
  Arg args[kMaxArgs];
  const char* text_key{nullptr};  // null: no Text
  uint8_t nargs{0};
  char phase{'X'};  // 'X' complete, 'i' instant
  char text[kTextBytes]{};
};

namespace detail {
extern std::atomic<bool> g_enabled;
void record(const Event& event);
}  // namespace detail

// Whether events are being recorded now: one relaxed load.
inline bool enabled() {
  return detail::g_enabled.load(std::memory_order_relaxed);
}

// Nanoseconds of the steady clock (the time base of every event).
inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace detail {
inline void fill(Event& e, std::initializer_list<Arg> args, const Text* text) {
  for (const Arg& a : args) {
    if (e.nargs == kMaxArgs) break;
    e.args[e.nargs++] = a;
  }
  if (text != nullptr) {
    e.text_key = text->key;
    const size_t n = text->value.size() < kTextBytes - 1 ? text->value.size() : kTextBytes - 1;
    for (size_t i = 0; i < n; ++i)
      e.text[i] = text->value[i];
    e.text[n] = '\0';
  }
}
}  // namespace detail

// Records a complete event from start_ns to end_ns (now_ns() readings), for work whose
// beginning and end are seen in different places (a call, from send to reply). Arguments
// past kMaxArgs are ignored.
inline void complete(const char* name, const char* category, int64_t start_ns, int64_t end_ns,
                     std::initializer_list<Arg> args = {}, const Text* text = nullptr) {
  if (!enabled()) return;
  Event e;
  e.name = name;
  e.category = category;
  e.phase = 'X';
  e.ts_ns = start_ns;
  e.dur_ns = end_ns > start_ns ? end_ns - start_ns : 0;
  detail::fill(e, args, text);
  detail::record(e);
}

// Records an instant event now.
inline void instant(const char* name, const char* category, std::initializer_list<Arg> args = {},
                    const Text* text = nullptr) {
  if (!enabled()) return;
  Event e;
  e.name = name;
  e.category = category;
  e.phase = 'i';
  e.ts_ns = now_ns();
  detail::fill(e, args, text);
  detail::record(e);
}

// A span from construction to destruction, recorded as one complete event when it ends,
// if tracing was enabled when it began. Not copyable; belongs to the thread that made it.
class Span {
 public:
  template <typename... A>
  Span(const char* name, const char* category, A... args)
      : active_(enabled()), name_(name), category_(category) {
    static_assert(sizeof...(A) <= kMaxArgs, "trace::Span takes at most kMaxArgs arguments");
    if (active_) {
      ((new (&storage_[sizeof(Arg) * nargs_++]) Arg(args)), ...);
      start_ns_ = now_ns();
    }
  }
  ~Span() {
    if (active_) end();
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

  // Adds an argument known only later (an outcome); ignored past kMaxArgs.
  void arg(const Arg& a) {
    if (active_ && nargs_ < kMaxArgs) new (&storage_[sizeof(Arg) * nargs_++]) Arg(a);
  }
  bool active() const { return active_; }

 private:
  void end();

  bool active_;
  uint8_t nargs_{0};
  const char* name_;
  const char* category_;
  int64_t start_ns_{0};
  // The arguments, made only while active (a disabled span initialises none of them).
  alignas(Arg) unsigned char storage_[sizeof(Arg) * kMaxArgs];
};

// Turns recording on. A non-empty `dir` becomes the directory flush() and the exit write
// to (created if missing); empty keeps the one GRADWIRE_TRACE set, if any (without one,
// events are kept in memory for write()).
void start(const std::string& dir = "");
// Turns recording off; what was recorded stays until clear().
void stop();
// Drops every recorded event and resets the counts.
void clear();

// This process's name in trace files (the worker's name): "pid<N>" until set.
void set_process_name(const std::string& name);
std::string process_name();
// The directory set by GRADWIRE_TRACE, start(dir) or set_directory; empty when none.
std::string directory();
// Sets the directory flush() and the exit write use; empty: none (nothing is written at
// exit). Does not create it (start(dir) does).
void set_directory(const std::string& dir);

// Metadata of this process's trace files: `json` (a JSON text: a number, a string in quotes,
// an object...) becomes otherData[key] of every file written after the call, replacing an
// earlier value of the same key. The keys the project writes: "worker_id" (the rpc
// agent's worker id, which gradwire-trace merge matches calls to their serving with) and
// "clock_offset" (c10d::record_trace_clock_offset: this process's steady clock against
// the store's clock). Keys the file itself writes (format, process_name, pid, clock_sync,
// ts_clock, overwritten_events, dropped_events, ring_capacity) are refused.
// Throws InvalidArgument for an empty or reserved key and for `json` that does not parse.
// Example: trace::set_metadata("worker_id", "3");
void set_metadata(const std::string& key, const std::string& json);
// The value set for `key` (JSON text), or "" when none.
std::string metadata(const std::string& key);

// Writes everything recorded so far to `path` (replacing it).
void write(const std::string& path);
// Writes DIR/<process name>.trace.json (making DIR if missing) and returns its path.
// InvalidArgument without a directory.
std::string flush();

// Events each thread's ring holds: GRADWIRE_TRACE_EVENTS when set (>= 16), else 16384.
size_t ring_capacity();
// Events overwritten because a ring was full, and events dropped because a flush was
// copying their ring, since the last clear().
uint64_t overwritten();
uint64_t dropped();

// Tracing on for a scope: start(dir) in the constructor, stop() in the destructor.
class ScopedCapture {
 public:
  explicit ScopedCapture(const std::string& dir = "") { start(dir); }
  ~ScopedCapture() { stop(); }
  ScopedCapture(const ScopedCapture&) = delete;
  ScopedCapture& operator=(const ScopedCapture&) = delete;
};

}  // namespace gradwire::trace
