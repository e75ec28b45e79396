#include "gradwire/c10d/prefix_store.h"

#include "gradwire/core/check.h"

namespace gradwire::c10d {

PrefixStore::PrefixStore(std::string prefix, std::shared_ptr<Store> store)
    : Store(store ? store->timeout() : kDefaultStoreTimeout),
      prefix_(std::move(prefix)),
      store_(std::move(store)) {
  GRADWIRE_CHECK_ARG(store_ != nullptr) << "PrefixStore('" << prefix_ << "'): store is null";
  GRADWIRE_CHECK_ARG(!prefix_.empty()) << "PrefixStore: prefix must not be empty";
  prefix_ += '/';
}

std::vector<std::string> PrefixStore::join(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys)
    out.push_back(join(k));
  return out;
}

void PrefixStore::rethrow_unprefixed(const std::exception& e) const {
  // The underlying store names its own keys; the caller knows them without the prefix.
  std::string message = e.what();
  const std::string quoted = "'" + prefix_;
  for (size_t pos = message.find(quoted); pos != std::string::npos;
       pos = message.find(quoted, pos + 1)) {
    message.erase(pos + 1, prefix_.size());
  }
  GRADWIRE_THROW(TimeoutError) << message;
}

void PrefixStore::do_set(const std::string& key, const Bytes& value) {
  store_->set(join(key), value);
}

Bytes PrefixStore::do_get(const std::string& key, std::chrono::milliseconds timeout) {
  try {
    return store_->get(join(key), timeout);
  } catch (const TimeoutError& e) {
    rethrow_unprefixed(e);
  }
}

int64_t PrefixStore::do_add(const std::string& key, int64_t delta) {
  return store_->add(join(key), delta);
}

Bytes PrefixStore::do_compare_set(const std::string& key, const Bytes& expected,
                                  const Bytes& desired) {
  return store_->compare_set(join(key), expected, desired);
}

void PrefixStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  try {
    store_->wait(join(keys), timeout);
  } catch (const TimeoutError& e) {
    rethrow_unprefixed(e);
  }
}

bool PrefixStore::do_check(const std::vector<std::string>& keys) {
  return store_->check(join(keys));
}

bool PrefixStore::do_delete_key(const std::string& key) {
  return store_->delete_key(join(key));
}

int64_t PrefixStore::do_num_keys() {
  return static_cast<int64_t>(do_list_keys().size());
}

std::vector<Bytes> PrefixStore::do_multi_get(const std::vector<std::string>& keys,
                                             std::chrono::milliseconds timeout) {
  try {
    return store_->multi_get(join(keys), timeout);
  } catch (const TimeoutError& e) {
    rethrow_unprefixed(e);
  }
}

void PrefixStore::do_multi_set(const std::vector<std::string>& keys,
                               const std::vector<Bytes>& values) {
  store_->multi_set(join(keys), values);
}

void PrefixStore::do_append(const std::string& key, const Bytes& value) {
  store_->append(join(key), value);
}

std::vector<std::string> PrefixStore::do_list_keys() {
  std::vector<std::string> keys;
  for (std::string& k : store_->list_keys()) {
    if (k.size() >= prefix_.size() && k.compare(0, prefix_.size(), prefix_) == 0) {
      keys.push_back(k.substr(prefix_.size()));
    }
  }
  return keys;
}

}  // namespace gradwire::c10d
