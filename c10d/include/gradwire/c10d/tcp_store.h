// TCPStore: the Store of a job whose workers meet over TCP.
//
// One process (is_master) hosts the server, a libuv loop on one thread
// (TCPStoreServer); every TCPStore, the master's included, is a client with one TCP
// connection (TCP_NODELAY) to it. A standalone server is the gradwire-store program.
//
// Clients connect with retry and exponential back-off (10 ms to 1 s) until
// connect_timeout, so workers may start before the master. Calls from many threads share
// the connection: requests are tagged with ids and pipelined, so a thread blocked in get
// never holds up another thread's set. Waits are served by the server; the client adds
// `wait_grace` to its own deadline only to survive a server that stopped answering.
//
// set and multi_set are one-way, as in PyTorch 1.13: they return once the
// request is handed to the kernel. Requests from one client are applied in order, so any
// later call on the same store that returns a reply (get, add, check, wait, ...) has been
// preceded by the write, and so has anything another client learns from that reply. A
// write the server rejects (its size limits lower than this client's, or one of its global
// limits: max_keys, max_total_bytes, a journal that cannot be written) is reported by a
// later call, the first to start after the refusal was read (so at the latest the second
// call after the write), as StoreError naming the key or the limit.
//
// Limits: calls the server refuses by one of its limits (a reply over its frame limit, a
// wait past its parked-wait limits, a write past max_keys or max_total_bytes, a journal that
// cannot be written) throw StoreError naming the limit and its value; a server at its
// max_connections makes connecting retry until connect_timeout and then throw StoreError
// naming it (docs/c10d.md).
//
// Authentication: see TCPStoreOptions::secret (and docs/security.md).
//
// When the server goes away, every pending call fails with NetworkError naming
// host:port; the next call reconnects (retrying until connect_timeout), so a server
// restarted on the same port serves the same client objects again.
//
// Thread-safety: every method may be called concurrently from any thread.
// Errors: NetworkError naming host:port for connection failures; TimeoutError naming the
// missing keys; InvalidArgument for bad options (a secret shorter than 16 bytes included)
// and for keys or values over the limits; StoreError for errors and limits the server
// reports.
//
// Example:
//   TCPStore store(TCPStoreOptions{.host = "10.0.0.1", .port = 29500,
//                                  .is_master = rank == 0, .world_size = 8});
//   store.set("rank0/addr", my_address);
//   barrier(store, "init", 8, std::chrono::seconds(60));
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/c10d/store.h"

namespace gradwire::c10d {

class TCPStoreServer;

struct TCPStoreOptions {
  // Where the server is (the master connects to it too). Empty means "127.0.0.1".
  std::string host{};
  // Port of the server; with is_master, 0 picks a free one (see TCPStore::port()).
  uint16_t port{0};
  // Host the server in this process.
  bool is_master{false};
  // With is_master: listen on this address only (empty: every interface).
  std::string bind_host{};
  // With is_master: adopt this listening socket (see TCPStoreServerOptions::listen_fd).
  int listen_fd{-1};
  // Number of workers (clients) of the job, if known; with wait_for_workers the
  // constructor returns only once that many TCPStores have connected.
  int world_size{0};
  bool wait_for_workers{false};
  // Default timeout of the Store calls, and of wait_for_workers.
  std::chrono::milliseconds timeout{kDefaultStoreTimeout};
  // How long to keep retrying the connection (and each reconnection).
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(60)};
  // Extra time a client waits for the server's own timeout reply before giving up.
  std::chrono::milliseconds wait_grace{std::chrono::seconds(5)};
  uint32_t max_key_bytes{64 * 1024};
  uint32_t max_value_bytes{64u << 20};
  uint32_t max_keys_per_request{1u << 16};
  // The job's shared secret (with is_master, the server's too; at least 16 bytes); empty:
  // GRADWIRE_SECRET, else the file named by GRADWIRE_SECRET_FILE, else none. With a secret,
  // client and server prove to each other that they know it (HMAC-SHA256 over fresh nonces,
  // the client first) before any request is sent; a server or client without it, or with another,
  // fails the connection at once with NetworkError "... authentication failed: ..." (never retried,
  // never naming the secret).
  std::string secret{};

  void validate() const;
};

// A measurement of this process's clock against the store server's (TCPStore::probe_clock).
// offset_ns: the server's system clock (ns since the Unix epoch) minus this process's
// steady clock (trace::now_ns()) at the same instant, estimated as the server's reading
// minus the midpoint of the request's send and reply; add it to a steady reading to put
// that reading on the server's clock. The estimate is off by at most rtt_ns / 2.
struct ClockProbe {
  int64_t offset_ns{0};
  int64_t rtt_ns{0};    // round trip of the probe kept (the shortest)
  int samples{0};       // probes made
  std::string address;  // host:port of the server
};

class TCPStore : public Store {
 public:
  explicit TCPStore(TCPStoreOptions options);
  ~TCPStore() override;
  TCPStore(const TCPStore&) = delete;
  TCPStore& operator=(const TCPStore&) = delete;

  const std::string& host() const { return host_; }
  // The server's port (the real one when the master was asked for port 0).
  uint16_t port() const { return port_; }
  bool is_master() const { return server_ != nullptr; }
  // The in-process server, or null when this store is not the master.
  TCPStoreServer* server() const { return server_.get(); }

  // The server's system clock, in ns since the Unix epoch (one TIME request).
  // Errors: as any call (NetworkError, TimeoutError after the store's timeout).
  int64_t server_time_ns();
  // Reads the server's clock `samples` times (1 .. 1000, else InvalidArgument) and keeps
  // the reading with the shortest round trip (the one queueing disturbed least).
  ClockProbe probe_clock(int samples = 8);

  class Client;

 protected:
  void do_set(const std::string& key, const Bytes& value) override;
  Bytes do_get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t do_add(const std::string& key, int64_t delta) override;
  Bytes do_compare_set(const std::string& key, const Bytes& expected,
                       const Bytes& desired) override;
  void do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool do_check(const std::vector<std::string>& keys) override;
  bool do_delete_key(const std::string& key) override;
  int64_t do_num_keys() override;
  std::vector<Bytes> do_multi_get(const std::vector<std::string>& keys,
                                  std::chrono::milliseconds timeout) override;
  void do_multi_set(const std::vector<std::string>& keys,
                    const std::vector<Bytes>& values) override;
  void do_append(const std::string& key, const Bytes& value) override;
  std::vector<std::string> do_list_keys() override;

 private:
  TCPStoreOptions options_;
  std::string host_;
  uint16_t port_{0};
  std::unique_ptr<TCPStoreServer> server_;  // declared before client_: outlives it
  std::unique_ptr<Client> client_;
};

// When tracing is on (trace::enabled()) and `store` is a TCPStore, or a PrefixStore over
// one: probes its clock `samples` times and records the result as the trace files'
// otherData.clock_offset = {offset_ns, rtt_ns, store, samples} (trace::set_metadata), which
// gradwire-trace merge uses to put the workers' files on one time line. Returns whether it
// recorded one; a store of another kind, or a probe that fails, records nothing (the
// failure is logged, never thrown: tracing must not stop a job).
bool record_trace_clock_offset(const std::shared_ptr<Store>& store, int samples = 8);

}  // namespace gradwire::c10d
