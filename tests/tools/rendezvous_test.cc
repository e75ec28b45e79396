// gradwire-run across nodes: several launchers in one test, each a child process meeting
// the others on 127.0.0.1 (the rendezvous does not care whether the nodes are machines).
// Covers rank assignment (arrival order, --node-rank, unequal --nproc-per-node),
// coordinated restarts, --max-restarts exhaustion on every node, a node that arrives late
// to an elastic job, and a launcher killed while its workers run.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "gradwire/c10d/tcp_store.h"
#include "launch.h"

namespace {

using namespace gradwire::testing::launcher;

// Short windows keep each case short (the heartbeat timeout long enough
// that a loaded machine does not make a live launcher look gone).
std::vector<std::string> with(const std::string& endpoint, const std::string& nnodes,
                              std::vector<std::string> rest) {
  std::vector<std::string> args = {"--rdzv-endpoint",
                                   endpoint,
                                   "--nnodes",
                                   nnodes,
                                   "--rdzv-last-call",
                                   "200ms",
                                   "--rdzv-heartbeat-timeout",
                                   "3s",
                                   "--rdzv-timeout",
                                   "20s",
                                   "--grace-ms",
                                   "2000",
                                   "--no-prefix"};
  args.insert(args.end(), rest.begin(), rest.end());
  return args;
}

std::string endpoint() {
  return "127.0.0.1:" + std::to_string(free_port());
}

const char* const kReport =
    "echo w rank=$RANK world=$WORLD_SIZE node=$GROUP_RANK nodes=$GROUP_WORLD_SIZE "
    "local=$LOCAL_RANK lw=$LOCAL_WORLD_SIZE addr=$MASTER_ADDR port=$MASTER_PORT "
    "gen=$GRADWIRE_RUN_GENERATION restart=$RESTART_COUNT te=$TORCHELASTIC_RESTART_COUNT";

TEST(Rendezvous, TwoLaunchersFormOneJobWithDistinctRanks) {
  const std::string ep = endpoint();
  Launch a(with(ep, "2", {"--nproc-per-node", "2", "sh", "-c", kReport}));
  Launch b(with(ep, "2", {"--nproc-per-node", "2", "sh", "-c", kReport}));
  ASSERT_EQ(a.wait(), 0) << a.err();
  ASSERT_EQ(b.wait(), 0) << b.err();
  std::set<std::string> ranks, ports;
  std::map<std::string, std::set<std::string>> ranks_of_node;
  for (const auto* run : {&a, &b}) {
    const auto rs = records(run->out(), "w");
    ASSERT_EQ(rs.size(), 2u) << run->out();
    EXPECT_EQ(rs[0].at("node"), rs[1].at("node")) << "one launcher, one node rank";
    for (const auto& r : rs) {
      ranks.insert(r.at("rank"));
      ports.insert(r.at("addr") + ":" + r.at("port"));
      ranks_of_node[r.at("node")].insert(r.at("rank"));
      EXPECT_EQ(r.at("world"), "4");
      EXPECT_EQ(r.at("nodes"), "2");
      EXPECT_EQ(r.at("lw"), "2");
      EXPECT_EQ(std::stoi(r.at("rank")), 2 * std::stoi(r.at("node")) + std::stoi(r.at("local")));
    }
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1", "2", "3"}));
  EXPECT_EQ(ports.size(), 1u) << "every worker meets at one store";
  EXPECT_EQ(ranks_of_node.size(), 2u);
  EXPECT_EQ(count(a.err() + b.err(), "(hosted by this launcher)"), 1u) << a.err() << b.err();
}

// The static flags still work, through the same rendezvous: unequal --nproc-per-node gives
// ranks that do not collide, and a node rank held twice is refused.
TEST(Rendezvous, StaticNodeRanksWithUnequalWorkerCounts) {
  const std::string port = std::to_string(free_port());
  auto node = [&](const std::string& rank, const std::string& nproc) {
    return std::vector<std::string>{"--nnodes",
                                    "2",
                                    "--node-rank",
                                    rank,
                                    "--master-addr",
                                    "127.0.0.1",
                                    "--master-port",
                                    port,
                                    "--nproc-per-node",
                                    nproc,
                                    "--no-prefix",
                                    "sh",
                                    "-c",
                                    kReport};
  };
  // Node 1 first: the node ranks come from the flags, not the order of arrival.
  Launch one(node("1", "1"));
  Launch zero(node("0", "2"));
  ASSERT_EQ(zero.wait(), 0) << zero.err();
  ASSERT_EQ(one.wait(), 0) << one.err();
  const auto z = records(zero.out(), "w");
  const auto o = records(one.out(), "w");
  ASSERT_EQ(z.size(), 2u) << zero.out();
  ASSERT_EQ(o.size(), 1u) << one.out();
  std::set<std::string> ranks;
  for (const auto& r : z) {
    EXPECT_EQ(r.at("node"), "0");
    EXPECT_EQ(r.at("world"), "3");
    ranks.insert(r.at("rank"));
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(o[0].at("node"), "1");
  EXPECT_EQ(o[0].at("rank"), "2");
  EXPECT_EQ(o[0].at("world"), "3");
  EXPECT_EQ(o[0].at("lw"), "1");
  EXPECT_NE(o[0].at("port"), port) << "the workers' store gets a port of its own";
  EXPECT_EQ(o[0].at("port"), z[0].at("port"));
}

TEST(Rendezvous, ANodeRankHeldTwiceIsRefused) {
  const std::string port = std::to_string(free_port());
  const std::vector<std::string> args = {
      "--nnodes", "2", "--node-rank", "0", "--master-port", port, "--rdzv-timeout", "3s", "true"};
  Launch first(args);
  Launch second(args);
  const int s1 = first.wait();
  const int s2 = second.wait();
  // Whichever claimed node rank 0 first waits for a node 1 that never comes, and fails
  // (its rendezvous times out, or its store goes away with the other launcher if that one
  // hosted it); the other is refused at once.
  EXPECT_TRUE((s1 == 2) != (s2 == 2)) << s1 << " " << s2 << "\n" << first.err() << second.err();
  const Launch& refused = s1 == 2 ? first : second;
  EXPECT_TRUE(has(refused.err(), "--node-rank 0 is already held by another launcher"))
      << refused.err();
  const Launch& waited = s1 == 2 ? second : first;
  EXPECT_EQ(s1 == 2 ? s2 : s1, 1) << waited.err();
  EXPECT_TRUE(has(waited.err(), "no generation formed within --rdzv-timeout") ||
              has(waited.err(), "lost"))
      << waited.err();
}

// A port taken by another program (bound here, not listening): the launcher can neither host
// the store there nor reach one, and says both, naming the port, within --rdzv-timeout.
TEST(Rendezvous, AnEndpointTakenByAnotherProgramIsNamedWithWhyItCouldNotBeHosted) {
  const int port = free_port();
  const int taken = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(taken, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string ep = "127.0.0.1:" + std::to_string(port);
  Launch alone(
      {"--rdzv-endpoint", ep, "--nnodes", "2", "--rdzv-timeout", "2s", "--no-prefix", "true"});
  EXPECT_NE(alone.wait(), 0);
  ::close(taken);
  EXPECT_TRUE(has(alone.err(), "the rendezvous store at " + ep + " could not be hosted here"))
      << alone.err();
  EXPECT_TRUE(has(alone.err(), "address already in use")) << alone.err();
  EXPECT_TRUE(has(alone.err(), "none answered there")) << alone.err();
}

// A worker failing on one node restarts every node's workers, with the restart counted.
TEST(Rendezvous, AFailureOnOneNodeRestartsEveryNode) {
  const std::string ep = endpoint();
  const std::string script = std::string(kReport) +
                             "; if [ $GROUP_RANK = 1 ] && [ $RESTART_COUNT = 0 ]; then exit 3; fi; "
                             "[ $RESTART_COUNT = 1 ] && exit 0; exec sleep 60";
  Launch a(with(ep, "2", {"--max-restarts", "1", "sh", "-c", script}));
  Launch b(with(ep, "2", {"--max-restarts", "1", "sh", "-c", script}));
  ASSERT_EQ(a.wait(), 0) << a.err();
  ASSERT_EQ(b.wait(), 0) << b.err();
  for (const auto* run : {&a, &b}) {
    bool restarted = false;
    for (const auto& r : records(run->out(), "w")) {
      if (r.at("restart") != "1") continue;
      restarted = true;
      EXPECT_EQ(r.at("te"), "1");
      EXPECT_EQ(r.at("gen"), "1");
      EXPECT_EQ(r.at("world"), "2");
    }
    EXPECT_TRUE(restarted) << run->out() << run->err();
    EXPECT_TRUE(
        has(run->err(), "exited with status 3; restarting every node's workers (restart 1 of 1)"))
        << run->err();
  }
}

TEST(Rendezvous, RestartsUsedUpEndEveryNodeWithTheFailure) {
  const std::string ep = endpoint();
  const std::string script = "if [ $GROUP_RANK = 1 ]; then exit 5; fi; exec sleep 60";
  Launch a(with(ep, "2", {"--max-restarts", "1", "sh", "-c", script}));
  Launch b(with(ep, "2", {"--max-restarts", "1", "sh", "-c", script}));
  EXPECT_EQ(a.wait(), 5) << a.err();
  EXPECT_EQ(b.wait(), 5) << b.err();
  for (const auto* run : {&a, &b}) {
    EXPECT_TRUE(has(run->err(), "giving up after 1 restart: rank 1 on node 1")) << run->err();
  }
}

// --nnodes 1:2: the first node runs alone; the second, arriving later, makes both start a
// new generation together (a membership change, not a restart).
TEST(Rendezvous, ANodeArrivingLaterJoinsInANewGeneration) {
  const std::string ep = endpoint();
  const std::string script =
      std::string(kReport) + "; [ $WORLD_SIZE = 2 ] && exit 0; exec sleep 60";
  Launch a(with(ep, "1:2", {"sh", "-c", script}));
  ASSERT_TRUE(a.read_until(
      [](const std::string& out, const std::string&) { return has(out, "w rank=0 world=1"); }, 20s))
      << a.out() << a.err();
  Launch b(with(ep, "1:2", {"sh", "-c", script}));
  ASSERT_EQ(a.wait(), 0) << a.err();
  ASSERT_EQ(b.wait(), 0) << b.err();
  const auto ra = records(a.out(), "w");
  const auto rb = records(b.out(), "w");
  ASSERT_EQ(ra.size(), 2u) << a.out();
  ASSERT_EQ(rb.size(), 1u) << b.out();
  EXPECT_EQ(ra[1].at("gen"), rb[0].at("gen"));
  EXPECT_NE(ra[1].at("gen"), "0");
  EXPECT_EQ(ra[1].at("world"), "2");
  EXPECT_EQ(rb[0].at("world"), "2");
  EXPECT_EQ(std::set<std::string>({ra[1].at("rank"), rb[0].at("rank")}),
            (std::set<std::string>{"0", "1"}));
  EXPECT_EQ(ra[1].at("restart"), "0") << "a membership change is not a restart";
  EXPECT_TRUE(has(a.err(), "a node is waiting to join")) << a.err();
}

// A launcher killed outright takes its workers with it (PR_SET_PDEATHSIG), and the other
// node goes on alone in a new generation once the heartbeat timeout passes.
TEST(Rendezvous, AKilledLaunchersWorkersDieAndTheRestGoOn) {
  const std::string ep = endpoint();
  // Alone in generation 0 (b came after the last call, on a loaded machine) a waits for b
  // to join in a new generation, like ANodeArrivingLaterJoinsInANewGeneration; alone in a
  // later one (b is gone) it is done.
  const std::string script =
      std::string(kReport) +
      " pid=$$; [ $WORLD_SIZE = 1 ] && [ $GRADWIRE_RUN_GENERATION != 0 ] && exit 0; exec sleep 60";
  Launch a(with(ep, "1:2", {"sh", "-c", script}));
  // a hosts the store: it must outlive b.
  ASSERT_TRUE(
      a.read_until([](const std::string&,
                      const std::string& err) { return has(err, "hosted by this launcher"); },
                   20s))
      << a.err();
  Launch b(with(ep, "1:2", {"sh", "-c", script}));
  auto both_running = [](const std::string& out, const std::string&) {
    return has(out, "world=2");
  };
  ASSERT_TRUE(a.read_until(both_running, 20s)) << a.out() << a.err();
  ASSERT_TRUE(b.read_until(both_running, 20s)) << b.out() << b.err();
  const std::string pid = records(b.out(), "w").back().at("pid");
  ASSERT_FALSE(pid.empty()) << b.out();
  ::kill(b.pid(), SIGKILL);
  EXPECT_TRUE(ends_within(std::stoi(pid), 10s)) << "the killed launcher's worker lives on";
  ASSERT_EQ(a.wait(), 0) << a.err();
  const auto ra = records(a.out(), "w");
  ASSERT_GE(ra.size(), 2u) << a.out();
  EXPECT_EQ(ra.back().at("world"), "1");
  EXPECT_EQ(ra.back().at("restart"), "0") << "a node leaving is not a restart";
  EXPECT_TRUE(has(a.err(), "stopped answering (no heartbeat for 3000 ms)")) << a.err();
}

// With a standalone gradwire-store at the endpoint every launcher is its client, and the
// store serves one job after another (told apart by --rdzv-id).
TEST(Rendezvous, LaunchersMeetOnAStandaloneStore) {
  Launch store({"--host", "127.0.0.1", "--port", "0"}, {}, GRADWIRE_STORE_PATH);
  ASSERT_TRUE(store.read_until(
      [](const std::string& out, const std::string&) { return has(out, "listening on port "); },
      20s))
      << store.out() << store.err();
  const std::string ep = "127.0.0.1:" + value_after(store.out(), "listening on port");
  Launch a(with(ep, "2", {"--rdzv-id", "one", "sh", "-c", kReport}));
  Launch b(with(ep, "2", {"--rdzv-id", "one", "sh", "-c", kReport}));
  ASSERT_EQ(a.wait(), 0) << a.err();
  ASSERT_EQ(b.wait(), 0) << b.err();
  EXPECT_FALSE(has(a.err() + b.err(), "hosted by this launcher")) << a.err() << b.err();
  std::set<std::string> ranks;
  for (const auto* run : {&a, &b})
    for (const auto& r : records(run->out(), "w"))
      ranks.insert(r.at("rank"));
  EXPECT_EQ(ranks, (std::set<std::string>{"0", "1"}));

  Launch next(with(ep, "1", {"--rdzv-id", "two", "sh", "-c", kReport}));
  ASSERT_EQ(next.wait(), 0) << next.err();
  EXPECT_TRUE(has(next.out(), "w rank=0 world=1")) << next.out();
  // An id whose job has completed is not run again.
  Launch again(with(ep, "2", {"--rdzv-id", "one", "sh", "-c", kReport}));
  ASSERT_EQ(again.wait(), 0) << again.err();
  EXPECT_EQ(again.out(), "");
  EXPECT_TRUE(has(again.err(), "the job completed before this node could join it")) << again.err();
}

// What another launcher publishes in the store is a peer's input: a node description of
// junk (a confused or hostile second node) ends the launcher with an error quoting it
// printably, and no worker starts, instead of a job planned over garbage.
TEST(Rendezvous, AMalformedNodeDescriptionIsRefusedNamingIt) {
  Launch store({"--host", "127.0.0.1", "--port", "0"}, {}, GRADWIRE_STORE_PATH);
  ASSERT_TRUE(store.read_until(
      [](const std::string& out, const std::string&) { return has(out, "listening on port "); },
      20s))
      << store.out() << store.err();
  const int port = std::stoi(value_after(store.out(), "listening on port"));
  Launch a(
      with("127.0.0.1:" + std::to_string(port), "2", {"--rdzv-id", "junk", "sh", "-c", kReport}));
  gradwire::c10d::TCPStore peer(
      gradwire::c10d::TCPStoreOptions{.host = "127.0.0.1", .port = static_cast<uint16_t>(port)});
  // The second "node": joins once the launcher has, with a description of junk.
  peer.wait({"/gradwire-run/junk/g0/node0"}, 20s);
  peer.set("/gradwire-run/junk/g0/node1", std::string("\x1b[2J 99999999999 h"));
  peer.add("/gradwire-run/junk/g0/joined", 1);
  EXPECT_NE(a.wait(), 0) << a.err();
  EXPECT_EQ(a.out(), "") << "no worker may start";
  EXPECT_TRUE(has(a.err(), "malformed description")) << a.err();
  EXPECT_FALSE(has(a.err(), "\x1b[2J")) << "the junk is quoted printably";
}

// A launcher waiting for the other nodes still answers Ctrl-C / SIGTERM at once.
TEST(Rendezvous, ASignalEndsALauncherWaitingForOtherNodes) {
  Launch run({"--rdzv-endpoint", endpoint(), "--nnodes", "2", "true"});
  ASSERT_TRUE(run.read_until(
      [](const std::string&, const std::string& err) { return has(err, "rendezvous 'default'"); },
      20s))
      << run.err();
  ::kill(run.pid(), SIGTERM);
  EXPECT_EQ(run.wait(10s), 128 + SIGTERM) << run.err();
  EXPECT_TRUE(has(run.err(), "interrupted by signal 15 during the rendezvous")) << run.err();
}

}  // namespace
