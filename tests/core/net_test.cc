#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/core/net.h"
#include "support/scoped_env.h"

namespace gradwire {
namespace {

using test::ScopedEnv;
using ::testing::HasSubstr;

// The overrides advertised_host reads, all unset.
ScopedEnv no_overrides() {
  return ScopedEnv({{"GRADWIRE_RPC_HOST", nullptr}, {"GRADWIRE_SOCKET_IFNAME", nullptr}});
}

// A non-loopback interface with an IPv4 address, as (name, address); empty when the
// machine has none.
std::pair<std::string, std::string> external_interface() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::pair<std::string, std::string> found;
  for (const ifaddrs* i = list; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) != 0 || (i->ifa_flags & IFF_UP) == 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text,
                sizeof(text));
    found = {i->ifa_name, text};
    break;
  }
  ::freeifaddrs(list);
  return found;
}

TEST(Net, LoopbackMasterGivesLoopback) {
  for (const char* host : {"127.0.0.1", "localhost", "127.0.1.1", "::1"}) {
    EXPECT_EQ(net::address_toward(host), "127.0.0.1") << host;
    EXPECT_TRUE(net::is_loopback(host)) << host;
  }
  auto env = no_overrides();
  EXPECT_EQ(net::advertised_host("127.0.0.1"), "127.0.0.1");
  EXPECT_EQ(net::advertised_host("localhost"), "127.0.0.1");
}

TEST(Net, LocalInterfaceAddressRoutesToItself) {
  auto [name, address] = external_interface();
  if (name.empty()) GTEST_SKIP() << "this machine has no non-loopback IPv4 interface";
  EXPECT_FALSE(net::is_loopback(address));
  // A master on this host's own external address is reached from that address, and the
  // worker announces it rather than a loopback one.
  EXPECT_EQ(net::address_toward(address, 29500), address);
  auto env = no_overrides();
  EXPECT_EQ(net::advertised_host(address), address);
  EXPECT_EQ(net::interface_address(name), address);
}

std::string this_hostname() {
  char name[256] = {};
  ::gethostname(name, sizeof(name) - 1);
  return name;
}

TEST(Net, MasterNameMappedToLoopbackHereStillGivesAReachableAddress) {
  const std::string name = this_hostname();
  auto [ifname, address] = external_interface();
  if (name.empty() || !net::is_loopback(name) || ifname.empty()) {
    GTEST_SKIP() << "needs a host name that resolves to loopback and an external interface";
  }
  // This host is the master, named by a name its peers resolve to a real address: the
  // worker must announce a real address too, not the loopback one the name maps to here.
  auto env = no_overrides();
  const std::string chosen = net::advertised_host(name);
  EXPECT_FALSE(net::is_loopback(chosen)) << chosen;
  // A master written as loopback keeps the job on loopback.
  EXPECT_EQ(net::advertised_host("127.0.0.1"), "127.0.0.1");
}

TEST(Net, UnknownInterfaceIsRefusedByName) {
  try {
    net::interface_address("gw-no-such-if0");
    FAIL() << "an unknown interface was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'gw-no-such-if0'"));
    // The interfaces that do exist are listed; every Linux machine has lo.
    EXPECT_THAT(e.what(), HasSubstr("lo"));
  }
}

TEST(Net, LoopbackInterfaceHasAnAddress) {
  EXPECT_EQ(net::interface_address("lo"), "127.0.0.1");
}

TEST(Net, UnresolvableHostIsANetworkErrorNamingIt) {
  // ".invalid" never resolves (RFC 2606).
  try {
    net::address_toward("no-such-host.invalid");
    FAIL() << "an unresolvable host was accepted";
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'no-such-host.invalid'"));
  }
  EXPECT_FALSE(net::is_loopback("no-such-host.invalid"));
  EXPECT_THROW(net::address_toward(""), InvalidArgument);
  EXPECT_THROW(net::address_toward("127.0.0.1", 70000), InvalidArgument);
}

TEST(Net, RpcHostOverridesEverything) {
  ScopedEnv env({{"GRADWIRE_RPC_HOST", "10.1.2.3"}, {"GRADWIRE_SOCKET_IFNAME", "lo"}});
  EXPECT_EQ(net::advertised_host("127.0.0.1"), "10.1.2.3");
  EXPECT_EQ(net::advertised_host(""), "10.1.2.3");
}

TEST(Net, SocketIfnameOverridesTheRoute) {
  ScopedEnv env({{"GRADWIRE_RPC_HOST", nullptr}, {"GRADWIRE_SOCKET_IFNAME", "lo"}});
  auto [name, address] = external_interface();
  // Even toward a master reached through another interface, the named one is used.
  EXPECT_EQ(net::advertised_host(name.empty() ? "" : address), "127.0.0.1");
}

TEST(Net, BadSocketIfnameNamesTheVariableAndInterface) {
  ScopedEnv env({{"GRADWIRE_RPC_HOST", nullptr}, {"GRADWIRE_SOCKET_IFNAME", "gw-missing7"}});
  try {
    net::advertised_host("127.0.0.1");
    FAIL() << "a missing interface was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("GRADWIRE_SOCKET_IFNAME"));
    EXPECT_THAT(e.what(), HasSubstr("'gw-missing7'"));
  }
}

TEST(Net, NoMasterGivesANonLoopbackAddressOrPlainLoopback) {
  auto env = no_overrides();
  const std::string host = net::advertised_host("");
  ASSERT_FALSE(host.empty());
  // A non-loopback address of the host name, or 127.0.0.1 as the last resort; never another
  // loopback address such as Debian's 127.0.1.1.
  if (host != "127.0.0.1") {
    EXPECT_FALSE(net::is_loopback(host)) << host;
  }
}

TEST(Net, HostIdFollowsTheOverride) {
  {
    ScopedEnv env({{"GRADWIRE_HOST_ID", nullptr}});
    EXPECT_FALSE(net::host_id().empty());
    EXPECT_EQ(net::host_id(), net::host_id());
  }
  ScopedEnv env({{"GRADWIRE_HOST_ID", "node-b"}});
  EXPECT_EQ(net::host_id(), "node-b");
}

TEST(Net, NamespaceIdIsStable) {
  const std::uint64_t id = net::network_namespace_id();
  EXPECT_NE(id, 0u) << "/proc/self/ns/net could not be read";
  EXPECT_EQ(net::network_namespace_id(), id);
}

}  // namespace
}  // namespace gradwire
