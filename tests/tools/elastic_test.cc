// Elastic role jobs (gradwire-run --role NAME:N[:critical], docs/launcher.md "Elastic
// parameter-server jobs"), run as users run them: several launchers meeting on 127.0.0.1,
// each a child process, their workers the elastic worker program (tests/multinode/
// elastic_worker.cc), which prints what it was told and meets the job on the workers' store
// that a launcher hosts. The store keys the workers set and wait for are the gates the
// cases open; the test reaches that store itself with the job's secret. Labelled elastic as
// well as tools (security_labels.cmake).
//
// Also here: rendezvous()'s side of the launcher's contract (GRADWIRE_STORE_HOSTED,
// GRADWIRE_RPC_JOIN), in process.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "gradwire/c10d/rendezvous.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/error.h"
#include "launch.h"
#include "support/error_text.h"
#include "support/scoped_env.h"

namespace {

using namespace gradwire::testing::launcher;
using gradwire::c10d::TCPStore;
using gradwire::c10d::TCPStoreOptions;
using Record = std::map<std::string, std::string>;

const std::string kWorker = GRADWIRE_ELASTIC_WORKER_PATH;

// The launcher's environment without a user's secret: a single node makes one up.
const EnvChanges kNoSecret = {{"GRADWIRE_SECRET", std::nullopt},
                              {"GRADWIRE_SECRET_FILE", std::nullopt}};

// The flags of one node of an elastic job of `nnodes` meeting at `endpoint`, then `rest`.
std::vector<std::string> node(const std::string& endpoint, std::vector<std::string> rest,
                              const std::string& nnodes = "1:4",
                              const std::string& rdzv_timeout = "20s") {
  std::vector<std::string> args = {"--rdzv-endpoint",
                                   endpoint,
                                   "--nnodes",
                                   nnodes,
                                   "--rdzv-last-call",
                                   "200ms",
                                   "--rdzv-heartbeat-timeout",
                                   "1s",
                                   "--rdzv-timeout",
                                   rdzv_timeout,
                                   "--grace-ms",
                                   "2000",
                                   "--no-prefix",
                                   "--rdzv-id",
                                   "elastic"};
  args.insert(args.end(), rest.begin(), rest.end());
  return args;
}

// sh -c running the worker with `server_args` in a worker of role server and `other_args`
// in the others.
std::vector<std::string> by_role(const std::string& server_args, const std::string& other_args) {
  return {"sh", "-c",
          "if [ \"$ROLE_NAME\" = server ]; then exec '" + kWorker + "' " + server_args +
              "; else exec '" + kWorker + "' " + other_args + "; fi"};
}

// The "worker ..." records of `out`, ordered by rank.
std::vector<Record> workers(const std::string& out) {
  std::vector<Record> rs = records(out, "worker");
  std::stable_sort(rs.begin(), rs.end(), [](const Record& a, const Record& b) {
    return std::stoi(a.at("rank")) < std::stoi(b.at("rank"));
  });
  return rs;
}

std::set<std::string> pids(const std::vector<Record>& rs) {
  std::set<std::string> out;
  for (const Record& r : rs)
    out.insert(r.at("pid"));
  return out;
}

bool lines_at_least(Launch& run, const std::string& part, size_t n) {
  return run.read_until(
      [&](const std::string& out, const std::string&) { return count(out, part) >= n; }, 20s);
}

std::string file_contents(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A client of the workers' store a record names, with the secret its file holds.
TCPStoreOptions store_of(const Record& r, const std::string& secret) {
  return TCPStoreOptions{.host = r.at("master").substr(0, r.at("master").rfind(':')),
                         .port = static_cast<uint16_t>(
                             std::stoi(r.at("master").substr(r.at("master").rfind(':') + 1))),
                         .timeout = 5s,
                         .connect_timeout = 5s,
                         .secret = secret};
}

void expect_worker(const Record& r, const std::string& rank, const std::string& role,
                   const std::string& role_rank, const std::string& role_world) {
  EXPECT_EQ(r.at("rank"), rank);
  EXPECT_EQ(r.at("role"), role) << "rank " << rank;
  EXPECT_EQ(r.at("role_rank"), role_rank) << "rank " << rank;
  EXPECT_EQ(r.at("role_world"), role_world) << "rank " << rank;
  EXPECT_EQ(r.at("elastic"), "1") << "rank " << rank;
  EXPECT_EQ(r.at("hosted"), "1") << "rank " << rank;
}

TEST(LauncherElastic, EachRoleWorkerGetsItsRoleEnvironment) {
  Launch run({"--role", "server:1:critical", "--role", "trainer:2", "--no-prefix", kWorker},
             {{"GRADWIRE_RPC_JOIN", "1"}});
  ASSERT_EQ(run.wait(), 0) << run.err();
  const std::vector<Record> rs = workers(run.out());
  ASSERT_EQ(rs.size(), 3u) << run.out();
  expect_worker(rs[0], "0", "server", "0", "1");
  expect_worker(rs[1], "1", "trainer", "0", "2");
  expect_worker(rs[2], "2", "trainer", "1", "2");
  for (const Record& r : rs) {
    EXPECT_EQ(r.at("local"), r.at("rank"));
    EXPECT_EQ(r.at("world"), "3");
    EXPECT_EQ(r.at("group"), "0");
    EXPECT_EQ(r.at("groups"), "1");
    EXPECT_EQ(r.at("join"), "0") << "an inherited GRADWIRE_RPC_JOIN is not passed on";
    EXPECT_EQ(r.at("rejoin"), "0");
  }
  EXPECT_TRUE(has(run.err(), "(hosted by this launcher)")) << run.err();

  // A plain --role NAME is one role of --nproc-per-node workers, as without roles; the
  // launcher's own names are not inherited.
  Launch plain({"--role", "solo", "--nproc-per-node", "2", "--no-prefix", kWorker},
               {{"GRADWIRE_STORE_HOSTED", "1"}, {"GRADWIRE_RPC_ELASTIC", "1"}});
  ASSERT_EQ(plain.wait(), 0) << plain.err();
  const std::vector<Record> ps = workers(plain.out());
  ASSERT_EQ(ps.size(), 2u) << plain.out();
  for (const Record& r : ps) {
    EXPECT_EQ(r.at("role"), "solo");
    EXPECT_EQ(r.at("role_rank"), r.at("rank"));
    EXPECT_EQ(r.at("role_world"), "2");
    EXPECT_EQ(r.at("hosted"), "0");
    EXPECT_EQ(r.at("elastic"), "0");
  }
}

TEST(LauncherElastic, BadRoleCommandLinesAreRefusedWithTheReason) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{"--role", "a:1", "--role", "a:2", "true"}, "--role a is given twice"},
      {{"--role", "a:0", "true"}, "--role a count takes an integer in [1, 4096], got '0'"},
      {{"--role", "a:1:vital", "true"}, "expected NAME:N or NAME:N:critical, got 'vital'"},
      {{"--role", "a:1", "--nproc-per-node", "2", "true"},
       "--nproc-per-node and --role NAME:N exclude each other"},
      {{"--role", "b", "--role", "a:1", "true"}, "give every role a count"},
      {{"--role", "a:1", "--max-restarts", "1", "true"}, "use --restart-workers W"},
      {{"--role", "a/b:1", "true"}, "the role's name must be"},
      {{"--role", "a:3000", "--role", "b:3000", "true"}, "add up to 6000 workers"},
  };
  for (const Case& c : cases) {
    Launch run(c.args);
    EXPECT_EQ(run.wait(), 2) << c.says;
    EXPECT_TRUE(has(run.err(), c.says)) << c.says << " in\n" << run.err();
  }
}

// A launcher that arrives after the job formed takes fresh RANKs and ROLE_RANKs and joins
// the running generation: the first node's workers run on, untouched. Its workers, failing
// once, are restarted alone under their ranks, still joiners (GRADWIRE_RPC_JOIN and
// GRADWIRE_RPC_REJOIN).
TEST(LauncherElastic, ALateLauncherJoinsWithoutRestartingTheFirst) {
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  Launch first(node(ep, {"--role", "server:1:critical", "--role", "trainer:1", kWorker,
                         "--rendezvous", "--wait", "end"}));
  ASSERT_TRUE(lines_at_least(first, "met rank=", 2)) << first.out() << first.err();
  const std::set<std::string> first_pids = pids(workers(first.out()));

  Launch late(node(ep, {"--role", "trainer:2", "--restart-workers", "2", kWorker, "--rendezvous",
                        "--fail-first-life", "3", "--set", "end"}));
  ASSERT_EQ(late.wait(), 0) << late.err();
  ASSERT_EQ(first.wait(), 0) << first.err();

  const std::vector<Record> joined = workers(late.out());
  ASSERT_EQ(joined.size(), 4u) << "two lives of each joiner:\n" << late.out();
  for (size_t i = 0; i < 4; ++i) {
    const Record& r = joined[i];
    expect_worker(r, std::to_string(2 + i / 2), "trainer", std::to_string(1 + i / 2), "1");
    EXPECT_EQ(r.at("join"), "1");
    EXPECT_EQ(r.at("rejoin"), r.at("restart")) << "a restarted joiner rejoins";
    EXPECT_EQ(r.at("world"), "2") << "WORLD_SIZE stays the initial group's";
    EXPECT_EQ(r.at("group"), "1");
    EXPECT_EQ(r.at("master"), workers(first.out())[0].at("master"));
  }
  EXPECT_EQ(count(late.out(), "met rank=2 world=2"), 2u) << late.out();
  EXPECT_EQ(count(late.out(), "met rank=3 world=2"), 2u) << late.out();
  EXPECT_TRUE(has(late.err(), "joining the running generation 0 of 'elastic' as node 1"))
      << late.err();

  const std::vector<Record> ran = workers(first.out());
  ASSERT_EQ(ran.size(), 2u) << "the first node's workers started once:\n" << first.out();
  EXPECT_EQ(pids(ran), first_pids);
  EXPECT_EQ(count(first.out(), "released by end"), 2u) << first.out();
  EXPECT_FALSE(has(first.err(), "generation 1")) << first.err();
}

// Late trainer nodes leave, one stopped with SIGTERM and one SIGKILLed: the first node's
// workers run on, and a third late node still joins (with ranks nobody held) and ends the job.
TEST(LauncherElastic, LateTrainerNodesLeavingLeaveTheJobRunning) {
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  Launch first(node(ep, {"--role", "server:1:critical", "--role", "trainer:1", kWorker,
                         "--rendezvous", "--wait", "end"}));
  ASSERT_TRUE(lines_at_least(first, "met rank=", 2)) << first.out() << first.err();
  const std::set<std::string> first_pids = pids(workers(first.out()));
  const std::vector<std::string> stays = {"--role",       "trainer:1", kWorker,
                                          "--rendezvous", "--wait",    "never"};
  Launch stopped(node(ep, stays));
  ASSERT_TRUE(lines_at_least(stopped, "met rank=", 1)) << stopped.err();
  ::kill(stopped.pid(), SIGTERM);
  EXPECT_EQ(stopped.wait(), 128 + SIGTERM) << stopped.err();

  Launch killed(node(ep, stays));
  ASSERT_TRUE(lines_at_least(killed, "met rank=", 1)) << killed.err();
  const std::string killed_worker = workers(killed.out()).at(0).at("pid");
  ::kill(killed.pid(), SIGKILL);
  EXPECT_TRUE(ends_within(std::stoi(killed_worker), 10s)) << "its worker dies with it";
  ASSERT_TRUE(first.read_until(
      [](const std::string&, const std::string& err) {
        return has(err, "node 1 left the job: its launcher got signal 15") &&
               has(err, "node 2 left the job: stopped answering");
      },
      20s))
      << first.err();

  Launch last(node(ep, {"--role", "trainer:1", kWorker, "--rendezvous", "--set", "end"}));
  ASSERT_EQ(last.wait(), 0) << last.err();
  ASSERT_EQ(first.wait(), 0) << first.err();
  const Record r = workers(last.out()).at(0);
  EXPECT_EQ(r.at("rank"), "4") << "ranks 2 and 3 went to the nodes that left";
  EXPECT_EQ(r.at("role_rank"), "3");
  EXPECT_EQ(r.at("group"), "3");
  EXPECT_EQ(pids(workers(first.out())), first_pids) << first.out();
  EXPECT_EQ(count(first.out(), "released by end"), 2u) << first.out();
}

// What a node arriving while the job runs MAX nodes says, once, before it waits.
const std::string kFull =
    "the job 'elastic' runs 2 nodes already, the most that --nnodes 1:2 allows; this node "
    "waits for one to leave";

bool says(Launch& run, const std::string& part) {
  return run.read_until([&](const std::string&, const std::string& err) { return has(err, part); },
                        20s);
}

// MAX holds for nodes that arrive after the job formed: with --nnodes 1:2 and one initial
// node, the first late node joins and the next waits, saying so once, until a place frees:
// the node stopped with SIGTERM gives its place back as it leaves, the SIGKILLed one once
// its heartbeat stops.
TEST(LauncherElastic, ALateNodePastMaxWaitsForANodeToLeave) {
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  Launch first(node(ep,
                    {"--role", "server:1:critical", "--role", "trainer:1", kWorker, "--rendezvous",
                     "--wait", "end"},
                    "1:2"));
  ASSERT_TRUE(lines_at_least(first, "met rank=", 2)) << first.out() << first.err();
  const std::vector<std::string> stays = {"--role",       "trainer:1", kWorker,
                                          "--rendezvous", "--wait",    "never"};
  Launch second(node(ep, stays, "1:2"));
  ASSERT_TRUE(lines_at_least(second, "met rank=2", 1)) << second.err();

  Launch third(node(ep, stays, "1:2"));
  ASSERT_TRUE(says(third, kFull)) << third.err();
  EXPECT_TRUE(workers(third.out()).empty()) << "no worker starts while it waits:\n" << third.out();
  ::kill(second.pid(), SIGTERM);
  EXPECT_EQ(second.wait(), 128 + SIGTERM) << second.err();
  ASSERT_TRUE(lines_at_least(third, "met rank=3", 1)) << third.out() << third.err();
  EXPECT_EQ(count(third.err(), kFull), 1u) << "said once:\n" << third.err();
  EXPECT_TRUE(has(third.err(), "joining the running generation 0 of 'elastic' as node 2"))
      << third.err();

  Launch fourth(node(ep, {"--role", "trainer:1", kWorker, "--rendezvous", "--set", "end"}, "1:2"));
  ASSERT_TRUE(says(fourth, kFull)) << fourth.err();
  const std::string third_worker = workers(third.out()).at(0).at("pid");
  ::kill(third.pid(), SIGKILL);
  EXPECT_TRUE(ends_within(std::stoi(third_worker), 10s)) << "its worker dies with it";
  ASSERT_EQ(fourth.wait(), 0) << fourth.err();
  ASSERT_EQ(first.wait(), 0) << first.err();
  EXPECT_TRUE(has(first.err(), "node 2 left the job: stopped answering")) << first.err();
  const Record r = workers(fourth.out()).at(0);
  EXPECT_EQ(r.at("rank"), "4") << "ranks 2 and 3 went to the nodes that left";
  EXPECT_EQ(r.at("group"), "3");
  EXPECT_EQ(count(first.out(), "released by end"), 2u) << first.out();
}

// Two nodes arriving together at a job with one place left: one takes it, the other waits,
// and past its --rdzv-timeout exits 1 saying why; the job runs on and ends.
TEST(LauncherElastic, OfTwoNodesArrivingTogetherOneJoinsAndTheOtherTimesOut) {
  const std::string secret = "a-users-secret-of-more-than-16-bytes";
  const EnvChanges env = {{"GRADWIRE_SECRET", secret}, {"GRADWIRE_SECRET_FILE", std::nullopt}};
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  Launch first(
      node(ep, {"--role", "server:1:critical", kWorker, "--rendezvous", "--wait", "end"}, "1:2"),
      env);
  ASSERT_TRUE(lines_at_least(first, "met rank=0", 1)) << first.out() << first.err();
  const std::vector<std::string> late = {"--role",       "trainer:1", kWorker,
                                         "--rendezvous", "--wait",    "end"};
  Launch a(node(ep, late, "1:2", "3s"), env);
  Launch b(node(ep, late, "1:2", "3s"), env);
  auto settled = [](Launch& l) {
    return l.read_until(
        [](const std::string& out, const std::string& err) {
          return has(out, "met rank=") || has(err, kFull);
        },
        20s);
  };
  ASSERT_TRUE(settled(a)) << a.out() << a.err();
  ASSERT_TRUE(settled(b)) << b.out() << b.err();
  ASSERT_NE(has(a.out(), "met rank="), has(b.out(), "met rank=")) << "exactly one joins:\n"
                                                                  << a.err() << b.err();
  Launch& joined = has(a.out(), "met rank=") ? a : b;
  Launch& waiting = &joined == &a ? b : a;
  EXPECT_EQ(waiting.wait(), 1) << waiting.err();
  EXPECT_TRUE(
      has(waiting.err(), "the job 'elastic' at " + ep +
                             " still runs 2 nodes, the most that --nnodes 1:2 allows, after "
                             "--rdzv-timeout (3000 ms): no node left to free a place for this one"))
      << waiting.err();
  EXPECT_TRUE(workers(waiting.out()).empty()) << waiting.out();
  EXPECT_EQ(workers(joined.out()).at(0).at("rank"), "1");
  EXPECT_FALSE(has(joined.err(), kFull)) << joined.err();

  TCPStore gate(store_of(workers(first.out()).at(0), secret));
  gate.set("end", std::string_view("1"));
  EXPECT_EQ(joined.wait(), 0) << joined.err();
  EXPECT_EQ(first.wait(), 0) << first.err();
}

// --restart-workers: a failed server is restarted alone, with its RANK and ROLE_RANK and
// GRADWIRE_RPC_REJOIN=1, and rejoins the running group; the trainers run on.
TEST(LauncherElastic, AFailedServerIsRestartedAloneWithItsRank) {
  std::vector<std::string> args = {"--role",     "server:1:critical", "--role",
                                   "trainer:2",  "--restart-workers", "1",
                                   "--no-prefix"};
  for (std::string& word :
       by_role("--rendezvous --fail-first-life 3 --set end", "--rendezvous --wait end"))
    args.push_back(std::move(word));
  Launch run(args);
  ASSERT_EQ(run.wait(), 0) << run.err();
  const std::vector<Record> rs = workers(run.out());
  ASSERT_EQ(rs.size(), 4u) << "two lives of the server, one of each trainer:\n" << run.out();
  for (size_t life = 0; life < 2; ++life) {
    expect_worker(rs[life], "0", "server", "0", "1");
    EXPECT_EQ(rs[life].at("restart"), std::to_string(life));
    EXPECT_EQ(rs[life].at("rejoin"), life == 0 ? "0" : "1");
  }
  EXPECT_EQ(count(run.out(), "failing 3"), 1u) << run.out();
  EXPECT_EQ(count(run.out(), "met rank=0 world=3"), 2u) << run.out();
  EXPECT_EQ(count(run.out(), "released by end"), 2u) << run.out();
  EXPECT_TRUE(has(run.err(), "rank 0 (server 0) failed (exit status 3); starting it again"))
      << run.err();
}

// Without a restart left, a failed trainer is logged and the job goes on; a failed worker of
// a critical role ends the job on every node, with its status.
TEST(LauncherElastic, ATrainerFailureGoesOnAndACriticalFailureEndsEveryNode) {
  const std::string secret = "a-users-secret-of-more-than-16-bytes";
  {
    Launch run(
        {"--role", "server:1:critical", "--role", "trainer:2", "--no-prefix", "sh", "-c",
         "if [ \"$ROLE_RANK$ROLE_NAME\" = 1trainer ]; then exec '" + kWorker +
             "' --rendezvous --exit 5; else exec '" + kWorker + "' --rendezvous --wait go; fi"},
        {{"GRADWIRE_SECRET", secret}, {"GRADWIRE_SECRET_FILE", std::nullopt}});
    ASSERT_TRUE(run.read_until(
        [](const std::string&, const std::string& err) {
          return has(err,
                     "rank 2 (trainer 1) failed (exit status 5); role 'trainer' is not "
                     "critical: the job goes on without it");
        },
        20s))
        << run.err();
    TCPStore gate(store_of(workers(run.out()).at(0), secret));
    gate.set("go", std::string_view("1"));
    EXPECT_EQ(run.wait(), 0) << run.err();
    EXPECT_EQ(count(run.out(), "released by go"), 2u) << run.out();
  }
  const std::string ep = "127.0.0.1:" + std::to_string(free_port());
  Launch servers(node(ep, {"--role", "server:1:critical", kWorker, "--rendezvous", "--wait",
                           "trainer-in", "--exit", "4"}));
  ASSERT_TRUE(lines_at_least(servers, "met rank=", 1)) << servers.err();
  Launch trainers(node(ep, {"--role", "trainer:1", kWorker, "--rendezvous", "--set", "trainer-in",
                            "--wait", "never"}));
  EXPECT_EQ(servers.wait(), 4) << servers.err();
  EXPECT_EQ(trainers.wait(), 4) << trainers.err();
  EXPECT_TRUE(has(servers.err(), "stopping the others (role 'server' is critical)"))
      << servers.err();
  for (const Launch* l : {&servers, &trainers}) {
    EXPECT_TRUE(has(l->err(), "the job failed: rank 0 on node 0")) << l->err();
  }
}

// The workers' store is the launcher's: rank 0 (a server) SIGKILLed, the store still answers,
// with what rank 0 wrote, to the job's made-up secret only; the restarted server meets the
// job there again.
TEST(LauncherElastic, TheLaunchersWorkerStoreOutlivesRankZero) {
  std::vector<std::string> args = {"--role",     "server:1:critical", "--role",
                                   "trainer:1",  "--restart-workers", "1",
                                   "--no-prefix"};
  for (std::string& word :
       by_role("--rendezvous --set from-server --wait end", "--rendezvous --wait end"))
    args.push_back(std::move(word));
  Launch run(args, kNoSecret);
  ASSERT_TRUE(lines_at_least(run, "set from-server", 1)) << run.out() << run.err();
  const Record server = workers(run.out()).at(0);
  ASSERT_EQ(server.at("role"), "server");
  ASSERT_NE(server.at("secret_file"), "none");
  const std::string secret = file_contents(server.at("secret_file"));
  TCPStore store(store_of(server, secret));
  EXPECT_EQ(store.get_string("from-server"), server.at("pid"));

  ::kill(std::stoi(server.at("pid")), SIGKILL);
  ASSERT_TRUE(ends_within(std::stoi(server.at("pid")), 10s));
  EXPECT_EQ(store.get_string("from-server"), server.at("pid"))
      << "the store and what rank 0 wrote outlive rank 0";
  {
    gradwire::test::ScopedEnv none(
        {{"GRADWIRE_SECRET", nullptr}, {"GRADWIRE_SECRET_FILE", nullptr}});
    const std::string refused = gradwire::test::error_text<gradwire::NetworkError>([&] {
      TCPStore stranger(store_of(server, ""));
      stranger.set("end", std::string_view("1"));
    });
    EXPECT_TRUE(has(refused, "authentication failed")) << refused;
  }
  ASSERT_TRUE(lines_at_least(run, "set from-server", 2)) << run.out() << run.err();
  const Record again = workers(run.out()).at(1);
  EXPECT_EQ(again.at("rank"), "0");
  EXPECT_EQ(again.at("rejoin"), "1");
  EXPECT_EQ(store.get_string("from-server"), again.at("pid"));
  store.set("end", std::string_view("1"));
  EXPECT_EQ(run.wait(), 0) << run.err();
  EXPECT_EQ(count(run.out(), "released by end"), 2u) << run.out();
}

// rendezvous(): with GRADWIRE_STORE_HOSTED no worker hosts the store; a joining worker takes
// a rank past the initial group's and does not count in it.
TEST(RendezvousElastic, AHostedStoreHasNoMasterAmongTheWorkers) {
  gradwire::c10d::TCPStoreServer server(gradwire::c10d::TCPStoreServerOptions{
      .bind_host = "127.0.0.1", .secret = "a-test-secret-of-16-bytes-or-more"});
  gradwire::test::ScopedEnv env({{"GRADWIRE_SECRET", "a-test-secret-of-16-bytes-or-more"},
                                 {"GRADWIRE_SECRET_FILE", nullptr},
                                 {"GRADWIRE_RUN_GENERATION", "7"}});
  const std::string base = "tcp://127.0.0.1:" + std::to_string(server.port()) + "?world_size=2";
  auto meet = [&](int rank) {
    return gradwire::c10d::rendezvous(base + "&store_hosted=1&rank=" + std::to_string(rank), 10s);
  };
  auto one = std::async(std::launch::async, meet, 1);
  const auto zero = meet(0);
  const auto first = one.get();
  for (const auto* r : {&zero, &first}) {
    const auto* tcp = dynamic_cast<const TCPStore*>(r->store.get());
    ASSERT_NE(tcp, nullptr);
    EXPECT_FALSE(tcp->is_master()) << "rank " << r->rank;
  }

  // A joiner past the group: it returns at once, without counting in a group of its own.
  const auto joiner = gradwire::c10d::rendezvous(base + "&join=1&rank=2", 10s);
  EXPECT_EQ(joiner.rank, 2);
  EXPECT_EQ(joiner.world_size, 2);
  const std::string inside = gradwire::test::error_text<gradwire::InvalidArgument>(
      [&] { gradwire::c10d::rendezvous(base + "&join=1&rank=1", 10s); });
  EXPECT_TRUE(has(inside, "takes a rank past the initial group's, but rank 1 is inside [0, 2)"))
      << inside;
}

TEST(RendezvousElastic, AJoiningWorkerDoesNotCountInTheInitialGroup) {
  gradwire::c10d::TCPStoreServer server(
      gradwire::c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  const std::string port = std::to_string(server.port());
  gradwire::test::ScopedEnv env({{"GRADWIRE_SECRET", nullptr},
                                 {"GRADWIRE_SECRET_FILE", nullptr},
                                 {"GRADWIRE_RUN_GENERATION", "3"},
                                 {"GRADWIRE_STORE_HOSTED", "1"},
                                 {"GRADWIRE_RPC_JOIN", "1"},
                                 {"MASTER_ADDR", "127.0.0.1"},
                                 {"MASTER_PORT", port.c_str()},
                                 {"RANK", "5"},
                                 {"WORLD_SIZE", "2"}});
  const auto joiner = gradwire::c10d::rendezvous("env://", 10s);
  EXPECT_EQ(joiner.rank, 5);
  // Had it counted in, rank 0 alone would complete the group of 2.
  gradwire::test::ScopedEnv initial({{"GRADWIRE_RPC_JOIN", nullptr}, {"RANK", "0"}});
  const std::string alone = gradwire::test::error_text<gradwire::TimeoutError>(
      [] { gradwire::c10d::rendezvous("env://", 600ms); });
  EXPECT_TRUE(has(alone, "only 1 of 2 workers connected")) << alone;
}

}  // namespace
