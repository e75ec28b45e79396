#include "support/harness.h"

#include <cxxabi.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest-spi.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <thread>

#include "gradwire/core/check.h"
#include "gradwire/core/mutex.h"
#include "support/eventually.h"

namespace gradwire::test {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

std::string ms_text(milliseconds d) {
  return std::to_string(d.count()) + " ms";
}

// "threw gradwire::TimeoutError: ..." for the exception being handled.
std::string describe_current_exception() {
  std::string type = "an exception of unknown type";
  if (const std::type_info* info = abi::__cxa_current_exception_type()) {
    int status = 0;
    std::unique_ptr<char, decltype(&std::free)> demangled(
        abi::__cxa_demangle(info->name(), nullptr, nullptr, &status), &std::free);
    type = status == 0 && demangled ? demangled.get() : info->name();
  }
  try {
    throw;
  } catch (const std::exception& e) {
    return "threw " + type + ": " + e.what();
  } catch (...) {
    return "threw " + type;
  }
}

// Runs fn(rank) on this thread, capturing GoogleTest failures raised on it and any
// exception; returns why the rank failed, or an empty string.
std::string run_rank_capturing(const std::function<void(int)>& fn, int rank) {
  ::testing::TestPartResultArray parts;
  std::string exception_text;
  {
    ::testing::ScopedFakeTestPartResultReporter reporter(
        ::testing::ScopedFakeTestPartResultReporter::INTERCEPT_ONLY_CURRENT_THREAD, &parts);
    try {
      fn(rank);
    } catch (...) {
      exception_text = describe_current_exception();
    }
  }
  std::string failure;
  for (int i = 0; i < parts.size(); ++i) {
    const ::testing::TestPartResult& part = parts.GetTestPartResult(i);
    if (!part.failed()) continue;
    if (!failure.empty()) failure += '\n';
    failure += part.file_name() != nullptr ? part.file_name() : "unknown file";
    failure += ':' + std::to_string(part.line_number()) + ": " + part.message();
  }
  if (!exception_text.empty()) {
    if (!failure.empty()) failure += '\n';
    failure += exception_text;
  }
  return failure;
}

void check_arguments(const char* harness, int world_size, milliseconds deadline) {
  GRADWIRE_CHECK_ARG(world_size >= 1) << harness << ": world_size must be >= 1, got " << world_size;
  GRADWIRE_CHECK_ARG(deadline.count() > 0)
      << harness << ": deadline must be positive, got " << deadline.count() << " ms";
}

RankResults make_results(int world_size) {
  RankResults results;
  results.ranks.resize(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank)
    results.ranks[rank].rank = rank;
  return results;
}

void append_line(std::string& text, const std::string& line) {
  if (line.empty()) return;
  if (!text.empty()) text += '\n';
  text += line;
}

// ---- ranks as processes ----

// ThreadSanitizer runs a background thread of its own, which is fork-safe: TSan
// intercepts fork() and quiesces it.
#if defined(__SANITIZE_THREAD__)
constexpr int kRuntimeThreads = 1;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr int kRuntimeThreads = 1;
#else
constexpr int kRuntimeThreads = 0;
#endif
#else
constexpr int kRuntimeThreads = 0;
#endif

// OpenBLAS (loaded by the tensor module) starts its worker threads when the library is
// loaded, before main. It registers blas_thread_shutdown_ as a fork handler itself, so
// fork() is safe with them; calling it here first stops them, so that the thread count
// below sees only threads that fork() would really abandon. OpenBLAS restarts its
// threads on its next parallel call.
void stop_blas_threads() {
  using Shutdown = int (*)();
  if (void* symbol = ::dlsym(RTLD_DEFAULT, "blas_thread_shutdown_")) {
    reinterpret_cast<Shutdown>(symbol)();
  }
}

int count_threads() {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  ::closedir(dir);
  return count;
}

void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

// The first byte a child writes after its rank function returned: the parent can then
// tell "returned and passed" from "called exit(0) halfway".
constexpr char kPassed = 'P';
constexpr char kFailed = 'F';
// Enough for any sane report; a runaway one is cut rather than filling memory.
constexpr size_t kMaxReport = 1 << 20;

[[noreturn]] void run_child(const std::function<void(int)>& fn, int rank, int report_fd,
                            pid_t parent) {
  // If the parent dies (say, killed by ctest's timeout), so do its children.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(2);
  std::string failure;
  try {
    failure = run_rank_capturing(fn, rank);
  } catch (...) {
    failure = describe_current_exception();
  }
  write_all(report_fd, failure.empty() ? std::string(1, kPassed) : kFailed + failure);
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  ::_exit(failure.empty() ? 0 : 1);
}

int open_pidfd(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  return -1;
#endif
}

struct Child {
  pid_t pid = -1;
  int report_fd = -1;  // read end of the child's report pipe; -1 once closed
  int pidfd = -1;      // readable when the child exits; -1 if the kernel has none
  bool reaped = false;
  int status = 0;
  std::string report;
  std::string spawn_error;
};

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Reads what the pipe holds now; closes it at end of file.
void drain_report(Child& child) {
  char buffer[4096];
  while (child.report_fd >= 0) {
    const ssize_t n = ::read(child.report_fd, buffer, sizeof(buffer));
    if (n > 0) {
      if (child.report.size() < kMaxReport) child.report.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    close_fd(child.report_fd);
  }
}

bool try_reap(Child& child) {
  if (child.reaped) return true;
  const pid_t r = ::waitpid(child.pid, &child.status, WNOHANG);
  if (r == child.pid) {
    child.reaped = true;
    close_fd(child.pidfd);
    // Whatever the child wrote is in the pipe by now; do not wait for EOF, which a
    // grandchild holding the pipe could delay.
    drain_report(child);
    close_fd(child.report_fd);
  }
  return child.reaped;
}

std::string describe_child(const Child& child, RankResult& result) {
  std::string text;
  const bool returned = !child.report.empty();
  const std::string message = returned ? child.report.substr(1) : std::string();
  if (WIFSIGNALED(child.status)) {
    result.term_signal = WTERMSIG(child.status);
    const char* name = ::strsignal(*result.term_signal);
    text = "killed by signal " + std::to_string(*result.term_signal) + " (" +
           (name != nullptr ? name : "unknown") + ")";
  } else if (WIFEXITED(child.status)) {
    result.exit_code = WEXITSTATUS(child.status);
    if (!returned) {
      text = "exited with status " + std::to_string(*result.exit_code) +
             " before its rank function returned (exit() called, or the child crashed?)";
    } else if (child.report[0] == kFailed || *result.exit_code != 0) {
      text = *result.exit_code == 1 && child.report[0] == kFailed
                 ? std::string()
                 : "exited with status " + std::to_string(*result.exit_code);
    }
  }
  append_line(text, message);
  return text;
}

}  // namespace

bool RankResults::all_ok() const {
  for (const RankResult& rank : ranks) {
    if (!rank.ok) return false;
  }
  return true;
}

std::vector<int> RankResults::failed_ranks() const {
  std::vector<int> failed;
  for (const RankResult& rank : ranks) {
    if (!rank.ok) failed.push_back(rank.rank);
  }
  return failed;
}

std::string RankResults::summary() const {
  std::string out;
  for (const RankResult& rank : ranks) {
    if (rank.ok) continue;
    out += "rank " + std::to_string(rank.rank) + ": ";
    // Indent continuation lines so each rank's report reads as one block.
    for (char c : rank.failure) {
      out += c;
      if (c == '\n') out += "  ";
    }
    out += '\n';
  }
  return out;
}

::testing::AssertionResult AllRanksOk(const char* expression, const RankResults& results) {
  if (results.all_ok()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << expression << ": " << results.failed_ranks().size()
                                       << " of " << results.ranks.size() << " ranks failed\n"
                                       << results.summary();
}

RankResults run_ranks_as_threads(int world_size, const std::function<void(int)>& fn,
                                 milliseconds deadline) {
  check_arguments("run_ranks_as_threads", world_size, deadline);
  struct Progress {
    Mutex mutex;
    std::condition_variable cv;
    int finished GRADWIRE_GUARDED_BY(mutex) = 0;
    std::vector<bool> done GRADWIRE_GUARDED_BY(mutex);
    std::vector<std::string> failures GRADWIRE_GUARDED_BY(mutex);
  } progress;
  {
    MutexLock lock(progress.mutex);
    progress.done.assign(world_size, false);
    progress.failures.assign(world_size, std::string());
  }

  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world_size));
  try {
    for (int rank = 0; rank < world_size; ++rank) {
      threads.emplace_back([&fn, &progress, rank] {
        std::string failure = run_rank_capturing(fn, rank);
        {
          MutexLock lock(progress.mutex);
          progress.failures[rank] = std::move(failure);
          progress.done[rank] = true;
          ++progress.finished;
        }
        progress.cv.notify_all();
      });
    }
  } catch (...) {
    // The ranks already started use this frame's state: they must end before it does.
    for (std::thread& thread : threads)
      thread.join();
    throw;
  }

  RankResults results = make_results(world_size);
  {
    MutexLock lock(progress.mutex);
    const Clock::time_point soft = start + deadline;
    while (progress.finished < world_size &&
           lock.wait_until(progress.cv, soft) != std::cv_status::timeout) {
    }
    for (int rank = 0; rank < world_size; ++rank) {
      results.ranks[rank].timed_out = !progress.done[rank];
    }
    // Past the deadline the stragglers are already failures; keep waiting a while longer
    // only because their threads use this frame's state and must be joined.
    const Clock::time_point hard = start + 2 * deadline;
    while (progress.finished < world_size) {
      if (lock.wait_until(progress.cv, hard) == std::cv_status::timeout &&
          progress.finished < world_size) {
        std::string stuck;
        for (int rank = 0; rank < world_size; ++rank) {
          if (!progress.done[rank]) stuck += (stuck.empty() ? "" : ", ") + std::to_string(rank);
        }
        std::fprintf(stderr,
                     "run_ranks_as_threads: rank(s) %s still running at twice the %lld ms "
                     "deadline; a rank function is ignoring its timeouts. Aborting.\n",
                     stuck.c_str(), static_cast<long long>(deadline.count()));
        std::fflush(stderr);
        std::abort();
      }
    }
  }
  for (std::thread& thread : threads)
    thread.join();

  MutexLock lock(progress.mutex);
  for (int rank = 0; rank < world_size; ++rank) {
    RankResult& result = results.ranks[rank];
    if (result.timed_out) {
      result.failure = "did not finish within " + ms_text(deadline) + " (finished after " +
                       ms_text(std::chrono::duration_cast<milliseconds>(Clock::now() - start)) +
                       ")";
    }
    append_line(result.failure, progress.failures[rank]);
    result.ok = result.failure.empty();
  }
  return results;
}

RankResults run_ranks_as_processes(int world_size, const std::function<void(int)>& fn,
                                   milliseconds deadline) {
  check_arguments("run_ranks_as_processes", world_size, deadline);
  RankResults results = make_results(world_size);
  stop_blas_threads();
  // A thread that was just joined can still be listed in /proc/self/task for a moment (the
  // kernel removes its entry after join returns): a count over the bound is read again
  // for up to a second before it is believed.
  int threads = 0;
  gradwire::testing::eventually(  // polling /proc: no event tells of the entry's removal
      [&] {
        threads = count_threads();
        return threads <= 1 + kRuntimeThreads;
      },
      std::chrono::seconds(1));
  // -1: no /proc to count with; trust the caller.
  if (threads > 1 + kRuntimeThreads) {
    for (RankResult& result : results.ranks) {
      result.failure =
          "not run: run_ranks_as_processes must be called before the test "
          "process starts any thread (fork() copies only the calling thread), "
          "but this process has " +
          std::to_string(threads) + " threads";
    }
    return results;
  }

  // Anything buffered now would otherwise be printed once by each child as well.
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);

  const pid_t parent = ::getpid();
  const Clock::time_point start = Clock::now();
  std::vector<Child> children(static_cast<size_t>(world_size));
  for (int rank = 0; rank < world_size; ++rank) {
    Child& child = children[rank];
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) {
      child.spawn_error = std::string("pipe2 failed: ") + std::strerror(errno);
      child.reaped = true;
      continue;
    }
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(fds[0]);
      // Earlier siblings' pipes and pidfds were inherited; they are not this child's.
      for (Child& other : children) {
        close_fd(other.report_fd);
        close_fd(other.pidfd);
      }
      run_child(fn, rank, fds[1], parent);
    }
    ::close(fds[1]);
    if (pid < 0) {
      child.spawn_error = std::string("fork failed: ") + std::strerror(errno);
      child.reaped = true;
      ::close(fds[0]);
      continue;
    }
    child.pid = pid;
    child.report_fd = fds[0];
    ::fcntl(child.report_fd, F_SETFL, ::fcntl(child.report_fd, F_GETFL) | O_NONBLOCK);
    child.pidfd = open_pidfd(pid);
  }

  const Clock::time_point end = start + deadline;
  while (true) {
    bool all_reaped = true;
    bool need_polling = false;  // a child without pidfd whose pipe has closed
    std::vector<pollfd> fds;
    for (Child& child : children) {
      if (try_reap(child)) continue;
      all_reaped = false;
      if (child.report_fd >= 0) fds.push_back({child.report_fd, POLLIN, 0});
      if (child.pidfd >= 0) {
        fds.push_back({child.pidfd, POLLIN, 0});
      } else if (child.report_fd < 0) {
        need_polling = true;
      }
    }
    if (all_reaped) break;
    const Clock::time_point now = Clock::now();
    if (now >= end) break;
    auto wait = std::chrono::ceil<milliseconds>(end - now);
    // Without a pidfd, exit after the pipe closed has no fd to wake us: check back soon.
    if (need_polling) wait = std::min(wait, milliseconds(5));
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(wait.count()));
    if (n < 0 && errno != EINTR) break;
    for (Child& child : children) {
      if (child.report_fd >= 0) drain_report(child);
    }
  }

  for (Child& child : children) {
    if (try_reap(child)) continue;
    ::kill(child.pid, SIGKILL);
    while (::waitpid(child.pid, &child.status, 0) < 0 && errno == EINTR) {
    }
    child.reaped = true;
    drain_report(child);
    close_fd(child.report_fd);
    close_fd(child.pidfd);
    RankResult& result = results.ranks[&child - children.data()];
    result.timed_out = true;
  }

  for (int rank = 0; rank < world_size; ++rank) {
    const Child& child = children[rank];
    RankResult& result = results.ranks[rank];
    if (!child.spawn_error.empty()) {
      result.failure = child.spawn_error;
    } else if (result.timed_out) {
      result.term_signal = SIGKILL;
      result.failure = "did not finish within " + ms_text(deadline) + "; killed with SIGKILL";
      if (child.report.size() > 1) append_line(result.failure, child.report.substr(1));
    } else {
      result.failure = describe_child(child, result);
    }
    result.ok = result.failure.empty();
  }
  return results;
}

}  // namespace gradwire::test
