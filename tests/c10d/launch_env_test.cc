// env:// under other launchers (Slurm, Open MPI, PMI), Slurm's node lists, the master's
// host, and ranks that cannot collide silently.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "c10d_test_util.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/rendezvous.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/error.h"
#include "support/harness.h"
#include "support/scoped_env.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using test::ScopedEnv;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Every variable launch_env reads, unset, so a test sees only what it sets.
ScopedEnv clean_env() {
  return ScopedEnv({{"RANK", nullptr},
                    {"WORLD_SIZE", nullptr},
                    {"LOCAL_RANK", nullptr},
                    {"GROUP_RANK", nullptr},
                    {"MASTER_ADDR", nullptr},
                    {"MASTER_PORT", nullptr},
                    {"OMPI_COMM_WORLD_RANK", nullptr},
                    {"OMPI_COMM_WORLD_SIZE", nullptr},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", nullptr},
                    {"PMI_RANK", nullptr},
                    {"PMI_SIZE", nullptr},
                    {"MPI_LOCALRANKID", nullptr},
                    {"SLURM_PROCID", nullptr},
                    {"SLURM_NTASKS", nullptr},
                    {"SLURM_NPROCS", nullptr},
                    {"SLURM_LOCALID", nullptr},
                    {"SLURM_NODEID", nullptr},
                    {"SLURM_STEP_NODELIST", nullptr},
                    {"SLURM_JOB_NODELIST", nullptr},
                    {"SLURM_NODELIST", nullptr},
                    {"GRADWIRE_RPC_REJOIN", nullptr},
                    {"GRADWIRE_RUN_GENERATION", nullptr},
                    {"RESTART_COUNT", nullptr}});
}

void expect_invalid_nodelist(const std::string& list, const std::string& needle) {
  try {
    expand_slurm_nodelist(list);
    ADD_FAILURE() << "'" << list << "' was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr(needle)) << list;
    EXPECT_THAT(e.what(), HasSubstr("Slurm node list")) << list;
  }
}

TEST(SlurmNodelist, ExpandsRangesListsAndPlainNames) {
  EXPECT_THAT(expand_slurm_nodelist("node[01-03,07],gpu5"),
              ElementsAre("node01", "node02", "node03", "node07", "gpu5"));
  EXPECT_THAT(expand_slurm_nodelist("a1"), ElementsAre("a1"));
  // Leading zeros fix the width across a carry; without them numbers are written plainly.
  EXPECT_THAT(expand_slurm_nodelist("n[08-10]"), ElementsAre("n08", "n09", "n10"));
  EXPECT_THAT(expand_slurm_nodelist("n[9-11]"), ElementsAre("n9", "n10", "n11"));
  // Several bracket groups multiply; a suffix after the brackets is kept.
  EXPECT_THAT(expand_slurm_nodelist("r[1-2]-n[0-1].ib"),
              ElementsAre("r1-n0.ib", "r1-n1.ib", "r2-n0.ib", "r2-n1.ib"));
  EXPECT_THAT(expand_slurm_nodelist(" x[3],y "), ElementsAre("x3", "y"));
}

TEST(SlurmNodelist, MalformedListsNameTheProblem) {
  expect_invalid_nodelist("", "empty");
  expect_invalid_nodelist("node[01-03", "'[' without ']'");
  expect_invalid_nodelist("node01-03]", "']' without '['");
  expect_invalid_nodelist("node[03-01]", "runs backwards");
  expect_invalid_nodelist("node[a-b]", "'a-b' is not a number");
  expect_invalid_nodelist("node[]", "empty brackets");
  expect_invalid_nodelist("node[1,,2]", "empty range");
  expect_invalid_nodelist("a,,b", "empty entry");
  expect_invalid_nodelist("n[[1]]", "nested");
  expect_invalid_nodelist("n[0-999999999]", "more than 1000000 hosts");
}

TEST(LaunchEnv, GradwireVariablesComeFirst) {
  auto env = clean_env();
  ScopedEnv vars({{"RANK", "3"},
                  {"WORLD_SIZE", "8"},
                  {"LOCAL_RANK", "1"},
                  {"GROUP_RANK", "1"},
                  {"MASTER_ADDR", "10.9.0.1"},
                  {"MASTER_PORT", "29400"},
                  // Another launcher's variables lose to RANK/WORLD_SIZE.
                  {"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "1"}});
  const LaunchEnv e = launch_env();
  EXPECT_EQ(e.launcher, "env");
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "10.9.0.1");
  EXPECT_EQ(e.master_port, 29400);
}

TEST(LaunchEnv, SlurmGivesRanksAndTheFirstNodeAsMaster) {
  auto env = clean_env();
  ScopedEnv vars({{"SLURM_PROCID", "5"},
                  {"SLURM_NTASKS", "8"},
                  {"SLURM_LOCALID", "1"},
                  {"SLURM_NODEID", "2"},
                  {"SLURM_JOB_NODELIST", "node[01-03,07],gpu5"}});
  LaunchEnv e = launch_env();
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.node_rank, 2);
  EXPECT_EQ(e.master_addr, "node01");
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
  {
    // The step's node list (srun inside an allocation) is the one rank 0 runs in.
    ScopedEnv step({{"SLURM_STEP_NODELIST", "node[03-04]"}});
    EXPECT_EQ(launch_env().master_addr, "node03");
  }
  // MASTER_ADDR wins over the node list.
  ScopedEnv master({{"MASTER_ADDR", "10.0.0.9"}});
  EXPECT_EQ(launch_env().master_addr, "10.0.0.9");
}

TEST(LaunchEnv, SlurmNodeListThatDoesNotParseIsNamed) {
  auto env = clean_env();
  ScopedEnv vars(
      {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "node[01-"}});
  try {
    launch_env();
    FAIL() << "a malformed node list was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("SLURM_JOB_NODELIST"));
    EXPECT_THAT(e.what(), HasSubstr("node[01-"));
  }
}

TEST(LaunchEnv, OpenMpiAndPmi) {
  auto env = clean_env();
  {
    ScopedEnv vars({{"OMPI_COMM_WORLD_RANK", "2"},
                    {"OMPI_COMM_WORLD_SIZE", "4"},
                    {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                    // An MPI launcher inside a Slurm allocation: the batch script's
                    // SLURM_PROCID is inherited by every process and must not win.
                    {"SLURM_PROCID", "0"},
                    {"SLURM_NTASKS", "1"},
                    {"SLURM_JOB_NODELIST", "c[7-8]"}});
    LaunchEnv e = launch_env();
    EXPECT_EQ(e.launcher, "open-mpi");
    EXPECT_EQ(e.rank, 2);
    EXPECT_EQ(e.world_size, 4);
    EXPECT_EQ(e.local_rank, 0);
    EXPECT_EQ(e.master_addr, "c7");
  }
  {
    ScopedEnv vars({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}});
    LaunchEnv e = launch_env();
    EXPECT_EQ(e.launcher, "pmi");
    EXPECT_EQ(e.rank, 1);
    EXPECT_EQ(e.world_size, 3);
    EXPECT_EQ(e.local_rank, 1);
    EXPECT_EQ(e.master_addr, "");
  }
}

TEST(LaunchEnv, NothingSetLeavesFieldsUnknown) {
  auto env = clean_env();
  const LaunchEnv e = launch_env();
  EXPECT_EQ(e.launcher, "");
  EXPECT_EQ(e.rank, -1);
  EXPECT_EQ(e.world_size, -1);
  EXPECT_EQ(e.master_port, 29500);
}

TEST(LaunchEnv, EnvUrlNamesWhatIsMissingPerLauncher) {
  auto env = clean_env();
  auto message = [](const std::string& url) -> std::string {
    try {
      rendezvous(url, 2s);
    } catch (const InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  };
  {
    const std::string m = message("env://");
    EXPECT_THAT(m, HasSubstr("WORLD_SIZE is not set"));
    EXPECT_THAT(m, HasSubstr("SLURM_NTASKS"));
  }
  {
    ScopedEnv vars({{"SLURM_PROCID", "0"}, {"SLURM_JOB_NODELIST", "n1"}});
    EXPECT_THAT(message("env://"), HasSubstr("SLURM_NTASKS is not set"));
  }
  {
    ScopedEnv vars({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}});
    const std::string m = message("env://");
    EXPECT_THAT(m, HasSubstr("MASTER_ADDR is not set"));
    EXPECT_THAT(m, HasSubstr("mpirun -x MASTER_ADDR"));
  }
  {
    ScopedEnv vars({{"PMI_RANK", "x"}, {"PMI_SIZE", "2"}});
    EXPECT_THAT(message("env://"), HasSubstr("PMI_RANK"));
  }
}

TEST(LaunchEnv, SlurmJobMeetsThroughEnvUrl) {
  auto env = clean_env();
  const std::string port = std::to_string(test::free_port());
  ScopedEnv vars({{"SLURM_PROCID", "0"},
                  {"SLURM_NTASKS", "1"},
                  {"SLURM_LOCALID", "0"},
                  {"SLURM_JOB_NODELIST", "localhost,node[2-3]"},
                  {"MASTER_PORT", port.c_str()}});
  RendezvousResult r = rendezvous("env://", 10s);
  EXPECT_EQ(r.rank, 0);
  EXPECT_EQ(r.world_size, 1);
  r.store->set("k", std::string_view("v"));
  EXPECT_EQ(r.store->get_string("k"), "v");
  // The store's host is the master the workers announce their addresses toward.
  EXPECT_EQ(master_host(r.store.get()), "localhost");
  auto prefixed = std::make_shared<PrefixStore>("group", r.store);
  EXPECT_EQ(master_host(prefixed.get()), "localhost");
}

TEST(LaunchEnv, MasterHostOfAStoreWithoutHostIsMasterAddr) {
  auto env = clean_env();
  EXPECT_EQ(master_host(nullptr), "");
  ScopedEnv vars({{"MASTER_ADDR", "10.9.0.1"}});
  EXPECT_EQ(master_host(nullptr), "10.9.0.1");
}

// ---- ranks that collide

// A file in `dir` per child, holding what its rendezvous said.
void record(const std::string& dir, int child, const std::string& text) {
  std::ofstream(dir + "/child" + std::to_string(child)) << text;
}

std::string read_record(const std::string& dir, int child) {
  std::ifstream in(dir + "/child" + std::to_string(child));
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(RankClaims, TwoProcessesClaimingOneRankFailClearly) {
  test::TempDir dir;
  const uint16_t port = test::free_port();
  const std::string base = "tcp://127.0.0.1:" + std::to_string(port);
  // Child 0 is rank 0 of 2; children 1 and 2 both say they are rank 1.
  test::RankResults results = test::run_ranks_as_processes(
      3,
      [&](int child) {
        auto env = clean_env();
        const int rank = child == 0 ? 0 : 1;
        const std::string url = base + "?rank=" + std::to_string(rank) + "&world_size=2";
        try {
          RendezvousResult r = rendezvous(url, 20s);
          record(dir.path(), child, "ok");
          if (rank == 0) {
            // Keeps the server up until both claimants of rank 1 are through.
            r.store->wait({"done", "refused"}, 20s);
          } else {
            r.store->set("done", std::string_view("1"));
          }
        } catch (const InvalidArgument& e) {
          record(dir.path(), child, e.what());
          TCPStore(TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = 20s})
              .set("refused", std::string_view("1"));
        }
      },
      40s);
  EXPECT_ALL_RANKS_OK(results);
  EXPECT_EQ(read_record(dir.path(), 0), "ok");
  const std::string one = read_record(dir.path(), 1);
  const std::string two = read_record(dir.path(), 2);
  // Exactly one of the two claimants of rank 1 is refused, naming both claims.
  ASSERT_TRUE((one == "ok") != (two == "ok")) << one << "\n" << two;
  const std::string refused = one == "ok" ? two : one;
  EXPECT_THAT(refused, HasSubstr("rank 1 is claimed twice"));
  EXPECT_THAT(refused, HasSubstr("--nproc-per-node must be equal on every node"));
  EXPECT_THAT(refused, HasSubstr("gradwire-run --rdzv-endpoint"));
  // Both claims are named, each with its process.
  EXPECT_EQ(std::count(refused.begin(), refused.end(), '('), 2) << refused;
}

TEST(RankClaims, UnequalWorldSizesFailEveryoneClearly) {
  test::TempDir dir;
  const uint16_t port = test::free_port();
  const std::string base = "tcp://127.0.0.1:" + std::to_string(port);
  // Rank 0 was told 3 workers, rank 1 two (as with --nproc-per-node 2 on one node and 1 on
  // another): both fail with the same clear message, rank 0 without waiting it out.
  test::RankResults results = test::run_ranks_as_processes(
      2,
      [&](int child) {
        auto env = clean_env();
        const std::string url =
            base + "?rank=" + std::to_string(child) + "&world_size=" + (child == 0 ? "3" : "2");
        try {
          rendezvous(url, 30s);
          record(dir.path(), child, "ok");
        } catch (const InvalidArgument& e) {
          record(dir.path(), child, e.what());
        }
      },
      40s);
  EXPECT_ALL_RANKS_OK(results);
  for (int child : {0, 1}) {
    const std::string text = read_record(dir.path(), child);
    EXPECT_THAT(text, HasSubstr("WORLD_SIZE=2")) << child;
    EXPECT_THAT(text, HasSubstr("WORLD_SIZE=3")) << child;
    EXPECT_THAT(text, HasSubstr("--nproc-per-node must be equal on every node")) << child;
  }
}

TEST(RankClaims, ARejoiningWorkerTakesItsRankOver) {
  test::TempDir dir;
  const uint16_t port = test::free_port();
  const std::string base = "tcp://127.0.0.1:" + std::to_string(port);
  test::RankResults results = test::run_ranks_as_processes(
      3,
      [&](int child) {
        auto env = clean_env();
        if (child == 2) {
          // The replacement of child 1: it waits until child 1 holds rank 1, then rejoins.
          TCPStore watcher(TCPStoreOptions{.host = "127.0.0.1", .port = port, .timeout = 20s});
          watcher.wait({"claimed"}, 20s);
          // Restarted alone, it may count its own restarts: it still joins the running job
          // rather than waiting for a launch of its own.
          ScopedEnv restarted({{"RESTART_COUNT", "1"}});
          RendezvousResult r = rendezvous(base + "?rank=1&world_size=2&rejoin=1", 20s);
          record(dir.path(), child, "ok");
          r.store->set("done", std::string_view("1"));
          return;
        }
        RendezvousResult r =
            rendezvous(base + "?rank=" + std::to_string(child) + "&world_size=2", 20s);
        record(dir.path(), child, "ok");
        if (child == 1) {
          r.store->set("claimed", std::string_view("1"));
        } else {
          r.store->wait({"done"}, 20s);
        }
      },
      40s);
  EXPECT_ALL_RANKS_OK(results);
  for (int child : {0, 1, 2})
    EXPECT_EQ(read_record(dir.path(), child), "ok") << child;
}

}  // namespace
}  // namespace gradwire::c10d
