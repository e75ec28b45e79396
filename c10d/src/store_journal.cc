#include "store_journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "gradwire/core/check.h"
#include "gradwire/core/error.h"
#include "gradwire/core/fd.h"
#include "little_endian.h"

namespace gradwire::c10d {

namespace {

constexpr char kMagic[4] = {'G', 'W', 'S', 'J'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderBytes = 8;
// A record longer than this is not one this server could have written (keys and values are
// bounded far below it): corruption, not an allocation to attempt.
constexpr uint32_t kMaxRecordBytes = (1u << 30) + (64u << 20);
constexpr uint64_t kCompactAfterBytes = uint64_t{64} << 20;

uint64_t fnv1a(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

using le::get_u32;
using le::get_u64;
using le::put_u32;
using le::put_u64;

void append_record(std::string& out, StoreJournal::Kind kind, std::string_view key,
                   std::string_view value) {
  std::string body;
  body.push_back(static_cast<char>(kind));
  put_u32(body, static_cast<uint32_t>(key.size()));
  body.append(key);
  put_u32(body, static_cast<uint32_t>(value.size()));
  body.append(value);
  put_u32(out, static_cast<uint32_t>(body.size() + 8));
  out += body;
  put_u64(out, fnv1a(body));
}

std::string header() {
  std::string h(kMagic, sizeof(kMagic));
  put_u32(h, kVersion);
  return h;
}

// Writes bytes; `done` gets how many reached the file even when it fails.
bool write_all(int fd, const std::string& bytes, size_t* done, std::string* error) {
  *done = 0;
  while (*done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + *done, bytes.size() - *done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *error = n == 0 ? std::string("no progress") : std::string(std::strerror(errno));
      return false;
    }
    *done += static_cast<size_t>(n);
  }
  return true;
}

// Why open() failed, saying so plainly for a symbolic link refused by O_NOFOLLOW.
std::string open_error(int err) {
  if (err == ELOOP) return "it is a symbolic link (refused: the journal is never followed)";
  return std::strerror(err);
}

std::string read_file(const std::string& path) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) return std::string();
    GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path
                               << "': cannot open it: " << open_error(errno);
  }
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path
                                 << "': cannot read it: " << std::strerror(err);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

StoreJournal::StoreJournal(std::string path, const Apply& apply, const ForEach& live, bool fsync)
    : path_(std::move(path)), fsync_(fsync) {
  const std::string bytes = read_file(path_);
  if (!bytes.empty()) {
    if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 4) != 0) {
      GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_
                                 << "' is not a gradwire store journal (no GWSJ header)";
    }
    if (get_u32(bytes.data() + 4) != kVersion) {
      GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_ << "' has version "
                                 << get_u32(bytes.data() + 4) << "; this server reads version "
                                 << kVersion;
    }
    size_t at = kHeaderBytes;
    while (at < bytes.size()) {
      const size_t left = bytes.size() - at;
      if (left < 4) {
        torn_tail_ = std::to_string(left) + " bytes of a record length";
        break;
      }
      const uint32_t len = get_u32(bytes.data() + at);
      if (len < 1 + 4 + 4 + 8 || len > kMaxRecordBytes) {
        GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_ << "' is corrupt at offset "
                                   << at << ": a record of " << len << " bytes";
      }
      if (left - 4 < len) {
        torn_tail_ = "a record of " + std::to_string(len) + " bytes with " +
                     std::to_string(left - 4) + " written";
        break;
      }
      const std::string_view body(bytes.data() + at + 4, len - 8);
      const uint64_t sum = get_u64(bytes.data() + at + 4 + len - 8);
      const uint8_t kind = static_cast<uint8_t>(body[0]);
      const uint32_t key_len = get_u32(body.data() + 1);
      bool ok = sum == fnv1a(body) && kind >= 1 && kind <= 3 &&
                1 + 4 + uint64_t{key_len} + 4 <= body.size();
      uint32_t value_len = 0;
      if (ok) {
        value_len = get_u32(body.data() + 1 + 4 + key_len);
        ok = 1 + 4 + uint64_t{key_len} + 4 + value_len == body.size();
      }
      if (!ok) {
        GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_ << "' is corrupt at offset "
                                   << at << " (a record that does not check out)";
      }
      apply(static_cast<Kind>(kind), body.substr(5, key_len), body.substr(5 + key_len + 4));
      ++replayed_;
      at += 4 + len;
    }
  }
  rewrite(live);
}

StoreJournal::~StoreJournal() = default;

void StoreJournal::rewrite(const ForEach& live) {
  std::string snapshot = header();
  live([&](std::string_view key, std::string_view value) {
    append_record(snapshot, Kind::kSet, key, value);
  });
  const std::string tmp = path_ + ".tmp";
  // A regular file left by a server that died while compacting is removed; anything else
  // there was put there by someone else, and nothing is written through it.
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      GRADWIRE_THROW(StoreError)
          << "TCPStore journal '" << path_ << "': '" << tmp << "' exists and is "
          << (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file")
          << "; refusing to write the journal through it (remove it if it is yours)";
    }
    ::unlink(tmp.c_str());
  }
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  std::string error;
  if (!fd) {
    GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_ << "': cannot create '" << tmp
                               << "': " << open_error(errno)
                               << (errno == EEXIST ? " (created by someone else meanwhile)" : "");
  }
  size_t done = 0;
  if (!write_all(fd.get(), snapshot, &done, &error) || ::fsync(fd.get()) != 0) {
    if (error.empty()) error = std::strerror(errno);
    fd.reset();
    ::unlink(tmp.c_str());
    GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_ << "': writing '" << tmp
                               << "' failed: " << error;
  }
  fd.reset();
  if (::rename(tmp.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_
                               << "': cannot replace it: " << std::strerror(err);
  }
  fd_.reset();
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW));
  if (!fd_) {
    GRADWIRE_THROW(StoreError) << "TCPStore journal '" << path_
                               << "': cannot open it for appending: " << open_error(errno);
  }
  live_bytes_ = snapshot.size();
  written_since_compaction_ = 0;
}

void StoreJournal::record(Kind kind, std::string_view key, std::string_view value) {
  append_record(buffer_, kind, key, value);
}

bool StoreJournal::flush(const ForEach& live, std::string* error) {
  if (buffer_.empty() && !unsynced_) return true;
  size_t done = 0;
  const bool ok = write_all(fd_.get(), buffer_, &done, error);
  // What reached the file stays there; the rest follows it on the next flush, so the file
  // holds the records' bytes in order either way.
  written_since_compaction_ += done;
  buffer_.erase(0, done);
  if (!ok) return false;
  if (fsync_) {
    // Until a sync succeeds, what was written is not known to be on the disk.
    unsynced_ = true;
    if (::fdatasync(fd_.get()) != 0) {
      *error = std::string("fdatasync: ") + std::strerror(errno);
      return false;
    }
    unsynced_ = false;
  }
  if (buffer_.capacity() > (size_t{4} << 20)) buffer_.shrink_to_fit();
  if (written_since_compaction_ > kCompactAfterBytes &&
      written_since_compaction_ > 4 * live_bytes_) {
    try {
      rewrite(live);
    } catch (const StoreError& e) {
      *error = e.what();
      return false;
    }
  }
  return true;
}

}  // namespace gradwire::c10d
