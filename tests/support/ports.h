// Ports for tests that must name one before anything binds it (a launcher's endpoint, a
// store's port), and raw loopback connections to a listener.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <string>

namespace gradwire::test {

// A port that was free a moment ago, for APIs that take a port number rather than a
// socket. It is drawn from below the kernel's ephemeral range (read from
// /proc/sys/net/ipv4/ip_local_port_range), where no socket bound to port 0 lands: other
// tests running in parallel (Gloo listens on port 0 per group) cannot take it before the
// caller binds it.
inline uint16_t free_port() {
  int low = 32768;
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int lo = 0;
    int hi = 0;
    if (std::fscanf(f, "%d %d", &lo, &hi) == 2 && lo > 2048) low = lo;
    std::fclose(f);
  }
  std::random_device seed;
  std::mt19937 rng(seed());
  std::uniform_int_distribution<int> pick(1024, low - 1);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const auto port = static_cast<uint16_t>(pick(rng));
    addr.sin_port = htons(port);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (ok) return port;
  }
  throw std::runtime_error("free_port: no free port below the ephemeral range");
}

// Socket buffer sizes set before connecting (0: the kernel's default).
struct SocketBuffers {
  int send = 0;
  int receive = 0;
};

// A TCP socket connected to 127.0.0.1:`port`, for a test that speaks a protocol byte by
// byte; the caller owns (and closes) the descriptor. Throws std::runtime_error when the
// socket cannot be made or the connection is refused.
inline int connect_loopback(uint16_t port, SocketBuffers buffers = {}) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  if (buffers.send > 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffers.send, sizeof(buffers.send));
  if (buffers.receive > 0)
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffers.receive, sizeof(buffers.receive));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + " failed");
  }
  return fd;
}

}  // namespace gradwire::test
