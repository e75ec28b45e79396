// gradwire-run: starts the local workers of a gradwire (or any) program with the
// environment that rendezvous reads, watches them, and stops or restarts them together.
//
//   gradwire-run --nproc-per-node 3 ./ps_train --epochs 2
//   gradwire-run --nnodes 2 --node-rank 1 --nproc-per-node 4
//                --master-addr 10.0.0.1 --master-port 29500 ./train   (one line)
//
// Each worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK (the node
// rank), MASTER_ADDR, MASTER_PORT and RESTART_COUNT, the names PyTorch's torchrun uses, so
// init_rpc and env:// rendezvous need no arguments. On one node without --master-port a
// free port is picked. Every output line is prefixed with its rank ("[rank1]: ..."; turn
// it off with --no-prefix). The first worker that fails stops the others (SIGTERM, then
// SIGKILL after --grace-ms) and its exit status becomes the launcher's (128 + N for a
// signal N); with --max-restarts R the whole local group is started again, up to R times.
// With --restart-workers W a worker that fails is instead started again alone, under the
// same rank, while the others run on (up to W such restarts in all, then the rule above):
// it gets GRADWIRE_RPC_REJOIN=1, so init_rpc makes it take its predecessor's place in the
// running group (AgentOptions::rejoin), and RESTART_COUNT counts its own restarts — the way
// a parameter server's trainer that was killed comes back while the job goes on.
// SIGINT and SIGTERM sent to the launcher reach every worker and end the run.
//
// Errors: a bad command line (an unknown flag, a missing value, N < 1, a program that
// cannot be found) prints what was wrong and exits with 2.
//
// Thread-safety: a single-threaded program; workers are watched with poll() over their
// output pipes, their pidfds and a self-pipe for signals.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace {

struct Options {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  int max_restarts = 0;
  int restart_workers = 0;
  int grace_ms = 5000;
  bool prefix = true;
  std::vector<std::string> program;  // program and its arguments
};

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

const char* const kUsage =
    "usage: gradwire-run [--nproc-per-node N] [--nnodes M --node-rank K]\n"
    "                    [--master-addr A] [--master-port P] [--max-restarts R]\n"
    "                    [--restart-workers W]\n"
    "                    [--grace-ms MS] [--no-prefix] [--] program [args...]\n";

int parse_int(const std::string& flag, const std::string& text, int min, int max) {
  size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || text.empty() || value < min || value > max) {
    throw UsageError(flag + " takes an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + text + "'");
  }
  return static_cast<int>(value);
}

Options parse(int argc, char** argv) {
  Options o;
  bool port_given = false;
  int i = 1;
  auto value = [&](const std::string& flag) -> std::string {
    if (i + 1 >= argc) throw UsageError(flag + " needs a value");
    return argv[++i];
  };
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    std::string inline_value;
    bool has_inline = false;
    if (arg.rfind("--", 0) == 0 && arg.find('=') != std::string::npos) {
      inline_value = arg.substr(arg.find('=') + 1);
      arg = arg.substr(0, arg.find('='));
      has_inline = true;
    }
    auto get = [&](const std::string& flag) { return has_inline ? inline_value : value(flag); };
    if (arg == "--") {
      ++i;
      break;
    } else if (arg == "--nproc-per-node" || arg == "--nproc_per_node") {
      o.nproc_per_node = parse_int("--nproc-per-node", get(arg), 1, 4096);
    } else if (arg == "--nnodes") {
      o.nnodes = parse_int("--nnodes", get(arg), 1, 65536);
    } else if (arg == "--node-rank" || arg == "--node_rank") {
      o.node_rank = parse_int("--node-rank", get(arg), 0, 65535);
    } else if (arg == "--master-addr" || arg == "--master_addr") {
      o.master_addr = get(arg);
      if (o.master_addr.empty()) throw UsageError("--master-addr is empty");
    } else if (arg == "--master-port" || arg == "--master_port") {
      o.master_port = parse_int("--master-port", get(arg), 1, 65535);
      port_given = true;
    } else if (arg == "--max-restarts" || arg == "--max_restarts") {
      o.max_restarts = parse_int("--max-restarts", get(arg), 0, 1000);
    } else if (arg == "--restart-workers" || arg == "--restart_workers") {
      o.restart_workers = parse_int("--restart-workers", get(arg), 0, 1000);
    } else if (arg == "--grace-ms") {
      o.grace_ms = parse_int("--grace-ms", get(arg), 0, 3'600'000);
    } else if (arg == "--no-prefix") {
      o.prefix = false;
    } else if (arg == "-h" || arg == "--help") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else if (arg.rfind("-", 0) == 0 && arg.size() > 1) {
      throw UsageError("unknown flag '" + arg + "'");
    } else {
      break;
    }
  }
  for (; i < argc; ++i)
    o.program.emplace_back(argv[i]);
  if (o.program.empty()) throw UsageError("no program to run");
  if (o.node_rank >= o.nnodes) {
    throw UsageError("--node-rank " + std::to_string(o.node_rank) + " is not below --nnodes " +
                     std::to_string(o.nnodes));
  }
  if (o.nnodes > 1 && !port_given) {
    throw UsageError("--nnodes " + std::to_string(o.nnodes) +
                     " needs --master-port (and --master-addr): every node must use the same");
  }
  return o;
}

// The program's path: as given when it names a directory, else found on PATH.
std::string resolve(const std::string& program) {
  auto executable = [](const std::string& path) { return ::access(path.c_str(), X_OK) == 0; };
  if (program.find('/') != std::string::npos) {
    if (!executable(program)) {
      throw UsageError("program '" + program + "' does not exist or is not executable");
    }
    return program;
  }
  const char* path = std::getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    if (dir.empty()) dir = ".";
    if (executable(dir + "/" + program)) return dir + "/" + program;
    start = end + 1;
  }
  throw UsageError("program '" + program + "' was not found on PATH (" + dirs + ")");
}

// A port nothing listens on now, on the master address.
int free_port(const std::string& addr) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (::inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) sa.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(sa);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw std::runtime_error("cannot find a free port on " + addr + ": " + why);
  }
  ::close(fd);
  return ntohs(sa.sin_port);
}

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

// Copies a worker's output line by line, prefixed with its rank.
struct Stream {
  int fd = -1;
  FILE* out = nullptr;
  std::string pending;
};

struct Worker {
  int rank = 0;
  int local_rank = 0;
  int restarts = 0;  // of this rank alone (--restart-workers)
  pid_t pid = -1;
  int pidfd = -1;
  Stream streams[2];
  std::optional<int> status;  // exit status as the launcher reports it
};

void emit(Stream& s, const std::string& prefix, bool final) {
  size_t start = 0;
  for (;;) {
    size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    std::fputs((prefix + s.pending.substr(start, nl - start + 1)).c_str(), s.out);
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (final && !s.pending.empty()) {
    std::fputs((prefix + s.pending + "\n").c_str(), s.out);
    s.pending.clear();
  }
  std::fflush(s.out);
}

int exit_code(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

// `rejoin`: the worker replaces a lost one of the running group (--restart-workers).
Worker spawn(const Options& o, const std::string& path, int local_rank, int restart,
             bool rejoin = false) {
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) {
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  const int world = o.nnodes * o.nproc_per_node;
  const int rank = o.node_rank * o.nproc_per_node + local_rank;
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    static const char* const kOurs[] = {
        "RANK=",        "LOCAL_RANK=",  "WORLD_SIZE=",    "LOCAL_WORLD_SIZE=",   "GROUP_RANK=",
        "MASTER_ADDR=", "MASTER_PORT=", "RESTART_COUNT=", "GRADWIRE_RPC_REJOIN="};
    bool ours = false;
    for (const char* k : kOurs)
      ours = ours || entry.rfind(k, 0) == 0;
    if (!ours) env.push_back(std::move(entry));
  }
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("LOCAL_RANK=" + std::to_string(local_rank));
  env.push_back("WORLD_SIZE=" + std::to_string(world));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(o.nproc_per_node));
  env.push_back("GROUP_RANK=" + std::to_string(o.node_rank));
  env.push_back("MASTER_ADDR=" + o.master_addr);
  env.push_back("MASTER_PORT=" + std::to_string(o.master_port));
  env.push_back("RESTART_COUNT=" + std::to_string(restart));
  if (rejoin) env.push_back("GRADWIRE_RPC_REJOIN=1");
  std::vector<char*> envp, argv;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.program;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  // Signals stay blocked across fork() until the child has dropped the launcher's
  // handlers: one arriving in between must not reach the launcher's signal pipe.
  sigset_t blocked, previous;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &blocked, &previous);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(path.c_str(), argv.data(), envp.data());
    std::fprintf(stderr, "gradwire-run: cannot run %s: %s\n", path.c_str(), std::strerror(errno));
    ::_exit(127);
  }
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  Worker w;
  w.rank = rank;
  w.local_rank = local_rank;
  w.pid = pid;
  w.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (w.pidfd < 0) throw std::runtime_error(std::string("pidfd_open: ") + std::strerror(errno));
  w.streams[0] = Stream{out[0], stdout, {}};
  w.streams[1] = Stream{err[0], stderr, {}};
  return w;
}

using Clock = std::chrono::steady_clock;

// Runs one attempt of the local group. Returns the first failure's status (0: all
// succeeded) and sets `interrupted` when a signal ended it. `worker_restarts` counts the
// workers restarted alone so far (--restart-workers), over every attempt.
int run_group(const Options& o, const std::string& path, int restart, int& interrupted,
              int& worker_restarts) {
  std::vector<Worker> workers;
  for (int r = 0; r < o.nproc_per_node; ++r)
    workers.push_back(spawn(o, path, r, restart));
  int first_failure = 0;
  bool stopping = false;
  // Zero: not set.
  Clock::time_point kill_at{};
  Clock::time_point drain_until{};
  auto stop_all = [&](int sig) {
    for (auto& w : workers) {
      if (!w.status) ::kill(w.pid, sig);
    }
  };
  for (;;) {
    // Workers to start again alone, once this round's events are handled.
    std::vector<std::pair<int, int>> respawn;  // (local rank, its restarts so far)
    std::vector<pollfd> fds;
    std::vector<std::pair<size_t, int>> owners;  // (worker, stream index or -1 for pidfd)
    fds.push_back(pollfd{g_signal_pipe[0], POLLIN, 0});
    owners.emplace_back(0, -2);
    bool running = false;
    for (size_t i = 0; i < workers.size(); ++i) {
      Worker& w = workers[i];
      for (int s = 0; s < 2; ++s) {
        if (w.streams[s].fd >= 0) {
          fds.push_back(pollfd{w.streams[s].fd, POLLIN, 0});
          owners.emplace_back(i, s);
        }
      }
      if (!w.status) {
        running = true;
        fds.push_back(pollfd{w.pidfd, POLLIN, 0});
        owners.emplace_back(i, -1);
      }
    }
    int timeout = -1;
    if (!running) {
      // Every worker has ended: drain what they wrote last, but do not wait on a pipe a
      // process they left behind still holds.
      bool any_open = false;
      for (auto& w : workers)
        for (auto& s : w.streams)
          any_open = any_open || s.fd >= 0;
      if (!any_open) break;
      if (drain_until == Clock::time_point{})
        drain_until = Clock::now() + std::chrono::milliseconds(1000);
      if (Clock::now() >= drain_until) break;
      timeout = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(drain_until - Clock::now())
              .count());
    }
    if (kill_at != Clock::time_point{}) {
      const int until_kill = static_cast<int>(std::max<int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count()));
      timeout = timeout < 0 ? until_kill : std::min(timeout, until_kill);
    }
    const int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
    }
    if (kill_at != Clock::time_point{} && Clock::now() >= kill_at) {
      stop_all(SIGKILL);
      kill_at = Clock::time_point{};
    }
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      auto [i, what] = owners[k];
      if (what == -2) {
        unsigned char sig = 0;
        if (::read(g_signal_pipe[0], &sig, 1) == 1) {
          interrupted = sig;
          if (!stopping) {
            stopping = true;
            stop_all(sig);
            kill_at = Clock::now() + std::chrono::milliseconds(o.grace_ms);
          }
        }
        continue;
      }
      Worker& w = workers[i];
      const std::string prefix = o.prefix ? "[rank" + std::to_string(w.rank) + "]: " : "";
      if (what == -1) {
        int wstatus = 0;
        if (::waitpid(w.pid, &wstatus, WNOHANG) == w.pid) {
          w.status = exit_code(wstatus);
          ::close(w.pidfd);
          w.pidfd = -1;
          if (*w.status != 0 && !stopping && worker_restarts < o.restart_workers) {
            ++worker_restarts;
            std::fprintf(stderr,
                         "gradwire-run: rank %d failed (exit status %d); starting it again to "
                         "rejoin the running group (worker restart %d of %d)\n",
                         w.rank, *w.status, worker_restarts, o.restart_workers);
            respawn.emplace_back(w.local_rank, w.restarts);
          } else if (*w.status != 0 && first_failure == 0 && !stopping) {
            first_failure = *w.status;
            std::fprintf(stderr,
                         "gradwire-run: rank %d failed (exit status %d); stopping the others\n",
                         w.rank, *w.status);
            stopping = true;
            stop_all(SIGTERM);
            kill_at = Clock::now() + std::chrono::milliseconds(o.grace_ms);
          }
        }
        continue;
      }
      Stream& s = w.streams[what];
      char buf[4096];
      const ssize_t got = ::read(s.fd, buf, sizeof(buf));
      if (got > 0) {
        s.pending.append(buf, static_cast<size_t>(got));
        emit(s, prefix, false);
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        emit(s, prefix, true);
        ::close(s.fd);
        s.fd = -1;
      }
    }
    for (const auto& [local_rank, restarts] : respawn) {
      workers.push_back(spawn(o, path, local_rank, restarts + 1, /*rejoin=*/true));
      workers.back().restarts = restarts + 1;
    }
  }
  for (auto& w : workers) {
    const std::string prefix = o.prefix ? "[rank" + std::to_string(w.rank) + "]: " : "";
    for (auto& s : w.streams) {
      if (s.fd < 0) continue;
      emit(s, prefix, true);
      ::close(s.fd);
    }
    if (w.pidfd >= 0) ::close(w.pidfd);
  }
  return first_failure;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::string path;
  try {
    o = parse(argc, argv);
    path = resolve(o.program[0]);
    if (o.master_port == 0) o.master_port = free_port(o.master_addr);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "gradwire-run: %s\n%s", e.what(), kUsage);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradwire-run: %s\n", e.what());
    return 1;
  }
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    std::perror("gradwire-run: pipe");
    return 1;
  }
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  try {
    int worker_restarts = 0;
    for (int restart = 0;; ++restart) {
      int interrupted = 0;
      const int status = run_group(o, path, restart, interrupted, worker_restarts);
      if (interrupted != 0) return 128 + interrupted;
      if (status == 0) return 0;
      if (restart >= o.max_restarts) return status;
      std::fprintf(stderr, "gradwire-run: restarting the local group (restart %d of %d)\n",
                   restart + 1, o.max_restarts);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gradwire-run: %s\n", e.what());
    return 1;
  }
}
