// gradwire-run's job secret, run as a user runs it (labelled security as well as tools):
// a single-node job (--standalone, or --nnodes 1 with an endpoint) makes up a secret that
// its rendezvous store requires, so a stranger who reaches the store can neither send the
// workers elsewhere (g<G>/master) nor add a node; its workers get the secret through a
// private file (GRADWIRE_SECRET_FILE) and so require it in their own stores; a user's
// secret is used as it is; a job of several nodes without one says at start that anyone
// can join it.
//
// The workers are /bin/sh scripts that wait on a FIFO (the test holds it open for reading
// and writing, so the shell's open never blocks and a line written early is kept) while the
// test plays the stranger and the job's member against the running stores.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/error.h"
#include "launch.h"
#include "support/scoped_env.h"
#include "support/temp_dir.h"

namespace {

using namespace gradwire::testing::launcher;
using gradwire::c10d::TCPStore;
using gradwire::c10d::TCPStoreOptions;

// The launcher's environment without a user's secret.
const EnvChanges kNoSecret = {{"GRADWIRE_SECRET", std::nullopt},
                              {"GRADWIRE_SECRET_FILE", std::nullopt}};

// A FIFO the workers read a line from ("read line < PATH") before they finish.
class Gate {
 public:
  explicit Gate(const std::filesystem::path& dir) : path_((dir / "gate").string()) {
    EXPECT_EQ(::mkfifo(path_.c_str(), 0600), 0) << path_;
    fd_ = ::open(path_.c_str(), O_RDWR | O_CLOEXEC);
    EXPECT_GE(fd_, 0) << path_;
  }
  ~Gate() {
    if (fd_ >= 0) ::close(fd_);
    ::unlink(path_.c_str());
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;

  // What a worker runs to wait for open().
  std::string wait_command() const { return "read line < '" + path_ + "'"; }
  // Lets `workers` waiting workers go on.
  void open(int workers = 1) {
    for (int i = 0; i < workers; ++i)
      EXPECT_EQ(::write(fd_, "go\n", 3), 3);
  }

 private:
  std::string path_;
  int fd_ = -1;
};

// The value of "key=value" on the first line of `text` that has it; "" when none.
std::string field(const std::string& text, const std::string& key) {
  for (const std::string& line : lines(text)) {
    std::istringstream in(line);
    for (std::string word; in >> word;)
      if (word.rfind(key + "=", 0) == 0) return word.substr(key.size() + 1);
  }
  return "";
}

// What the worker scripts print first: where their secret is, and their store.
const char* const kReport =
    "echo worker pid=$$ file=${GRADWIRE_SECRET_FILE:-none} env=${GRADWIRE_SECRET:-none} "
    "master=$MASTER_ADDR:$MASTER_PORT";

// The TCP ports process `pid` listens on (what `ss -ltnp` shows a user): its sockets'
// inodes matched against the listening rows of its network namespace's tables.
std::vector<int> listening_ports(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  std::set<std::string> inodes;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(proc + "/fd", ec), end; !ec && it != end;
       it.increment(ec)) {
    const std::string target = std::filesystem::read_symlink(it->path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) inodes.insert(target.substr(8, target.size() - 9));
  }
  std::vector<int> ports;
  for (const char* table : {"/net/tcp", "/net/tcp6"}) {
    std::ifstream in(proc + table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string slot, local, remote, state, queues, timer, retransmits, uid, timeout, inode;
      row >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid >> timeout >>
          inode;
      if (state != "0A" || inodes.count(inode) == 0) continue;  // 0A: LISTEN
      ports.push_back(std::stoi(local.substr(local.rfind(':') + 1), nullptr, 16));
    }
  }
  return ports;
}

// What `attempt` threw; "" when it did not throw.
std::string refusal(const std::function<void()>& attempt) {
  try {
    attempt();
  } catch (const gradwire::Error& e) {
    return e.what();
  }
  return "";
}

TCPStoreOptions client(int port, const std::string& secret) {
  return TCPStoreOptions{.host = "127.0.0.1",
                         .port = static_cast<uint16_t>(port),
                         .timeout = 5s,
                         .connect_timeout = 5s,
                         .secret = secret};
}

// A stranger without the secret tries to hand every worker its own address, and to add
// a node to the job; both are refused.
void expect_strangers_refused(int port, const std::string& run_id) {
  gradwire::test::ScopedEnv none({{"GRADWIRE_SECRET", nullptr}, {"GRADWIRE_SECRET_FILE", nullptr}});
  const std::string prefix = "/gradwire-run/" + run_id + "/g0/";
  const std::string master = refusal([&] {
    TCPStore stranger(client(port, ""));
    stranger.set(prefix + "master", std::string_view("203.0.113.9 29500"));
  });
  EXPECT_TRUE(has(master, "authentication failed"))
      << "a stranger rewrote the master record; the refusal was: '" << master << "'";
  const std::string node = refusal([&] {
    TCPStore stranger(client(port, ""));
    stranger.set(prefix + "node1", std::string_view("64 203.0.113.9 stranger"));
    stranger.add(prefix + "joined", 1);
  });
  EXPECT_TRUE(has(node, "authentication failed"))
      << "a stranger added a node; the refusal was: '" << node << "'";
}

std::string contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The secret file the worker of `out` was told of: a file only this user can read, in a
// directory only this user can enter; returns its contents.
std::string expect_private_secret_file(const std::string& out) {
  const std::string file = field(out, "file");
  EXPECT_NE(file, "none") << "the worker got no GRADWIRE_SECRET_FILE:\n" << out;
  EXPECT_EQ(field(out, "env"), "none") << "the secret itself is not in the environment";
  struct stat st {};
  EXPECT_EQ(::lstat(file.c_str(), &st), 0) << file;
  EXPECT_TRUE(S_ISREG(st.st_mode)) << file;
  EXPECT_EQ(st.st_mode & 07777, 0600u) << file;
  EXPECT_EQ(st.st_uid, ::getuid()) << file;
  const std::string dir = std::filesystem::path(file).parent_path().string();
  EXPECT_EQ(::lstat(dir.c_str(), &st), 0) << dir;
  EXPECT_TRUE(S_ISDIR(st.st_mode)) << dir;
  EXPECT_EQ(st.st_mode & 07777, 0700u) << dir;
  const std::string secret = contents(file);
  EXPECT_GE(secret.size(), 32u);
  return secret;
}

// --standalone: the launcher's own store on a free localhost port requires a secret made
// up for the job; the workers read it from a private file (not from their environment), the
// job finishes, and the file and its directory are gone with the launcher.
TEST(LauncherSecret, StandaloneRefusesAnUnauthenticatedRendezvousWrite) {
  gradwire::test::TempDir tmp("gradwire-launcher-secret");
  Gate gate(tmp.path());
  Launch run({"--standalone", "--rdzv-id", "guarded", "--no-prefix", "sh", "-c",
              std::string(kReport) + "; " + gate.wait_command() + "; echo worker done"},
             kNoSecret);
  ASSERT_TRUE(run.read_until(
      [](const std::string& out, const std::string&) { return has(out, "worker pid="); }, 20s))
      << run.out() << run.err();
  const std::vector<int> ports = listening_ports(run.pid());
  ASSERT_EQ(ports.size(), 1u) << "the launcher listens on its rendezvous store alone";

  expect_strangers_refused(ports[0], "guarded");

  const std::string secret = expect_private_secret_file(run.out());
  const std::string file = field(run.out(), "file");
  // Not readable from any process's environment.
  const std::string worker = field(run.out(), "pid");
  for (const std::string& pid : {std::to_string(run.pid()), worker}) {
    const std::string environ = contents("/proc/" + pid + "/environ");
    EXPECT_FALSE(has(environ, secret)) << "the secret is in the environment of " << pid;
  }
  EXPECT_TRUE(has(contents("/proc/" + worker + "/environ"), "GRADWIRE_SECRET_FILE=" + file));

  // The job's members know it: with it, the store answers, and its master record is what
  // the workers were told.
  TCPStore member(client(ports[0], secret));
  std::string told = field(run.out(), "master");
  ASSERT_NE(told.rfind(':'), std::string::npos) << run.out();
  told[told.rfind(':')] = ' ';
  EXPECT_EQ(member.get_string("/gradwire-run/guarded/g0/master"), told);

  gate.open();
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_TRUE(has(run.out(), "worker done")) << run.out();
  EXPECT_FALSE(std::filesystem::exists(file)) << file;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(file).parent_path())) << file;
}

// One node with an endpoint of its own is a single-host job too: the store it hosts there
// requires the job's secret, and so does a store a worker runs (gradwire-store here, as
// any worker's TCPStore or rpc agent reads GRADWIRE_SECRET_FILE).
TEST(LauncherSecret, ASingleNodeJobsWorkersRequireItsSecretInTheirOwnStores) {
  gradwire::test::TempDir tmp("gradwire-launcher-secret");
  Gate gate(tmp.path());
  const int port = free_port();
  Launch run({"--nnodes", "1", "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port), "--rdzv-id",
              "single", "--no-prefix", "sh", "-c",
              std::string(kReport) + "; '" + GRADWIRE_STORE_PATH +
                  "' --host 127.0.0.1 --port 0 & store=$!; " + gate.wait_command() +
                  "; kill $store; wait $store; echo worker done"},
             kNoSecret);
  ASSERT_TRUE(run.read_until(
      [](const std::string& out, const std::string&) { return has(out, "listening on port "); },
      20s))
      << run.out() << run.err();
  expect_strangers_refused(port, "single");

  const std::string secret = expect_private_secret_file(run.out());
  const int worker_store = std::stoi(value_after(run.out(), "listening on port"));
  {
    gradwire::test::ScopedEnv none(
        {{"GRADWIRE_SECRET", nullptr}, {"GRADWIRE_SECRET_FILE", nullptr}});
    const std::string refused = refusal([&] {
      TCPStore stranger(client(worker_store, ""));
      stranger.set("weights", std::string_view("junk"));
    });
    EXPECT_TRUE(has(refused, "authentication failed"))
        << "the worker's store let a stranger in; the refusal was: '" << refused << "'";
  }
  TCPStore member(client(worker_store, secret));
  member.set("weights", std::string_view("ok"));
  EXPECT_EQ(member.get_string("weights"), "ok");

  gate.open();
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_TRUE(has(run.out(), "worker done")) << run.out();
}

// A secret the user set is the job's: the workers inherit it unchanged, and the launcher's
// store requires that one (not one made up).
TEST(LauncherSecret, AUsersSecretIsUsedAndNeverReplaced) {
  gradwire::test::TempDir tmp("gradwire-launcher-secret");
  const std::string given = "the-users-own-secret-of-16-bytes-or-more";
  {
    Gate gate(tmp.path());
    const int port = free_port();
    Launch run(
        {"--nnodes", "1", "--rdzv-endpoint", "127.0.0.1:" + std::to_string(port), "--rdzv-id",
         "users", "--no-prefix", "sh", "-c", std::string(kReport) + "; " + gate.wait_command()},
        {{"GRADWIRE_SECRET", given}, {"GRADWIRE_SECRET_FILE", std::nullopt}});
    ASSERT_TRUE(run.read_until(
        [](const std::string& out, const std::string&) { return has(out, "worker pid="); }, 20s))
        << run.out() << run.err();
    EXPECT_EQ(field(run.out(), "file"), "none");
    EXPECT_EQ(field(run.out(), "env"), given);
    TCPStore member(client(port, given));
    EXPECT_FALSE(member.get_string("/gradwire-run/users/g0/master").empty());
    gate.open();
    ASSERT_EQ(run.wait(), 0) << run.err();
  }
  {
    Gate gate(tmp.path());
    const std::string file = (tmp.path() / "job.secret").string();
    std::ofstream(file) << "a secret the user keeps in a file\n";
    std::filesystem::permissions(
        file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
    Launch run({"--standalone", "--rdzv-id", "users", "--no-prefix", "sh", "-c",
                std::string(kReport) + "; " + gate.wait_command()},
               {{"GRADWIRE_SECRET", std::nullopt}, {"GRADWIRE_SECRET_FILE", file}});
    ASSERT_TRUE(run.read_until(
        [](const std::string& out, const std::string&) { return has(out, "worker pid="); }, 20s))
        << run.out() << run.err();
    EXPECT_EQ(field(run.out(), "file"), file);
    const std::vector<int> ports = listening_ports(run.pid());
    ASSERT_EQ(ports.size(), 1u);
    TCPStore member(client(ports[0], "a secret the user keeps in a file"));
    EXPECT_FALSE(member.get_string("/gradwire-run/users/g0/master").empty());
    gate.open();
    ASSERT_EQ(run.wait(), 0) << run.err();
    EXPECT_TRUE(std::filesystem::exists(file)) << "the user's file is the user's";
  }
}

// The launcher removes the secret's file however it ends: here stopped by SIGTERM while its
// worker runs.
TEST(LauncherSecret, TheSecretFileIsRemovedWhenTheLauncherIsStopped) {
  gradwire::test::TempDir tmp("gradwire-launcher-secret");
  Gate gate(tmp.path());
  Launch run({"--standalone", "--grace-ms", "2000", "--no-prefix", "sh", "-c",
              std::string(kReport) + "; " + gate.wait_command()},
             kNoSecret);
  ASSERT_TRUE(run.read_until(
      [](const std::string& out, const std::string&) { return has(out, "worker pid="); }, 20s))
      << run.out() << run.err();
  const std::string file = field(run.out(), "file");
  ASSERT_TRUE(std::filesystem::exists(file)) << run.out();
  ::kill(run.pid(), SIGTERM);
  EXPECT_EQ(run.wait(), 128 + SIGTERM) << run.err();
  EXPECT_FALSE(std::filesystem::exists(file)) << file;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(file).parent_path())) << file;
}

// Several nodes cannot make up a secret they agree on: without the user's, every launcher
// says at start that anyone on the network can join, and the job runs. With it,
// there is no warning and a stranger is refused.
TEST(LauncherSecret, AMultiNodeJobWithoutASecretSaysAnyoneCanJoin) {
  auto nodes = [](const std::string& endpoint, const std::string& tail) {
    return std::vector<std::string>{"--rdzv-endpoint",
                                    endpoint,
                                    "--nnodes",
                                    "2",
                                    "--rdzv-id",
                                    "open",
                                    "--rdzv-last-call",
                                    "200ms",
                                    "--rdzv-heartbeat-timeout",
                                    "3s",
                                    "--rdzv-timeout",
                                    "20s",
                                    "--no-prefix",
                                    "sh",
                                    "-c",
                                    std::string(kReport) + tail};
  };
  {
    const std::string ep = "127.0.0.1:" + std::to_string(free_port());
    Launch a(nodes(ep, ""), kNoSecret);
    Launch b(nodes(ep, ""), kNoSecret);
    ASSERT_EQ(a.wait(), 0) << a.err();
    ASSERT_EQ(b.wait(), 0) << b.err();
    for (const Launch* run : {&a, &b}) {
      EXPECT_TRUE(has(run->err(), "WARNING: this job of several nodes has no shared secret"))
          << run->err();
      EXPECT_TRUE(has(run->err(), "anyone on the network who can reach the rendezvous store at " +
                                      ep + " can join the job"))
          << run->err();
      EXPECT_EQ(field(run->out(), "file"), "none") << run->out();
    }
  }
  {
    gradwire::test::TempDir tmp("gradwire-launcher-secret");
    Gate gate(tmp.path());
    const int port = free_port();
    const std::string ep = "127.0.0.1:" + std::to_string(port);
    const EnvChanges shared = {{"GRADWIRE_SECRET", "every node's secret, 16 bytes or more"},
                               {"GRADWIRE_SECRET_FILE", std::nullopt}};
    Launch a(nodes(ep, "; " + gate.wait_command()), shared);
    Launch b(nodes(ep, "; " + gate.wait_command()), shared);
    ASSERT_TRUE(a.read_until(
        [](const std::string& out, const std::string&) { return has(out, "worker pid="); }, 20s))
        << a.out() << a.err();
    expect_strangers_refused(port, "open");
    gate.open(2);
    ASSERT_EQ(a.wait(), 0) << a.err();
    ASSERT_EQ(b.wait(), 0) << b.err();
    EXPECT_FALSE(has(a.err() + b.err(), "no shared secret")) << a.err() << b.err();
  }
}

}  // namespace
