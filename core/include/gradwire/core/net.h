// Which address a process listens on and announces, and which machine and network
// namespace it runs in.
//
// A worker must announce an address its peers can reach. The host name is a poor guide:
// many distributions map it to a loopback address in /etc/hosts, and a container sees only
// its own interfaces. The address that reaches the rendezvous master is a good one: the
// kernel's routing table says which local interface leads there, and peers reach the
// master by the same network. advertised_host() chooses in this order:
//
//   1. GRADWIRE_RPC_HOST, if set (an address or a name, used as given);
//   2. the IPv4 address of the interface GRADWIRE_SOCKET_IFNAME names (like Gloo's
//      GLOO_SOCKET_IFNAME; "eth0", "ib0");
//   3. the local address of the interface the kernel routes to the master host: never a
//      loopback address when the master is another machine. A master written as a
//      loopback address ("127.0.0.1", "localhost", "::1") gives 127.0.0.1, so a job on one
//      host stays on loopback. A master *name* that resolves to a loopback address here
//      (Debian's /etc/hosts maps the host's own name to 127.0.1.1) means this is the
//      master's host, whose peers may be elsewhere: step 4 then decides, and failing
//      that the first non-loopback interface that is up;
//   4. the first non-loopback address the host name resolves to;
//   5. 127.0.0.1.
//
// host_id() and network_namespace_id() tell two processes whether they share a host and a
// network namespace: transports that only work within one namespace (the rpc agent's
// `local` transport listens on an abstract Unix socket, which exists per namespace) are
// used between two workers only when both values are equal.
//
// Thread-safety: every function is safe from any thread so long as nothing modifies the
// environment at the same time (setenv is not thread-safe in POSIX). Nothing is cached:
// each call reads the environment and asks the kernel again.
// Errors: NetworkError when a host cannot be resolved or routed to; InvalidArgument for an
// interface that does not exist or has no IPv4 address (the message lists the interfaces
// that do) and for an empty host.
//
// Example:
//   std::string host = gradwire::net::advertised_host(env_string("MASTER_ADDR", ""));
//   // "10.9.0.2" on a node whose eth0 routes to the master at 10.9.0.1
#pragma once

#include <cstdint>
#include <string>

namespace gradwire::net {

// The local address of the interface the kernel would use to send to `host` (a name or
// an IPv4/IPv6 address; `port` only completes the destination, 0 picks a harmless one).
// A UDP socket is connected and asked for its local address: no packet is sent. An IPv4
// route is preferred; a host with IPv6 addresses only gives an IPv6 address. A loopback
// `host` ("localhost", 127.0.0.0/8, ::1) gives "127.0.0.1".
// Throws InvalidArgument for an empty host, NetworkError naming `host` when it cannot be
// resolved or no route leads there.
std::string address_toward(const std::string& host, int port = 0);

// The IPv4 address of the interface named `ifname` ("eth0"). Throws InvalidArgument naming
// it, and listing the interfaces that exist, when it does not exist or has no IPv4 address.
std::string interface_address(const std::string& ifname);

// The address this process should listen on and announce (see the order at the top of
// this file). `master_host` is the rendezvous master's host (MASTER_ADDR or the store's
// host); empty when none is known. Errors as address_toward and interface_address.
std::string advertised_host(const std::string& master_host);

// Whether `host` is a loopback address or a name that resolves only to loopback addresses
// ("localhost", "127.0.0.1", "127.0.1.1", "::1"). A name that cannot be resolved is not.
bool is_loopback(const std::string& host);

// An identifier of this machine: GRADWIRE_HOST_ID if set (tests use it to make network
// namespaces pose as separate hosts), else the kernel's boot id
// (/proc/sys/kernel/random/boot_id, shared by every container on the host), else
// /etc/machine-id, else the host name. Never empty.
std::string host_id();

// The inode of this process's network namespace (/proc/self/ns/net), which two processes
// share exactly when they share the namespace; 0 when it cannot be read.
std::uint64_t network_namespace_id();

}  // namespace gradwire::net
