// Runs gradwire-run as a user does, in a child process, and reads its output as it comes;
// helpers for the launcher tests (free ports, process liveness, text matching).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "support/eventually.h"
#include "support/ports.h"

namespace gradwire::testing::launcher {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Environment changes for the launcher: a value to set, or nullopt to unset the name.
using EnvChanges = std::vector<std::pair<std::string, std::optional<std::string>>>;

// A launcher run: its pid, and its stdout and stderr read as they come.
class Launch {
 public:
  // Runs `program` (gradwire-run unless said otherwise) with `args`.
  explicit Launch(std::vector<std::string> args, const EnvChanges& env = {},
                  const std::string& program = GRADWIRE_RUN_PATH) {
    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    args.insert(args.begin(), program);
    std::vector<char*> argv;
    for (auto& a : args)
      argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      for (const auto& [name, value] : env) {
        if (value) {
          ::setenv(name.c_str(), value->c_str(), 1);
        } else {
          ::unsetenv(name.c_str());
        }
      }
      ::execv(argv[0], argv.data());
      ::_exit(126);
    }
    ::close(out[1]);
    ::close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }
  ~Launch() {
    if (!status_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
    if (pidfd_ >= 0) ::close(pidfd_);
  }
  Launch(const Launch&) = delete;
  Launch& operator=(const Launch&) = delete;

  // Reads until `pred(stdout, stderr)` holds or the deadline passes.
  template <typename P>
  bool read_until(P pred, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!pred(out_, err_)) {
      if (Clock::now() >= deadline || !pump(deadline)) return pred(out_, err_);
    }
    return true;
  }
  // Waits for the launcher to exit (reading its output); its exit status, or -1 at the
  // deadline.
  int wait(std::chrono::milliseconds limit = 30s) {
    const auto deadline = Clock::now() + limit;
    while (!status_ || fds_[0] >= 0 || fds_[1] >= 0) {
      if (Clock::now() >= deadline) return -1;
      pump(deadline);
    }
    return *status_;
  }
  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }

 private:
  bool pump(Clock::time_point deadline) {
    std::vector<pollfd> fds;
    for (int fd : fds_)
      if (fd >= 0) fds.push_back(pollfd{fd, POLLIN, 0});
    if (!status_) fds.push_back(pollfd{pidfd_, POLLIN, 0});
    if (fds.empty()) return false;
    const int ms = static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count()));
    if (::poll(fds.data(), fds.size(), ms) <= 0) return false;
    for (const auto& p : fds) {
      if (p.revents == 0) continue;
      if (p.fd == pidfd_) {
        int wstatus = 0;
        if (::waitpid(pid_, &wstatus, WNOHANG) == pid_) {
          status_ = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
        }
        continue;
      }
      const int which = p.fd == fds_[0] ? 0 : 1;
      char buf[4096];
      const ssize_t n = ::read(p.fd, buf, sizeof(buf));
      if (n > 0) {
        (which == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
      } else {
        ::close(fds_[which]);
        fds_[which] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int pidfd_ = -1;
  int fds_[2] = {-1, -1};
  std::string out_, err_;
  std::optional<int> status_;
};

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

// "key=value" words of every output line that has `tag`, one map per line.
inline std::vector<std::map<std::string, std::string>> records(const std::string& out,
                                                               const std::string& tag) {
  std::vector<std::map<std::string, std::string>> all;
  for (const std::string& line : lines(out)) {
    if (line.rfind(tag + " ", 0) != 0) continue;
    std::map<std::string, std::string> r;
    std::istringstream in(line.substr(tag.size() + 1));
    for (std::string word; in >> word;) {
      const size_t eq = word.find('=');
      if (eq != std::string::npos) r[word.substr(0, eq)] = word.substr(eq + 1);
    }
    all.push_back(std::move(r));
  }
  return all;
}

inline size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

inline bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// A TCP port nothing listens on now, drawn from below the ephemeral range, where no
// outgoing connection of a test running in parallel can take it before the launcher binds
// it (support/ports.h).
inline int free_port() {
  return gradwire::test::free_port();
}

// Whether process `pid` has ended (gone, or a zombie nobody reaped yet).
inline bool ended(pid_t pid) {
  if (::kill(pid, 0) != 0) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || (paren + 2 < text.size() && text[paren + 2] == 'Z');
}

// Waits (bounded) for `pid` to end.
inline bool ends_within(pid_t pid, std::chrono::milliseconds limit) {
  return gradwire::testing::eventually([&] { return ended(pid); }, limit);
}

// The value after "<word> " on the first line of `text` that has it ("pid 123" -> "123").
inline std::string value_after(const std::string& text, const std::string& word) {
  const size_t at = text.find(word + " ");
  if (at == std::string::npos) return "";
  const size_t start = at + word.size() + 1;
  const size_t end = text.find_first_of(" \n", start);
  return text.substr(start, end == std::string::npos ? std::string::npos : end - start);
}

}  // namespace gradwire::testing::launcher
