#include "files.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "format.h"
#include "gradwire/core/check.h"
#include "gradwire/core/fd.h"

namespace gradwire::checkpoint::detail {
namespace {

std::string errno_text() {
  return std::strerror(errno);
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      GRADWIRE_THROW(Error) << "checkpoint: writing '" << path << "' failed: " << errno_text();
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void write_file_durably(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp";
  try {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd) GRADWIRE_THROW(Error) << "checkpoint: cannot create '" << tmp << "': " << errno_text();
    write_all(fd.get(), bytes, tmp);
    if (::fsync(fd.get()) != 0)
      GRADWIRE_THROW(Error) << "checkpoint: fsync of '" << tmp << "' failed: " << errno_text();
    if (::close(fd.release()) != 0)
      GRADWIRE_THROW(Error) << "checkpoint: closing '" << tmp << "' failed: " << errno_text();
    if (::rename(tmp.c_str(), path.c_str()) != 0) {
      GRADWIRE_THROW(Error) << "checkpoint: cannot rename '" << tmp << "' to '" << path
                            << "': " << errno_text();
    }
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

void fsync_dir(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd)
    GRADWIRE_THROW(Error) << "checkpoint: cannot open directory '" << dir << "': " << errno_text();
  if (::fsync(fd.get()) != 0)
    GRADWIRE_THROW(Error) << "checkpoint: fsync of directory '" << dir
                          << "' failed: " << errno_text();
}

std::string read_file(const std::string& path, uint64_t max_bytes, std::string_view limit_text) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd && errno == ENOENT)
    GRADWIRE_THROW(InvalidArgument) << "checkpoint: " << path << ": missing";
  if (!fd) GRADWIRE_THROW(Error) << "checkpoint: cannot open '" << path << "': " << errno_text();
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    GRADWIRE_THROW(Error) << "checkpoint: cannot stat '" << path << "': " << errno_text();
  const auto size = static_cast<uint64_t>(st.st_size);
  GRADWIRE_CHECK_ARG(size <= max_bytes)
      << "checkpoint: " << path << ": " << size << " bytes, " << limit_text << " " << max_bytes;
  std::string out(size, '\0');
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::read(fd.get(), out.data() + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      GRADWIRE_THROW(Error) << "checkpoint: reading '" << path << "' failed: " << errno_text();
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  out.resize(done);
  return out;
}

std::vector<SnapshotDir> list_snapshots(const std::string& shard_dir) {
  namespace fs = std::filesystem;
  std::vector<SnapshotDir> out;
  std::error_code ec;
  if (!fs::exists(shard_dir, ec)) return out;
  fs::directory_iterator it(shard_dir, ec);
  if (ec)
    GRADWIRE_THROW(Error) << "checkpoint: cannot list '" << shard_dir << "': " << ec.message();
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (ec)
      GRADWIRE_THROW(Error) << "checkpoint: cannot list '" << shard_dir << "': " << ec.message();
    const int64_t seq = parse_snapshot_name(it->path().filename().string());
    // A directory removed while being listed is skipped (another writer's pruning).
    std::error_code gone;
    if (seq < 0 || !it->is_directory(gone)) continue;
    out.push_back({seq, fs::exists(it->path() / kManifestName, gone), it->path().string()});
  }
  std::sort(out.begin(), out.end(),
            [](const SnapshotDir& a, const SnapshotDir& b) { return a.seq < b.seq; });
  return out;
}

void remove_snapshot(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove(std::filesystem::path(path) / kManifestName, ignored);
  std::filesystem::remove_all(path, ignored);
}

}  // namespace gradwire::checkpoint::detail
