#include "gradwire/c10d/hash_store.h"

#include "counter.h"
#include "gradwire/core/check.h"

namespace gradwire::c10d {

HashStore::HashStore(std::chrono::milliseconds timeout) : Store(timeout) {}

void HashStore::do_set(const std::string& key, const Bytes& value) {
  MutexLock lock(mutex_);
  data_[key] = value;
  changed_.notify_all();
}

void HashStore::wait_locked(MutexLock& lock, std::string_view op,
                            const std::vector<std::string>& keys,
                            std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    std::vector<std::string> missing;
    for (const std::string& k : keys) {
      if (data_.find(k) == data_.end()) missing.push_back(k);
    }
    if (missing.empty()) return;
    if (lock.wait_until(changed_, deadline) == std::cv_status::timeout) {
      missing.clear();
      for (const std::string& k : keys) {
        if (data_.find(k) == data_.end()) missing.push_back(k);
      }
      if (missing.empty()) return;
      GRADWIRE_THROW(TimeoutError) << timeout_message(op, missing, timeout);
    }
  }
}

Bytes HashStore::do_get(const std::string& key, std::chrono::milliseconds timeout) {
  MutexLock lock(mutex_);
  wait_locked(lock, "get", {key}, timeout);
  return data_.find(key)->second;
}

int64_t HashStore::do_add(const std::string& key, int64_t delta) {
  MutexLock lock(mutex_);
  auto it = data_.find(key);
  const int64_t result =
      detail::add_to_counter(key, it == data_.end() ? nullptr : &it->second, delta);
  data_[key] = detail::counter_bytes(result);
  changed_.notify_all();
  return result;
}

Bytes HashStore::do_compare_set(const std::string& key, const Bytes& expected,
                                const Bytes& desired) {
  MutexLock lock(mutex_);
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return {};
    data_.emplace(key, desired);
    changed_.notify_all();
    return desired;
  }
  if (it->second == expected) {
    it->second = desired;
    changed_.notify_all();
  }
  return it->second;
}

void HashStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  MutexLock lock(mutex_);
  wait_locked(lock, "wait", keys, timeout);
}

bool HashStore::do_check(const std::vector<std::string>& keys) {
  MutexLock lock(mutex_);
  for (const std::string& k : keys) {
    if (data_.find(k) == data_.end()) return false;
  }
  return true;
}

bool HashStore::do_delete_key(const std::string& key) {
  MutexLock lock(mutex_);
  return data_.erase(key) > 0;
}

int64_t HashStore::do_num_keys() {
  MutexLock lock(mutex_);
  return static_cast<int64_t>(data_.size());
}

std::vector<Bytes> HashStore::do_multi_get(const std::vector<std::string>& keys,
                                           std::chrono::milliseconds timeout) {
  MutexLock lock(mutex_);
  wait_locked(lock, "multi_get", keys, timeout);
  std::vector<Bytes> values;
  values.reserve(keys.size());
  for (const std::string& k : keys)
    values.push_back(data_.find(k)->second);
  return values;
}

void HashStore::do_multi_set(const std::vector<std::string>& keys,
                             const std::vector<Bytes>& values) {
  MutexLock lock(mutex_);
  for (size_t i = 0; i < keys.size(); ++i)
    data_[keys[i]] = values[i];
  changed_.notify_all();
}

void HashStore::do_append(const std::string& key, const Bytes& value) {
  MutexLock lock(mutex_);
  Bytes& current = data_[key];
  current.insert(current.end(), value.begin(), value.end());
  changed_.notify_all();
}

std::vector<std::string> HashStore::do_list_keys() {
  MutexLock lock(mutex_);
  std::vector<std::string> keys;
  keys.reserve(data_.size());
  for (const auto& entry : data_)
    keys.push_back(entry.first);
  return keys;
}

}  // namespace gradwire::c10d
