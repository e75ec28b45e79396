// UniqueFd: the one owner of a file descriptor, closed when the owner goes.
//
// Thread-safety: none (like std::unique_ptr); hand it between threads by moving.
// Errors: none; close(2) failures on destruction are ignored (nothing can be done there).
//
// Example:
//   gradwire::UniqueFd fd(::open(path, O_RDONLY | O_CLOEXEC));
//   if (!fd) throw Error("cannot open " + path);
//   ::read(fd.get(), buf, n);            // closed at the end of the scope, on every path
//   int raw = fd.release();              // or handed on: no longer closed here
#pragma once

#include <unistd.h>

#include <utility>

namespace gradwire {

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) noexcept : fd_(fd) {}
  ~UniqueFd() { reset(); }

  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const noexcept { return fd_; }
  bool valid() const noexcept { return fd_ >= 0; }
  explicit operator bool() const noexcept { return valid(); }

  // Gives the descriptor up without closing it.
  int release() noexcept { return std::exchange(fd_, -1); }

  // Closes the descriptor held (if any) and holds `fd` instead.
  void reset(int fd = -1) noexcept {
    const int old = std::exchange(fd_, fd);
    if (old >= 0 && old != fd) ::close(old);
  }

 private:
  int fd_ = -1;
};

}  // namespace gradwire
