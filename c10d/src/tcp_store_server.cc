// TCPStoreServer: one libuv loop thread owns every key, connection and parked wait.
//
// Nothing here is shared with other threads except through the loop: the constructor
// sets everything up before the thread starts, and the destructor wakes the loop with an
// async handle that closes every handle, so no member needs a lock. Replies are appended
// to each connection's output buffer and flushed once at the end of the callback that
// produced them (uv_try_write first, a queued uv_write for what the kernel did not take),
// so a burst of requests, or a key that wakes many waiters, costs one write per client.
//
// Memory accounting: stored_bytes_ is the key and value bytes in data_, parked_bytes_ the
// key bytes of parked waiters, and each connection counts its unsent replies (out plus the
// bytes of its queued uv_writes). Every reply's size is known before it is built, so a
// reply past the frame limit is refused instead of built. A connection past the high water
// mark is not read, and the frames already read but not handled wait in its `in` buffer
// (at most one read plus one partial frame) until its replies drain.
//
// CPU: a request costs in proportion to its own bytes, its reply and the waits it completes
// (list_keys sizes its reply from key_bytes_, a running total, instead of summing every
// key), and each request is charged its bytes, its reply's and kRequestWork to its
// connection's budget for the loop turn (kTurnWork). A connection that spends its budget is
// not read for the rest of the turn: the frames it sent stay in its `in` buffer, as under
// back-pressure, and it is served again once the loop has polled every other connection
// (turn_check_ resumes it after the next poll; the idle handle turn_idle_ keeps that poll
// from blocking meanwhile). So a pipeline of any length holds the loop for one budget at a
// time.
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
#include <optional>
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
#include "gradwire/core/printable.h"
#include "store_journal.h"
#include "tcp_protocol.h"

namespace gradwire::c10d {

namespace {

using proto::FrameReader;
using proto::FrameWriter;
using proto::Limit;
using proto::Op;
using proto::Reply;

// Bytes of a frame's header: length, opcode, request id.
constexpr uint64_t kFrameHeader = proto::kLengthBytes + proto::kMinFrame;

// The work one connection's requests may do in one loop turn, in bytes of request and
// reply, each request also counting kRequestWork (a stream of tiny requests is work too).
// Past it the connection waits for the next turn.
constexpr uint64_t kTurnWork = 256 * 1024;
constexpr uint64_t kRequestWork = 64;

// A key quoted for a log line or an error message.
std::string quoted(std::string_view key) {
  return "'" + printable(key) + "'";
}

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
  GRADWIRE_CHECK_ARG(max_parked_waits >= 1)
      << "TCPStoreServerOptions.max_parked_waits must be at least 1";
  GRADWIRE_CHECK_ARG(max_parked_bytes >= 1)
      << "TCPStoreServerOptions.max_parked_bytes must be at least 1";
  GRADWIRE_CHECK_ARG(max_connections >= 1)
      << "TCPStoreServerOptions.max_connections must be at least 1";
  GRADWIRE_CHECK_ARG(max_keys >= 1) << "TCPStoreServerOptions.max_keys must be at least 1";
  GRADWIRE_CHECK_ARG(max_total_bytes >= 1)
      << "TCPStoreServerOptions.max_total_bytes must be at least 1";
  GRADWIRE_CHECK_ARG(unsent_high_water_bytes >= 2)
      << "TCPStoreServerOptions.unsent_high_water_bytes = " << unsent_high_water_bytes
      << " must be at least 2";
  GRADWIRE_CHECK_ARG(slow_client_timeout.count() > 0)
      << "TCPStoreServerOptions.slow_client_timeout = " << slow_client_timeout.count()
      << " ms must be positive";
  GRADWIRE_CHECK_ARG(journal_buffer_bytes >= 1)
      << "TCPStoreServerOptions.journal_buffer_bytes must be at least 1";
}

class TCPStoreServer::Impl {
 public:
  explicit Impl(TCPStoreServerOptions options);
  ~Impl();

  uint16_t port() const { return port_; }
  int64_t num_clients() const { return num_clients_.load(std::memory_order_relaxed); }
  uint64_t num_refused() const { return num_refused_.load(std::memory_order_relaxed); }
  bool authenticated() const { return !secret_.empty(); }
  void set_request_hook(std::function<void(uint8_t)> hook) { request_hook_ = std::move(hook); }

 private:
  struct Connection;

  // The keys of a multi-key request, each distinct key once: `keys[order[i]]` is the i-th
  // key named. A request naming one key 65,536 times holds it once.
  struct KeyList {
    std::vector<std::string> keys;
    std::vector<uint32_t> order;
    uint64_t bytes() const {
      uint64_t n = order.size() * sizeof(uint32_t);
      for (const std::string& k : keys)
        n += k.size();
      return n;
    }
  };

  // A get, wait or multi_get parked until its keys exist or its deadline passes.
  struct Waiter {
    Connection* conn = nullptr;
    uint32_t id = 0;
    Op op = Op::kGet;
    KeyList keys;
    uint64_t bytes = 0;  // counted in parked_bytes_
    size_t missing = 0;  // distinct keys this waiter is listed under in waiters_by_key_
    std::multimap<uint64_t, Waiter*>::iterator deadline_it;
  };

  struct Connection {
    uv_tcp_t handle;
    Impl* server;
    uint64_t serial;
    std::string peer;
    bool hello_done = false;       // the handshake (authentication included) is complete
    bool hello_seen = false;       // HELLO answered; with a secret, AUTH is due
    uint64_t accepted_ms = 0;      // loop time of the accept, for the handshake deadline
    proto::Transcript transcript;  // what the proofs sign (with a secret)
    bool closing = false;
    bool dirty = false;
    bool paused = false;     // not read: too many unsent replies (back-pressure)
    uint64_t paused_ms = 0;  // loop time when it was paused
    bool yielded = false;    // not read: its work budget of the turn is spent
    uint64_t yield_at = 0;   // the turn it yielded in
    uint64_t work_at = 0;    // the turn `work` is charged to
    uint64_t work = 0;       // request and reply bytes (and kRequestWork each) in that turn
    std::string in;          // frames read but not handled yet (a partial one at least)
    std::string out;         // replies not yet handed to the kernel
    uint64_t queued = 0;     // bytes in uv_write requests not completed yet
    std::unordered_set<Waiter*> waiters;
    uint64_t unsent() const { return out.size() + queued; }
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
  static void on_slow_timer(uv_timer_t* timer);
  static void on_turn_check(uv_check_t* check);

  void accept_one();
  // Refuses a connection past max_connections: tells it why and closes it.
  void refuse_connection(Connection* c);
  void consume(Connection* c, const char* data, size_t size);
  // Handles one complete frame; false when the connection was closed. Exceptions of the
  // handlers are caught here: they close this connection only.
  bool handle_frame(Connection* c, const uint8_t* frame, size_t size);
  bool handle_hello(Connection* c, uint8_t op, uint32_t id, FrameReader& r);
  bool handle_auth(Connection* c, uint8_t op, uint32_t id, FrameReader& r);
  std::string proof(std::string_view label, const proto::Transcript& t) const;
  bool handle_request(Connection* c, uint8_t op, uint32_t id, FrameReader& r);

  // Writes: refused (a kLimit reply, true) when the change would pass max_keys or
  // max_total_bytes, or while the journal cannot take it.
  bool refuse_write(Connection* c, uint32_t id, const char* what, uint64_t new_keys,
                    int64_t added_bytes);
  int64_t set_growth(std::string_view key, std::string_view value) const;
  void set_key(std::string_view key, std::string_view value);
  void append_key(std::string_view key, std::string_view value);
  void erase_key(std::string_view key);
  void open_journal();
  StoreJournal::ForEach live_keys();
  void notify(std::string_view key);
  // Parks a waiter on the missing keys; false (after a refusal) if a limit forbids it.
  bool park(Connection* c, uint32_t id, Op op, KeyList keys, uint64_t timeout_ms);
  // Answers a waiter whose keys all (may) exist; re-parks it if one was deleted since.
  void complete(Waiter* w);
  void reply_values(Connection* c, uint32_t id, Op op, const KeyList& keys);
  void remove_waiter(Waiter* w);
  void rearm_timer();

  // Before a reply of `payload` bytes: refuses it with a kLimit reply naming the frame
  // limit when it is over (false), and drops the connection when its unsent replies would
  // pass the high water mark plus a frame (false; `c` is closing then).
  bool room_for(Connection* c, uint32_t id, uint64_t payload);
  FrameWriter reply(Connection* c, Reply kind, uint32_t id);
  void end_reply(Connection* c, FrameWriter& w);
  void reply_error(Connection* c, uint32_t id, ErrorKind kind, const std::string& message);
  void reply_limit(Connection* c, uint32_t id, Limit limit, uint64_t value,
                   const std::string& message);
  // Back-pressure: stop reading `c`, and read it again (handling the frames it holds).
  void pause(Connection* c);
  void resume(Connection* c);
  // Charges the work of one request to `c`'s turn; past kTurnWork `c` yields: it is not
  // read again before the loop has polled the other connections.
  void charge(Connection* c, uint64_t work);
  // Reads `c` again when neither back-pressure nor its turn budget holds it, handling the
  // frames it holds first (which may hold it again).
  void read_again(Connection* c);
  void flush_dirty();
  void flush(Connection* c);
  // Drops `c`, telling it why (best effort) and logging it (summarised); `refused`: a final
  // refusal of the handshake (Reply::kRefused); `limit`: a limit closed it (Reply::kLimit).
  void disconnect(Connection* c, const std::string& why, bool refused = false,
                  std::optional<Limit> limit = std::nullopt);
  // Closes `c`; `reset`: abortively (RST), so that replies the peer never read do not stay
  // in the kernel's buffers after it.
  void close_connection(Connection* c, bool reset = false);

  std::string tag() const { return "[tcpstore :" + std::to_string(port_) + "] "; }

  TCPStoreServerOptions options_;
  std::string secret_;
  BackgroundLog log_;
  std::unique_ptr<StoreJournal> journal_;
  bool journal_failing_ = false;
  EventSummary drops_{std::chrono::seconds(10)};
  uv_timer_t log_timer_{};
  uv_timer_t handshake_timer_{};               // runs while some connection is in its handshake
  uv_timer_t slow_timer_{};                    // runs while some connection is paused
  std::function<void(uint8_t)> request_hook_;  // tests only
  uint64_t stored_bytes_ = 0;                  // key and value bytes in data_
  uint64_t key_bytes_ = 0;                     // key bytes in data_ (list_keys' reply size)
  uint64_t parked_bytes_ = 0;                  // KeyList::bytes() of every parked waiter
  size_t parked_ = 0;                          // parked waiters
  std::unordered_set<Connection*> paused_;
  std::unordered_set<Waiter*>* completing_ = nullptr;  // see notify()
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
  // The waiters listed under each missing key (each waiter once per distinct key), so that
  // removing a waiter costs its distinct keys.
  std::unordered_map<std::string, std::unordered_set<Waiter*>, StringHash, StringEq>
      waiters_by_key_;
  std::multimap<uint64_t, Waiter*> deadlines_;
  std::unordered_set<Connection*> connections_;
  std::vector<Connection*> dirty_;
  // A turn runs from one check callback (after a poll) to the next, so it holds one poll.
  uv_check_t turn_check_{};  // ends the turn; resumes the connections that yielded before it
  uv_idle_t turn_idle_{};    // active while some connection yielded: the poll does not block
  uint64_t turn_ = 1;
  std::vector<Connection*> yielded_;  // connections waiting for a later turn
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
  uv_timer_init(&loop_, &slow_timer_);
  slow_timer_.data = this;
  uv_check_init(&loop_, &turn_check_);
  turn_check_.data = this;
  uv_check_start(&turn_check_, &Impl::on_turn_check);
  uv_idle_init(&loop_, &turn_idle_);
  turn_idle_.data = this;
  uv_async_init(&loop_, &stop_, &Impl::on_stop);
  stop_.data = this;

  // On failure the handles are closed and the loop run until they are, then closed.
  auto fail = [&](const std::string& what) {
    uv_close(reinterpret_cast<uv_handle_t*>(&listener_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&log_timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&handshake_timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&slow_timer_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&turn_check_), nullptr);
    uv_close(reinterpret_cast<uv_handle_t*>(&turn_idle_), nullptr);
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
  uv_close(reinterpret_cast<uv_handle_t*>(&self->slow_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->turn_check_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&self->turn_idle_), nullptr);
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
  if (connections_.size() >= options_.max_connections) {
    refuse_connection(c);
    return;
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

void TCPStoreServer::Impl::refuse_connection(Connection* c) {
  num_refused_.fetch_add(1, std::memory_order_relaxed);
  const std::string why = "refused client " + std::to_string(c->serial) + " (" + c->peer +
                          "): " + std::to_string(connections_.size()) +
                          " connections are open, the limit (max_connections)";
  if (drops_.note(why)) {
    log_.log(LogLevel::kWarning, tag() + why + " (further drops are summarised every 10 s)");
  }
  // What the client sent so far is read and dropped, so that closing sends an orderly end
  // of stream rather than a reset that could overtake the reply.
  uv_os_fd_t fd = -1;
  if (uv_fileno(reinterpret_cast<uv_handle_t*>(&c->handle), &fd) == 0) {
    char scratch[256];
    for (int i = 0; i < 16 && ::recv(fd, scratch, sizeof(scratch), MSG_DONTWAIT) > 0; ++i) {
    }
  }
  std::string frame;
  FrameWriter w(frame);
  w.begin(static_cast<uint8_t>(Reply::kLimit), 0);
  w.u8(static_cast<uint8_t>(Limit::kConnections));
  w.u64(options_.max_connections);
  w.str("the store has " + std::to_string(connections_.size()) +
        " connections open, its limit max_connections = " +
        std::to_string(options_.max_connections) + "; try again later");
  w.end();
  uv_buf_t buf = uv_buf_init(frame.data(), static_cast<unsigned>(frame.size()));
  uv_try_write(reinterpret_cast<uv_stream_t*>(&c->handle), &buf, 1);
  c->closing = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&c->handle),
           [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); });
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
      self->disconnect(c,
                       "authentication failed: the client left without proving that it "
                       "knows this store's secret",
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
  // Frames are parsed straight from the read buffer; only what is left when the loop stops
  // (a partial frame, or the rest of the read when the connection was paused) is copied,
  // into c->in, to be handled by the next read or when the connection resumes.
  const char* p = data;
  size_t avail = size;
  bool carried = !c->in.empty();
  if (carried) {
    if (size > 0) c->in.append(data, size);
    p = c->in.data();
    avail = c->in.size();
  }
  size_t used = 0;
  while (!c->paused && !c->yielded && avail - used >= proto::kLengthBytes) {
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
    const size_t replied = c->out.size();
    if (!handle_frame(c, frame + proto::kLengthBytes, len) || c->closing) return;
    used += proto::kLengthBytes + len;
    charge(c, kRequestWork + proto::kLengthBytes + len +
                  (c->out.size() > replied ? c->out.size() - replied : 0));
  }
  if (carried) {
    c->in.erase(0, used);
    if (c->in.empty() && c->in.capacity() > (size_t{1} << 20)) c->in.shrink_to_fit();
  } else if (used < avail) {
    c->in.assign(p + used, avail - used);
  }
}

bool TCPStoreServer::Impl::handle_frame(Connection* c, const uint8_t* frame, size_t size) {
  FrameReader r(frame, size);
  const uint8_t op = r.u8();
  const uint32_t id = r.u32();
  try {
    if (!c->hello_done) {
      return c->hello_seen ? handle_auth(c, op, id, r) : handle_hello(c, op, id, r);
    }
    if (request_hook_) request_hook_(op);
    return handle_request(c, op, id, r);
  } catch (const std::bad_alloc&) {
    // Whatever this request had built for its reply goes with the connection.
    disconnect(c, std::string("out of memory while handling ") +
                      (c->hello_done ? "request " + std::to_string(id) : "the handshake"));
  } catch (const std::exception& e) {
    disconnect(c,
               std::string("internal error while handling ") +
                   (c->hello_done ? "request " + std::to_string(id) : "the handshake") + ": " +
                   e.what(),
               /*refused=*/!c->hello_done);
  }
  return false;
}

std::string TCPStoreServer::Impl::proof(std::string_view label, const proto::Transcript& t) const {
  // hmac_sha256 throws on a failure of the library: the caller's handler refuses the client.
  const Digest256 mac = hmac_sha256(secret_, proto::transcript(label, t));
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
  // The client proves first; a wrong proof is refused without the server's, so whoever
  // does not know the secret learns nothing to test guesses against.
  const std::string want = proof(proto::kClientProofLabel, c->transcript);
  if (!constant_time_equal(want.data(), got.data(), want.size())) {
    disconnect(c, "authentication failed: the client does not know this store's secret",
               /*refused=*/true);
    return false;
  }
  const std::string server_proof = proof(proto::kServerProofLabel, c->transcript);
  c->hello_done = true;
  c->transcript = {};
  FrameWriter w = reply(c, Reply::kOk, id);
  w.raw(server_proof);
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
    // Final: a client of another version cannot succeed by trying again.
    disconnect(c,
               "unsupported protocol version " + std::to_string(version) +
                   " (this server speaks version " + std::to_string(proto::kVersion) +
                   "; client and server must come from the same gradwire release)",
               /*refused=*/true);
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
  proto::Transcript t;
  t.client_flags = flags;
  t.server_flags = secret_.empty() ? 0 : proto::kFlagSecret;
  t.client_nonce = std::string(client_nonce);
  t.server_nonce = random_bytes(proto::kNonceBytes);
  t.max_key = options_.max_key_bytes;
  t.max_value = options_.max_value_bytes;
  t.max_keys = options_.max_keys_per_request;
  t.max_frame = static_cast<uint32_t>(frame_limit_);
  c->hello_seen = true;
  FrameWriter w = reply(c, Reply::kHelloOk, id);
  w.u16(proto::kVersion);
  w.u32(t.max_key);
  w.u32(t.max_value);
  w.u32(t.max_keys);
  w.u32(t.max_frame);
  w.u8(t.server_flags);
  w.raw(t.server_nonce);
  end_reply(c, w);
  if (secret_.empty()) {
    c->hello_done = true;
  } else {
    c->transcript = std::move(t);
  }
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
  // The keys of a multi-key request, each distinct one once (views into the frame until
  // they are copied into the list).
  auto read_keys = [&]() {
    KeyList list;
    const uint32_t n = r.count(max_keys, 4, "keys");
    list.order.reserve(n);
    std::unordered_map<std::string_view, uint32_t> index;
    for (uint32_t i = 0; i < n && r.ok(); ++i) {
      const std::string_view key = r.bytes(max_key, "key");
      auto [it, added] = index.emplace(key, static_cast<uint32_t>(list.keys.size()));
      if (added) list.keys.emplace_back(key);
      list.order.push_back(it->second);
    }
    return list;
  };
  auto all_exist = [&](const KeyList& list) {
    for (const std::string& k : list.keys) {
      if (data_.find(k) == data_.end()) return false;
    }
    return true;
  };

  switch (static_cast<Op>(op)) {
    case Op::kSet: {
      const std::string_view key = r.bytes(max_key, "key");
      const std::string_view value = r.bytes(max_value, "value");
      if (!r.done()) return bad("set");
      const bool exists = data_.find(key) != data_.end();
      if (refuse_write(c, id, "set", exists ? 0 : 1, set_growth(key, value))) return true;
      set_key(key, value);
      return true;
    }
    case Op::kGet: {
      const std::string_view key = r.bytes(max_key, "key");
      const uint64_t timeout_ms = r.u64();
      if (!r.done()) return bad("get");
      auto it = data_.find(key);
      if (it != data_.end()) {
        if (!room_for(c, id, 4 + uint64_t{it->second.size()})) return !c->closing;
        FrameWriter w = reply(c, Reply::kValue, id);
        w.str(it->second);
        end_reply(c, w);
        return true;
      }
      KeyList list;
      list.keys.emplace_back(key);
      list.order.push_back(0);
      park(c, id, Op::kGet, std::move(list), timeout_ms);
      return !c->closing;
    }
    case Op::kAdd: {
      const std::string_view key = r.bytes(max_key, "key");
      const int64_t delta = r.i64();
      if (!r.done()) return bad("add");
      int64_t current = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !parse_counter(it->second, current)) {
        reply_error(c, id, ErrorKind::kStore,
                    "add: the value of key " + quoted(key) + " is not an integer");
        return true;
      }
      int64_t result = 0;
      if (__builtin_add_overflow(current, delta, &result)) {
        reply_error(c, id, ErrorKind::kStore,
                    "add: counter " + quoted(key) + " would overflow int64");
        return true;
      }
      char text[24];
      auto [end, ec] = std::to_chars(text, text + sizeof(text), result);
      const std::string_view value(text, static_cast<size_t>(end - text));
      if (refuse_write(c, id, "add", it == data_.end() ? 1 : 0, set_growth(key, value))) {
        return true;
      }
      set_key(key, value);
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
        if (refuse_write(c, id, "compare_set", exists ? 0 : 1, set_growth(key, desired))) {
          return true;
        }
        set_key(key, desired);
        exists = true;
        it = data_.find(key);
      }
      const std::string_view current = exists ? std::string_view(it->second) : std::string_view();
      if (!room_for(c, id, 4 + uint64_t{current.size()})) return !c->closing;
      FrameWriter w = reply(c, Reply::kValue, id);
      w.str(current);
      end_reply(c, w);
      return true;
    }
    case Op::kWait:
    case Op::kMultiGet: {
      KeyList keys = read_keys();
      const uint64_t timeout_ms = r.u64();
      const bool is_wait = static_cast<Op>(op) == Op::kWait;
      if (!r.done()) return bad(is_wait ? "wait" : "multi_get");
      if (all_exist(keys)) {
        reply_values(c, id, static_cast<Op>(op), keys);
        return !c->closing;
      }
      park(c, id, static_cast<Op>(op), std::move(keys), timeout_ms);
      return !c->closing;
    }
    case Op::kCheck: {
      const KeyList keys = read_keys();
      if (!r.done()) return bad("check");
      FrameWriter w = reply(c, Reply::kBool, id);
      w.u8(all_exist(keys) ? 1 : 0);
      end_reply(c, w);
      return true;
    }
    case Op::kDelete: {
      const std::string_view key = r.bytes(max_key, "key");
      if (!r.done()) return bad("delete_key");
      const bool existed = data_.find(key) != data_.end();
      // A delete frees memory, so it is refused only while the journal cannot record it.
      if (existed && refuse_write(c, id, "delete_key", 0, 0)) return true;
      if (existed) erase_key(key);
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
      // The request's effect on the limits: the last value of each key wins.
      std::unordered_map<std::string_view, std::string_view> last;
      for (const auto& [key, value] : entries)
        last[key] = value;
      uint64_t new_keys = 0;
      int64_t growth = 0;
      for (const auto& [key, value] : last) {
        if (data_.find(key) == data_.end()) ++new_keys;
        growth += set_growth(key, value);
      }
      if (refuse_write(c, id, "multi_set", new_keys, growth)) return true;
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
                    "append: the value of key " + quoted(key) + " would grow to " +
                        std::to_string(current + value.size()) + " bytes, over the limit of " +
                        std::to_string(max_value));
        return true;
      }
      const bool exists = it != data_.end();
      const int64_t growth =
          static_cast<int64_t>(value.size()) + (exists ? 0 : static_cast<int64_t>(key.size()));
      if (refuse_write(c, id, "append", exists ? 0 : 1, growth)) return true;
      if (!exists) {
        set_key(key, value);
      } else {
        append_key(key, value);
      }
      FrameWriter w = reply(c, Reply::kOk, id);
      end_reply(c, w);
      return true;
    }
    case Op::kListKeys: {
      if (!r.done()) return bad("list_keys");
      // Sized from the running totals: a listing past the frame limit is refused at the
      // cost of its refusal, not of a walk over every key.
      const uint64_t payload = 4 + 4 * uint64_t{data_.size()} + key_bytes_;
      if (!room_for(c, id, payload)) return !c->closing;
      FrameWriter w = reply(c, Reply::kKeys, id);
      w.u32(static_cast<uint32_t>(data_.size()));
      for (const auto& entry : data_)
        w.str(entry.first);
      end_reply(c, w);
      return true;
    }
    case Op::kTime: {
      // No payload, a fixed-size answer: the clock read as the request is handled, for
      // clients measuring their offset to it (TCPStore::probe_clock).
      if (!r.done()) return bad("time");
      FrameWriter w = reply(c, Reply::kInt, id);
      w.i64(std::chrono::duration_cast<std::chrono::nanoseconds>(
                std::chrono::system_clock::now().time_since_epoch())
                .count());
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
        auto it = data_.find(key);
        switch (kind) {
          case StoreJournal::Kind::kSet:
            stored_bytes_ += static_cast<uint64_t>(set_growth(key, value));
            if (it == data_.end()) {
              key_bytes_ += key.size();
              data_.emplace(std::string(key), std::string(value));
            } else {
              it->second.assign(value.data(), value.size());
            }
            break;
          case StoreJournal::Kind::kAppend:
            stored_bytes_ += value.size() + (it == data_.end() ? key.size() : 0);
            if (it == data_.end()) {
              key_bytes_ += key.size();
              data_.emplace(std::string(key), std::string(value));
            } else {
              it->second.append(value);
            }
            break;
          case StoreJournal::Kind::kDelete:
            if (it != data_.end()) {
              stored_bytes_ -= it->first.size() + it->second.size();
              key_bytes_ -= it->first.size();
              data_.erase(it);
            }
            break;
        }
      },
      live_keys(), options_.journal_fsync);
  if (!journal_->torn_tail().empty()) {
    GRADWIRE_LOG(kWarning) << "TCPStoreServer: journal '" << options_.journal
                           << "': dropped an incomplete last record (" << journal_->torn_tail()
                           << "), the end of a write the previous server did not finish";
  }
  GRADWIRE_LOG(kInfo) << "TCPStoreServer: journal '" << options_.journal
                      << "': " << journal_->records_replayed() << " records replayed, "
                      << data_.size() << " keys";
  if (data_.size() > options_.max_keys || stored_bytes_ > options_.max_total_bytes) {
    GRADWIRE_LOG(kWarning) << "TCPStoreServer: journal '" << options_.journal
                           << "' holds more than this server's limits (" << data_.size()
                           << " keys, " << stored_bytes_
                           << " bytes; max_keys = " << options_.max_keys
                           << ", max_total_bytes = " << options_.max_total_bytes
                           << "): every key is kept, and writes that add to them are refused";
  }
}

int64_t TCPStoreServer::Impl::set_growth(std::string_view key, std::string_view value) const {
  auto it = data_.find(key);
  if (it == data_.end()) return static_cast<int64_t>(key.size() + value.size());
  return static_cast<int64_t>(value.size()) - static_cast<int64_t>(it->second.size());
}

bool TCPStoreServer::Impl::refuse_write(Connection* c, uint32_t id, const char* what,
                                        uint64_t new_keys, int64_t added_bytes) {
  if (journal_ && (journal_failing_ || journal_->buffered() > options_.journal_buffer_bytes)) {
    reply_limit(c, id, Limit::kJournal, options_.journal_buffer_bytes,
                std::string(what) + " refused: the store's journal '" + options_.journal + "' " +
                    (journal_failing_ ? std::string("cannot be written")
                                      : "holds " + std::to_string(journal_->buffered()) +
                                            " bytes not yet written, over its limit "
                                            "journal_buffer_bytes = " +
                                            std::to_string(options_.journal_buffer_bytes)) +
                    "; writes are refused until it is written again");
    return true;
  }
  if (new_keys > 0 && data_.size() + new_keys > options_.max_keys) {
    reply_limit(c, id, Limit::kKeys, options_.max_keys,
                std::string(what) + " refused: the store holds " + std::to_string(data_.size()) +
                    " keys, its limit max_keys = " + std::to_string(options_.max_keys));
    return true;
  }
  if (added_bytes > 0 &&
      stored_bytes_ + static_cast<uint64_t>(added_bytes) > options_.max_total_bytes) {
    reply_limit(
        c, id, Limit::kTotalBytes, options_.max_total_bytes,
        std::string(what) + " refused: the store holds " + std::to_string(stored_bytes_) +
            " bytes of keys and values and this would add " + std::to_string(added_bytes) +
            ", over its limit max_total_bytes = " + std::to_string(options_.max_total_bytes));
    return true;
  }
  return false;
}

void TCPStoreServer::Impl::set_key(std::string_view key, std::string_view value) {
  if (journal_) journal_->record(StoreJournal::Kind::kSet, key, value);
  stored_bytes_ += static_cast<uint64_t>(set_growth(key, value));
  auto it = data_.find(key);
  if (it == data_.end()) {
    key_bytes_ += key.size();
    data_.emplace(std::string(key), std::string(value));
    notify(key);
  } else {
    it->second.assign(value.data(), value.size());
  }
}

void TCPStoreServer::Impl::append_key(std::string_view key, std::string_view value) {
  auto it = data_.find(key);
  if (journal_) journal_->record(StoreJournal::Kind::kAppend, key, value);
  stored_bytes_ += value.size();
  it->second.append(value);
  notify(key);
}

void TCPStoreServer::Impl::erase_key(std::string_view key) {
  auto it = data_.find(key);
  if (journal_) journal_->record(StoreJournal::Kind::kDelete, key);
  stored_bytes_ -= it->first.size() + it->second.size();
  key_bytes_ -= it->first.size();
  data_.erase(it);
}

void TCPStoreServer::Impl::notify(std::string_view key) {
  // Waiters are listed only under keys that were missing when they parked, so a key that
  // already existed has none and this lookup is the whole cost of a plain set.
  if (waiters_by_key_.empty()) return;
  auto it = waiters_by_key_.find(key);
  if (it == waiters_by_key_.end()) return;
  std::vector<Waiter*> ready;
  for (Waiter* w : it->second) {
    if (--w->missing == 0) ready.push_back(w);
  }
  waiters_by_key_.erase(it);
  // Completing a waiter may drop its connection (too many unsent replies), and with it
  // other waiters of this list: remove_waiter takes those out of `alive`.
  std::unordered_set<Waiter*> alive(ready.begin(), ready.end());
  std::unordered_set<Waiter*>* outer = completing_;
  completing_ = &alive;
  for (Waiter* w : ready) {
    if (alive.count(w) != 0) complete(w);
  }
  completing_ = outer;
  rearm_timer();
}

bool TCPStoreServer::Impl::park(Connection* c, uint32_t id, Op op, KeyList keys,
                                uint64_t timeout_ms) {
  if (c->waiters.size() >= options_.max_pending_waits_per_client) {
    reply_limit(c, id, Limit::kClientWaits, options_.max_pending_waits_per_client,
                std::string(op == Op::kGet    ? "get"
                            : op == Op::kWait ? "wait"
                                              : "multi_get") +
                    " refused: this client has " + std::to_string(c->waiters.size()) +
                    " waits parked, the limit max_pending_waits_per_client = " +
                    std::to_string(options_.max_pending_waits_per_client));
    return false;
  }
  const uint64_t bytes = keys.bytes();
  if (parked_ >= options_.max_parked_waits || parked_bytes_ + bytes > options_.max_parked_bytes) {
    const bool count = parked_ >= options_.max_parked_waits;
    reply_limit(c, id, Limit::kParkedWaits,
                count ? options_.max_parked_waits : options_.max_parked_bytes,
                std::string(op == Op::kGet    ? "get"
                            : op == Op::kWait ? "wait"
                                              : "multi_get") +
                    " refused: " +
                    (count ? std::to_string(parked_) +
                                 " waits are parked on the store, its limit max_parked_waits = " +
                                 std::to_string(options_.max_parked_waits)
                           : "the waits parked on the store name " + std::to_string(parked_bytes_) +
                                 " bytes of keys and this one " + std::to_string(bytes) +
                                 ", over its limit max_parked_bytes = " +
                                 std::to_string(options_.max_parked_bytes)));
    return false;
  }
  auto* w = new Waiter();
  w->conn = c;
  w->id = id;
  w->op = op;
  w->keys = std::move(keys);
  w->bytes = bytes;
  for (const std::string& k : w->keys.keys) {
    if (data_.find(k) == data_.end() && waiters_by_key_[k].insert(w).second) ++w->missing;
  }
  // Loop time is cached per iteration and truncated to whole milliseconds: refresh it and
  // add one, so a wait never ends before its timeout. Clamped against overflow (~35 years).
  uv_update_time(&loop_);
  const uint64_t deadline = uv_now(&loop_) + std::min<uint64_t>(timeout_ms, uint64_t{1} << 40) + 1;
  w->deadline_it = deadlines_.emplace(deadline, w);
  c->waiters.insert(w);
  ++parked_;
  parked_bytes_ += bytes;
  rearm_timer();
  return true;
}

void TCPStoreServer::Impl::complete(Waiter* w) {
  // A key can be deleted between its arrival and the arrival of the waiter's last key:
  // then the waiter goes back to waiting for it (a wait, though, has seen every key).
  if (w->op != Op::kWait) {
    for (const std::string& k : w->keys.keys) {
      if (data_.find(k) == data_.end() && waiters_by_key_[k].insert(w).second) ++w->missing;
    }
    if (w->missing > 0) return;
  }
  Connection* c = w->conn;
  const uint32_t id = w->id;
  const Op op = w->op;
  KeyList keys = std::move(w->keys);
  remove_waiter(w);
  reply_values(c, id, op, keys);
}

void TCPStoreServer::Impl::reply_values(Connection* c, uint32_t id, Op op, const KeyList& keys) {
  if (c->closing) return;
  if (op == Op::kWait) {
    FrameWriter w = reply(c, Reply::kOk, id);
    end_reply(c, w);
    return;
  }
  // The reply's size first: one value per key named, in order, duplicates included. Past
  // the frame limit it is refused before a byte of it is built.
  std::vector<const std::string*> values;
  values.reserve(keys.keys.size());
  for (const std::string& k : keys.keys)
    values.push_back(&data_.find(k)->second);
  uint64_t payload = op == Op::kMultiGet ? 4 : 0;
  for (const uint32_t i : keys.order)
    payload += 4 + uint64_t{values[i]->size()};
  if (!room_for(c, id, payload)) return;
  FrameWriter w = reply(c, op == Op::kGet ? Reply::kValue : Reply::kValues, id);
  if (op == Op::kMultiGet) w.u32(static_cast<uint32_t>(keys.order.size()));
  for (const uint32_t i : keys.order)
    w.str(*values[i]);
  end_reply(c, w);
}

void TCPStoreServer::Impl::remove_waiter(Waiter* w) {
  // O(distinct keys of this waiter): each is listed at most once per key.
  if (w->missing > 0) {
    for (const std::string& k : w->keys.keys) {
      auto it = waiters_by_key_.find(k);
      if (it == waiters_by_key_.end()) continue;
      it->second.erase(w);
      if (it->second.empty()) waiters_by_key_.erase(it);
    }
  }
  deadlines_.erase(w->deadline_it);
  w->conn->waiters.erase(w);
  if (completing_ != nullptr) completing_->erase(w);
  --parked_;
  parked_bytes_ -= w->bytes;
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
    Connection* c = w->conn;
    try {
      std::vector<std::string_view> missing;
      uint64_t payload = 4;
      for (const std::string& k : w->keys.keys) {
        if (self->data_.find(k) == self->data_.end()) {
          missing.push_back(k);
          payload += 4 + k.size();
        }
      }
      // The missing keys are a subset of the request's, so this fits a frame; the unsent
      // replies, though, may be too many.
      if (self->room_for(c, w->id, payload)) {
        FrameWriter fw = self->reply(c, Reply::kTimeout, w->id);
        fw.u32(static_cast<uint32_t>(missing.size()));
        for (std::string_view k : missing)
          fw.str(k);
        self->end_reply(c, fw);
      }
      if (!c->closing) self->remove_waiter(w);
    } catch (const std::exception& e) {
      self->disconnect(c, std::string("internal error while timing out request ") +
                              std::to_string(w->id) + ": " + e.what());
    }
  }
  self->rearm_timer();
  self->flush_dirty();
}

bool TCPStoreServer::Impl::room_for(Connection* c, uint32_t id, uint64_t payload) {
  if (kFrameHeader + payload - proto::kLengthBytes > frame_limit_) {
    reply_limit(c, id, Limit::kReplyBytes, frame_limit_,
                "the reply would be " + std::to_string(kFrameHeader + payload) +
                    " bytes, over the store's frame limit (max_frame) of " +
                    std::to_string(frame_limit_) +
                    " bytes; ask for fewer or smaller values per request");
    return false;
  }
  if (c->unsent() + kFrameHeader + payload > options_.unsent_high_water_bytes + frame_limit_) {
    disconnect(c,
               "does not read its replies: " + std::to_string(c->unsent()) +
                   " bytes unsent and a reply of " + std::to_string(kFrameHeader + payload) +
                   " more would pass unsent_high_water_bytes (" +
                   std::to_string(options_.unsent_high_water_bytes) + ") plus a frame",
               false, Limit::kUnsentReplies);
    return false;
  }
  return true;
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
  if (!c->paused && c->unsent() > options_.unsent_high_water_bytes) pause(c);
}

void TCPStoreServer::Impl::reply_error(Connection* c, uint32_t id, ErrorKind kind,
                                       const std::string& message) {
  FrameWriter w = reply(c, Reply::kError, id);
  w.u8(static_cast<uint8_t>(kind));
  w.str(message);
  end_reply(c, w);
}

void TCPStoreServer::Impl::reply_limit(Connection* c, uint32_t id, Limit limit, uint64_t value,
                                       const std::string& message) {
  FrameWriter w = reply(c, Reply::kLimit, id);
  w.u8(static_cast<uint8_t>(limit));
  w.u64(value);
  w.str(message);
  end_reply(c, w);
}

void TCPStoreServer::Impl::pause(Connection* c) {
  if (c->paused || c->closing) return;
  c->paused = true;
  c->paused_ms = uv_now(&loop_);
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  paused_.insert(c);
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&slow_timer_)) == 0 && !stopping_) {
    const uint64_t period =
        std::max<uint64_t>(static_cast<uint64_t>(options_.slow_client_timeout.count()) / 4, 1);
    uv_timer_start(&slow_timer_, &Impl::on_slow_timer, period, period);
  }
}

void TCPStoreServer::Impl::resume(Connection* c) {
  if (!c->paused || c->closing) return;
  c->paused = false;
  paused_.erase(c);
  read_again(c);
}

void TCPStoreServer::Impl::read_again(Connection* c) {
  if (c->paused || c->yielded || c->closing) return;
  // The frames read before the pause or the yield come first; they may hold it again.
  consume(c, nullptr, 0);
  if (!c->paused && !c->yielded && !c->closing) {
    uv_read_start(reinterpret_cast<uv_stream_t*>(&c->handle), &Impl::on_alloc, &Impl::on_read);
  }
}

void TCPStoreServer::Impl::charge(Connection* c, uint64_t work) {
  if (c->work_at < turn_) {
    c->work_at = turn_;
    c->work = 0;
  }
  c->work += work;
  if (c->work < kTurnWork || c->yielded || c->closing) return;
  c->yielded = true;
  c->yield_at = turn_;
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  yielded_.push_back(c);
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&turn_idle_)) == 0 && !stopping_) {
    uv_idle_start(&turn_idle_, [](uv_idle_t*) {});
  }
}

void TCPStoreServer::Impl::on_turn_check(uv_check_t* check) {
  Impl* self = static_cast<Impl*>(check->data);
  if (!self->yielded_.empty()) {
    // Those that yielded before this turn's poll are served again: every connection that
    // was ready in that poll has had its turn since. Those that yielded in it wait for the
    // next poll. A resumed one has a fresh budget, for the rest of this callback and the
    // next turn together.
    std::vector<Connection*> due;
    std::vector<Connection*> later;
    for (Connection* c : self->yielded_)
      (c->yield_at < self->turn_ ? due : later).push_back(c);
    self->yielded_.swap(later);
    for (Connection* c : due) {
      // Closed by another connection's request meanwhile: still allocated (handles are
      // freed in close callbacks, after this one), and done with.
      if (c->closing) continue;
      c->yielded = false;
      c->work_at = self->turn_ + 1;
      c->work = 0;
      self->read_again(c);
    }
    if (self->yielded_.empty()) uv_idle_stop(&self->turn_idle_);
    self->flush_dirty();
  }
  ++self->turn_;
}

void TCPStoreServer::Impl::on_slow_timer(uv_timer_t* timer) {
  Impl* self = static_cast<Impl*>(timer->data);
  const uint64_t now = uv_now(&self->loop_);
  const auto limit = static_cast<uint64_t>(self->options_.slow_client_timeout.count());
  std::vector<Connection*> slow;
  for (Connection* c : self->paused_) {
    if (now - c->paused_ms >= limit) slow.push_back(c);
  }
  for (Connection* c : slow) {
    self->disconnect(c,
                     "does not read its replies: they passed unsent_high_water_bytes (" +
                         std::to_string(self->options_.unsent_high_water_bytes) +
                         ") and have not drained below half of it within " + std::to_string(limit) +
                         " ms (slow_client_timeout; " + std::to_string(c->unsent()) +
                         " bytes still unsent)",
                     false, Limit::kUnsentReplies);
  }
  if (self->paused_.empty()) uv_timer_stop(&self->slow_timer_);
  self->flush_dirty();
}

void TCPStoreServer::Impl::flush_dirty() {
  do {
    // The changes of this loop turn reach the journal before any reply about them leaves.
    if (journal_ && journal_->pending()) {
      std::string error;
      if (journal_->flush(live_keys(), &error)) {
        if (journal_failing_) {
          log_.log(LogLevel::kWarning,
                   tag() + "journal '" + options_.journal + "' is written again");
        }
        journal_failing_ = false;
      } else if (!journal_failing_) {
        // Retried on every loop turn; meanwhile writes are refused (refuse_write).
        journal_failing_ = true;
        log_.log(LogLevel::kError, tag() + "writing the journal '" + options_.journal +
                                       "' failed: " + error +
                                       "; writes are refused until it is written again");
      }
    }
    // Connections closed during this callback are still allocated (handles are freed in
    // close callbacks, which run after this one), and flush() skips them.
    std::vector<Connection*> batch;
    batch.swap(dirty_);
    std::vector<Connection*> drained;
    for (Connection* c : batch) {
      c->dirty = false;
      flush(c);
      if (c->paused && !c->closing && c->unsent() <= options_.unsent_high_water_bytes / 2) {
        drained.push_back(c);
      }
    }
    // Resuming handles the frames they hold, which may make more replies (and changes).
    for (Connection* c : drained)
      resume(c);
  } while (!dirty_.empty());
  // A journal that failed is retried on every turn, changes or not, so that writes are
  // accepted again as soon as it can be written.
  if (journal_ && journal_failing_) {
    std::string error;
    if (journal_->flush(live_keys(), &error)) {
      journal_failing_ = false;
      log_.log(LogLevel::kWarning, tag() + "journal '" + options_.journal + "' is written again");
    }
  }
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
    if (c->out.capacity() > (size_t{1} << 20)) c->out.shrink_to_fit();
    return;
  }
  auto* req = new WriteRequest();
  req->data.assign(c->out, sent);
  c->out.clear();
  c->out.shrink_to_fit();
  req->req.data = c;
  c->queued += req->data.size();
  uv_buf_t rest = uv_buf_init(req->data.data(), static_cast<unsigned>(req->data.size()));
  const int wrc = uv_write(&req->req, stream, &rest, 1, &Impl::on_write);
  if (wrc != 0) {
    c->queued -= req->data.size();
    delete req;
    disconnect(c, "write failed: " + uv_message(wrc));
  }
}

void TCPStoreServer::Impl::on_write(uv_write_t* req, int status) {
  auto* wr = reinterpret_cast<WriteRequest*>(req);
  auto* c = static_cast<Connection*>(req->data);
  c->queued -= wr->data.size();
  delete wr;
  if (c->closing) return;
  Impl* self = c->server;
  if (status < 0 && status != UV_ECANCELED) {
    self->disconnect(c, "write failed: " + uv_message(status));
  } else if (c->paused && c->unsent() <= self->options_.unsent_high_water_bytes / 2) {
    self->resume(c);
  }
  self->flush_dirty();
}

void TCPStoreServer::Impl::disconnect(Connection* c, const std::string& why, bool refused,
                                      std::optional<Limit> limit) {
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
  if (limit) {
    w.begin(static_cast<uint8_t>(Reply::kLimit), 0);
    w.u8(static_cast<uint8_t>(*limit));
    w.u64(options_.unsent_high_water_bytes);
  } else {
    w.begin(static_cast<uint8_t>(refused ? Reply::kRefused : Reply::kError), 0);
    if (!refused) w.u8(static_cast<uint8_t>(ErrorKind::kStore));
  }
  w.str("server dropped the connection: " + why);
  w.end();
  uv_buf_t buf = uv_buf_init(frame.data(), static_cast<unsigned>(frame.size()));
  uv_try_write(reinterpret_cast<uv_stream_t*>(&c->handle), &buf, 1);
  close_connection(c, /*reset=*/limit == Limit::kUnsentReplies);
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

void TCPStoreServer::Impl::close_connection(Connection* c, bool reset) {
  if (c->closing) return;
  c->closing = true;
  while (!c->waiters.empty())
    remove_waiter(*c->waiters.begin());
  paused_.erase(c);
  if (c->yielded) std::erase(yielded_, c);
  connections_.erase(c);
  num_clients_.fetch_sub(1, std::memory_order_relaxed);
  uv_read_stop(reinterpret_cast<uv_stream_t*>(&c->handle));
  auto on_closed = [](uv_handle_t* h) { delete static_cast<Connection*>(h->data); };
  if (!reset || uv_tcp_close_reset(&c->handle, on_closed) != 0) {
    uv_close(reinterpret_cast<uv_handle_t*>(&c->handle), on_closed);
  }
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

void TCPStoreServerTestPeer::set_request_hook(TCPStoreServer& server,
                                              std::function<void(uint8_t op)> hook) {
  server.impl_->set_request_hook(std::move(hook));
}

}  // namespace gradwire::c10d
