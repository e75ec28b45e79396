// libFuzzer target: the TCPStore server's request parser, through a real server. Each input
// is sent on a fresh connection (its first byte picks: raw bytes, bytes after a valid HELLO,
// or raw bytes to a server that has a secret), the connection is half-closed, and the
// server must close it in turn: a server that crashes, or holds the connection open after
// the client's end of the stream (a hang), is a finding. Requests that parse change the
// store, so later inputs meet keys that exist.

#include <cstddef>
#include <cstdint>
#include <string>

#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/logging.h"
#include "loopback.h"

using namespace gradwire;

namespace {

std::string le32(uint32_t v) {
  std::string s(4, '\0');
  for (int i = 0; i < 4; ++i)
    s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// HELLO, protocol version 3, no secret.
std::string hello() {
  return le32(44) + std::string(1, '\x01') + le32(0) + le32(0x54535747) +
         std::string("\x03\x00\x00", 3) + std::string(32, 'n');
}

c10d::TCPStoreServer& server(bool secret) {
  static auto* plain =
      new c10d::TCPStoreServer(c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1"});
  static auto* authenticated = new c10d::TCPStoreServer(
      c10d::TCPStoreServerOptions{.bind_host = "127.0.0.1", .secret = "fuzz target secret"});
  return secret ? *authenticated : *plain;
}

void send_and_wait_for_close(uint16_t port, const std::string& bytes) {
  const int fd = fuzz::connect_loopback(port);
  fuzz::send_all(fd, bytes);
  fuzz::finish_and_wait_for_close(fd);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(LogLevel::kOff);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      send_and_wait_for_close(server(false).port(), rest);
      break;
    case 1:
      send_and_wait_for_close(server(false).port(), hello() + rest);
      break;
    default:
      send_and_wait_for_close(server(true).port(), rest);
      break;
  }
  return 0;
}
