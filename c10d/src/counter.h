// The text form of add() counters, shared by the stores that keep values themselves.
#pragma once

#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>

#include "gradwire/c10d/store.h"
#include "gradwire/core/check.h"

namespace gradwire::c10d::detail {

// The counter stored under `key` plus delta, as the decimal text to store. A missing key
// counts as 0. Throws StoreError for a value that is not an integer or an overflow.
inline int64_t add_to_counter(const std::string& key, const Bytes* current, int64_t delta) {
  int64_t value = 0;
  if (current != nullptr) {
    std::string_view text(reinterpret_cast<const char*>(current->data()), current->size());
    if (!text.empty() && text.front() == '+') text.remove_prefix(1);
    auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    if (current->empty() || ec != std::errc() || ptr != text.data() + text.size()) {
      GRADWIRE_THROW(StoreError) << "add: the value of key '" << key << "' is not an integer";
    }
  }
  int64_t result = 0;
  if (__builtin_add_overflow(value, delta, &result)) {
    GRADWIRE_THROW(StoreError) << "add: counter '" << key << "' would overflow int64";
  }
  return result;
}

inline Bytes counter_bytes(int64_t value) {
  return to_bytes(std::to_string(value));
}

}  // namespace gradwire::c10d::detail
