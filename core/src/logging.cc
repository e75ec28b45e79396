#include "gradwire/core/logging.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>
#include <mutex>
#include <utility>

#include "gradwire/core/env.h"
#include "gradwire/core/error.h"
#include "gradwire/core/mutex.h"

namespace gradwire {
namespace detail {
std::atomic<int> g_log_threshold{kLogLevelUnread};
}  // namespace detail

namespace {

constexpr const char* kLogLevelVariable = "GRADWIRE_LOG_LEVEL";
constexpr LogLevel kDefaultLogLevel = LogLevel::kWarning;

// The sink lives behind a shared_ptr so that a line can be emitted outside the lock: a
// sink that logs, or one replaced while another thread is writing, cannot deadlock.
struct SinkSlot {
  Mutex mutex;
  std::shared_ptr<const LogSink> sink GRADWIRE_GUARDED_BY(mutex);
};

SinkSlot& sink_slot() {
  // Leaked on purpose: threads may still log while static destructors run at exit.
  static SinkSlot* slot = new SinkSlot();
  return *slot;
}

std::once_flag g_env_once;

void read_env_once() {
  std::call_once(g_env_once, [] {
    // A bad value's warning goes straight to the sink (emit_log_line skips the
    // threshold), so it cannot re-enter this once-block.
    const LogLevel level = log_level_from_env();
    int expected = detail::kLogLevelUnread;
    // A set_log_level that ran first wins over the environment.
    detail::g_log_threshold.compare_exchange_strong(expected, static_cast<int>(level));
  });
}

void write_stderr(std::string_view line) {
  // One write() per line keeps lines from different threads and processes whole (a
  // pipe guarantees it up to PIPE_BUF); only a short write, rare on stderr, takes more.
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t n = ::write(STDERR_FILENO, data, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    data += n;
    left -= static_cast<size_t>(n);
  }
}

const char* base_name(const char* file) {
  const char* slash = std::strrchr(file, '/');
  return slash != nullptr ? slash + 1 : file;
}

std::string format_line(LogLevel level, const char* file, int line, std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t seconds = std::chrono::system_clock::to_time_t(now);
  const auto micros =
      std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() %
      1'000'000;
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char stamp[64];
  std::snprintf(stamp, sizeof(stamp), "%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long>(micros));
  std::string out;
  out.reserve(message.size() + 96);
  out += "[gradwire ";
  out += stamp;
  out += ' ';
  out += log_level_name(level);
  // The kernel thread id, as shown by top -H and gdb, next to the pthread name.
  out += " tid=";
  out += std::to_string(static_cast<long>(::syscall(SYS_gettid)));
  out += ' ';
  out += base_name(file);
  out += ':';
  out += std::to_string(line);
  out += "] ";
  out += message;
  if (out.back() != '\n') out += '\n';
  return out;
}

}  // namespace

std::string_view log_level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarning:
      return "WARNING";
    case LogLevel::kError:
      return "ERROR";
    case LogLevel::kOff:
      return "OFF";
  }
  return "UNKNOWN";
}

LogLevel parse_log_level(std::string_view text) {
  const std::string word =
      parse_choice(kLogLevelVariable, text, {"debug", "info", "warning", "error", "off"});
  if (word == "debug") return LogLevel::kDebug;
  if (word == "info") return LogLevel::kInfo;
  if (word == "warning") return LogLevel::kWarning;
  if (word == "error") return LogLevel::kError;
  return LogLevel::kOff;
}

LogLevel log_level_from_env() {
  const std::optional<std::string> raw = env_raw(kLogLevelVariable);
  if (!raw || raw->find_first_not_of(" \t\r\n") == std::string::npos) return kDefaultLogLevel;
  try {
    return parse_log_level(*raw);
  } catch (const InvalidArgument& e) {
    detail::emit_log_line(
        LogLevel::kWarning, __FILE__, __LINE__,
        std::string(e.what()) + "; using " + std::string(log_level_name(kDefaultLogLevel)));
    return kDefaultLogLevel;
  }
}

LogLevel log_level() {
  read_env_once();
  return static_cast<LogLevel>(detail::g_log_threshold.load(std::memory_order_relaxed));
}

void set_log_level(LogLevel level) {
  detail::g_log_threshold.store(static_cast<int>(level), std::memory_order_relaxed);
  // Consumes the once-block so a later first log cannot overwrite the program's choice.
  read_env_once();
}

LogSink set_log_sink(LogSink sink) {
  auto next = sink ? std::make_shared<const LogSink>(std::move(sink)) : nullptr;
  SinkSlot& slot = sink_slot();
  std::shared_ptr<const LogSink> previous;
  {
    MutexLock lock(slot.mutex);
    previous = std::exchange(slot.sink, std::move(next));
  }
  return previous ? *previous : LogSink();
}

namespace detail {

bool log_enabled_slow(LogLevel level) {
  return level != LogLevel::kOff && static_cast<int>(level) >= static_cast<int>(log_level());
}

void emit_log_line(LogLevel level, const char* file, int line, std::string_view message) {
  try {
    const std::string text = format_line(level, file, line, message);
    std::shared_ptr<const LogSink> sink;
    {
      SinkSlot& slot = sink_slot();
      MutexLock lock(slot.mutex);
      sink = slot.sink;
    }
    if (sink) {
      (*sink)(level, text);
    } else {
      write_stderr(text);
    }
  } catch (...) {
    // Logging must never take a program down; a line that cannot be built is dropped.
  }
}

LogMessage::LogMessage(LogLevel level, const char* file, int line)
    : level_(level), file_(file), line_(line) {}

LogMessage::~LogMessage() {
  try {
    emit_log_line(level_, file_, line_, stream_.str());
  } catch (...) {
    // As in emit_log_line: a line that cannot be built is dropped.
  }
}

}  // namespace detail
}  // namespace gradwire
