// TCPStoreServer: the server side of TCPStore, a libuv event loop on one thread.
//
// It holds the keys, answers requests in arrival order per connection, and serves waits
// itself: a get or wait on a missing key is parked on the loop and answered when the key
// appears or when the client's deadline (a loop timer) passes, so clients never poll.
// The protocol (docs/wire-format.md) is versioned and bounds every length; a client that
// sends garbage, a truncated frame or an oversized length is disconnected with a logged
// reason (GRADWIRE_LOG_LEVEL=warning shows it) and everyone else keeps being served.
//
// A TCPStore with is_master starts one of these in-process; the gradwire-store program
// runs one standalone. Destroying the server closes every client connection, so their
// pending calls fail at once with NetworkError.
//
// Thread-safety: port() and the destructor may be called from any thread; the loop runs
// on its own thread and shares no state with callers.
// Errors: construction throws NetworkError naming the address when it cannot bind or
// listen, InvalidArgument for bad options.
//
// Example:
//   TCPStoreServer server(TCPStoreServerOptions{.port = 0});
//   std::printf("listening on %u\n", server.port());
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace gradwire::c10d {

struct TCPStoreServerOptions {
  // Address to listen on; empty means every interface (IPv6 and IPv4 when available).
  std::string bind_host{};
  // 0 picks a free port; port() reports it.
  uint16_t port{0};
  // Adopt this already listening (or bound) socket instead of binding; the server owns
  // it from then on. Lets a launcher bind port 0 before forking workers.
  int listen_fd{-1};
  uint32_t max_key_bytes{64 * 1024};
  uint32_t max_value_bytes{64u << 20};
  // Keys in one multi_get / multi_set / wait / check request.
  uint32_t max_keys_per_request{1u << 16};
  // Waits (get/wait/multi_get on missing keys) one connection may have parked at once.
  uint32_t max_pending_waits_per_client{1u << 16};
  int listen_backlog{4096};

  void validate() const;
};

class TCPStoreServer {
 public:
  explicit TCPStoreServer(TCPStoreServerOptions options);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;

  // The port the server listens on (the real one when options.port was 0).
  uint16_t port() const;

  // Number of client connections open now (counted on the loop; a snapshot).
  int64_t num_clients() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradwire::c10d
