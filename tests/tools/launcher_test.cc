// gradwire-run, run as a user runs it: the environment each worker sees, output prefixes,
// a failing worker stopping the others, restarts, signals reaching the workers, and the
// errors for a bad command line. The workers are small /bin/sh scripts.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A launcher run: its pid, and its stdout and stderr read as they come.
class Launch {
 public:
  explicit Launch(std::vector<std::string> args) {
    int out[2], err[2];
    EXPECT_EQ(::pipe2(out, O_CLOEXEC), 0);
    EXPECT_EQ(::pipe2(err, O_CLOEXEC), 0);
    args.insert(args.begin(), GRADWIRE_RUN_PATH);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(out[1], STDOUT_FILENO);
      ::dup2(err[1], STDERR_FILENO);
      std::vector<char*> argv;
      for (auto& a : args)
        argv.push_back(a.data());
      argv.push_back(nullptr);
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

  // Reads until `pred(stdout)` holds or the deadline passes.
  template <typename P>
  bool read_until(P pred, std::chrono::milliseconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!pred(out_)) {
      if (Clock::now() >= deadline || !pump(deadline)) return pred(out_);
    }
    return true;
  }
  // Waits for the launcher to exit (reading its output); its exit status, or -1 at the
  // deadline.
  int wait(std::chrono::milliseconds limit = 20s) {
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

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    out.push_back(line);
  return out;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1))
    ++n;
  return n;
}

TEST(Launcher, EachWorkerGetsTheRendezvousEnvironment) {
  Launch run({"--nproc-per-node", "3", "sh", "-c",
              "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
              "$MASTER_PORT $RESTART_COUNT"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  std::set<std::string> seen;
  std::string port;
  for (const std::string& line : lines(run.out())) {
    std::istringstream in(line);
    std::string prefix, rank, local, world, local_world, group, addr, p, restart;
    in >> prefix >> rank >> local >> world >> local_world >> group >> addr >> p >> restart;
    EXPECT_EQ(prefix, "[rank" + rank + "]:") << line;
    EXPECT_EQ(local, rank);
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(group, "0");
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_EQ(restart, "0");
    EXPECT_GT(std::stoi(p), 0);
    if (port.empty()) port = p;
    EXPECT_EQ(p, port) << "every worker meets on one port";
    seen.insert(rank);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"0", "1", "2"}));
}

TEST(Launcher, ASecondNodeNumbersItsRanksAfterTheFirst) {
  Launch run({"--nnodes", "2", "--node-rank", "1", "--nproc-per-node", "2", "--master-addr",
              "127.0.0.1", "--master-port", "29999", "--no-prefix", "sh", "-c",
              "echo $RANK/$WORLD_SIZE/$GROUP_RANK/$MASTER_PORT"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_EQ(count(run.out(), "2/4/1/29999"), 1u) << run.out();
  EXPECT_EQ(count(run.out(), "3/4/1/29999"), 1u) << run.out();
  EXPECT_EQ(count(run.out(), "[rank"), 0u);
}

TEST(Launcher, TheFirstFailureStopsTheOthersAndIsTheExitStatus) {
  const auto t0 = Clock::now();
  Launch run({"--nproc-per-node", "3", "--grace-ms", "2000", "sh", "-c",
              "if [ $RANK = 1 ]; then echo failing >&2; exit 7; fi; exec sleep 60"});
  EXPECT_EQ(run.wait(), 7) << run.err();
  EXPECT_LT(Clock::now() - t0, 10s);
  EXPECT_NE(run.err().find("[rank1]: failing"), std::string::npos) << run.err();
  EXPECT_NE(run.err().find("rank 1 failed (exit status 7)"), std::string::npos) << run.err();
}

TEST(Launcher, RestartsTheGroupWithARestartCount) {
  // Rank 0 fails in the first two attempts (rank 1 may be stopped before it prints).
  Launch run({"--nproc-per-node", "2", "--max-restarts", "2", "sh", "-c",
              "echo attempt $RESTART_COUNT; [ $RANK = 1 ] || [ $RESTART_COUNT = 2 ] || exit 3"});
  EXPECT_EQ(run.wait(), 0) << run.err();
  for (const char* line :
       {"[rank0]: attempt 0", "[rank0]: attempt 1", "[rank0]: attempt 2", "[rank1]: attempt 2"}) {
    EXPECT_EQ(count(run.out(), line), 1u) << line << " in\n" << run.out();
  }
  EXPECT_EQ(count(run.err(), "restarting the local group"), 2u) << run.err();
  Launch out_of_restarts({"--nproc-per-node", "1", "--max-restarts", "1", "sh", "-c", "exit 4"});
  EXPECT_EQ(out_of_restarts.wait(), 4);
}

// --restart-workers: a failed worker is started again alone, told to rejoin, while the others
// run on; once the restarts are spent, a failure stops the job as before.
TEST(Launcher, RestartsAFailedWorkerAloneAndTellsItToRejoin) {
  // Rank 1 fails twice; rank 0 waits for rank 1's third life to print before it ends, so it
  // is certainly never restarted or stopped meanwhile.
  const std::string marker = "/tmp/gradwire-launcher-rejoin-" + std::to_string(::getpid());
  Launch run({"--nproc-per-node", "2", "--restart-workers", "2", "sh", "-c",
              "echo life $RESTART_COUNT rejoin=${GRADWIRE_RPC_REJOIN:-0}; "
              "if [ $RANK = 1 ]; then [ $RESTART_COUNT = 2 ] && touch " +
                  marker +
                  " && exit 0; exit 5; fi; "
                  "while [ ! -e " +
                  marker + " ]; do sleep 0.02; done; rm -f " + marker});
  EXPECT_EQ(run.wait(), 0) << run.err();
  for (const char* line : {"[rank0]: life 0 rejoin=0", "[rank1]: life 0 rejoin=0",
                           "[rank1]: life 1 rejoin=1", "[rank1]: life 2 rejoin=1"}) {
    EXPECT_EQ(count(run.out(), line), 1u) << line << " in\n" << run.out();
  }
  EXPECT_EQ(count(run.out(), "[rank0]: life"), 1u) << run.out();
  EXPECT_EQ(count(run.err(), "starting it again to rejoin the running group"), 2u) << run.err();
  EXPECT_NE(run.err().find("(worker restart 2 of 2)"), std::string::npos) << run.err();

  Launch spent({"--nproc-per-node", "2", "--restart-workers", "1", "--grace-ms", "2000", "sh", "-c",
                "if [ $RANK = 1 ]; then exit 6; fi; exec sleep 60"});
  EXPECT_EQ(spent.wait(), 6) << spent.err();
  EXPECT_NE(spent.err().find("rank 1 failed (exit status 6); stopping the others"),
            std::string::npos)
      << spent.err();
}

TEST(Launcher, SignalsReachEveryWorker) {
  Launch run({"--nproc-per-node", "2", "sh", "-c",
              "trap 'echo got TERM; exit 0' TERM; echo ready; while :; do sleep 0.05; done"});
  ASSERT_TRUE(run.read_until([](const std::string& out) { return count(out, "ready") == 2; }, 10s))
      << run.out();
  ::kill(run.pid(), SIGTERM);
  EXPECT_EQ(run.wait(), 128 + SIGTERM);
  EXPECT_EQ(count(run.out(), "got TERM"), 2u) << run.out();
}

TEST(Launcher, BadCommandLinesAreRefusedWithTheReason) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--bogus", "true"}, "unknown flag '--bogus'"},
      {{"--nproc-per-node", "0", "true"}, "--nproc-per-node takes an integer in [1, "},
      {{"--nproc-per-node", "x", "true"}, "got 'x'"},
      {{"--nproc-per-node"}, "--nproc-per-node needs a value"},
      {{"no-such-program-here"}, "program 'no-such-program-here' was not found on PATH"},
      {{"./no/such/file"}, "does not exist or is not executable"},
      {{"--nnodes", "2", "true"}, "needs --master-port"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-port", "1", "true"},
       "is not below --nnodes"},
      {{}, "no program to run"},
      {{"--restart-workers", "-1", "true"}, "--restart-workers takes an integer in [0, 1000]"},
  };
  for (const Case& c : cases) {
    Launch run(c.args);
    EXPECT_EQ(run.wait(), 2) << c.says;
    EXPECT_NE(run.err().find(c.says), std::string::npos) << run.err();
  }
}

}  // namespace
