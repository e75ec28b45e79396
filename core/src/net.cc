#include "gradwire/core/net.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "gradwire/core/check.h"
#include "gradwire/core/env.h"
#include "gradwire/core/fd.h"

namespace gradwire::net {
namespace {

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { ::freeaddrinfo(info); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

struct IfAddrsDeleter {
  void operator()(ifaddrs* list) const { ::freeifaddrs(list); }
};

std::string trim(const std::string& text) {
  const char* space = " \t\r\n";
  const size_t begin = text.find_first_not_of(space);
  if (begin == std::string::npos) return "";
  return text.substr(begin, text.find_last_not_of(space) - begin + 1);
}

bool loopback_sockaddr(const sockaddr* addr) {
  if (addr->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(addr);
    return (ntohl(in->sin_addr.s_addr) >> 24) == 127;
  }
  if (addr->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(addr);
    if (IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr)) return true;
    // ::ffff:127.x.y.z
    if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) return in6->sin6_addr.s6_addr[12] == 127;
  }
  return false;
}

// The numeric text of an IPv4 or IPv6 address ("10.0.0.1", "fe80::1").
std::string numeric(const sockaddr* addr) {
  char text[INET6_ADDRSTRLEN] = {};
  const void* raw =
      addr->sa_family == AF_INET
          ? static_cast<const void*>(&reinterpret_cast<const sockaddr_in*>(addr)->sin_addr)
          : static_cast<const void*>(&reinterpret_cast<const sockaddr_in6*>(addr)->sin6_addr);
  if (::inet_ntop(addr->sa_family, raw, text, sizeof(text)) == nullptr) return "";
  return text;
}

// Resolves `host` (names and numeric addresses) for `family` (AF_UNSPEC: both). A null
// pointer and the resolver's message in `error` when it fails.
AddrInfoPtr resolve(const std::string& host, int family, std::string* error) {
  addrinfo hints{};
  hints.ai_family = family;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* result = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &result);
  if (rc != 0) {
    if (error != nullptr) *error = rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoPtr(result);
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return trim(line);
}

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "";
  return name;
}

// The first address the host name resolves to that is not a loopback one; "" when none.
std::string hostname_address() {
  const std::string name = hostname();
  if (name.empty()) return "";
  for (int family : {AF_INET, AF_INET6}) {
    AddrInfoPtr list = resolve(name, family, nullptr);
    for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
      if (loopback_sockaddr(a->ai_addr)) continue;
      // An IPv6 link-local address needs a scope id peers do not know; skip it.
      if (a->ai_family == AF_INET6 &&
          IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr)) {
        continue;
      }
      std::string text = numeric(a->ai_addr);
      if (!text.empty()) return text;
    }
  }
  return "";
}

// "localhost", a 127.0.0.0/8 address or ::1, as written (no resolving).
bool literal_loopback(const std::string& host) {
  if (host == "localhost" || host.rfind("localhost.", 0) == 0) return true;
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

// The IPv4 address of the first interface that is up and not a loopback one; "" if none.
std::string first_interface_address() {
  ifaddrs* raw = nullptr;
  if (::getifaddrs(&raw) != 0) return "";
  std::unique_ptr<ifaddrs, IfAddrsDeleter> list(raw);
  for (const ifaddrs* i = list.get(); i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_UP) == 0 || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    if (loopback_sockaddr(i->ifa_addr)) continue;
    std::string text = numeric(i->ifa_addr);
    if (!text.empty()) return text;
  }
  return "";
}

}  // namespace

bool is_loopback(const std::string& host) {
  if (host.empty()) return false;
  if (host == "localhost") return true;
  AddrInfoPtr list = resolve(host, AF_UNSPEC, nullptr);
  if (list == nullptr) return false;
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    if (!loopback_sockaddr(a->ai_addr)) return false;
  }
  return true;
}

std::string address_toward(const std::string& host, int port) {
  if (host.empty()) {
    GRADWIRE_THROW(InvalidArgument) << "address_toward: the host is empty";
  }
  if (port < 0 || port > 65535) {
    GRADWIRE_THROW(InvalidArgument)
        << "address_toward: port " << port << " is out of range [0, 65535]";
  }
  std::string error;
  AddrInfoPtr list = resolve(host, AF_UNSPEC, &error);
  if (list == nullptr) {
    GRADWIRE_THROW(NetworkError) << "cannot resolve host '" << host << "': " << error;
  }
  bool all_loopback = true;
  for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
    all_loopback = all_loopback && loopback_sockaddr(a->ai_addr);
  }
  if (all_loopback) return "127.0.0.1";

  // Connecting a UDP socket only asks the routing table for a source address.
  // The discard port completes the destination when the caller gave none.
  const uint16_t destination_port = htons(static_cast<uint16_t>(port == 0 ? 9 : port));
  std::string last_error = "no IPv4 or IPv6 address";
  for (int family : {AF_INET, AF_INET6}) {
    for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next) {
      if (a->ai_family != family) continue;
      sockaddr_storage target{};
      std::memcpy(&target, a->ai_addr, a->ai_addrlen);
      if (family == AF_INET) {
        reinterpret_cast<sockaddr_in*>(&target)->sin_port = destination_port;
      } else {
        reinterpret_cast<sockaddr_in6*>(&target)->sin6_port = destination_port;
      }
      UniqueFd fd(::socket(family, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      if (fd.get() < 0) {
        last_error = std::string("socket: ") + std::strerror(errno);
        continue;
      }
      if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&target), a->ai_addrlen) != 0) {
        last_error = numeric(a->ai_addr) + ": " + std::strerror(errno);
        continue;
      }
      sockaddr_storage local{};
      socklen_t length = sizeof(local);
      if (::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &length) != 0) {
        last_error = std::string("getsockname: ") + std::strerror(errno);
        continue;
      }
      std::string text = numeric(reinterpret_cast<const sockaddr*>(&local));
      if (!text.empty()) return text;
    }
  }
  GRADWIRE_THROW(NetworkError) << "no route to host '" << host << "' (" << last_error << ")";
}

std::string interface_address(const std::string& ifname) {
  ifaddrs* raw = nullptr;
  if (::getifaddrs(&raw) != 0) {
    GRADWIRE_THROW(NetworkError) << "cannot list the network interfaces (getifaddrs: "
                                 << std::strerror(errno) << ")";
  }
  std::unique_ptr<ifaddrs, IfAddrsDeleter> list(raw);
  std::vector<std::string> names;
  bool exists = false;
  for (const ifaddrs* i = list.get(); i != nullptr; i = i->ifa_next) {
    if (i->ifa_name == nullptr) continue;
    const std::string name = i->ifa_name;
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
    if (name != ifname) continue;
    exists = true;
    if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET) {
      std::string text = numeric(i->ifa_addr);
      if (!text.empty()) return text;
    }
  }
  std::string known;
  for (const std::string& name : names)
    known += (known.empty() ? "" : ", ") + name;
  if (exists) {
    GRADWIRE_THROW(InvalidArgument)
        << "network interface '" << ifname << "' has no IPv4 address (interfaces: " << known << ")";
  }
  GRADWIRE_THROW(InvalidArgument) << "no network interface named '" << ifname
                                  << "' (interfaces: " << known << ")";
}

std::string advertised_host(const std::string& master_host) {
  if (auto host = env_raw("GRADWIRE_RPC_HOST"); host && !trim(*host).empty()) return trim(*host);
  if (auto ifname = env_raw("GRADWIRE_SOCKET_IFNAME"); ifname && !trim(*ifname).empty()) {
    try {
      return interface_address(trim(*ifname));
    } catch (const InvalidArgument& e) {
      GRADWIRE_THROW(InvalidArgument) << "GRADWIRE_SOCKET_IFNAME: " << e.what();
    }
  }
  if (!master_host.empty()) {
    std::string address = address_toward(master_host);
    if (address != "127.0.0.1" || literal_loopback(master_host)) return address;
    // A name that maps to a loopback address only here (Debian's /etc/hosts maps the host's
    // own name to 127.0.1.1): this is the master's host, and peers on other hosts reach it
    // by one of its other addresses.
  }
  if (std::string address = hostname_address(); !address.empty()) return address;
  if (!master_host.empty()) {
    if (std::string address = first_interface_address(); !address.empty()) return address;
  }
  return "127.0.0.1";
}

std::string host_id() {
  if (auto id = env_raw("GRADWIRE_HOST_ID"); id && !trim(*id).empty()) return trim(*id);
  for (const char* path : {"/proc/sys/kernel/random/boot_id", "/etc/machine-id"}) {
    if (std::string id = read_first_line(path); !id.empty()) return id;
  }
  if (std::string name = hostname(); !name.empty()) return name;
  return "unknown-host";
}

std::uint64_t network_namespace_id() {
  struct stat info {};
  if (::stat("/proc/self/ns/net", &info) != 0) return 0;
  return static_cast<std::uint64_t>(info.st_ino);
}

}  // namespace gradwire::net
