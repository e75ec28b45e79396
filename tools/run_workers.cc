#include "run_workers.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>

extern char** environ;

namespace gradwire::run {

namespace {

using Clock = std::chrono::steady_clock;

int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = ::write(g_signal_pipe[1], &byte, 1);
  errno = saved;
}

std::runtime_error sys_error(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

int exit_code(int wstatus) {
  if (WIFEXITED(wstatus)) return WEXITSTATUS(wstatus);
  if (WIFSIGNALED(wstatus)) return 128 + WTERMSIG(wstatus);
  return 1;
}

int ms_until(Clock::time_point t) {
  return static_cast<int>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count()));
}

// The names the launcher sets; inherited values of them are dropped.
const char* const kOurNames[] = {"RANK",
                                 "LOCAL_RANK",
                                 "WORLD_SIZE",
                                 "LOCAL_WORLD_SIZE",
                                 "GROUP_RANK",
                                 "GROUP_WORLD_SIZE",
                                 "ROLE_RANK",
                                 "ROLE_WORLD_SIZE",
                                 "ROLE_NAME",
                                 "MASTER_ADDR",
                                 "MASTER_PORT",
                                 "RESTART_COUNT",
                                 "TORCHELASTIC_RESTART_COUNT",
                                 "TORCHELASTIC_MAX_RESTARTS",
                                 "TORCHELASTIC_RUN_ID",
                                 "GRADWIRE_RPC_REJOIN",
                                 "GRADWIRE_RESTARTED_ALONE",
                                 "GRADWIRE_RUN_GENERATION",
                                 "GRADWIRE_RPC_ELASTIC",
                                 "GRADWIRE_RPC_JOIN",
                                 "GRADWIRE_STORE_HOSTED"};

}  // namespace

void install_signal_handlers() {
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw sys_error("pipe");
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

int signal_fd() {
  return g_signal_pipe[0];
}

int take_signal() {
  unsigned char sig = 0;
  return ::read(g_signal_pipe[0], &sig, 1) == 1 ? sig : 0;
}

void throw_if_interrupted() {
  if (g_signal_pipe[0] < 0) return;
  if (const int sig = take_signal(); sig != 0) throw Interrupted{sig};
}

// Copies one of a worker's streams line by line: to the console (prefixed) when it is
// shown there, and as written to its log file when there is one.
struct Stream {
  int fd = -1;
  FILE* console = nullptr;  // null: not shown on the console
  int log = -1;
  std::string pending;

  void emit(const std::string& prefix, bool final) {
    if (console == nullptr) {
      pending.clear();
      return;
    }
    size_t start = 0;
    for (;;) {
      const size_t nl = pending.find('\n', start);
      if (nl == std::string::npos) break;
      std::fputs((prefix + pending.substr(start, nl - start + 1)).c_str(), console);
      start = nl + 1;
    }
    pending.erase(0, start);
    if (final && !pending.empty()) {
      std::fputs((prefix + pending + "\n").c_str(), console);
      pending.clear();
    }
    std::fflush(console);
  }
  // Appends to the log file; a log that cannot be written (a full disk) is reported once
  // and then left: the worker goes on, and so does what --tee shows of it.
  void write_log(const char* data, size_t size) {
    while (size > 0) {
      const ssize_t n = ::write(log, data, size);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        std::fprintf(stderr, "gradwire-run: cannot write a worker's log file: %s\n",
                     std::strerror(errno));
        ::close(log);
        log = -1;
        return;
      }
      data += n;
      size -= static_cast<size_t>(n);
    }
  }
  void close_all() {
    if (fd >= 0) ::close(fd);
    if (log >= 0) ::close(log);
    fd = log = -1;
  }
};

struct LocalGroup::Worker {
  int rank = 0;
  int local_rank = 0;
  int restarts = 0;  // of this rank alone (--restart-workers)
  pid_t pid = -1;
  int pidfd = -1;
  Stream streams[2];
  std::optional<int> status;
};

LocalGroup::LocalGroup(const Options& options, GroupPlan plan, std::string secret_file)
    : options_(options), plan_(std::move(plan)), secret_file_(std::move(secret_file)) {
  workers_.reserve(plan_.workers.size() * 2);
  for (size_t r = 0; r < plan_.workers.size(); ++r)
    spawn(static_cast<int>(r), plan_.restart_count, /*alone=*/false);
}

LocalGroup::~LocalGroup() {
  for (auto& w : workers_) {
    if (!w.status) {
      ::kill(-w.pid, SIGKILL);
      ::waitpid(w.pid, nullptr, 0);
    }
    for (auto& s : w.streams)
      s.close_all();
    if (w.pidfd >= 0) ::close(w.pidfd);
  }
}

std::vector<std::string> LocalGroup::worker_env(int local_rank, int restarts, bool alone) const {
  const Options& o = options_;
  const WorkerSlot& slot = plan_.workers.at(static_cast<size_t>(local_rank));
  const int local_world = static_cast<int>(plan_.workers.size());
  std::vector<std::string> env;
  bool omp_set = false;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry = *e;
    bool ours = false;
    for (const char* k : kOurNames)
      ours = ours || entry.rfind(std::string(k) + "=", 0) == 0;
    if (!secret_file_.empty()) {
      ours = ours || entry.rfind("GRADWIRE_SECRET=", 0) == 0 ||
             entry.rfind("GRADWIRE_SECRET_FILE=", 0) == 0;
    }
    omp_set = omp_set || entry.rfind("OMP_NUM_THREADS=", 0) == 0;
    if (!ours) env.push_back(std::move(entry));
  }
  auto put = [&](const char* name, const std::string& value) {
    env.push_back(std::string(name) + "=" + value);
  };
  put("RANK", std::to_string(slot.rank));
  put("LOCAL_RANK", std::to_string(local_rank));
  put("WORLD_SIZE", std::to_string(plan_.world_size));
  put("LOCAL_WORLD_SIZE", std::to_string(local_world));
  put("GROUP_RANK", std::to_string(plan_.node_rank));
  put("GROUP_WORLD_SIZE", std::to_string(plan_.num_nodes));
  put("ROLE_RANK", std::to_string(slot.role_rank));
  put("ROLE_WORLD_SIZE", std::to_string(slot.role_world_size));
  put("ROLE_NAME", slot.role);
  put("MASTER_ADDR", plan_.master_addr);
  put("MASTER_PORT", std::to_string(plan_.master_port));
  put("RESTART_COUNT", std::to_string(restarts));
  put("TORCHELASTIC_RESTART_COUNT", std::to_string(restarts));
  put("TORCHELASTIC_MAX_RESTARTS", std::to_string(o.max_restarts));
  put("TORCHELASTIC_RUN_ID", o.run_id);
  put("GRADWIRE_RUN_GENERATION", std::to_string(plan_.generation));
  if (!secret_file_.empty()) put("GRADWIRE_SECRET_FILE", secret_file_);
  if (!omp_set && local_world > 1) put("OMP_NUM_THREADS", "1");
  if (alone) {
    put("GRADWIRE_RPC_REJOIN", "1");
    put("GRADWIRE_RESTARTED_ALONE", "1");
  }
  if (plan_.elastic) put_role_env(env);
  return env;
}

// An elastic role job's own names: its rpc group is elastic, no worker hosts the workers'
// store (a launcher does), and a node that arrived after the group formed joins it.
void LocalGroup::put_role_env(std::vector<std::string>& env) const {
  env.emplace_back("GRADWIRE_RPC_ELASTIC=1");
  env.emplace_back("GRADWIRE_STORE_HOSTED=1");
  if (plan_.joins_running) env.emplace_back("GRADWIRE_RPC_JOIN=1");
}

std::array<int, 2> LocalGroup::open_logs(int rank) const {
  std::array<int, 2> logs = {-1, -1};
  const Options& o = options_;
  if (o.log_dir.empty()) return logs;
  const std::filesystem::path dir = std::filesystem::path(o.log_dir) / o.run_id /
                                    ("attempt_" + std::to_string(plan_.generation)) /
                                    std::to_string(rank);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error("cannot create log directory " + dir.string() + ": " + ec.message());
  const char* names[2] = {"stdout.log", "stderr.log"};
  for (size_t s = 0; s < 2; ++s) {
    const std::string file = (dir / names[s]).string();
    logs[s] = ::open(file.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (logs[s] < 0) throw sys_error("cannot open " + file);
  }
  return logs;
}

namespace {

// Starts the program in a process of its own group, its stdout and stderr on the write ends
// of `out` and `err`, which are closed here once it runs.
pid_t fork_worker(std::vector<char*>& argv, std::vector<char*>& envp, const int out[2],
                  const int err[2]) {
  // Signals stay blocked across fork() until the child has dropped the launcher's
  // handlers: one arriving in between must not reach the launcher's signal pipe.
  sigset_t blocked, previous;
  sigemptyset(&blocked);
  sigaddset(&blocked, SIGINT);
  sigaddset(&blocked, SIGTERM);
  ::sigprocmask(SIG_BLOCK, &blocked, &previous);
  const pid_t launcher = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::sigprocmask(SIG_SETMASK, &previous, nullptr);
    throw sys_error("fork");
  }
  if (pid == 0) {
    // Only async-signal-safe calls between fork and exec: the launcher has threads (its
    // store client, maybe the store server).
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    // The launcher may have died before prctl took effect: then nobody would kill us.
    if (::getppid() != launcher) ::_exit(129);
    ::dup2(out[1], STDOUT_FILENO);
    ::dup2(err[1], STDERR_FILENO);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execve(argv[0], argv.data(), envp.data());
    static const char kFailed[] = "gradwire-run: cannot run the program: exec failed\n";
    [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, kFailed, sizeof(kFailed) - 1);
    ::_exit(127);
  }
  // Also here, so the group exists before the launcher signals it, whoever runs first.
  ::setpgid(pid, pid);
  ::sigprocmask(SIG_SETMASK, &previous, nullptr);
  ::close(out[1]);
  ::close(err[1]);
  return pid;
}

}  // namespace

void LocalGroup::spawn(int local_rank, int restarts, bool alone) {
  const Options& o = options_;
  const int rank = plan_.workers.at(static_cast<size_t>(local_rank)).rank;
  std::vector<std::string> env = worker_env(local_rank, restarts, alone);
  std::vector<char*> envp, argv;
  for (auto& e : env)
    envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.program;
  for (auto& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);

  const std::array<int, 2> logs = open_logs(rank);
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) throw sys_error("pipe");
  if (::pipe2(err, O_CLOEXEC) != 0) throw sys_error("pipe");
  const pid_t pid = fork_worker(argv, envp, out, err);
  Worker w;
  w.rank = rank;
  w.local_rank = local_rank;
  w.restarts = restarts;
  w.pid = pid;
  w.pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (w.pidfd < 0) throw sys_error("pidfd_open");
  const bool logged = !o.log_dir.empty();
  w.streams[0] = Stream{out[0], !logged || (o.tee & 1) != 0 ? stdout : nullptr, logs[0], {}};
  w.streams[1] = Stream{err[0], !logged || (o.tee & 2) != 0 ? stderr : nullptr, logs[1], {}};
  workers_.push_back(std::move(w));
}

void LocalGroup::signal_all(int sig) {
  for (auto& w : workers_) {
    if (!w.status) ::kill(-w.pid, sig);
  }
}

// One run() call: what it has decided and when it acts next.
struct LocalGroup::Watch {
  GroupResult result;
  bool stopping = false;            // the workers are being stopped; result.outcome is final
  Clock::time_point kill_at{};      // SIGKILL to those left (zero: not set)
  Clock::time_point drain_until{};  // every worker ended: output read until then (zero: not set)
  Clock::time_point next_tick{};
};

// The descriptors one poll() watches, each with what it belongs to.
struct LocalGroup::PollSet {
  static constexpr int kPidfd = -1;
  static constexpr int kSignals = -2;
  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, int>> owners;  // (worker, stream, kPidfd or kSignals)
  bool running = false;                        // some worker has not ended
};

GroupResult LocalGroup::run(int tick_ms, const std::function<std::optional<std::string>()>& tick,
                            const std::function<void(int, int)>& on_failure, int& worker_restarts) {
  Watch watch;
  watch.next_tick = Clock::now() + std::chrono::milliseconds(tick_ms);
  for (;;) {
    PollSet set = poll_set();
    int timeout = ms_until(watch.next_tick);
    if (!set.running && !draining(watch, timeout)) break;
    if (watch.kill_at != Clock::time_point{}) timeout = std::min(timeout, ms_until(watch.kill_at));
    std::vector<pollfd>& fds = set.fds;
    const int n = ::poll(fds.data(), fds.size(), timeout);
    if (n < 0 && errno != EINTR) throw sys_error("poll");
    if (watch.kill_at != Clock::time_point{} && Clock::now() >= watch.kill_at) {
      signal_all(SIGKILL);
      watch.kill_at = Clock::time_point{};
    }
    if (Clock::now() >= watch.next_tick) {
      watch.next_tick = Clock::now() + std::chrono::milliseconds(tick_ms);
      if (!watch.stopping && set.running) {
        if (std::optional<std::string> why = tick()) stop(watch, Outcome::kStopped, SIGTERM, *why);
      }
    }
    std::vector<std::pair<int, int>> respawn;  // (local rank, its restarts so far)
    for (size_t k = 0; n > 0 && k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const auto [i, what] = set.owners[k];
      if (what == PollSet::kSignals) {
        if (const int sig = take_signal(); sig != 0) {
          if (!watch.stopping) watch.result.signal = sig;
          stop(watch, Outcome::kInterrupted, sig, "signal " + std::to_string(sig));
        }
      } else if (what == PollSet::kPidfd) {
        reap(watch, workers_[i], on_failure, worker_restarts, respawn);
      } else {
        copy_output(workers_[i], what);
      }
    }
    for (const auto& [local_rank, restarts] : respawn)
      spawn(local_rank, restarts + 1, /*alone=*/true);
  }
  for (auto& w : workers_) {
    for (auto& s : w.streams) {
      if (s.fd >= 0) s.emit(prefix(w), true);
      s.close_all();
    }
  }
  return watch.result;
}

LocalGroup::PollSet LocalGroup::poll_set() const {
  PollSet set;
  set.fds.push_back(pollfd{signal_fd(), POLLIN, 0});
  set.owners.emplace_back(0, PollSet::kSignals);
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = workers_[i];
    for (int s = 0; s < 2; ++s) {
      if (w.streams[s].fd >= 0) {
        set.fds.push_back(pollfd{w.streams[s].fd, POLLIN, 0});
        set.owners.emplace_back(i, s);
      }
    }
    if (!w.status) {
      set.running = true;
      set.fds.push_back(pollfd{w.pidfd, POLLIN, 0});
      set.owners.emplace_back(i, PollSet::kPidfd);
    }
  }
  return set;
}

bool LocalGroup::draining(Watch& watch, int& timeout) const {
  // Every worker has ended: drain what they wrote last, but do not wait on a pipe a
  // process they left behind still holds.
  bool any_open = false;
  for (const auto& w : workers_)
    for (const auto& s : w.streams)
      any_open = any_open || s.fd >= 0;
  if (!any_open) return false;
  if (watch.drain_until == Clock::time_point{}) {
    watch.drain_until = Clock::now() + std::chrono::milliseconds(1000);
  }
  if (Clock::now() >= watch.drain_until) return false;
  timeout = std::min(timeout, ms_until(watch.drain_until));
  return true;
}

void LocalGroup::stop(Watch& watch, Outcome outcome, int sig, std::string reason) {
  if (watch.stopping) return;
  watch.stopping = true;
  watch.result.outcome = outcome;
  watch.result.reason = std::move(reason);
  signal_all(sig);
  watch.kill_at = Clock::now() + std::chrono::milliseconds(options_.grace_ms);
}

void LocalGroup::reap(Watch& watch, Worker& w, const std::function<void(int, int)>& on_failure,
                      int& worker_restarts, std::vector<std::pair<int, int>>& respawn) {
  const Options& o = options_;
  int wstatus = 0;
  if (::waitpid(w.pid, &wstatus, WNOHANG) != w.pid) return;
  w.status = exit_code(wstatus);
  ::close(w.pidfd);
  w.pidfd = -1;
  if (*w.status == 0 || watch.stopping) return;
  const std::string who = describe(w);
  if (worker_restarts < o.restart_workers) {
    ++worker_restarts;
    std::fprintf(stderr,
                 "gradwire-run: %s failed (exit status %d); starting it again to "
                 "rejoin the running group (worker restart %d of %d)\n",
                 who.c_str(), *w.status, worker_restarts, o.restart_workers);
    respawn.emplace_back(w.local_rank, w.restarts);
    return;
  }
  const WorkerSlot& slot = plan_.workers.at(static_cast<size_t>(w.local_rank));
  if (plan_.elastic && !slot.critical) {
    ++watch.result.lost;
    std::fprintf(stderr,
                 "gradwire-run: %s failed (exit status %d); role '%s' is not critical: the job "
                 "goes on without it\n",
                 who.c_str(), *w.status, slot.role.c_str());
    return;
  }
  std::fprintf(stderr, "gradwire-run: %s failed (exit status %d); stopping the others%s\n",
               who.c_str(), *w.status,
               plan_.elastic ? (" (role '" + slot.role + "' is critical)").c_str() : "");
  watch.result.status = *w.status;
  on_failure(w.rank, *w.status);
  stop(
      watch, Outcome::kFailed, SIGTERM,
      "rank " + std::to_string(w.rank) + " failed (exit status " + std::to_string(*w.status) + ")");
}

void LocalGroup::copy_output(Worker& w, int stream) const {
  Stream& s = w.streams[stream];
  char buf[4096];
  const ssize_t got = ::read(s.fd, buf, sizeof(buf));
  if (got > 0) {
    if (s.log >= 0) s.write_log(buf, static_cast<size_t>(got));
    s.pending.append(buf, static_cast<size_t>(got));
    s.emit(prefix(w), false);
  } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
    s.emit(prefix(w), true);
    s.close_all();
  }
}

std::string LocalGroup::describe(const Worker& w) const {
  if (!plan_.elastic) return "rank " + std::to_string(w.rank);
  const WorkerSlot& slot = plan_.workers.at(static_cast<size_t>(w.local_rank));
  return "rank " + std::to_string(w.rank) + " (" + slot.role + " " +
         std::to_string(slot.role_rank) + ")";
}

std::string LocalGroup::prefix(const Worker& w) const {
  return options_.prefix ? "[rank" + std::to_string(w.rank) + "]: " : "";
}

}  // namespace gradwire::run
