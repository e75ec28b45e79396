// TCPStoreServer: the server side of TCPStore, a libuv event loop on one thread.
//
// It holds the keys, answers requests in arrival order per connection, and serves waits
// itself: a get or wait on a missing key is parked on the loop and answered when the key
// appears or when the client's deadline (a loop timer) passes, so clients never poll.
// The protocol (docs/wire-format.md) is versioned and bounds every length; a client that
// sends garbage, a truncated frame or an oversized length is disconnected with a logged
// reason and everyone else keeps being served. Those log lines never hold up the loop:
// the first dropped connection of every 10 s is logged in full, the rest are summarised
// ("dropped 250 more connections in the last 10 s (the last: ...)"), and lines are
// written by a background thread, so a stderr nobody drains cannot stop the store.
//
// Authentication: with a shared secret (options.secret, else GRADWIRE_SECRET, else the
// file named by GRADWIRE_SECRET_FILE; at least 16 bytes) every client must complete a
// mutual HMAC-SHA256 challenge-response over fresh nonces before any request of it is
// parsed. The client proves first, so a stranger never receives a proof to test guesses
// against; a client without the secret, or with another one, is refused with
// "authentication failed" on both sides (the secret itself is never logged or sent).
// Without a secret anyone who can reach the port can read and write every key; the server
// says so once at start (info).
//
// Memory: everything a client can make the server hold is bounded by an option below. A
// request whose reply would exceed the frame limit, or that would pass a global limit
// (keys, stored bytes, parked waits), gets a typed refusal naming the limit (the client
// throws StoreError) and changes nothing. A client that does not read its replies is no
// longer read once its unsent replies pass unsent_high_water_bytes, and is dropped if it
// stays there for slow_client_timeout. Connections past max_connections are accepted,
// told why, and closed. An exception while handling a request (std::bad_alloc included)
// closes that request's connection only. Keys in logs and errors are escaped and cut
// (gradwire::printable).
//
// CPU: a request costs the loop in proportion to its own bytes, its reply and the waits it
// completes; list_keys is sized from a running total of the key bytes, so a listing past
// the frame limit is refused at the cost of the refusal, not of a walk over every key. A
// connection whose pipelined requests pass 256 KiB of request and reply bytes in one loop
// turn is not read again until the loop has polled every other connection, so one client's
// pipeline, however long, holds up the others for one such budget at a time.
//
// A TCPStore with is_master starts one of these in-process; the gradwire-store program
// runs one standalone. Destroying the server closes every client connection, so their
// pending calls fail at once with NetworkError.
//
// Journal: with options.journal, every change is appended to a file that a restarted
// server replays (keys, counters and appended values come back; parked waits do not).
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
#include <functional>
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
  // Waits parked by all clients together, and the bytes of the keys they name (a key named
  // several times in one request counts once). Past either, a wait is refused (StoreError).
  uint32_t max_parked_waits{1u << 18};
  uint64_t max_parked_bytes{uint64_t{256} << 20};
  // Client connections open at once; one more is accepted, told why and closed at once.
  uint32_t max_connections{16384};
  // Keys held, and the bytes of every key and value held together; a write past either is
  // refused (StoreError naming the limit) and changes nothing.
  uint64_t max_keys{1u << 20};
  uint64_t max_total_bytes{uint64_t{2} << 30};
  // Back-pressure: once a connection's replies not yet taken by the kernel exceed the high
  // water mark, the server stops reading its requests until they drain below half of it;
  // a connection that stays above it for slow_client_timeout is dropped. A single reply may
  // pass the mark (a reply is at most a frame); a connection whose unsent replies would
  // exceed the mark plus one frame (waits completing together) is dropped at once.
  uint64_t unsent_high_water_bytes{uint64_t{64} << 20};
  std::chrono::milliseconds slow_client_timeout{30'000};
  int listen_backlog{4096};
  // A connection that has not completed its handshake (HELLO, and with a secret AUTH)
  // within this is dropped: a client that stalls half-way holds nothing for long. > 0.
  std::chrono::milliseconds handshake_timeout{10'000};
  // The job's shared secret; empty: GRADWIRE_SECRET, else GRADWIRE_SECRET_FILE, else none.
  std::string secret{};
  // An append-only journal of every change (created if missing; never through a symbolic
  // link): a server started with the file of one that stopped or was killed has every key
  // back. Empty: none. Changes reach the file before their replies are sent; without
  // journal_fsync a killed process loses nothing, a machine that loses power may.
  // See docs/c10d.md.
  std::string journal{};
  // fsync the journal after each batch of changes, before their replies are sent.
  bool journal_fsync{false};
  // Changes the journal may hold that have not reached the file. While the journal cannot
  // be written (a full disk), or holds more than this, every write is refused (StoreError
  // naming journal_buffer_bytes) rather than kept in memory; reads go on.
  uint64_t journal_buffer_bytes{uint64_t{64} << 20};

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
  // Connections the server dropped so far: protocol violations, failed or unfinished
  // authentication, handshakes not completed in time, broken connections, clients that do
  // not read their replies, and connections refused past max_connections.
  uint64_t num_refused() const;
  // Whether clients must authenticate (a secret is set).
  bool authenticated() const;

  class Impl;
  friend struct TCPStoreServerTestPeer;

 private:
  std::unique_ptr<Impl> impl_;
};

// For tests only: runs `hook` on the loop thread before each request (after the handshake)
// is handled, with the request's opcode; an exception it throws is handled as one thrown by
// the request's handler (the connection is closed, the server goes on). Set it before any
// client connects.
struct TCPStoreServerTestPeer {
  static void set_request_hook(TCPStoreServer& server, std::function<void(uint8_t op)> hook);
};

}  // namespace gradwire::c10d
