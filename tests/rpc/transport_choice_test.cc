// Transports chosen per pair of workers by reachability: transports that exist per network
// namespace (local) only between workers of one host and namespace, tcp otherwise.
// (Two real network namespaces are exercised by the multinode test bed.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "gradwire/c10d/file_store.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/core/error.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "group.h"
#include "support/harness.h"

namespace gradwire::rpc {
namespace {

using namespace std::chrono_literals;
using ::testing::ElementsAre;

// Two worker processes whose host ids are `host0` and `host1`. Each calls the other, then
// reports over the store what it sees: the transport toward its peer and how many
// connections it accepted over the local transport.
void run_pair(const std::string& tag, const char* host0, const char* host1,
              const std::string& expected_transport) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("gradwire-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "store").string();
  test::RankResults results = test::run_ranks_as_processes(
      2,
      [&](int rank) {
        // In the child: nothing else reads the environment.
        ::setenv("GRADWIRE_HOST_ID", rank == 0 ? host0 : host1, 1);
        auto store = std::make_shared<c10d::FileStore>(
            c10d::FileStoreOptions{.path = path, .num_workers = 2, .timeout = 30s});
        Registry reg;
        reg.def("echo", [](const std::string& s) { return s; });
        AgentOptions options;
        options.registry = &reg;
        options.rpc_timeout = 20s;
        options.join_timeout = 20s;
        options.num_worker_threads = 2;
        options.mpt_lanes = 1;
        options.transports = {"local", "tcp"};
        auto agent = make_tensorpipe_agent("w" + std::to_string(rank), rank, 2, store, options);
        const std::string peer = "w" + std::to_string(1 - rank);
        EXPECT_EQ(agent->transport_to(peer), expected_transport);
        EXPECT_EQ(agent->rpc_sync<std::string>(peer, "echo", std::string("hi")), "hi");
        // Both calls have been served once both are past this point.
        c10d::barrier(*store, "called", 2, 20s);
        const AgentMetrics m = agent->metrics();
        EXPECT_GE(m.connections_accepted, 1u);
        if (expected_transport == "local") {
          EXPECT_GE(m.local_connections_accepted, 1u);
        } else {
          EXPECT_EQ(m.local_connections_accepted, 0u);
        }
        EXPECT_THROW(agent->transport_to("nobody"), InvalidArgument);
        agent->shutdown();
      },
      60s);
  std::filesystem::remove_all(dir);
  EXPECT_ALL_RANKS_OK(results);
}

TEST(TransportChoice, WorkersOfOneHostAndNamespaceUseLocal) {
  run_pair("same-host", "node-a", "node-a", "local");
}

TEST(TransportChoice, WorkersOfOtherHostsUseTcpWhateverThePreference) {
  // Same machine and namespace, but the workers say they are on two hosts (as two network
  // namespaces posing as hosts do): local is preferred yet must not be used.
  run_pair("other-host", "node-a", "node-b", "tcp");
}

// ---- the store's records (white-box)

std::string record(const std::string& name, const std::string& extra) {
  return "gradwire-rpc 1\nname " + name + "\nurl tcp://127.0.0.1:1\ndevices 0\n" + extra;
}

TEST(TransportChoice, RecordsDecideWhoSharesTheNamespace) {
  auto store = std::make_shared<c10d::HashStore>(10s);
  // Ranks 1 to 3 as other workers would publish them: 1 an older worker (no host, no
  // transports), 2 on this host and namespace, 3 on this host in another namespace, 4 on
  // another host with the same namespace inode (inodes repeat across machines).
  store->set("rpc/1/worker/1", record("w1", ""));
  store->set("rpc/1/worker/2",
             record("w2", "host boot-a\nnetns 4026531992\ntransports local tcp\n"));
  store->set("rpc/1/worker/3",
             record("w3", "host boot-a\nnetns 4026532500\ntransports local tcp\n"));
  store->set("rpc/1/worker/4",
             record("w4", "host boot-b\nnetns 4026531992\ntransports local tcp\n"));
  for (int r = 1; r <= 4; ++r)
    store->set("rpc/1/direct/" + std::to_string(r), "readable");
  detail::GroupDirectory group(WorkerInfo{"w0", 0}, 5, store, 10s);
  detail::GroupDirectory::Announcement me;
  me.url = "tcp://127.0.0.1:2";
  me.host_id = "boot-a";
  me.netns = 4026531992;
  me.transports = {"local", "tcp"};
  group.join(me, /*direct_copies=*/false);
  EXPECT_TRUE(group.same_namespace(0));
  EXPECT_FALSE(group.same_namespace(1));
  EXPECT_TRUE(group.same_namespace(2));
  EXPECT_FALSE(group.same_namespace(3));
  EXPECT_FALSE(group.same_namespace(4));
  EXPECT_FALSE(group.same_namespace(7));
  EXPECT_THAT(group.transports_of(1), ElementsAre("tcp"));
  EXPECT_THAT(group.transports_of(2), ElementsAre("local", "tcp"));
  // What this worker published reads back the same way.
  const std::string mine = c10d::to_string(store->get("rpc/1/worker/0"));
  EXPECT_THAT(mine, ::testing::HasSubstr("host boot-a\nnetns 4026531992\n"));
  EXPECT_THAT(mine, ::testing::HasSubstr("transports local tcp\n"));
}

TEST(TransportChoice, AHostIdWithSpacesStaysOneWordInTheRecord) {
  auto store = std::make_shared<c10d::HashStore>(10s);
  // A peer with the same host id, as its record spells it.
  store->set("rpc/1/worker/1", record("w1", "host rack_7_node_3\nnetns 12\ntransports tcp\n"));
  store->set("rpc/1/direct/1", "readable");
  detail::GroupDirectory group(WorkerInfo{"w0", 0}, 2, store, 10s);
  detail::GroupDirectory::Announcement me;
  me.url = "tcp://127.0.0.1:2";
  me.host_id = "rack 7 node\t3";
  me.netns = 12;
  me.transports = {"tcp"};
  group.join(me, /*direct_copies=*/false);
  EXPECT_TRUE(group.same_namespace(0));
  EXPECT_TRUE(group.same_namespace(1));
  EXPECT_THAT(c10d::to_string(store->get("rpc/1/worker/0")),
              ::testing::HasSubstr("host rack_7_node_3\n"));
}

}  // namespace
}  // namespace gradwire::rpc
