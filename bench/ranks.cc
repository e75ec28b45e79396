#include "ranks.h"

#include <poll.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <sstream>
#include <stdexcept>

#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/trace.h"

namespace gradwire::bench {

std::vector<double> run_rank_processes(uint16_t store_port, const std::string& prefix, int world,
                                       const RankBody& body, const std::string& what) {
  using namespace std::chrono_literals;
  std::fflush(nullptr);
  std::vector<pid_t> children;
  for (int rank = 0; rank < world; ++rank) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      int code = 0;
      try {
        auto client = std::make_shared<c10d::TCPStore>(
            c10d::TCPStoreOptions{.host = "127.0.0.1", .port = store_port, .timeout = 120s});
        auto store = std::make_shared<c10d::PrefixStore>(prefix, client);
        const std::vector<double> figures = body(store, rank);
        if (rank == 0) {
          std::ostringstream os;
          os.precision(17);
          for (double f : figures)
            os << f << ' ';
          store->set("result", std::string_view(os.str()));
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "%s bench rank %d: %s\n", what.c_str(), rank, e.what());
        code = 1;
      }
      // _exit skips the exit-time trace write: under GRADWIRE_TRACE each rank writes its
      // timeline here (named after its rpc worker, or "pid<N>").
      if (trace::enabled() && !trace::directory().empty()) {
        try {
          trace::flush();
        } catch (const std::exception& e) {
          std::fprintf(stderr, "%s bench rank %d: trace not written: %s\n", what.c_str(), rank,
                       e.what());
        }
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    children.push_back(pid);
  }
  // Every rank has kRanksDeadline to finish; one that has not by then (stuck where no
  // timeout of its own reaches) is killed with the others, and the figure fails naming it.
  const auto deadline = std::chrono::steady_clock::now() + kRanksDeadline;
  bool ok = true;
  std::string stuck;
  for (size_t rank = 0; rank < children.size(); ++rank) {
    const pid_t pid = children[rank];
    const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
    if (pidfd >= 0) {
      for (;;) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            deadline - std::chrono::steady_clock::now());
        pollfd p{pidfd, POLLIN, 0};
        const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
        if (n < 0 && errno == EINTR) continue;
        if (n == 0) {
          stuck += (stuck.empty() ? "" : ", ") + std::to_string(rank);
          ::kill(pid, SIGKILL);
        }
        break;
      }
      ::close(pidfd);
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!stuck.empty()) {
    throw std::runtime_error(what + " bench: rank process(es) " + stuck +
                             " did not finish within " + std::to_string(kRanksDeadline.count()) +
                             " s and were killed");
  }
  if (!ok) throw std::runtime_error(what + " bench: a rank process failed");
  c10d::TCPStore reader(
      c10d::TCPStoreOptions{.host = "127.0.0.1", .port = store_port, .timeout = 10s});
  std::istringstream is(reader.get_string(prefix + "/result"));
  std::vector<double> figures;
  for (double f; is >> f;)
    figures.push_back(f);
  return figures;
}

}  // namespace gradwire::bench
