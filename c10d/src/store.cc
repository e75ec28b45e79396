#include "gradwire/c10d/store.h"

#include <string>

#include "gradwire/core/check.h"

namespace gradwire::c10d {

Bytes to_bytes(std::string_view text) {
  return Bytes(text.begin(), text.end());
}

std::string to_string(const Bytes& bytes) {
  return std::string(bytes.begin(), bytes.end());
}

namespace {

void check_timeout(std::string_view op, std::chrono::milliseconds timeout) {
  GRADWIRE_CHECK_ARG(timeout.count() > 0)
      << op << ": timeout must be positive, got " << timeout.count() << " ms";
}

}  // namespace

Bytes Store::get(const std::string& key, std::chrono::milliseconds timeout) {
  check_timeout("get", timeout);
  return do_get(key, timeout);
}

void Store::wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  check_timeout("wait", timeout);
  if (keys.empty()) return;
  do_wait(keys, timeout);
}

std::vector<Bytes> Store::multi_get(const std::vector<std::string>& keys,
                                    std::chrono::milliseconds timeout) {
  check_timeout("multi_get", timeout);
  if (keys.empty()) return {};
  return do_multi_get(keys, timeout);
}

void Store::multi_set(const std::vector<std::string>& keys, const std::vector<Bytes>& values) {
  GRADWIRE_CHECK_ARG(keys.size() == values.size())
      << "multi_set: " << keys.size() << " keys but " << values.size() << " values";
  if (keys.empty()) return;
  do_multi_set(keys, values);
}

void Store::set_timeout(std::chrono::milliseconds timeout) {
  check_timeout("set_timeout", timeout);
  timeout_ = timeout;
}

void barrier(Store& store, const std::string& key, int world_size,
             std::chrono::milliseconds timeout) {
  GRADWIRE_CHECK_ARG(world_size >= 1)
      << "barrier '" << key << "': world_size must be at least 1, got " << world_size;
  GRADWIRE_CHECK_ARG(timeout.count() > 0)
      << "barrier '" << key << "': timeout must be positive, got " << timeout.count() << " ms";
  const int64_t arrived = store.add(key, 1);
  const int64_t round = (arrived - 1) / world_size;
  const std::string done = key + "/done/" + std::to_string(round);
  if (arrived % world_size == 0) store.set(done, std::string_view("1"));
  store.wait({done}, timeout);
}

std::string timeout_message(std::string_view op, const std::vector<std::string>& missing,
                            std::chrono::milliseconds timeout) {
  std::string text(op);
  text += ": timed out after " + std::to_string(timeout.count()) + " ms waiting for key";
  text += missing.size() == 1 ? " " : "s ";
  text += "[";
  for (size_t i = 0; i < missing.size(); ++i) {
    if (i > 0) text += ", ";
    text += "'" + missing[i] + "'";
  }
  text += "]";
  return text;
}

}  // namespace gradwire::c10d
