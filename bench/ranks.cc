#include "ranks.h"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
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
  bool ok = true;
  for (pid_t pid : children) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
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
