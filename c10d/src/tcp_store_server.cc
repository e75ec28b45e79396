// TCPStoreServer: one libuv loop thread owns every key, connection and parked wait.
//
// Nothing here is shared with other threads except through the loop: the constructor
// sets everything up before the thread starts, and the destructor wakes the loop with an
// async handle that closes every handle, so no member needs a lock. Replies are appended
// to each connection's output buffer and flushed once at the end of the callback that
// produced them (uv_try_write first, a queued uv_write for what the kernel did not take),
// so a burst of requests, or a key that wakes many waiters, costs one write per client.
#include "gradwire/c10d/tcp_store_server.h"

#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <uv.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gradwire/core/auth.h"
#include "gradwire/core/background_log.h"
#include "gradwire/core/check.h"
#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "store_journal.h"
#include "tcp_protocol.h"

namespace gradwire::c10d {

namespace {

using proto::FrameReader;
using proto::FrameWriter;
using proto::Op;
using proto::Reply;

// Hash and equality that accept std::string_view, so lookups never copy the key.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

std::string uv_message(int status) {
  return std::string(uv_err_name(status)) + ": " + uv_strerror(status);
}

std::string format_address(const sockaddr_storage& addr) {
  char host[NI_MAXHOST] = "?";
  char port[NI_MAXSERV] = "?";
  getnameinfo(reinterpret_cast<const sockaddr*>(&addr), sizeof(addr), host, sizeof(host), port,
              sizeof(port), NI_NUMERICHOST | NI_NUMERICSERV);
  const bool v6 = addr.ss_family == AF_INET6;
  return (v6 ? "[" : "") + std::string(host) + (v6 ? "]:" : ":") + port;
}

// Parses a counter value: optional sign and decimal digits, nothing else.
bool parse_counter(std::string_view text, int64_t& out) {
  if (text.empty()) return false;
  const char* first = text.data();
  if (*first == '+') ++first;
  auto [ptr, ec] = std::from_chars(first, text.data() + text.size(), out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

}  // namespace

void TCPStoreServerOptions::validate() const {
  GRADWIRE_CHECK_ARG(max_key_bytes >= 1 && max_key_bytes <= (16u << 20))
      << "TCPStoreServerOptions.max_key_bytes = " << max_key_bytes
      << " is invalid: expected 1 .. 16 MiB";
  GRADWIRE_CHECK_ARG(max_value_bytes >= 1 && max_value_bytes <= (1u << 30))
      << "TCPStoreServerOptions.max_value_bytes = " << max_value_bytes
      << " is invalid: expected 1 .. 1 GiB";
  GRADWIRE_CHECK_ARG(max_keys_per_request >= 1)
      << "TCPStoreServerOptions.max_keys_per_request must be at least 1";
  GRADWIRE_CHECK_ARG(max_pending_waits_per_client >= 1)
      << "TCPStoreServerOptions.max_pending_waits_per_client must be at least 1";
  GRADWIRE_CHECK_ARG(listen_backlog >= 1)
      << "TCPStoreServerOptions.listen_backlog = " << listen_backlog << " must be positive";
  GRADWIRE_CHECK_ARG(handshake_timeout.count() > 0)
      << "TCPStoreServerOptions.handshake_timeout = " << handshake_timeout.count()
      << " ms must be positive";
}

class TCPStoreServer::Impl {
 public:
  explicit Impl(TCPStoreServerOptions options);
  ~Impl();

  uint16_t port() const { return port_; }
  int64_t num_clients() const { return num_clients_.load(std::memory_order_relaxed); }
  uint64_t num_refused() const { return num_refused_.load(std::memory_order_relaxed); }
  bool authenticated() const { return !secret_.empty(); }

 private:
  struct Connection;

  // A get, wait or multi_get parked until its keys exist or its deadline passes.
  struct Waiter {
    Connection* conn = nullptr;
    uint32_t id = 0;
    Op op = Op::kGet;
    std::vector<std::string> keys;
    size_t missing = 0;  // keys this waiter is still listed under in waiters_by_key_
    std::multimap<uint64_t, Waiter*>::iterator deadline_it;
  };

  struct Connection {
    uv_tcp_t handle;
    Impl* server;
    uint64_t serial;
    std::string peer;
    bool hello_done = false;   // the handshake (authentication included) is complete
    bool hello_seen = false;   // HELLO answered; with a secret, AUTH is due
    uint64_t accepted_ms = 0;  // loop time of the accept, for the handshake deadline
    std::string nonces;        // the client's and the server's, for the proofs
    bool closing = false;
    bool dirty = false;
    std::string in;   // an incomplete frame carried over between reads
    std::string out;  // replies not yet handed to the kernel
    std::unordered_set<Waiter*> waiters;
  };

  struct WriteRequest {
    uv_write_t req;
    std::string data;
  };

  // Loop callbacks (static trampolines into the loop thread's methods).
  static void on_connection(uv_stream_t* listener, int status);
  static void on_alloc(uv_handle_t* handle, size_t suggested, uv_buf_t* buf);
  static void on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf);
  static void on_write(uv_write_t* req, int status);
  static void on_timer(uv_timer_t* timer);
  static void on_stop(uv_async_t* async);
  static void on_log_timer(uv_timer_t* timer);
  static void on_handshake_timer(uv_timer_t* timer);

  void accept_one();
  void consume(Connection* c, const char* data, size_t size);
  // Handles one complete frame; false when the connection was closed.
  bool handle_frame(Connection* c, const uint8_t* frame, size_t size);
  bool handle_hello(Connection* c, uint8_t op, uint32_t id, FrameReader& r);
  bool handle_auth(Connection* c, uint8_t op, uint32_t id, FrameReader& r);
  std::string proof(std::string_view label, const std::string& nonces) const;
  bool handle_request(Connection* c, uint8_t op, uint32_t id, FrameReader& r);

  void set_key(std::string_view key, std::string_view value);
  void open_journal();
  StoreJournal::ForEach live_keys();
  void notify(std::string_view key);
  // Parks a waiter on the missing keys; false if the client has too many parked.
  bool park(Connection* c, uint32_t id, Op op, std::vector<std::string> keys, uint64_t timeout_ms);
  // Answers a waiter whose keys all (may) exist; re-parks it if one was deleted since.
  void complete(Waiter* w);
  void reply_values(Connection* c, uint32_t id, Op op, const std::vector<std::string>& keys);
  void remove_waiter(Waiter* w);
  void rearm_timer();

  FrameWriter reply(Connection* c, Reply kind, uint32_t id);
  void end_reply(Connection* c, FrameWriter& w);
  void reply_error(Connection* c, uint32_t id, ErrorKind kind, const std::string& message);
  void flush_dirty();
  void flush(Connection* c);
  // Logs why, sends a best-effort error frame, and closes the connection.
  // Drops `c`, telling it why; `refused`: an authentication failure (Reply::kRefused).
  void disconnect(Connection* c, const std::string& why, bool refused = false);
  void close_connection(Connection* c);

  std::string tag() const { return "[tcpstore :" + std::to_string(port_) + "] "; }

  TCPStoreServerOptions options_;
  std::string secret_;
  BackgroundLog log_;
  std::unique_ptr<StoreJournal> journal_;
  bool journal_failing_ = false;
  EventSummary drops_{std::chrono::seconds(10)};
  uv_timer_t log_timer_{};
  uv_timer_t handshake_timer_{};  // runs while some connection is in its handshake
  std::atomic<uint64_t> num_refused_{0};
  uint64_t frame_limit_;
  uv_loop_t loop_{};
  uv_tcp_t listener_{};
  uv_timer_t timer_{};
  uv_async_t stop_{};
  uint16_t port_ = 0;
  std::thread thread_;
  std::atomic<int64_t> num_clients_{0};
  uint64_t next_serial_ = 1;
  bool stopping_ = false;

  std::unordered_map<std::string, std::string, StringHash, StringEq> data_;
  std::unordered_map<std::string, std::vector<Waiter*>, StringHash, StringEq> waiters_by_key_;
  std::multimap<uint64_t, Waiter*> deadlines_;
  std::unordered_set<Connection*> connections_;
  std::vector<Connection*> dirty_;
  char read_buffer_[64 * 1024];
};

TCPStoreServer::Impl::Impl(TCPStoreServerOptions options)
    : options_(std::move(options)),
      frame_limit_(proto::frame_limit(options_.max_key_bytes, options_.max_value_bytes)) {
  options_.validate();
  secret_ = resolve_secret(options_.secret);
  if (!options_.journal.empty()) open_journal();
  int rc = uv_loop_init(&loop_);
  if (rc != 0) GRADWIRE_THROW(StoreError) << "TCPStoreServer: uv_loop_init: " << uv_message(rc);
  uv_tcp_init(&loop_, &listener_);
  listener_.data = this;
  uv_timer_init(&loop_, &timer_);
  timer_.data = this;
  uv_timer_init(&loop_, &log_timer_);
  log_timer_.data = this;
  uv_timer_init(&loop_, &handshake_timer_);
  handshake_timer_.data = this;
  uv_async_init(&loop_, &stop_, &Impl::on_stop);
  stop_.data = this;

  // On failure the handles are closed and the loop run until they are, then closed.
  auto fail = [&](const std::string& what) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&log_timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&handshake_timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&stop_), nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
    uv_loop_close(&loop_);
    GRADWIRE_THROW(NetworkError) << "TCPStoreServer: " << what;
  };

  std::string where;
  if (options_.listen_fd >= 0) {
    where = "listen fd " + std::to_string(options_.listen_fd);
    rc = uv_tcp_open(&listener_, options_.listen_fd);
    if (rc != 0) fail("cannot adopt " + where + ": " + uv_message(rc));
  } else {
    const std::string port_text = std::to_string(options_.port);
    std::vector<std::string> hosts;
    if (options_.bind_host.empty()) {
      hosts = {"::", "0.0.0.0"};  // dual-stack where IPv6 exists, IPv4 otherwise
    } else {
      hosts = {options_.bind_host};
    }
    std::string errors;
    bool bound = false;
    for (const std::string& host : hosts) {
      addrinfo hints{};
      hints.ai_family = AF_UNSPEC;
      hints.ai_socktype = SOCK_STREAM;
      hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
      addrinfo* res = nullptr;
      const int gai = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &res);
      if (gai != 0) {
        errors += " " + host + ": " + gai_strerror(gai) + ";";
        continue;
      }
      for (addrinfo* ai = res; ai != nullptr && !bound; ai = ai->ai_next) {
        rc = uv_tcp_bind(&listener_, ai->ai_addr, 0);
        if (rc == 0) {
          // libuv reports some bind errors only at listen time.
          rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), options_.listen_backlog,
                         &Impl::on_connection);
        }
        if (rc == 0) {
          bound = true;
        } else {
          errors += " " + host + ":" + port_text + ": " + uv_message(rc) + ";";
          // A failed bind leaves the handle unusable for another address family.
          uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
          uv_run(&loop_, UV_RUN_NOWAIT);
          uv_tcp_init(&loop_, &listener_);
          listener_.data = this;
        }
      }
      freeaddrinfo(res);
      if (bound) break;
    }
    where = (options_.bind_host.empty() ? std::string("*") : options_.bind_host) + ":" + port_text;
    if (!bound) fail("cannot listen on " + where + ":" + errors);
  }
  if (options_.listen_fd >= 0) {
    rc = uv_listen(reinterpret_cast<uv_stream_t*>(&listener_), options_.listen_backlog,
                   &Impl::on_connection);
    if (rc != 0) fail("cannot listen on " + where + ": " + uv_message(rc));
  }
  sockaddr_storage addr{};
  int len = sizeof(addr);
  uv_tcp_getsockname(&listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  GRADWIRE_LOG(kInfo) << tag() << "listening (" << where << ")";
  if (secret_.empty()) {
    GRADWIRE_LOG(kInfo) << tag()
                        << "no secret is set (TCPStoreServerOptions::secret, GRADWIRE_SECRET or "
                           "GRADWIRE_SECRET_FILE): anyone who can reach this port can read and "
                           "write every key";
  }
  thread_ = std::thread([this] {
    // libuv writes with write(), which raises SIGPIPE when a client has gone; the default
    // action would kill the whole process. Blocked in this thread only (the disposition
    // is the application's), the signal stays pending here and write() returns EPIPE.
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    uv_run(&loop_, UV_RUN_DEFAULT);
  });
}

TCPStoreServer::Impl::~Impl() {
  uv_async_send(&stop_);
  thread_.join();
  const int rc = uv_loop_close(&loop_);
  GRADWIRE_CHECK(rc == 0) << "TCPStoreServer: loop still had handles at close: " << uv_message(rc);
}

void TCPStoreServer::Impl::on_stop(uv_async_t* async) {
  Impl* self = static_cast<Impl*>(async->data);
  self->stopping_ = true;
  std::vector<Connection*> conns(self->connections_.begin(), self->connections_.end());
  for (Connection* c : conns)
    self->close_connection(c);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->listener_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->log_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->handshake_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->stop_), nullptr);
  if (auto line = self->drops_.summarise("connections")) {
    self->log_.log(LogLevel::kWarning, self->tag() + "dropped " + *line);
  }
  GRADWIRE_LOG(kInfo) << self->tag() << "stopped; closed " << conns.size() << " connection(s)";
}

void TCPStoreServer::Impl::on_connection(uv_stream_t* listener, int status) {
  Impl* self = static_cast<Impl*>(listener->data);
  if (status < 0) {
    GRADWIRE_LOG(kWarning) << self->tag() << "accept failed: " << uv_message(status);
    return;
  }
  self->accept_one();
}

void TCPStoreServer::Impl::accept_one() {
  auto* c = new Connection();
  c->server = this;
  c->serial = next_serial_++;
  uv_tcp_init(&loop_, &c->handle);
  c->handle.data = c;
  const int rc = uv_accept(reinterpret_cast<uv_stream_t*>(&listener_),
                           reinterpret_cast<uv_stream_t*>(&c->handle));
  if (rc != 0) {
    GRADWIRE_LOG(kWarning) << tag() << "accept failed: " << uv_message(rc);
    uv_close(reinterpret_cast<uv_handle_t*>(&c->handle),
             [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
    return;
  }
  uv_tcp_nodelay(&c->handle, 1);
  sockaddr_storage addr{};
  int len = sizeof(addr);
  if (uv_tcp_getpeername(&c->handle, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    c->peer = format_address(addr);
  } else {
    c->peer = "?";
  }
  connections_.insert(c);
  num_clients_.fetch_add(1, std::memory_order_relaxed);
  c->accepted_ms = uv_now(&loop_);
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&handshake_timer_)) == 0) {
    // Checked a few times per timeout; the deadline is never early, at most a period late.
    const uint64_t period =
        std::max<uint64_t>(static_cast<uint64_t>(options_.handshake_timeout.count()) / 4, 1);
    uv_timer_start(&handshake_timer_, &Impl::on_handshake_timer, period, period);
  }
  GRADWIRE_LOG(kDebug) << tag() << "client " << c->serial << " (" << c->peer << ") connected";
  uv_read_start(reinterpret_cast<uv_stream_t*>(&c->handle), &Impl::on_alloc, &Impl::on_read);
}

void TCPStoreServer::Impl::on_alloc(uv_handle_t* handle, size_t, uv_buf_t* buf) {
  Impl* self = static_cast<Connection*>(handle->data)->server;
  // One buffer serves every read: reads are handled to completion inside on_read.
  buf->base = self->read_buffer_;
  buf->len = sizeof(self->read_buffer_);
}

void TCPStoreServer::Impl::on_read(uv_stream_t* stream, ssize_t nread, const uv_buf_t* buf) {
  auto* c = static_cast<Connection*>(stream->data);
  Impl* self = c->server;
  if (c->closing) return;
  if (nread < 0) {
    if (nread == UV_EOF && c->hello_seen && !c->hello_done) {
      // A client that finds the server's proof wrong leaves without its own.
      self->disconnect(c,
                       "authentication failed: the client left without proving that it "
                       "knows this store's secret (it may hold another one)",
                       /*refused=*/true);
    } else if (nread == UV_EOF && c->in.empty()) {
      GRADWIRE_LOG(kDebug) << self->tag() << "client " << c->serial << " (" << c->peer
                           << ") disconnected";
      self->close_connection(c);
    } else if (nread == UV_EOF) {
      self->disconnect(c, "connection closed in the middle of a frame (" +
                              std::to_string(c->in.size()) + " bytes received)");
    } else {
      self->disconnect(c, "read failed: " + uv_message(static_cast<int>(nread)));
    }
  } else if (nread > 0) {
    self->consume(c, buf->base, static_cast<size_t>(nread));
  }
  self->flush_dirty();
}

void TCPStoreServer::Impl::consume(Connection* c, const char* data, size_t size) {
  // Frames are parsed straight from the read buffer; only a partial frame at the end is
  // copied, into c->in, to be completed by the next read.
  const char* p = data;
  size_t avail = size;
  bool carried = !c->in.empty();
  if (carried) {
    c->in.append(data, size);
    p = c->in.data();
    avail = c->in.size();
  }
  size_t used = 0;
  while (avail - used >= proto::kLengthBytes) {
    const auto* frame = reinterpret_cast<const uint8_t*>(p + used);
    const uint32_t len = proto::load_u32(frame);
    const uint64_t limit = c->hello_done ? frame_limit_ : proto::kMaxHandshakeFrame;
    if (len < proto::kMinFrame || len > limit) {
      disconnect(c, "frame length " + std::to_string(len) + " outside [" +
                        std::to_string(proto::kMinFrame) + ", " + std::to_string(limit) + "]" +
                        (c->hello_done ? "" : " before the handshake"));
      return;
    }
    if (avail - used < proto::kLengthBytes + len) break;
    if (!handle_frame(c, frame + proto::kLengthBytes, len)) return;
    used += proto::kLengthBytes + len;
  }
  if (carried) {
    c->in.erase(0, used);
  } else if (used < avail) {
    c->in.assign(p + used, avail - used);
  }
}

bool TCPStoreServer::Impl::handle_frame(Connection* c, const uint8_t* frame, size_t size) {
  FrameReader r(frame, size);
  const uint8_t op = r.u8();
  const uint32_t id = r.u32();
  if (!c->hello_done) {
    return c->hello_seen ? handle_auth(c, op, id, r) : handle_hello(c, op, id, r);
  }
  return handle_request(c, op, id, r);
}

std::string TCPStoreServer::Impl::proof(std::string_view label, const std::string& nonces) const {
  const Digest256 mac = hmac_sha256(secret_, std::string(label) + nonces);
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

bool TCPStoreServer::Impl::handle_auth(Connection* c, uint8_t op, uint32_t id, FrameReader& r) {
  const std::string_view got = r.raw(proto::kProofBytes, "client proof");
  if (op != static_cast<uint8_t>(Op::kAuth) || !r.done()) {
    disconnect(c,
               "authentication failed: expected the client's proof, got " +
                   (op == static_cast<uint8_t>(Op::kAuth) ? std::string("a malformed one")
                                                          : std::string("another request")),
               /*refused=*/true);
    return false;
  }
  const std::string want = proof(proto::kClientProofLabel, c->nonces);
  if (!constant_time_equal(want.data(), got.data(), want.size())) {
    disconnect(c, "authentication failed: the client does not know this store's secret",
               /*refused=*/true);
    return false;
  }
  c->hello_done = true;
  c->nonces.clear();
  FrameWriter w = reply(c, Reply::kOk, id);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_hello(Connection* c, uint8_t op, uint32_t id, FrameReader& r) {
  const uint32_t magic = r.u32();
  const uint16_t version = r.u16();
  if (op != static_cast<uint8_t>(Op::kHello) || magic != proto::kMagic) {
    disconnect(c, "not a gradwire TCPStore client (bad handshake" +
                      (r.ok() ? std::string() : ": " + r.error()) + ")");
    return false;
  }
  if (version != proto::kVersion) {
    disconnect(c, "unsupported protocol version " + std::to_string(version) +
                      " (this server speaks version " + std::to_string(proto::kVersion) + ")");
    return false;
  }
  const uint8_t flags = r.u8();
  const std::string_view client_nonce = r.raw(proto::kNonceBytes, "client nonce");
  if (!r.done() || (flags & ~proto::kFlagSecret) != 0) {
    disconnect(c, "not a gradwire TCPStore client (bad handshake" +
                      (r.ok() ? std::string(": unknown flags") : ": " + r.error()) + ")");
    return false;
  }
  const bool client_secret = (flags & proto::kFlagSecret) != 0;
  if (client_secret != !secret_.empty()) {
    disconnect(c,
               client_secret ? "authentication failed: the client has a secret and this "
                               "store has none"
                             : "authentication failed: this store requires a shared secret "
                               "and the client has none",
               /*refused=*/true);
    return false;
  }
  const std::string server_nonce = random_bytes(proto::kNonceBytes);
  c->hello_seen = true;
  FrameWriter w = reply(c, Reply::kHelloOk, id);
  w.u16(proto::kVersion);
  w.u32(options_.max_key_bytes);
  w.u32(options_.max_value_bytes);
  w.u32(options_.max_keys_per_request);
  w.u32(static_cast<uint32_t>(frame_limit_));
  w.u8(secret_.empty() ? 0 : proto::kFlagSecret);
  w.raw(server_nonce);
  if (secret_.empty()) {
    c->hello_done = true;
  } else {
    c->nonces = std::string(client_nonce) + server_nonce;
    w.raw(proof(proto::kServerProofLabel, c->nonces));
  }
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_request(Connection* c, uint8_t op, uint32_t id, FrameReader& r) {
  const uint32_t max_key = options_.max_key_bytes;
  const uint32_t max_value = options_.max_value_bytes;
  const uint32_t max_keys = options_.max_keys_per_request;
  // A request that does not decode is a protocol violation: the client is dropped.
  auto bad = [&](const char* what) {
    disconnect(c, std::string("malformed ") + what + " request " + std::to_string(id) + ": " +
                      (r.ok() ? std::string("trailing bytes") : r.error()));
    return false;
  };
  auto read_keys = [&]() {
    std::vector<std::string> keys;
    const uint32_t n = r.count(max_keys, 4, "keys");
    keys.reserve(n);
    for (uint32_t i = 0; i < n && r.ok(); ++i)
      keys.emplace_back(r.bytes(max_key, "key"));
    return keys;
  };

  switch (static_cast<Op>(op)) {
    case Op::kSet: {
      const std::string_view key = r.bytes(max_key, "key");
      const std::string_view value = r.bytes(max_value, "value");
      if (!r.done()) return bad("set");
      set_key(key, value);
      return true;
    }
    case Op::kGet: {
      std::string key(r.bytes(max_key, "key"));
      const uint64_t timeout_ms = r.u64();
      if (!r.done()) return bad("get");
      auto it = data_.find(key);
      if (it != data_.end()) {
        FrameWriter w = reply(c, Reply::kValue, id);
        w.str(it->second);
        end_reply(c, w);
        return true;
      }
      std::vector<std::string> keys;
      keys.push_back(std::move(key));
      if (!park(c, id, Op::kGet, std::move(keys), timeout_ms)) return false;
      return true;
    }
    case Op::kAdd: {
      const std::string_view key = r.bytes(max_key, "key");
      const int64_t delta = r.i64();
      if (!r.done()) return bad("add");
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !parse_counter(it->second, current)) {
        reply_error(c, id, ErrorKind::kStore,
                    "add: the value of key '" + std::string(key) + "' is not an integer");
        return true;
      }
      int64_t result = 0;
      if (__builtin_add_overflow(current, delta, &result)) {
        reply_error(c, id, ErrorKind::kStore,
                    "add: counter '" + std::string(key) + "' would overflow int64");
        return true;
      }
      char text[24];
      auto [end, ec] = std::to_chars(text, text + sizeof(text), result);
      set_key(key, std::string_view(text, static_cast<size_t>(end - text)));
      FrameWriter w = reply(c, Reply::kInt, id);
      w.i64(result);
      end_reply(c, w);
      return true;
    }
    case Op::kCompareSet: {
      const std::string_view key = r.bytes(max_key, "key");
      const std::string_view expected = r.bytes(max_value, "expected value");
      const std::string_view desired = r.bytes(max_value, "desired value");
      if (!r.done()) return bad("compare_set");
      auto it = data_.find(key);
      bool exists = it != data_.end();
      if ((!exists && expected.empty()) || (exists && it->second == expected)) {
        set_key(key, desired);
        exists = true;
        it = data_.find(key);
      }
      FrameWriter w = reply(c, Reply::kValue, id);
      w.str(exists ? std::string_view(it->second) : std::string_view());
      end_reply(c, w);
      return true;
    }
    case Op::kWait:
    case Op::kMultiGet: {
      std::vector<std::string> keys = read_keys();
      const uint64_t timeout_ms = r.u64();
      const bool is_wait = static_cast<Op>(op) == Op::kWait;
      if (!r.done()) return bad(is_wait ? "wait" : "multi_get");
      bool all = true;
      for (const std::string& k : keys) {
        if (data_.find(k) == data_.end()) {
          all = false;
          break;
        }
      }
      if (all) {
        reply_values(c, id, static_cast<Op>(op), keys);
        return true;
      }
      return park(c, id, static_cast<Op>(op), std::move(keys), timeout_ms);
    }
    case Op::kCheck: {
      const std::vector<std::string> keys = read_keys();
      if (!r.done()) return bad("check");
      bool all = true;
      for (const std::string& k : keys)
        all = all && data_.find(k) != data_.end();
      FrameWriter w = reply(c, Reply::kBool, id);
      w.u8(all ? 1 : 0);
      end_reply(c, w);
      return true;
    }
    case Op::kDelete: {
      const std::string_view key = r.bytes(max_key, "key");
      if (!r.done()) return bad("delete_key");
      auto it = data_.find(key);
      const bool existed = it != data_.end();
      if (existed) {
        if (journal_) journal_->record(StoreJournal::Kind::kDelete, key);
        data_.erase(it);
      }
      FrameWriter w = reply(c, Reply::kBool, id);
      w.u8(existed ? 1 : 0);
      end_reply(c, w);
      return true;
    }
    case Op::kNumKeys: {
      if (!r.done()) return bad("num_keys");
      FrameWriter w = reply(c, Reply::kInt, id);
      w.i64(static_cast<int64_t>(data_.size()));
      end_reply(c, w);
      return true;
    }
    case Op::kMultiSet: {
      const uint32_t n = r.count(max_keys, 8, "multi_set entries");
      std::vector<std::pair<std::string_view, std::string_view>> entries;
      entries.reserve(n);
      for (uint32_t i = 0; i < n && r.ok(); ++i) {
        const std::string_view key = r.bytes(max_key, "key");
        const std::string_view value = r.bytes(max_value, "value");
        entries.emplace_back(key, value);
      }
      // Validated completely before anything is applied, so a bad request changes nothing.
      if (!r.done()) return bad("multi_set");
      for (const auto& [key, value] : entries)
        set_key(key, value);
      return true;
    }
    case Op::kAppend: {
      const std::string_view key = r.bytes(max_key, "key");
      const std::string_view value = r.bytes(max_value, "value");
      if (!r.done()) return bad("append");
      auto it = data_.find(key);
      const size_t current = it == data_.end() ? 0 : it->second.size();
      if (current + value.size() > max_value) {
        reply_error(c, id, ErrorKind::kInvalidArgument,
                    "append: the value of key '" + std::string(key) + "' would grow to " +
                        std::to_string(current + value.size()) + " bytes, over the limit of " +
                        std::to_string(max_value));
        return true;
      }
      if (it == data_.end()) {
        set_key(key, value);
      } else {
        if (journal_) journal_->record(StoreJournal::Kind::kAppend, key, value);
        it->second.append(value);
        notify(key);
      }
      FrameWriter w = reply(c, Reply::kOk, id);
      end_reply(c, w);
      return true;
    }
    case Op::kListKeys: {
      if (!r.done()) return bad("list_keys");
      FrameWriter w = reply(c, Reply::kKeys, id);
      w.u32(static_cast<uint32_t>(data_.size()));
      for (const auto& entry : data_)
        w.str(entry.first);
      end_reply(c, w);
      return true;
    }
    case Op::kHello:
      disconnect(c, "second handshake on one connection");
      return false;
    case Op::kAuth:
      disconnect(c, "authentication outside the handshake");
      return false;
  }
  disconnect(c, "unknown opcode " + std::to_string(op) + " in request " + std::to_string(id));
  return false;
}

StoreJournal::ForEach TCPStoreServer::Impl::live_keys() {
  return [this](const StoreJournal::Visit& visit) {
    for (const auto& [key, value] : data_)
      visit(key, value);
  };
}

void TCPStoreServer::Impl::open_journal() {
  journal_ = std::make_unique<StoreJournal>(
      options_.journal,
      [this](StoreJournal::Kind kind, std::string_view key, std::string_view value) {
        switch (kind) {
          case StoreJournal::Kind::kSet:
            data_[std::string(key)] = std::string(value);
            break;
          case StoreJournal::Kind::kAppend:
            data_[std::string(key)].append(value);
            break;
          case StoreJournal::Kind::kDelete:
            data_.erase(std::string(key));
            break;
        }
      },
      live_keys());
  if (!journal_->torn_tail().empty()) {
    GRADWIRE_LOG(kWarning) << "TCPStoreServer: journal '" << options_.journal
                           << "': dropped an incomplete last record (" << journal_->torn_tail()
                           << "), the end of a write the previous server did not finish";
  }
  GRADWIRE_LOG(kInfo) << "TCPStoreServer: journal '" << options_.journal
                      << "': " << journal_->records_replayed() << " records replayed, "
                      << data_.size() << " keys";
}

void TCPStoreServer::Impl::set_key(std::string_view key, std::string_view value) {
  if (journal_) journal_->record(StoreJournal::Kind::kSet, key, value);
  auto it = data_.find(key);
  if (it == data_.end()) {
    data_.emplace(std::string(key), std::string(value));
    notify(key);
  } else {
    it->second.assign(value.data(), value.size());
  }
}

void TCPStoreServer::Impl::notify(std::string_view key) {
  // Waiters are listed only under keys that were missing when they parked, so a key that
  // already existed has none and this lookup is the whole cost of a plain set.
  if (waiters_by_key_.empty()) return;
  auto it = waiters_by_key_.find(key);
  if (it == waiters_by_key_.end()) return;
  std::vector<Waiter*> woken = std::move(it->second);
  waiters_by_key_.erase(it);
  for (Waiter* w : woken) {
    if (--w->missing == 0) complete(w);
  }
  rearm_timer();
}

bool TCPStoreServer::Impl::park(Connection* c, uint32_t id, Op op, std::vector<std::string> keys,
                                uint64_t timeout_ms) {
  if (c->waiters.size() >= options_.max_pending_waits_per_client) {
    disconnect(c, "more than " + std::to_string(options_.max_pending_waits_per_client) +
                      " waits parked by one client");
    return false;
  }
  auto* w = new Waiter();
  w->conn = c;
  w->id = id;
  w->op = op;
  w->keys = std::move(keys);
  for (const std::string& k : w->keys) {
    if (data_.find(k) == data_.end()) {
      auto& list = waiters_by_key_[k];
      // A key named twice in one request is listed once.
      if (list.empty() || list.back() != w) {
        list.push_back(w);
        ++w->missing;
      }
    }
  }
  // Loop time is cached per iteration and truncated to whole milliseconds: refresh it and
  // add one, so a wait never ends before its timeout. Clamped against overflow (~35 years).
  uv_update_time(&loop_);
  const uint64_t deadline = uv_now(&loop_) + std::min<uint64_t>(timeout_ms, uint64_t{1} << 40) + 1;
  w->deadline_it = deadlines_.emplace(deadline, w);
  c->waiters.insert(w);
  rearm_timer();
  return true;
}

void TCPStoreServer::Impl::complete(Waiter* w) {
  // A key can be deleted between its arrival and the arrival of the waiter's last key:
  // then the waiter goes back to waiting for it (a wait, though, has seen every key).
  if (w->op != Op::kWait) {
    for (const std::string& k : w->keys) {
      if (data_.find(k) == data_.end()) {
        auto& list = waiters_by_key_[k];
        if (list.empty() || list.back() != w) {
          list.push_back(w);
          ++w->missing;
        }
      }
    }
    if (w->missing > 0) return;
  }
  reply_values(w->conn, w->id, w->op, w->keys);
  remove_waiter(w);
}

void TCPStoreServer::Impl::reply_values(Connection* c, uint32_t id, Op op,
                                        const std::vector<std::string>& keys) {
  if (op == Op::kWait) {
    FrameWriter w = reply(c, Reply::kOk, id);
    end_reply(c, w);
    return;
  }
  FrameWriter w = reply(c, op == Op::kGet ? Reply::kValue : Reply::kValues, id);
  if (op == Op::kMultiGet) w.u32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys)
    w.str(data_.find(k)->second);
  end_reply(c, w);
}

void TCPStoreServer::Impl::remove_waiter(Waiter* w) {
  if (w->missing > 0) {
    for (const std::string& k : w->keys) {
      auto it = waiters_by_key_.find(k);
      if (it == waiters_by_key_.end()) continue;
      auto& list = it->second;
      list.erase(std::remove(list.begin(), list.end(), w), list.end());
      if (list.empty()) waiters_by_key_.erase(it);
    }
  }
  deadlines_.erase(w->deadline_it);
  w->conn->waiters.erase(w);
  delete w;
}

void TCPStoreServer::Impl::rearm_timer() {
  if (stopping_) return;
  if (deadlines_.empty()) {
    uv_timer_stop(&timer_);
    return;
  }
  const uint64_t now = uv_now(&loop_);
  const uint64_t first = deadlines_.begin()->first;
  uv_timer_start(&timer_, &Impl::on_timer, first > now ? first - now : 0, 0);
}

void TCPStoreServer::Impl::on_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  const uint64_t now = uv_now(&self->loop_);
  while (!self->deadlines_.empty() && self->deadlines_.begin()->first <= now) {
    Waiter* w = self->deadlines_.begin()->second;
    FrameWriter fw = self->reply(w->conn, Reply::kTimeout, w->id);
    std::vector<std::string_view> missing;
    for (const std::string& k : w->keys) {
      if (self->data_.find(k) == self->data_.end()) missing.push_back(k);
    }
    fw.u32(static_cast<uint32_t>(missing.size()));
    for (std::string_view k : missing)
      fw.str(k);
    self->end_reply(w->conn, fw);
    self->remove_waiter(w);
  }
  self->rearm_timer();
  self->flush_dirty();
}

FrameWriter TCPStoreServer::Impl::reply(Connection* c, Reply kind, uint32_t id) {
  FrameWriter w(c->out);
  w.begin(static_cast<uint8_t>(kind), id);
  return w;
}

void TCPStoreServer::Impl::end_reply(Connection* c, FrameWriter& w) {
  w.end();
  if (!c->dirty) {
    c->dirty = true;
    dirty_.push_back(c);
  }
}

void TCPStoreServer::Impl::reply_error(Connection* c, uint32_t id, ErrorKind kind,
                                       const std::string& message) {
  FrameWriter w = reply(c, Reply::kError, id);
  w.u8(static_cast<uint8_t>(kind));
  w.str(message);
  end_reply(c, w);
}

void TCPStoreServer::Impl::flush_dirty() {
  // The changes of this loop turn reach the journal before any reply about them leaves.
  if (journal_ && journal_->pending()) {
    std::string error;
    if (journal_->flush(live_keys(), &error)) {
      if (journal_failing_) {
        log_.log(LogLevel::kWarning, tag() + "journal '" + options_.journal + "' is written again");
      }
      journal_failing_ = false;
    } else if (!journal_failing_) {
      // Kept in memory and retried on the next change; said once per failing stretch.
      journal_failing_ = true;
      log_.log(LogLevel::kError, tag() + "writing the journal '" + options_.journal + "' failed: " +
                                     error + "; changes are kept and written once it works again");
    }
  }
  // Connections closed during this callback are still allocated (handles are freed in
  // close callbacks, which run after this one), and flush() skips them.
  for (Connection* c : dirty_) {
    c->dirty = false;
    flush(c);
  }
  dirty_.clear();
}

void TCPStoreServer::Impl::flush(Connection* c) {
  if (c->closing || c->out.empty()) return;
  auto* stream = reinterpret_cast<uv_stream_t*>(&c->handle);
  size_t sent = 0;
  // uv_try_write refuses (UV_EAGAIN) while earlier writes are queued, keeping order.
  uv_buf_t buf = uv_buf_init(c->out.data(), static_cast<unsigned>(c->out.size()));
  const int rc = uv_try_write(stream, &buf, 1);
  if (rc > 0) {
    sent = static_cast<size_t>(rc);
  } else if (rc != UV_EAGAIN) {
    c->out.clear();
    disconnect(c, "write failed: " + uv_message(rc));
    return;
  }
  if (sent == c->out.size()) {
    c->out.clear();
    return;
  }
  auto* req = new WriteRequest();
  req->data.assign(c->out, sent);
  c->out.clear();
  req->req.data = c;
  uv_buf_t rest = uv_buf_init(req->data.data(), static_cast<unsigned>(req->data.size()));
  const int wrc = uv_write(&req->req, stream, &rest, 1, &Impl::on_write);
  if (wrc != 0) {
    delete req;
    disconnect(c, "write failed: " + uv_message(wrc));
  }
}

void TCPStoreServer::Impl::on_write(uv_write_t* req, int status) {
  auto* wr = reinterpret_cast<WriteRequest*>(req);
  auto* c = static_cast<Connection*>(req->data);
  delete wr;
  if (status < 0 && status != UV_ECANCELED && !c->closing) {
    Impl* self = c->server;
    self->disconnect(c, "write failed: " + uv_message(status));
    self->flush_dirty();
  }
}

void TCPStoreServer::Impl::disconnect(Connection* c, const std::string& why, bool refused) {
  if (c->closing) return;
  num_refused_.fetch_add(1, std::memory_order_relaxed);
  const std::string what = "client " + std::to_string(c->serial) + " (" + c->peer + "): " + why;
  if (drops_.note(what)) {
    log_.log(LogLevel::kWarning,
             tag() + "dropping " + what + " (further drops are summarised every 10 s)");
  } else if (!stopping_ && uv_is_active(reinterpret_cast<uv_handle_t*>(&log_timer_)) == 0) {
    const auto wait =
        std::chrono::ceil<std::chrono::milliseconds>(drops_.due() - EventSummary::Clock::now());
    uv_timer_start(&log_timer_, &Impl::on_log_timer,
                   static_cast<uint64_t>(std::max<int64_t>(wait.count(), 0)), 0);
  }
  // Best effort: tell the client why before closing (ignored if the kernel will not take it).
  std::string frame;
  FrameWriter w(frame);
  w.begin(static_cast<uint8_t>(refused ? Reply::kRefused : Reply::kError), 0);
  if (!refused) w.u8(static_cast<uint8_t>(ErrorKind::kStore));
  w.str("server dropped the connection: " + why);
  w.end();
  uv_buf_t buf = uv_buf_init(frame.data(), static_cast<unsigned>(frame.size()));
  uv_try_write(reinterpret_cast<uv_stream_t*>(&c->handle), &buf, 1);
  close_connection(c);
}

void TCPStoreServer::Impl::on_handshake_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  const uint64_t now = uv_now(&self->loop_);
  const auto limit = static_cast<uint64_t>(self->options_.handshake_timeout.count());
  std::vector<Connection*> late;
  bool waiting = false;
  for (Connection* c : self->connections_) {
    if (c->hello_done || c->closing) continue;
    if (now - c->accepted_ms >= limit) {
      late.push_back(c);
    } else {
      waiting = true;
    }
  }
  for (Connection* c : late) {
    self->disconnect(c, "did not complete the handshake within " + std::to_string(limit) + " ms" +
                            (c->hello_seen ? " (no proof of the secret)" : ""));
  }
  if (!waiting) uv_timer_stop(&self->handshake_timer_);
  self->flush_dirty();
}

void TCPStoreServer::Impl::on_log_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  if (auto line = self->drops_.summarise("connections")) {
    self->log_.log(LogLevel::kWarning, self->tag() + "dropped " + *line);
  }
}

void TCPStoreServer::Impl::close_connection(Connection* c) {
  if (c->closing) return;
  c->closing = true;
  while (!c->waiters.empty())
    remove_waiter(*c->waiters.begin());
  connections_.erase(c);
  num_clients_.fetch_sub(1, std::memory_order_relaxed);
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  uv_close(reinterpret_cast<uv_handle_t*>(&c->handle),
           [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
  rearm_timer();
}

TCPStoreServer::TCPStoreServer(TCPStoreServerOptions options)
    : impl_(std::make_unique<Impl>(std::move(options))) {}

TCPStoreServer::~TCPStoreServer() = default;

uint16_t TCPStoreServer::port() const {
  return impl_->port();
}

int64_t TCPStoreServer::num_clients() const {
  return impl_->num_clients();
}

uint64_t TCPStoreServer::num_refused() const {
  return impl_->num_refused();
}

bool TCPStoreServer::authenticated() const {
  return impl_->authenticated();
}

}  // namespace gradwire::c10d
