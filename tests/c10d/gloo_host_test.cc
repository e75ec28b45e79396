// The address a Gloo group listens on when GlooOptions::host is empty: the one that reaches
// the rendezvous master (core/net.h), unless GRADWIRE_GLOO_HOST, GLOO_SOCKET_IFNAME or
// GRADWIRE_SOCKET_IFNAME say otherwise.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <chrono>
#include <string>

#include "c10d_test_util.h"
#include "gradwire/c10d/hash_store.h"
#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/process_group_gloo.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/error.h"
#include "gradwire/core/net.h"
#include "support/scoped_env.h"

namespace gradwire::c10d {
namespace {

using namespace std::chrono_literals;
using test::ScopedEnv;
using ::testing::HasSubstr;

ScopedEnv no_overrides() {
  return ScopedEnv({{"GRADWIRE_GLOO_HOST", nullptr},
                    {"GLOO_SOCKET_IFNAME", nullptr},
                    {"GRADWIRE_RPC_HOST", nullptr},
                    {"GRADWIRE_SOCKET_IFNAME", nullptr},
                    {"MASTER_ADDR", nullptr},
                    {"RANK", nullptr},
                    {"WORLD_SIZE", nullptr},
                    {"SLURM_PROCID", nullptr},
                    {"SLURM_JOB_NODELIST", nullptr},
                    {"SLURM_STEP_NODELIST", nullptr},
                    {"SLURM_NODELIST", nullptr}});
}

// The host a one-rank group on `store` chooses.
std::string chosen_host(std::shared_ptr<Store> store) {
  auto group = ProcessGroupGloo::create(std::move(store), 0, 1, {.timeout = 10s});
  return group->gloo_options().host;
}

// The IPv4 address of an interface that is up and not loopback; "" when there is none.
std::string external_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (const ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) != 0 || (i->ifa_flags & IFF_UP) == 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    found = text;
  }
  ::freeifaddrs(list);
  return found;
}

TEST(GlooHost, AStoreOnLoopbackKeepsTheGroupOnLoopback) {
  auto env = no_overrides();
  auto store = std::make_shared<TCPStore>(
      TCPStoreOptions{.host = "127.0.0.1", .port = 0, .is_master = true, .timeout = 10s});
  // Seen through a PrefixStore, as groups usually get it.
  EXPECT_EQ(chosen_host(std::make_shared<PrefixStore>("g", store)), "127.0.0.1");
}

TEST(GlooHost, TheInterfaceThatRoutesToTheMasterIsChosen) {
  const std::string address = external_address();
  if (address.empty()) GTEST_SKIP() << "no non-loopback IPv4 interface here";
  auto env = no_overrides();
  // A HashStore has no host: MASTER_ADDR names the master.
  ScopedEnv master({{"MASTER_ADDR", address.c_str()}});
  EXPECT_EQ(chosen_host(std::make_shared<HashStore>(10s)), address);
}

TEST(GlooHost, OverridesWin) {
  auto env = no_overrides();
  {
    ScopedEnv ifname({{"GRADWIRE_SOCKET_IFNAME", "lo"}});
    EXPECT_EQ(chosen_host(std::make_shared<HashStore>(10s)), "127.0.0.1");
  }
  {
    ScopedEnv ifname({{"GLOO_SOCKET_IFNAME", "lo"}, {"GRADWIRE_SOCKET_IFNAME", "gw-none0"}});
    EXPECT_EQ(chosen_host(std::make_shared<HashStore>(10s)), "127.0.0.1");
  }
  ScopedEnv host({{"GRADWIRE_GLOO_HOST", "127.0.0.1"}, {"GLOO_SOCKET_IFNAME", "gw-none0"}});
  EXPECT_EQ(chosen_host(std::make_shared<HashStore>(10s)), "127.0.0.1");
}

TEST(GlooHost, AMissingInterfaceIsNamed) {
  auto env = no_overrides();
  for (const char* variable : {"GLOO_SOCKET_IFNAME", "GRADWIRE_SOCKET_IFNAME"}) {
    ScopedEnv ifname({{variable, "gw-none0"}});
    try {
      chosen_host(std::make_shared<HashStore>(10s));
      ADD_FAILURE() << variable << ": a missing interface was accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr(variable));
      EXPECT_THAT(e.what(), HasSubstr("'gw-none0'"));
      EXPECT_THAT(e.what(), HasSubstr("ProcessGroupGloo"));
    }
  }
}

}  // namespace
}  // namespace gradwire::c10d
