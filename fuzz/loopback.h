// What the fuzz targets that drive a real server share: a connection to 127.0.0.1, sending
// all of an input, and waiting for the server to close the connection after the input's
// end (a server that keeps it open is a hang: the target traps).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace gradwire::fuzz {

// How long a server may take to answer or to close before it counts as hung.
inline constexpr int kHangMs = 15000;

// Connects to 127.0.0.1:port from 127.0.0.2 .. 127.0.0.251 in turn. Each input's
// connection is closed by the client's half-close first, which leaves it in TIME_WAIT on
// this side for a minute; from one source address a long run would use up the ephemeral
// ports (and meet kernel corner cases of their reuse) after some 10^5 inputs.
inline int connect_loopback(uint16_t port) {
  static uint32_t next = 0;
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  // SO_REUSEADDR: these sockets linger in TIME_WAIT bound to their port, and without it
  // they would stop other programs binding that port on every address for a minute.
  const int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + (next++ % 250));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
    std::perror("fuzz: bind");
    __builtin_trap();
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::perror("fuzz: connect");
    __builtin_trap();
  }
  return fd;
}

// False if the server closed the connection first (which is fine: it refused the input).
inline bool send_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

// Ends the input (half-close), reads until the server closes, closes.
inline void finish_and_wait_for_close(int fd) {
  ::shutdown(fd, SHUT_WR);
  char sink[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, kHangMs) <= 0) {
      std::fprintf(stderr, "fuzz: the server kept the connection open after the input ended\n");
      __builtin_trap();
    }
    if (::recv(fd, sink, sizeof(sink), 0) <= 0) break;
  }
  ::close(fd);
}

}  // namespace gradwire::fuzz
