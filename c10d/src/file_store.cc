// FileStore: an append-only log of records, replayed into a per-object cache.
//
// Record: u8 type | u32 key length | u32 value length | key | value (little-endian).
//   type 1: set key = value    type 2: delete key    type 3: users (value: i64 joined
//   delta, i64 finished delta)
// Writers append under an exclusive OFD lock after replaying to the end, so the log is a
// total order of every operation by every process; readers take a shared lock. OFD locks
// belong to the open file description, not the process, so two FileStores in one process
// exclude each other too, and closing one descriptor never drops another's lock.
#include "gradwire/c10d/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "counter.h"
#include "gradwire/core/check.h"
#include "gradwire/core/logging.h"
#include "little_endian.h"

namespace gradwire::c10d {

namespace {

constexpr uint8_t kRecordSet = 1;
constexpr uint8_t kRecordDelete = 2;
constexpr uint8_t kRecordUsers = 3;
constexpr size_t kRecordHeader = 9;

using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  GRADWIRE_THROW(StoreError) << "FileStore '" << path << "': " << what << ": "
                             << std::strerror(err);
}

using le::get_u32;
using le::put_u32;

std::string users_value(int64_t joined, int64_t finished) {
  std::string out;
  for (int64_t v : {joined, finished}) {
    const auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i)
      out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
  }
  return out;
}

int64_t get_i64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return static_cast<int64_t>(v);
}

bool ofd_lock(int fd, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = 0;
  fl.l_len = 0;
  while (::fcntl(fd, F_OFD_SETLKW, &fl) != 0) {
    if (errno != EINTR) return false;
  }
  return true;
}

// Releases the file lock at the end of an operation, whatever way it leaves.
struct OfdUnlock {
  int fd;
  ~OfdUnlock() { ofd_lock(fd, F_UNLCK); }
};

}  // namespace

void FileStoreOptions::validate() const {
  GRADWIRE_CHECK_ARG(!path.empty()) << "FileStoreOptions.path must not be empty";
  GRADWIRE_CHECK_ARG(num_workers >= 0)
      << "FileStoreOptions.num_workers = " << num_workers << " must not be negative";
  GRADWIRE_CHECK_ARG(timeout.count() > 0)
      << "FileStoreOptions.timeout = " << timeout.count() << " ms must be positive";
  GRADWIRE_CHECK_ARG(max_key_bytes >= 1 && max_value_bytes >= 1)
      << "FileStoreOptions: max_key_bytes and max_value_bytes must be positive";
}

FileStore::FileStore(FileStoreOptions options)
    : Store(options.timeout), options_(std::move(options)) {
  options_.validate();
  MutexLock lock(mutex_);
  lock_file(true);
  OfdUnlock guard{fd_};
  append_record(kRecordUsers, {}, users_value(1, 0));
}

FileStore::~FileStore() {
  MutexLock lock(mutex_);
  try {
    lock_file(true);
    OfdUnlock guard{fd_};
    append_record(kRecordUsers, {}, users_value(-1, 1));
    const bool last = options_.num_workers > 0 ? finished_ >= options_.num_workers : users_ <= 0;
    if (last && ::unlink(options_.path.c_str()) != 0 && errno != ENOENT) {
      GRADWIRE_LOG(kWarning) << "FileStore '" << options_.path
                             << "': cannot remove the file: " << std::strerror(errno);
    }
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kWarning) << "FileStore '" << options_.path << "': clean-up failed: " << e.what();
  }
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::open_file() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = ::open(options_.path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw_io(options_.path, "cannot open", errno);
  struct stat st {};
  ::fstat(fd_, &st);
  ino_ = st.st_ino;
  offset_ = 0;
  cache_.clear();
  users_ = 0;
  finished_ = 0;
}

void FileStore::lock_file(bool exclusive) {
  for (;;) {
    if (fd_ < 0) open_file();
    if (!ofd_lock(fd_, exclusive ? F_WRLCK : F_RDLCK)) {
      throw_io(options_.path, "cannot lock", errno);
    }
    // The last user may have removed the file between our open and our lock: then the
    // path names a new file (or none), and this one must be left for it.
    struct stat st {};
    if (::stat(options_.path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_ino) == ino_) {
      break;
    }
    ofd_lock(fd_, F_UNLCK);
    ::close(fd_);
    fd_ = -1;
  }
  replay();
}

void FileStore::replay() {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) throw_io(options_.path, "cannot stat", errno);
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size <= offset_) return;
  std::string buf(size - offset_, '\0');
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t n =
        ::pread(fd_, buf.data() + got, buf.size() - got, static_cast<off_t>(offset_ + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io(options_.path, "cannot read", errno);
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  buf.resize(got);
  size_t pos = 0;
  while (pos < buf.size()) {
    if (buf.size() - pos < kRecordHeader) break;
    const auto type = static_cast<uint8_t>(buf[pos]);
    const uint32_t klen = get_u32(buf.data() + pos + 1);
    const uint32_t vlen = get_u32(buf.data() + pos + 5);
    if (buf.size() - pos - kRecordHeader < uint64_t{klen} + vlen) break;
    const char* k = buf.data() + pos + kRecordHeader;
    const char* v = k + klen;
    switch (type) {
      case kRecordSet:
        cache_[std::string(k, klen)] = Bytes(v, v + vlen);
        break;
      case kRecordDelete:
        cache_.erase(std::string(k, klen));
        break;
      case kRecordUsers:
        if (vlen != 16) {
          GRADWIRE_THROW(StoreError) << "FileStore '" << options_.path
                                     << "': corrupt users record at offset " << offset_ + pos;
        }
        users_ += get_i64(v);
        finished_ += get_i64(v + 8);
        break;
      default:
        GRADWIRE_THROW(StoreError)
            << "FileStore '" << options_.path << "': corrupt record type " << int{type}
            << " at offset " << offset_ + pos << " (not a gradwire FileStore, or damaged)";
    }
    pos += kRecordHeader + klen + vlen;
  }
  if (pos != buf.size()) {
    // Writers append whole records under the lock, so a partial record is damage.
    GRADWIRE_THROW(StoreError) << "FileStore '" << options_.path << "': truncated record at offset "
                               << offset_ + pos;
  }
  offset_ += pos;
}

void FileStore::append_record(uint8_t type, std::string_view key, std::string_view value) {
  std::string rec;
  rec.reserve(kRecordHeader + key.size() + value.size());
  rec.push_back(static_cast<char>(type));
  put_u32(rec, static_cast<uint32_t>(key.size()));
  put_u32(rec, static_cast<uint32_t>(value.size()));
  rec.append(key);
  rec.append(value);
  size_t done = 0;
  while (done < rec.size()) {
    const ssize_t n =
        ::pwrite(fd_, rec.data() + done, rec.size() - done, static_cast<off_t>(offset_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_io(options_.path, "cannot write", errno);
    done += static_cast<size_t>(n);
  }
  // Applying our own record by replaying it keeps one code path for every record.
  replay();
}

void FileStore::append_set(const std::string& key, const Bytes& value) {
  append_record(kRecordSet, key,
                std::string_view(reinterpret_cast<const char*>(value.data()), value.size()));
}

void FileStore::check_key(const std::string& key) const {
  GRADWIRE_CHECK_ARG(key.size() <= options_.max_key_bytes)
      << "FileStore: key of " << key.size() << " bytes exceeds the limit of "
      << options_.max_key_bytes << " bytes (FileStoreOptions.max_key_bytes)";
}

void FileStore::check_value(const std::string& key, size_t size) const {
  GRADWIRE_CHECK_ARG(size <= options_.max_value_bytes)
      << "FileStore: value of " << size << " bytes for key '" << key << "' exceeds the limit of "
      << options_.max_value_bytes << " bytes (FileStoreOptions.max_value_bytes)";
}

void FileStore::do_set(const std::string& key, const Bytes& value) {
  check_key(key);
  check_value(key, value.size());
  MutexLock lock(mutex_);
  lock_file(true);
  OfdUnlock guard{fd_};
  append_set(key, value);
}

std::vector<Bytes> FileStore::wait_for(std::string_view op, const std::vector<std::string>& keys,
                                       std::chrono::milliseconds timeout, bool want_values) {
  for (const std::string& k : keys)
    check_key(k);
  const auto deadline = Clock::now() + timeout;
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    {
      MutexLock lock(mutex_);
      lock_file(false);
      OfdUnlock guard{fd_};
      std::vector<std::string> missing;
      for (const std::string& k : keys) {
        if (cache_.find(k) == cache_.end()) missing.push_back(k);
      }
      if (missing.empty()) {
        std::vector<Bytes> values;
        if (want_values) {
          for (const std::string& k : keys)
            values.push_back(cache_.find(k)->second);
        }
        return values;
      }
      if (Clock::now() >= deadline) {
        GRADWIRE_THROW(TimeoutError) << timeout_message(op, missing, timeout);
      }
    }
    // No change notification works on every shared file system, so waits re-read.
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    std::this_thread::sleep_for(std::clamp(left, std::chrono::milliseconds(0), backoff));
    backoff = std::min(backoff * 2, std::chrono::milliseconds(20));
  }
}

Bytes FileStore::do_get(const std::string& key, std::chrono::milliseconds timeout) {
  return std::move(wait_for("get", {key}, timeout, true).front());
}

int64_t FileStore::do_add(const std::string& key, int64_t delta) {
  check_key(key);
  MutexLock lock(mutex_);
  lock_file(true);
  OfdUnlock guard{fd_};
  auto it = cache_.find(key);
  const int64_t result =
      detail::add_to_counter(key, it == cache_.end() ? nullptr : &it->second, delta);
  append_set(key, detail::counter_bytes(result));
  return result;
}

Bytes FileStore::do_compare_set(const std::string& key, const Bytes& expected,
                                const Bytes& desired) {
  check_key(key);
  check_value(key, desired.size());
  MutexLock lock(mutex_);
  lock_file(true);
  OfdUnlock guard{fd_};
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    if (!expected.empty()) return {};
    append_set(key, desired);
    return desired;
  }
  if (it->second == expected) append_set(key, desired);
  return cache_.find(key)->second;
}

void FileStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  wait_for("wait", keys, timeout, false);
}

bool FileStore::do_check(const std::vector<std::string>& keys) {
  MutexLock lock(mutex_);
  lock_file(false);
  OfdUnlock guard{fd_};
  return std::all_of(keys.begin(), keys.end(),
                     [&](const std::string& k) GRADWIRE_NO_THREAD_SAFETY_ANALYSIS {
                       return cache_.find(k) != cache_.end();
                     });
}

bool FileStore::do_delete_key(const std::string& key) {
  check_key(key);
  MutexLock lock(mutex_);
  lock_file(true);
  OfdUnlock guard{fd_};
  if (cache_.find(key) == cache_.end()) return false;
  append_record(kRecordDelete, key, {});
  return true;
}

int64_t FileStore::do_num_keys() {
  MutexLock lock(mutex_);
  lock_file(false);
  OfdUnlock guard{fd_};
  return static_cast<int64_t>(cache_.size());
}

std::vector<Bytes> FileStore::do_multi_get(const std::vector<std::string>& keys,
                                           std::chrono::milliseconds timeout) {
  return wait_for("multi_get", keys, timeout, true);
}

void FileStore::do_multi_set(const std::vector<std::string>& keys,
                             const std::vector<Bytes>& values) {
  for (size_t i = 0; i < keys.size(); ++i) {
    check_key(keys[i]);
    check_value(keys[i], values[i].size());
  }
  MutexLock lock(mutex_);
  lock_file(true);
  OfdUnlock guard{fd_};
  for (size_t i = 0; i < keys.size(); ++i)
    append_set(keys[i], values[i]);
}

void FileStore::do_append(const std::string& key, const Bytes& value) {
  check_key(key);
  MutexLock lock(mutex_);
  lock_file(true);
  OfdUnlock guard{fd_};
  auto it = cache_.find(key);
  Bytes combined = it == cache_.end() ? Bytes() : it->second;
  combined.insert(combined.end(), value.begin(), value.end());
  check_value(key, combined.size());
  append_set(key, combined);
}

std::vector<std::string> FileStore::do_list_keys() {
  MutexLock lock(mutex_);
  lock_file(false);
  OfdUnlock guard{fd_};
  std::vector<std::string> keys;
  keys.reserve(cache_.size());
  for (const auto& entry : cache_)
    keys.push_back(entry.first);
  return keys;
}

}  // namespace gradwire::c10d
