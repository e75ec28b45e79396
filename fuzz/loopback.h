// What the fuzz targets that drive a real server share: a connection to 127.0.0.1, sending
// all of an input, and waiting for the server to close the connection after the input's
// end (a server that keeps it open is a hang: the target traps).
//
// Every system call here carries on after EINTR. libFuzzer's -timeout runs a SIGALRM timer
// (every timeout/2 + 1 s) whose handler is installed without SA_RESTART, so once in about
// 10^5 inputs it interrupts a connect() or poll() of the harness. Taking that for a server
// that did not answer would trap with the server's reply already waiting in the client's
// receive queue: a "stall" that no input reproduces.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace gradwire::fuzz {

// How long a server may take to answer or to close before it counts as hung.
inline constexpr int kHangMs = 15000;

// Waits until `fd` has one of `events` (or an error, or the peer's end), at most `ms`
// milliseconds in all, however often a signal interrupts the wait. False on timeout.
inline bool wait_for(int fd, short events, int ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 0)));
    if (n > 0) return true;
    if (n == 0 || errno != EINTR) return false;
  }
}

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
    // Interrupted, the connection goes on being made: wait for it, then read its outcome.
    int error = errno;
    if (error == EINTR && wait_for(fd, POLLOUT, kHangMs)) {
      socklen_t len = sizeof(error);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    }
    if (error != 0) {
      std::fprintf(stderr, "fuzz: connect: %s\n", std::strerror(error));
      __builtin_trap();
    }
  }
  return fd;
}

// A server that did not answer in time: says what the kernel knows of the connection at
// both ends (this end's TCP state and counters, and `ss` on the 4-tuple, the server's socket
// included), so a rare stall can be told apart — never accepted, data not read, FIN not
// acted on — and traps.
[[noreturn]] inline void report_hang(int fd, const char* what) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  sockaddr_in local{}, peer{};
  socklen_t local_len = sizeof(local), peer_len = sizeof(peer);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len);
  ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len);
  char from[INET_ADDRSTRLEN] = "?";
  ::inet_ntop(AF_INET, &local.sin_addr, from, sizeof(from));
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0) {
    std::fprintf(stderr,
                 "fuzz: %s: client %s:%u -> port %u: state %u, unacked %u, retransmits %u, "
                 "last data sent %u ms ago, last data received %u ms ago\n",
                 what, from, ntohs(local.sin_port), ntohs(peer.sin_port), info.tcpi_state,
                 info.tcpi_unacked, info.tcpi_total_retrans, info.tcpi_last_data_sent,
                 info.tcpi_last_data_recv);
  }
  const std::string command =
      "ss -tnio state all '( sport = :" + std::to_string(ntohs(local.sin_port)) +
      " or dport = :" + std::to_string(ntohs(local.sin_port)) + " )' 1>&2";
  [[maybe_unused]] int rc = std::system(command.c_str());
  __builtin_trap();
}

// False if the server closed the connection first (which is fine: it refused the input).
inline bool send_all(int fd, const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
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
    if (!wait_for(fd, POLLIN, kHangMs))
      report_hang(fd, "the server kept the connection open after the input ended");
    const ssize_t n = ::recv(fd, sink, sizeof(sink), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
  }
  ::close(fd);
}

}  // namespace gradwire::fuzz
