#include "pingpong.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

#include "bench.h"
#include "gradwire/c10d/store.h"

namespace gradwire::bench {
namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    throw std::runtime_error(std::string("ping-pong baseline: ") + what + ": " +
                             std::strerror(errno));
  }
}

void no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

int listen_for_echo(c10d::Store& store) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  check(listener >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "bind");
  check(::listen(listener, 1) == 0, "listen");
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  store.set("echo_port", std::to_string(ntohs(addr.sin_port)));
  return listener;
}

void serve_echo(int listener) {
  const int fd = ::accept(listener, nullptr, nullptr);
  check(fd >= 0, "accept");
  no_delay(fd);
  char byte = 0;
  while (::read(fd, &byte, 1) == 1) {
    if (::write(fd, &byte, 1) != 1) break;
  }
  ::close(fd);
  ::close(listener);
}

std::vector<double> ping_pong(c10d::Store& store, int count, int warmup) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  check(fd >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(store.get_string("echo_port"))));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "connect");
  no_delay(fd);
  std::vector<double> times;
  times.reserve(static_cast<size_t>(count));
  char byte = 'x';
  for (int i = 0; i < warmup + count; ++i) {
    const double t = time_once([&] {
      check(::write(fd, &byte, 1) == 1, "write");
      check(::read(fd, &byte, 1) == 1, "read");
    });
    if (i >= warmup) times.push_back(t);
  }
  ::close(fd);
  return times;
}

}  // namespace gradwire::bench
