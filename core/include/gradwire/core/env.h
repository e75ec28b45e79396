// Typed options from environment variables, with errors that say what went wrong.
//
// Each env_* function reads one variable: unset or empty gives the default (for the typed
// ones, whitespace only counts as empty too), a good value is converted, and a bad one throws
// InvalidArgument naming the variable, the value received and what was expected:
//
//   GRADWIRE_NUM_THREADS="many" is invalid: expected an integer in [1, 1024]
//
// The parse_* functions do the same conversions on text the caller already has (a
// command-line flag, a config entry); `name` is only used in the error message.
//
// Accepted forms (surrounding whitespace is ignored; env_string returns the value as is):
//   int       decimal, optional sign: "8", "-3", "+4"; must lie in [min, max]
//   bool      1/0, true/false, yes/no, on/off, any case
//   double    decimal or scientific ("0.5", "1e-3"); finite; must lie in [min, max]
//   duration  "500ms", "2s", "1m", "1h" or a bare number of milliseconds ("250");
//             whole non-negative numbers only
//   choice    one of the allowed words, any case; the allowed spelling is returned
//
// The defaults are returned as given, unvalidated, so a program may use a sentinel such
// as -1 for "decide later".
//
// Thread-safety: reading functions are safe from any thread so long as nothing modifies
// the environment concurrently (setenv/putenv are not thread-safe in POSIX).
// Errors: InvalidArgument for a bad value, and for min > max.
//
// Example:
//   int threads = static_cast<int>(gradwire::env_int("GRADWIRE_NUM_THREADS", 4, 1, 1024));
//   auto timeout = gradwire::env_duration_ms("GRADWIRE_RPC_TIMEOUT", std::chrono::seconds(60));
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace gradwire {

// The raw value of a variable, or nullopt when it is unset. No trimming.
std::optional<std::string> env_raw(const std::string& name);

std::string env_string(const std::string& name, const std::string& default_value);
int64_t env_int(const std::string& name, int64_t default_value, int64_t min = INT64_MIN,
                int64_t max = INT64_MAX);
bool env_bool(const std::string& name, bool default_value);
double env_double(const std::string& name, double default_value,
                  double min = std::numeric_limits<double>::lowest(),
                  double max = std::numeric_limits<double>::max());
std::chrono::milliseconds env_duration_ms(const std::string& name,
                                          std::chrono::milliseconds default_value);
std::string env_choice(const std::string& name, const std::string& default_value,
                       const std::vector<std::string>& allowed);

int64_t parse_int(std::string_view name, std::string_view text, int64_t min = INT64_MIN,
                  int64_t max = INT64_MAX);
bool parse_bool(std::string_view name, std::string_view text);
double parse_double(std::string_view name, std::string_view text,
                    double min = std::numeric_limits<double>::lowest(),
                    double max = std::numeric_limits<double>::max());
std::chrono::milliseconds parse_duration_ms(std::string_view name, std::string_view text);
std::string parse_choice(std::string_view name, std::string_view text,
                         const std::vector<std::string>& allowed);

}  // namespace gradwire
