// Quiet-by-default logging: GRADWIRE_LOG(kInfo) << "worker " << name << " joined";
//
// The threshold comes once from GRADWIRE_LOG_LEVEL (debug, info, warning, error or off,
// any case; default warning), so a healthy job prints nothing. A statement below the
// threshold costs one load and one branch: its operands are not evaluated. Each line is
// formatted completely and then handed to the sink in one piece; the default sink writes
// it to stderr with a single write(), so lines from different threads never interleave:
//
//   [gradwire 2024-05-01T10:11:12.345678Z WARNING tid=4242 thread_pool.cc:88] message
//
// Programs may change the threshold (set_log_level) and replace the sink (set_log_sink),
// e.g. to route lines into their own logging or to capture them in a test.
//
// Thread-safety: every function is safe to call from any thread. Sinks are called
// concurrently from the logging threads, outside any gradwire lock, and must be
// thread-safe themselves.
// Errors: logging never throws. parse_log_level throws InvalidArgument for bad text; a
// bad GRADWIRE_LOG_LEVEL is reported by one warning line and the default is used.
//
// Example:
//   gradwire::set_log_level(gradwire::LogLevel::kInfo);
//   GRADWIRE_LOG(kInfo) << "rank " << rank << " listening on port " << port;
#pragma once

#include <atomic>
#include <functional>
#include <sstream>
#include <string>
#include <string_view>

namespace gradwire {

enum class LogLevel { kDebug, kInfo, kWarning, kError, kOff };

// "DEBUG", "INFO", "WARNING", "ERROR" or "OFF".
std::string_view log_level_name(LogLevel level);

// Parses debug|info|warning|error|off in any case; throws InvalidArgument naming
// GRADWIRE_LOG_LEVEL, the text and the accepted values otherwise.
LogLevel parse_log_level(std::string_view text);

// Reads GRADWIRE_LOG_LEVEL now. Unset or empty gives kWarning; a bad value gives kWarning
// after one warning line (written whatever the threshold, since the user asked for logs).
// The library calls this once, on first use; a program may call it again to re-read:
// set_log_level(log_level_from_env()).
LogLevel log_level_from_env();

LogLevel log_level();
void set_log_level(LogLevel level);

// Receives each complete line (with its trailing newline) and the level it was logged at.
using LogSink = std::function<void(LogLevel level, std::string_view line)>;

// Installs a sink, or restores the stderr sink when given an empty function. Returns the
// sink it replaced (empty for the stderr sink) so that callers can put it back.
LogSink set_log_sink(LogSink sink);

namespace detail {

// Threshold as an int, or kLogLevelUnread before GRADWIRE_LOG_LEVEL was read. Constant-
// initialised, so logging works even from other libraries' static initialisers.
inline constexpr int kLogLevelUnread = -1;
extern std::atomic<int> g_log_threshold;
bool log_enabled_slow(LogLevel level);

}  // namespace detail

// True when a line at `level` would be written.
inline bool log_enabled(LogLevel level) {
  const int threshold = detail::g_log_threshold.load(std::memory_order_relaxed);
  // kLogLevelUnread is below every level, so the first call falls through to the slow
  // path, which reads the environment once.
  if (static_cast<int>(level) < threshold) return false;
  return threshold != detail::kLogLevelUnread ? level != LogLevel::kOff
                                              : detail::log_enabled_slow(level);
}

namespace detail {

// One log statement: collects the message, and writes the line when destroyed at the end
// of the full expression.
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

// Formats and emits one line, bypassing the threshold.
void emit_log_line(LogLevel level, const char* file, int line, std::string_view message);

}  // namespace detail
}  // namespace gradwire

// `level` is the bare enumerator name: GRADWIRE_LOG(kWarning) << ...;
#define GRADWIRE_LOG(level)                                    \
  if (!::gradwire::log_enabled(::gradwire::LogLevel::level)) { \
  } else                                                       \
    ::gradwire::detail::LogMessage(::gradwire::LogLevel::level, __FILE__, __LINE__).stream()
