#include "gradwire/core/env.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "gradwire/core/check.h"

namespace gradwire {
namespace {

std::string_view trim(std::string_view text) {
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && is_space(text.front()))
    text.remove_prefix(1);
  while (!text.empty() && is_space(text.back()))
    text.remove_suffix(1);
  return text;
}

bool equals_ignore_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

[[noreturn]] void fail(std::string_view name, std::string_view text, std::string_view expected) {
  GRADWIRE_THROW(InvalidArgument) << name << "=\"" << text << "\" is invalid: expected "
                                  << expected;
}

// from_chars rejects a leading '+', which people do write ("+4"); accept it, but only in
// front of a digit, so "+-4" stays invalid.
std::string_view skip_plus(std::string_view text) {
  if (text.size() >= 2 && text[0] == '+' && std::isdigit(static_cast<unsigned char>(text[1]))) {
    text.remove_prefix(1);
  }
  return text;
}

template <typename T>
std::string range_text(std::string_view what, T min, T max, T lowest, T highest) {
  std::ostringstream out;
  out << what;
  if (min != lowest && max != highest) {
    out << " in [" << min << ", " << max << "]";
  } else if (min != lowest) {
    out << " >= " << min;
  } else if (max != highest) {
    out << " <= " << max;
  }
  return out.str();
}

// Empty (after trimming) counts as unset, so `FOO= program` falls back to the default.
std::optional<std::string> env_value(const std::string& name) {
  std::optional<std::string> raw = env_raw(name);
  if (!raw || trim(*raw).empty()) return std::nullopt;
  return raw;
}

}  // namespace

std::optional<std::string> env_raw(const std::string& name) {
  const char* value = std::getenv(name.c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

int64_t parse_int(std::string_view name, std::string_view text, int64_t min, int64_t max) {
  GRADWIRE_CHECK_ARG(min <= max) << "range for " << name << " is empty: min " << min << " > max "
                                 << max;
  const std::string expected = range_text("an integer", min, max, INT64_MIN, INT64_MAX);
  const std::string_view digits = skip_plus(trim(text));
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec == std::errc::result_out_of_range) fail(name, text, expected + " (value out of range)");
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size()) {
    fail(name, text, expected);
  }
  if (value < min || value > max) fail(name, text, expected);
  return value;
}

bool parse_bool(std::string_view name, std::string_view text) {
  const std::string_view word = trim(text);
  for (std::string_view yes : {"1", "true", "yes", "on"}) {
    if (equals_ignore_case(word, yes)) return true;
  }
  for (std::string_view no : {"0", "false", "no", "off"}) {
    if (equals_ignore_case(word, no)) return false;
  }
  fail(name, text, "a boolean (1/0, true/false, yes/no, on/off)");
}

double parse_double(std::string_view name, std::string_view text, double min, double max) {
  GRADWIRE_CHECK_ARG(min <= max) << "range for " << name << " is empty: min " << min << " > max "
                                 << max;
  const std::string expected =
      range_text("a finite number", min, max, std::numeric_limits<double>::lowest(),
                 std::numeric_limits<double>::max());
  const std::string_view digits = skip_plus(trim(text));
  double value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() ||
      !std::isfinite(value)) {
    fail(name, text, expected);
  }
  if (value < min || value > max) fail(name, text, expected);
  return value;
}

std::chrono::milliseconds parse_duration_ms(std::string_view name, std::string_view text) {
  constexpr std::string_view kExpected =
      "a duration such as 500ms, 2s, 1m, 1h or a whole number of milliseconds";
  const std::string_view word = trim(text);
  size_t digits = 0;
  while (digits < word.size() && std::isdigit(static_cast<unsigned char>(word[digits]))) {
    ++digits;
  }
  if (digits == 0) fail(name, text, kExpected);
  int64_t count = 0;
  const auto [end, ec] = std::from_chars(word.data(), word.data() + digits, count);
  if (ec != std::errc() || end != word.data() + digits) {
    fail(name, text, std::string(kExpected) + " (value out of range)");
  }
  const std::string_view unit = word.substr(digits);
  int64_t scale = 0;
  if (unit.empty() || unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60'000;
  } else if (unit == "h") {
    scale = 3'600'000;
  } else {
    fail(name, text, kExpected);
  }
  if (count > INT64_MAX / scale) fail(name, text, std::string(kExpected) + " (value out of range)");
  return std::chrono::milliseconds(count * scale);
}

std::string parse_choice(std::string_view name, std::string_view text,
                         const std::vector<std::string>& allowed) {
  GRADWIRE_CHECK_ARG(!allowed.empty()) << "no allowed values given for " << name;
  const std::string_view word = trim(text);
  for (const std::string& choice : allowed) {
    if (equals_ignore_case(word, choice)) return choice;
  }
  std::string expected = "one of ";
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (i > 0) expected += ", ";
    expected += allowed[i];
  }
  fail(name, text, expected);
}

std::string env_string(const std::string& name, const std::string& default_value) {
  std::optional<std::string> raw = env_raw(name);
  return raw && !raw->empty() ? *raw : default_value;
}

int64_t env_int(const std::string& name, int64_t default_value, int64_t min, int64_t max) {
  std::optional<std::string> value = env_value(name);
  return value ? parse_int(name, *value, min, max) : default_value;
}

bool env_bool(const std::string& name, bool default_value) {
  std::optional<std::string> value = env_value(name);
  return value ? parse_bool(name, *value) : default_value;
}

double env_double(const std::string& name, double default_value, double min, double max) {
  std::optional<std::string> value = env_value(name);
  return value ? parse_double(name, *value, min, max) : default_value;
}

std::chrono::milliseconds env_duration_ms(const std::string& name,
                                          std::chrono::milliseconds default_value) {
  std::optional<std::string> value = env_value(name);
  return value ? parse_duration_ms(name, *value) : default_value;
}

std::string env_choice(const std::string& name, const std::string& default_value,
                       const std::vector<std::string>& allowed) {
  std::optional<std::string> value = env_value(name);
  return value ? parse_choice(name, *value, allowed) : default_value;
}

}  // namespace gradwire
