#include "pingpong.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

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

int listen_for_echo(c10d::Store& store, const std::string& key) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  check(listener >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  check(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0, "bind");
  check(::listen(listener, 1) == 0, "listen");
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  store.set(key, std::to_string(ntohs(addr.sin_port)));
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

void serve_echo_handoff(int listener) {
  const int fd = ::accept(listener, nullptr, nullptr);
  check(fd >= 0, "accept");
  no_delay(fd);
  std::mutex mutex;
  std::condition_variable ready;
  bool have = false;
  bool closed = false;
  char pending = 0;
  std::thread writer([&] {
    for (;;) {
      std::unique_lock lock(mutex);
      ready.wait(lock, [&] { return have || closed; });
      if (!have) return;
      const char byte = pending;
      have = false;
      lock.unlock();
      if (::send(fd, &byte, 1, MSG_NOSIGNAL) != 1) return;
    }
  });
  char byte = 0;
  for (;;) {
    const ssize_t got = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (got == 1) {
      {
        const std::lock_guard lock(mutex);
        pending = byte;
        have = true;
      }
      ready.notify_one();
    } else if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      ::sched_yield();
    } else {
      break;  // closed by the client (or failed): the round trips are over
    }
  }
  {
    const std::lock_guard lock(mutex);
    closed = true;
  }
  ready.notify_one();
  writer.join();
  ::close(fd);
  ::close(listener);
}

std::vector<double> ping_pong(c10d::Store& store, int count, int warmup, const std::string& key) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  check(fd >= 0, "socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(std::stoi(store.get_string(key))));
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
