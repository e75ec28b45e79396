// gradwire-run, run as a user runs it: the environment each worker sees, output prefixes,
// a failing worker stopping the others, restarts, signals reaching the workers, and the
// errors for a bad command line. The workers are small /bin/sh scripts.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/process_group.h"
#include "gradwire/core/error.h"
#include "launch.h"

namespace {

using namespace gradwire::testing::launcher;

TEST(Launcher, EachWorkerGetsTheRendezvousEnvironment) {
  Launch run(
      {"--nproc-per-node", "3", "--rdzv-id", "envjob", "--max-restarts", "2", "sh", "-c",
       "echo $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR "
       "$MASTER_PORT $RESTART_COUNT $GROUP_WORLD_SIZE $ROLE_RANK $ROLE_WORLD_SIZE $ROLE_NAME "
       "$TORCHELASTIC_RESTART_COUNT $TORCHELASTIC_MAX_RESTARTS $TORCHELASTIC_RUN_ID"},
      {{"RANK", "77"}, {"TORCHELASTIC_RUN_ID", "stale"}});
  ASSERT_EQ(run.wait(), 0) << run.err();
  std::set<std::string> seen;
  std::string port;
  for (const std::string& line : lines(run.out())) {
    std::istringstream in(line);
    std::string prefix, rank, local, world, local_world, group, addr, p, restart, group_world,
        role_rank, role_world, role, te_restart, te_max, te_id;
    in >> prefix >> rank >> local >> world >> local_world >> group >> addr >> p >> restart >>
        group_world >> role_rank >> role_world >> role >> te_restart >> te_max >> te_id;
    EXPECT_EQ(prefix, "[rank" + rank + "]:") << line;
    EXPECT_EQ(local, rank);
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local_world, "3");
    EXPECT_EQ(group, "0");
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_EQ(restart, "0");
    EXPECT_EQ(group_world, "1");
    EXPECT_EQ(role_rank, rank);
    EXPECT_EQ(role_world, "3");
    EXPECT_EQ(role, "default");
    EXPECT_EQ(te_restart, "0");
    EXPECT_EQ(te_max, "2");
    EXPECT_EQ(te_id, "envjob");
    EXPECT_GT(std::stoi(p), 0);
    if (port.empty()) port = p;
    EXPECT_EQ(p, port) << "every worker meets on one port";
    seen.insert(rank);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"0", "1", "2"}));
}

TEST(Launcher, OneNodeWithAMasterPortGivesItToTheWorkers) {
  const std::string port = std::to_string(free_port());
  Launch run({"--master-addr", "127.0.0.1", "--master-port", port, "--no-prefix", "sh", "-c",
              "echo $MASTER_ADDR:$MASTER_PORT"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_EQ(run.out(), "127.0.0.1:" + port + "\n");
}

TEST(Launcher, StandaloneRunsOneNodeOnItsOwnStore) {
  Launch run({"--standalone", "--nproc-per-node", "2", "--no-prefix", "sh", "-c",
              "echo $RANK/$WORLD_SIZE/$GROUP_WORLD_SIZE"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  EXPECT_EQ(count(run.out(), "0/2/1"), 1u) << run.out();
  EXPECT_EQ(count(run.out(), "1/2/1"), 1u) << run.out();
}

TEST(Launcher, NprocPerNodeAutoCountsVisibleGpusElseCpus) {
  Launch gpus({"--nproc-per-node", "auto", "--no-prefix", "sh", "-c", "echo $LOCAL_WORLD_SIZE"},
              {{"CUDA_VISIBLE_DEVICES", "0,1,2"}});
  ASSERT_EQ(gpus.wait(), 0) << gpus.err();
  EXPECT_EQ(count(gpus.out(), "3\n"), 3u) << gpus.out();

  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(::sched_getaffinity(0, sizeof(set), &set), 0);
  const int cpus = CPU_COUNT(&set);
  // An empty CUDA_VISIBLE_DEVICES hides every GPU.
  Launch cpu({"--nproc-per-node", "auto", "--no-prefix", "sh", "-c", "echo $LOCAL_WORLD_SIZE"},
             {{"CUDA_VISIBLE_DEVICES", ""}});
  ASSERT_EQ(cpu.wait(), 0) << cpu.err();
  EXPECT_EQ(count(cpu.out(), std::to_string(cpus) + "\n"), static_cast<size_t>(cpus)) << cpu.out();
}

TEST(Launcher, OmpNumThreadsIsOneUnlessSet) {
  Launch unset({"--nproc-per-node", "2", "--no-prefix", "sh", "-c", "echo omp=$OMP_NUM_THREADS"},
               {{"OMP_NUM_THREADS", std::nullopt}});
  ASSERT_EQ(unset.wait(), 0) << unset.err();
  EXPECT_EQ(count(unset.out(), "omp=1\n"), 2u) << unset.out();
  EXPECT_EQ(count(unset.err(), "setting OMP_NUM_THREADS=1"), 1u) << unset.err();

  Launch set({"--nproc-per-node", "2", "--no-prefix", "sh", "-c", "echo omp=$OMP_NUM_THREADS"},
             {{"OMP_NUM_THREADS", "4"}});
  ASSERT_EQ(set.wait(), 0) << set.err();
  EXPECT_EQ(count(set.out(), "omp=4\n"), 2u) << set.out();
  EXPECT_FALSE(has(set.err(), "OMP_NUM_THREADS")) << set.err();
}

TEST(Launcher, LogDirKeepsEachWorkersStreamsAndTeeShowsSome) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("gradwire-launcher-logs-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  // --tee 2: stderr also goes to the console, stdout only to the files.
  Launch run({"--nproc-per-node", "2", "--log-dir", dir.string(), "--rdzv-id", "logjob", "--tee",
              "2", "sh", "-c", "echo out $RANK; echo err $RANK >&2"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  };
  for (const char* rank : {"0", "1"}) {
    const auto at = dir / "logjob" / "attempt_0" / rank;
    EXPECT_EQ(read(at / "stdout.log"), std::string("out ") + rank + "\n");
    EXPECT_EQ(read(at / "stderr.log"), std::string("err ") + rank + "\n");
    EXPECT_TRUE(has(run.err(), std::string("[rank") + rank + "]: err " + rank)) << run.err();
  }
  EXPECT_EQ(run.out(), "") << "stdout is not teed";
  std::filesystem::remove_all(dir);

  // Without --tee nothing of the workers reaches the console.
  Launch quiet({"--log-dir", dir.string(), "sh", "-c", "echo out; echo err >&2"});
  ASSERT_EQ(quiet.wait(), 0) << quiet.err();
  EXPECT_EQ(quiet.out(), "");
  EXPECT_FALSE(has(quiet.err(), "[rank0]")) << quiet.err();
  EXPECT_EQ(read(dir / "default" / "attempt_0" / "0" / "stdout.log"), "out\n");
  std::filesystem::remove_all(dir);
}

// Each generation's logs go to a folder of their own.
TEST(Launcher, LogDirKeepsEachAttemptApart) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("gradwire-launcher-attempts-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  Launch run({"--log-dir", dir.string(), "--max-restarts", "1", "sh", "-c",
              "echo attempt $RESTART_COUNT; [ $RESTART_COUNT = 1 ]"});
  ASSERT_EQ(run.wait(), 0) << run.err();
  for (const char* attempt : {"0", "1"}) {
    std::ifstream in(dir / "default" / (std::string("attempt_") + attempt) / "0" / "stdout.log");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, std::string("attempt ") + attempt + "\n");
  }
  std::filesystem::remove_all(dir);
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
  EXPECT_EQ(count(run.err(), "restarting every node's workers"), 2u) << run.err();
  Launch out_of_restarts({"--nproc-per-node", "1", "--max-restarts", "1", "sh", "-c", "exit 4"});
  EXPECT_EQ(out_of_restarts.wait(), 4);
}

// --restart-workers: a failed worker is started again alone, told to rejoin, while the others
// run on; once the restarts are spent, a failure stops the job as it does without the flag.
TEST(Launcher, RestartsAFailedWorkerAloneAndTellsItToRejoin) {
  // Rank 1 fails twice; rank 0 waits for rank 1's third life to print before it ends, so it
  // is certainly never restarted or stopped meanwhile.
  const std::string marker = "/tmp/gradwire-launcher-rejoin-" + std::to_string(::getpid());
  Launch run({"--nproc-per-node", "2", "--restart-workers", "2", "sh", "-c",
              "echo life $RESTART_COUNT rejoin=${GRADWIRE_RPC_REJOIN:-0}"
              "${GRADWIRE_RESTARTED_ALONE:-0}; "
              "if [ $RANK = 1 ]; then [ $RESTART_COUNT = 2 ] && touch " +
                  marker +
                  " && exit 0; exit 5; fi; "
                  "while [ ! -e " +
                  marker + " ]; do sleep 0.02; done; rm -f " + marker});
  EXPECT_EQ(run.wait(), 0) << run.err();
  for (const char* line : {"[rank0]: life 0 rejoin=00", "[rank1]: life 0 rejoin=00",
                           "[rank1]: life 1 rejoin=11", "[rank1]: life 2 rejoin=11"}) {
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

// Signals go to each worker's process group, so what a worker started itself stops too.
TEST(Launcher, SignalsReachEveryWorkersProcessGroup) {
  Launch run({"--nproc-per-node", "2", "sh", "-c",
              "sleep 60 & echo child $!; trap 'echo got TERM; exit 0' TERM; echo ready; "
              "while :; do sleep 0.05; done"});
  ASSERT_TRUE(run.read_until(
      [](const std::string& out, const std::string&) { return count(out, "ready") == 2; }, 10s))
      << run.out();
  std::vector<pid_t> children;
  for (const std::string& line : lines(run.out()))
    if (has(line, "child ")) children.push_back(std::stoi(value_after(line, "child")));
  ASSERT_EQ(children.size(), 2u) << run.out();
  ::kill(run.pid(), SIGTERM);
  EXPECT_EQ(run.wait(), 128 + SIGTERM);
  EXPECT_EQ(count(run.out(), "got TERM"), 2u) << run.out();
  for (pid_t child : children)
    EXPECT_TRUE(ends_within(child, 10s)) << "the worker's own child " << child << " lives on";
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
      {{"--nnodes", "2", "true"}, "needs --rdzv-endpoint HOST:PORT"},
      {{"--nnodes", "2", "--node-rank", "2", "--master-port", "1", "true"},
       "is not below --nnodes"},
      {{}, "no program to run"},
      {{"--restart-workers", "-1", "true"}, "--restart-workers takes an integer in [0, 1000]"},
      {{"--nnodes", "3:2", "--rdzv-endpoint", "127.0.0.1:1", "true"},
       "--nnodes 3:2: MIN 3 is above MAX 2"},
      {{"--nnodes", "x:2", "true"}, "--nnodes MIN takes an integer"},
      {{"--nnodes", "2", "--rdzv-endpoint", "127.0.0.1", "true"},
       "--rdzv-endpoint '127.0.0.1' has no port"},
      {{"--rdzv-endpoint", "127.0.0.1:70000", "true"}, "--rdzv-endpoint port takes an integer"},
      {{"--rdzv-endpoint", ":29400", "true"}, "has no host"},
      {{"--standalone", "--nnodes", "2", "true"}, "--standalone runs one node"},
      {{"--standalone", "--rdzv-endpoint", "127.0.0.1:1", "true"}, "exclude each other"},
      {{"--nnodes", "1:2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:1", "true"},
       "--node-rank needs a fixed --nnodes N"},
      {{"--rdzv-endpoint", "127.0.0.1:1", "--master-port", "2", "true"},
       "--master-port is for the static setup"},
      {{"--tee", "4", "true"}, "--tee takes an integer in [0, 3]"},
      {{"--rdzv-id", "a/b", "true"}, "--rdzv-id 'a/b' must be"},
      {{"--rdzv-last-call", "soon", "true"}, "--rdzv-last-call"},
      {{"--rdzv-heartbeat-timeout", "5ms", "true"}, "at least 100ms"},
      {{"--rdzv-backend", "etcd", "true"}, "--rdzv-backend 'etcd' is not supported"},
  };
  for (const Case& c : cases) {
    Launch run(c.args);
    EXPECT_EQ(run.wait(), 2) << c.says;
    EXPECT_NE(run.err().find(c.says), std::string::npos) << c.says << " in\n" << run.err();
  }
}

// A worker restarted alone cannot enter a process group: creating one fails at once and
// says what to use instead.
TEST(Launcher, AProcessGroupRefusesAWorkerRestartedAlone) {
  ASSERT_EQ(::setenv("GRADWIRE_RESTARTED_ALONE", "1", 1), 0);
  try {
    gradwire::c10d::make_process_group("gloo", std::make_shared<gradwire::c10d::HashStore>(), 0, 1);
    ADD_FAILURE() << "a process group was created in a worker restarted alone";
  } catch (const gradwire::InvalidArgument& e) {
    EXPECT_TRUE(has(e.what(), "restarted alone")) << e.what();
    EXPECT_TRUE(has(e.what(), "use --max-restarts")) << e.what();
  }
  ::unsetenv("GRADWIRE_RESTARTED_ALONE");
}

}  // namespace
