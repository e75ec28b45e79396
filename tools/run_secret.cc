#include "run_secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "gradwire/core/auth.h"

namespace gradwire::run {

namespace {

std::runtime_error failure(const std::string& what) {
  return std::runtime_error("gradwire-run: cannot keep the job's secret: " + what + ": " +
                            std::strerror(errno));
}

}  // namespace

std::string generate_secret() {
  static const char kHex[] = "0123456789abcdef";
  const std::string bytes = gradwire::random_bytes(32);
  std::string hex;
  hex.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto b = static_cast<unsigned char>(c);
    hex.push_back(kHex[b >> 4]);
    hex.push_back(kHex[b & 0xf]);
  }
  return hex;
}

SecretFile::SecretFile(const std::string& secret) {
  const char* tmp = std::getenv("TMPDIR");
  std::string base = tmp != nullptr && tmp[0] == '/' ? tmp : "/tmp";
  while (base.size() > 1 && base.back() == '/')
    base.pop_back();
  std::string templ = base + "/gradwire-run-XXXXXX";
  std::vector<char> name(templ.begin(), templ.end());
  name.push_back('\0');
  // mkdtemp makes the directory with mode 0700: nobody else may even look it up.
  if (::mkdtemp(name.data()) == nullptr) throw failure("mkdtemp " + templ);
  dir_ = name.data();
  path_ = dir_ + "/secret";
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    const std::runtime_error e = failure("open " + path_);
    ::rmdir(dir_.c_str());
    throw e;
  }
  size_t written = 0;
  while (written < secret.size()) {
    const ssize_t n = ::write(fd, secret.data() + written, secret.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::runtime_error e = failure("write " + path_);
      ::close(fd);
      ::unlink(path_.c_str());
      ::rmdir(dir_.c_str());
      throw e;
    }
    written += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    const std::runtime_error e = failure("close " + path_);
    ::unlink(path_.c_str());
    ::rmdir(dir_.c_str());
    throw e;
  }
}

SecretFile::~SecretFile() {
  ::unlink(path_.c_str());
  ::rmdir(dir_.c_str());
}

}  // namespace gradwire::run
