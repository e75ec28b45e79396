// TCPStore client: connects (and reconnects) with the handshake, and runs each store
// operation as one request over the shared connection (tcp_store_connection.h).
#include "gradwire/c10d/tcp_store.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>

#include "gradwire/c10d/prefix_store.h"
#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/auth.h"
#include "gradwire/core/check.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/trace.h"
#include "tcp_protocol.h"
#include "tcp_store_connection.h"

namespace gradwire::c10d {

using proto::FrameReader;
using proto::FrameWriter;
using proto::Op;
using proto::Reply;
using store_client::Clock;
using store_client::Connection;
using store_client::errno_text;
using store_client::kReceiveSlice;
using store_client::limit_message;
using store_client::Response;
using store_client::ServerLimits;

namespace {

constexpr const char* kJoinedKey = "__gradwire/tcpstore/joined";
constexpr const char* kReadyKey = "__gradwire/tcpstore/ready";

// Milliseconds left until `deadline` for poll(): at least 0, at most INT_MAX.
int poll_ms(Clock::time_point deadline) {
  const auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count() + 1;
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT_MAX));
}

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  // Saturate: a timeout of years must not overflow the clock.
  if (timeout > std::chrono::hours(24 * 365 * 10)) return now + std::chrono::hours(24 * 365 * 10);
  return now + timeout;
}

// A c10d.store span around one client request: op, the key (the first of a multi-key
// request, as Text), and the bytes of the values sent or received. Recorded when it ends,
// if tracing was on when it began.
class StoreSpan {
 public:
  StoreSpan(const char* op, std::string_view key, uint64_t bytes = 0)
      : active_(trace::enabled()), op_(op), key_(key), bytes_(bytes) {
    if (active_) start_ns_ = trace::now_ns();
  }
  ~StoreSpan() {
    if (!active_) return;
    const trace::Text key{"key", key_};
    trace::complete("c10d.store", "c10d", start_ns_, trace::now_ns(),
                    {trace::Arg("op", op_), trace::Arg("bytes", bytes_)}, &key);
  }
  StoreSpan(const StoreSpan&) = delete;
  StoreSpan& operator=(const StoreSpan&) = delete;
  void add_bytes(uint64_t n) { bytes_ += n; }

 private:
  bool active_;
  const char* op_;
  std::string_view key_;
  uint64_t bytes_;
  int64_t start_ns_{0};
};

std::string_view first_key(const std::vector<std::string>& keys) {
  return keys.empty() ? std::string_view() : std::string_view(keys.front());
}

}  // namespace

void TCPStoreOptions::validate() const {
  GRADWIRE_CHECK_ARG(is_master || port != 0)
      << "TCPStoreOptions.port is 0: only the master (is_master) may ask for a free port";
  GRADWIRE_CHECK_ARG(listen_fd < 0 || is_master)
      << "TCPStoreOptions.listen_fd is set but is_master is false";
  GRADWIRE_CHECK_ARG(world_size >= 0)
      << "TCPStoreOptions.world_size = " << world_size << " must not be negative";
  GRADWIRE_CHECK_ARG(!wait_for_workers || world_size > 0)
      << "TCPStoreOptions.wait_for_workers needs world_size > 0";
  GRADWIRE_CHECK_ARG(timeout.count() > 0)
      << "TCPStoreOptions.timeout = " << timeout.count() << " ms must be positive";
  GRADWIRE_CHECK_ARG(connect_timeout.count() > 0)
      << "TCPStoreOptions.connect_timeout = " << connect_timeout.count() << " ms must be positive";
  GRADWIRE_CHECK_ARG(wait_grace.count() >= 0)
      << "TCPStoreOptions.wait_grace = " << wait_grace.count() << " ms must not be negative";
  GRADWIRE_CHECK_ARG(max_key_bytes >= 1 && max_key_bytes <= (16u << 20))
      << "TCPStoreOptions.max_key_bytes = " << max_key_bytes << " is invalid: expected 1 .. 16 MiB";
  GRADWIRE_CHECK_ARG(max_value_bytes >= 1 && max_value_bytes <= (1u << 30))
      << "TCPStoreOptions.max_value_bytes = " << max_value_bytes
      << " is invalid: expected 1 .. 1 GiB";
  GRADWIRE_CHECK_ARG(max_keys_per_request >= 1)
      << "TCPStoreOptions.max_keys_per_request must be at least 1";
}

// The client half of a TCPStore: connects (and reconnects) and runs calls.
class TCPStore::Client {
 public:
  Client(std::string host, uint16_t port, const TCPStoreOptions& options)
      : host_(std::move(host)),
        port_(port),
        address_(host_ + ":" + std::to_string(port_)),
        options_(options),
        secret_(resolve_secret(options.secret)) {
    MutexLock lock(connect_mutex_);
    connection_ = connect();
  }

  const std::string& address() const { return address_; }

  // Runs one request: `build` writes the payload; returns the reply (one-way requests
  // return an empty one).
  template <typename Build>
  Response call(Op op, Build&& build, bool reply, Clock::time_point deadline,
                std::string_view what) {
    std::shared_ptr<Connection> conn = connection();
    const uint32_t id = next_id();
    std::string frame;
    FrameWriter w(frame);
    w.begin(static_cast<uint8_t>(op), id);
    build(w);
    const size_t size = w.end();
    const uint32_t limit = conn->limits().max_frame;
    GRADWIRE_CHECK_ARG(size - proto::kLengthBytes <= limit)
        << "TCPStore " << what << ": request of " << size << " bytes exceeds the server's frame "
        << "limit of " << limit << " bytes; split it into smaller requests";
    Response r = conn->call(frame, id, reply, deadline, what);
    if (reply && r.kind == static_cast<uint8_t>(Reply::kLimit)) {
      GRADWIRE_THROW(StoreError) << "TCPStore " << what << " (server " << address_
                                 << "): " << limit_message(r.payload);
    }
    if (reply && r.kind == static_cast<uint8_t>(Reply::kError)) {
      FrameReader er(reinterpret_cast<const uint8_t*>(r.payload.data()), r.payload.size());
      const auto kind = static_cast<ErrorKind>(er.u8());
      const std::string message(er.bytes(UINT32_MAX, "message"));
      throw_error(kind, "TCPStore " + std::string(what) + " (server " + address_ + "): " + message);
    }
    return r;
  }

  const ServerLimits& limits() { return connection()->limits(); }

  void check_key(const std::string& key) {
    const uint32_t limit = std::min(options_.max_key_bytes, limits().max_key);
    GRADWIRE_CHECK_ARG(key.size() <= limit)
        << "TCPStore: key of " << key.size() << " bytes exceeds the limit of " << limit
        << " bytes (TCPStoreOptions.max_key_bytes, or the server's)";
  }
  void check_value(const std::string& key, size_t size) {
    const uint32_t limit = std::min(options_.max_value_bytes, limits().max_value);
    GRADWIRE_CHECK_ARG(size <= limit)
        << "TCPStore: value of " << size << " bytes for key '" << key << "' exceeds the limit of "
        << limit << " bytes (TCPStoreOptions.max_value_bytes, or the server's)";
  }
  void check_keys(const std::vector<std::string>& keys) {
    const uint32_t limit = std::min(options_.max_keys_per_request, limits().max_keys);
    GRADWIRE_CHECK_ARG(keys.size() <= limit)
        << "TCPStore: " << keys.size() << " keys in one request exceed the limit of " << limit;
    for (const std::string& k : keys)
      check_key(k);
  }

 private:
  uint32_t next_id() {
    // Id 0 is reserved for the server's connection-level errors.
    uint32_t id = next_id_.fetch_add(1, std::memory_order_relaxed);
    if (id == 0) id = next_id_.fetch_add(1, std::memory_order_relaxed);
    return id;
  }

  std::shared_ptr<Connection> connection() GRADWIRE_EXCLUDES(connect_mutex_) {
    MutexLock lock(connect_mutex_);
    if (connection_) {
      connection_->probe();
      if (!connection_->broken()) return connection_;
      GRADWIRE_LOG(kInfo) << "TCPStore: reconnecting to " << address_;
    }
    connection_.reset();
    connection_ = connect();
    return connection_;
  }

  // Connects with retry and jittered exponential back-off until connect_timeout, then
  // performs the handshake. Throws NetworkError naming the address and the last error.
  std::shared_ptr<Connection> connect() GRADWIRE_REQUIRES(connect_mutex_) {
    const auto deadline = deadline_after(options_.connect_timeout);
    auto backoff = std::chrono::milliseconds(10);
    std::minstd_rand rng(static_cast<uint32_t>(Clock::now().time_since_epoch().count()) ^
                         static_cast<uint32_t>(reinterpret_cast<uintptr_t>(this)));
    std::string last_error;
    int attempts = 0;
    limit_error_.clear();
    for (;;) {
      ++attempts;
      bool refused = false;
      std::shared_ptr<Connection> conn = try_connect(deadline, last_error, refused);
      if (conn) return conn;
      if (refused) {
        // Retrying cannot change the answer.
        GRADWIRE_THROW(NetworkError)
            << "TCPStore: the server at " << address_ << " refused this client: " << last_error;
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      // Jitter spreads a thousand clients that start together.
      std::uniform_real_distribution<double> jitter(0.5, 1.5);
      auto pause = std::chrono::duration_cast<std::chrono::milliseconds>(backoff * jitter(rng));
      pause =
          std::min(pause, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now));
      std::this_thread::sleep_for(pause);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(1000));
    }
    if (!limit_error_.empty()) {
      // The server is there and answering: it is full (max_connections), which the caller
      // should hear as the store's limit rather than as a network failure.
      GRADWIRE_THROW(StoreError) << "TCPStore: the server at " << address_
                                 << " did not accept this client within "
                                 << options_.connect_timeout.count() << " ms (" << attempts
                                 << " attempts): " << limit_error_;
    }
    GRADWIRE_THROW(NetworkError) << "TCPStore: cannot connect to the server at " << address_
                                 << " within " << options_.connect_timeout.count() << " ms ("
                                 << attempts << " attempts; last error: " << last_error << ")";
  }

  std::shared_ptr<Connection> try_connect(Clock::time_point deadline, std::string& error,
                                          bool& refused) GRADWIRE_REQUIRES(connect_mutex_) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* res = nullptr;
    const std::string port_text = std::to_string(port_);
    const int gai = getaddrinfo(host_.c_str(), port_text.c_str(), &hints, &res);
    if (gai != 0) {
      error = std::string("cannot resolve '") + host_ + "': " + gai_strerror(gai);
      return nullptr;
    }
    std::shared_ptr<Connection> conn;
    for (addrinfo* ai = res; ai != nullptr && !conn; ai = ai->ai_next) {
      // Closed at the end of the attempt unless the handshake hands it to the connection.
      UniqueFd fd(
          ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
      if (!fd) {
        error = "socket: " + errno_text(errno);
        continue;
      }
      if (connect_socket(fd.get(), ai, deadline, error)) {
        handshake(fd, deadline, error, refused, conn);
      }
    }
    freeaddrinfo(res);
    return conn;
  }

  static bool connect_socket(int fd, addrinfo* ai, Clock::time_point deadline, std::string& error) {
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS) {
        error = "connect: " + errno_text(errno);
        return false;
      }
      pollfd pfd{fd, POLLOUT, 0};
      const int ready = ::poll(&pfd, 1, poll_ms(deadline));
      if (ready <= 0) {
        error = ready == 0 ? "connect: timed out" : "poll: " + errno_text(errno);
        return false;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        error = "connect: " + errno_text(err);
        return false;
      }
    }
    // Blocking from here on: the client waits with poll() where it needs a deadline.
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    timeval slice{0, static_cast<suseconds_t>(kReceiveSlice.count() * 1000)};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice));
    return true;
  }

  // Reads one whole frame of at most 4096 bytes into `in` (which must hold nothing else).
  static bool read_handshake_frame(int fd, Clock::time_point deadline, std::string& in,
                                   std::string& error) {
    in.clear();
    for (;;) {
      if (in.size() >= proto::kLengthBytes) {
        const uint32_t len = proto::load_u32(reinterpret_cast<const uint8_t*>(in.data()));
        if (len < proto::kMinFrame || len > 4096) {
          error = "handshake: not a gradwire TCPStore server (frame length " + std::to_string(len) +
                  ")";
          return false;
        }
        if (in.size() > proto::kLengthBytes + len) {
          error = "handshake: unexpected data after the answer";
          return false;
        }
        if (in.size() == proto::kLengthBytes + len) return true;
      }
      pollfd pfd{fd, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, poll_ms(deadline));
      if (ready <= 0) {
        error = "handshake: no answer from the server";
        return false;
      }
      char buf[4096];
      // Never past the frame: the length is read first, then exactly the rest.
      size_t want = proto::kLengthBytes - std::min(in.size(), size_t{proto::kLengthBytes});
      if (want == 0) {
        want = proto::kLengthBytes + proto::load_u32(reinterpret_cast<const uint8_t*>(in.data())) -
               in.size();
      }
      const ssize_t n = ::recv(fd, buf, std::min(want, sizeof(buf)), 0);
      if (n <= 0) {
        error = n == 0 ? "handshake: the server closed the connection"
                       : "handshake receive: " + errno_text(errno);
        return false;
      }
      in.append(buf, static_cast<size_t>(n));
    }
  }

  // Sends one handshake frame whole and reads the server's answer into `in`.
  static bool handshake_round(int fd, const std::string& frame, Clock::time_point deadline,
                              std::string& in, std::string& error) {
    if (::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(frame.size())) {
      error = "handshake send: " + errno_text(errno);
      return false;
    }
    return read_handshake_frame(fd, deadline, in, error);
  }

  // A server's kRefused (final: authentication failed, or another protocol version),
  // kLimit (its connection limit: try again later) or kError (it failed otherwise) answer
  // to the handshake: the reason, and whether it refused this client for good.
  bool refusal(FrameReader& r, uint8_t kind, const std::string& payload, std::string& error,
               bool& refused) GRADWIRE_REQUIRES(connect_mutex_) {
    refused = kind == static_cast<uint8_t>(Reply::kRefused);
    if (kind == static_cast<uint8_t>(Reply::kLimit)) {
      // The payload starts after the request id.
      error = "the server refused the connection: " + limit_message(payload.substr(9));
      limit_error_ = error;
      return true;
    }
    if (!refused && kind != static_cast<uint8_t>(Reply::kError)) return false;
    if (!refused) r.u8();  // the error kind
    const std::string message(r.bytes(4096, "message"));
    error = "handshake refused: " + message;
    return true;
  }

  std::string proof(std::string_view label, const proto::Transcript& t) const {
    const Digest256 mac = hmac_sha256(secret_, proto::transcript(label, t));
    return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
  }

  // Protocol version 3: HELLO -> HELLO_OK (no proof); with a secret the client proves first
  // (AUTH), and only then does the server prove itself (OK carrying its proof).
  // On success `conn` owns `fd`.
  bool handshake(UniqueFd& fd, Clock::time_point deadline, std::string& error, bool& refused,
                 std::shared_ptr<Connection>& conn) GRADWIRE_REQUIRES(connect_mutex_) {
    proto::Transcript t;
    t.client_nonce = random_bytes(proto::kNonceBytes);
    t.client_flags = secret_.empty() ? 0 : proto::kFlagSecret;
    ServerLimits limits;
    if (!hello(fd.get(), deadline, t, limits, error, refused)) return false;
    const bool server_secret = (t.server_flags & proto::kFlagSecret) != 0;
    if (server_secret != !secret_.empty()) {
      refused = true;
      error = server_secret ? "authentication failed: the store requires a shared secret and "
                              "none is set here (TCPStoreOptions::secret, GRADWIRE_SECRET or "
                              "GRADWIRE_SECRET_FILE)"
                            : "authentication failed: this client has a secret and the store "
                              "has none";
      return false;
    }
    if (server_secret && !authenticate(fd.get(), deadline, t, limits, error, refused)) {
      return false;
    }
    conn = std::make_shared<Connection>(std::move(fd), address_, limits);
    return true;
  }

  // Sends HELLO and reads the HELLO_OK answer: the server's limits, and its flags and nonce
  // into `t`.
  bool hello(int fd, Clock::time_point deadline, proto::Transcript& t, ServerLimits& limits,
             std::string& error, bool& refused) GRADWIRE_REQUIRES(connect_mutex_) {
    std::string frame;
    FrameWriter w(frame);
    w.begin(static_cast<uint8_t>(Op::kHello), 0);
    w.u32(proto::kMagic);
    w.u16(proto::kVersion);
    w.u8(t.client_flags);
    w.raw(t.client_nonce);
    w.end();
    std::string in;
    if (!handshake_round(fd, frame, deadline, in, error)) return false;
    FrameReader r(reinterpret_cast<const uint8_t*>(in.data()) + proto::kLengthBytes,
                  in.size() - proto::kLengthBytes);
    const uint8_t kind = r.u8();
    r.u32();  // request id
    if (refusal(r, kind, in, error, refused)) return false;
    const uint16_t version = r.u16();
    limits.max_key = r.u32();
    limits.max_value = r.u32();
    limits.max_keys = r.u32();
    limits.max_frame = r.u32();
    t.server_flags = r.u8();
    t.server_nonce = std::string(r.raw(proto::kNonceBytes, "server nonce"));
    if (kind != static_cast<uint8_t>(Reply::kHelloOk) || !r.done() || version != proto::kVersion) {
      error = "handshake: unexpected answer (not a gradwire TCPStore server of version " +
              std::to_string(proto::kVersion) + ")";
      return false;
    }
    return true;
  }

  // With a secret: sends the client's proof (AUTH) over the transcript `t`, and checks the
  // server's proof in its OK answer.
  bool authenticate(int fd, Clock::time_point deadline, proto::Transcript& t,
                    const ServerLimits& limits, std::string& error, bool& refused)
      GRADWIRE_REQUIRES(connect_mutex_) {
    t.max_key = limits.max_key;
    t.max_value = limits.max_value;
    t.max_keys = limits.max_keys;
    t.max_frame = limits.max_frame;
    std::string client_proof;
    std::string want;
    try {
      client_proof = proof(proto::kClientProofLabel, t);
      want = proof(proto::kServerProofLabel, t);
    } catch (const Error& e) {
      // Fail closed: nothing is sent without a real proof.
      refused = true;
      error = std::string("authentication failed: ") + e.what();
      return false;
    }
    std::string auth;
    FrameWriter a(auth);
    a.begin(static_cast<uint8_t>(Op::kAuth), 0);
    a.raw(client_proof);
    a.end();
    std::string in;
    if (!handshake_round(fd, auth, deadline, in, error)) return false;
    FrameReader ok(reinterpret_cast<const uint8_t*>(in.data()) + proto::kLengthBytes,
                   in.size() - proto::kLengthBytes);
    const uint8_t answer = ok.u8();
    ok.u32();
    if (answer == static_cast<uint8_t>(Reply::kRefused)) {
      refused = true;
      error =
          "authentication failed: the store does not know this job's secret (it refused "
          "this client's proof)";
      return false;
    }
    if (refusal(ok, answer, in, error, refused)) return false;
    const std::string_view server_proof = ok.raw(proto::kProofBytes, "server proof");
    if (answer != static_cast<uint8_t>(Reply::kOk) || !ok.done()) {
      error = "handshake: unexpected answer to the client's proof";
      return false;
    }
    if (!constant_time_equal(want.data(), server_proof.data(), want.size())) {
      refused = true;
      error =
          "authentication failed: the store does not know this job's secret (its proof "
          "is wrong)";
      return false;
    }
    return true;
  }

  const std::string host_;
  const uint16_t port_;
  const std::string address_;
  const TCPStoreOptions options_;
  const std::string secret_;
  std::atomic<uint32_t> next_id_{1};
  Mutex connect_mutex_;
  // Why an attempt of the current connect() was refused by the server's max_connections.
  std::string limit_error_ GRADWIRE_GUARDED_BY(connect_mutex_);
  std::shared_ptr<Connection> connection_ GRADWIRE_GUARDED_BY(connect_mutex_);
};

namespace {

std::vector<Bytes> read_values(const Response& r, size_t expected, std::string_view what) {
  FrameReader reader(reinterpret_cast<const uint8_t*>(r.payload.data()), r.payload.size());
  const uint32_t n = reader.count(UINT32_MAX, 4, "values");
  std::vector<Bytes> values;
  values.reserve(n);
  for (uint32_t i = 0; i < n && reader.ok(); ++i) {
    const std::string_view v = reader.bytes(UINT32_MAX, "value");
    values.emplace_back(v.begin(), v.end());
  }
  if (!reader.done() || n != expected) {
    GRADWIRE_THROW(StoreError) << "TCPStore " << what << ": malformed reply from the server";
  }
  return values;
}

std::vector<std::string> read_keys(const Response& r, std::string_view what) {
  FrameReader reader(reinterpret_cast<const uint8_t*>(r.payload.data()), r.payload.size());
  const uint32_t n = reader.count(UINT32_MAX, 4, "keys");
  std::vector<std::string> keys;
  keys.reserve(n);
  for (uint32_t i = 0; i < n && reader.ok(); ++i)
    keys.emplace_back(reader.bytes(UINT32_MAX, "key"));
  if (!reader.done()) {
    GRADWIRE_THROW(StoreError) << "TCPStore " << what << ": malformed reply from the server";
  }
  return keys;
}

void expect_kind(const Response& r, Reply kind, std::string_view what,
                 std::chrono::milliseconds timeout) {
  if (r.kind == static_cast<uint8_t>(kind)) return;
  if (r.kind == static_cast<uint8_t>(Reply::kTimeout)) {
    GRADWIRE_THROW(TimeoutError) << timeout_message(what, read_keys(r, what), timeout);
  }
  GRADWIRE_THROW(StoreError) << "TCPStore " << what << ": unexpected reply "
                             << static_cast<int>(r.kind) << " from the server";
}

FrameReader reader_of(const Response& r) {
  return FrameReader(reinterpret_cast<const uint8_t*>(r.payload.data()), r.payload.size());
}

}  // namespace

TCPStore::TCPStore(TCPStoreOptions options) : Store(options.timeout), options_(std::move(options)) {
  options_.validate();
  host_ = options_.host.empty() ? std::string("127.0.0.1") : options_.host;
  port_ = options_.port;
  if (options_.is_master) {
    TCPStoreServerOptions server_options;
    server_options.bind_host = options_.bind_host;
    server_options.port = options_.port;
    server_options.listen_fd = options_.listen_fd;
    server_options.max_key_bytes = options_.max_key_bytes;
    server_options.max_value_bytes = options_.max_value_bytes;
    server_options.max_keys_per_request = options_.max_keys_per_request;
    server_options.secret = options_.secret;
    server_ = std::make_unique<TCPStoreServer>(server_options);
    port_ = server_->port();
  }
  client_ = std::make_unique<Client>(host_, port_, options_);
  if (options_.wait_for_workers) {
    // Every worker counts itself in; the last one marks the job complete; the master
    // waits for that mark, so it returns only once the whole job has connected.
    const int64_t joined = add(kJoinedKey, 1);
    if (joined == options_.world_size) set(kReadyKey, std::string_view("1"));
    if (options_.is_master) {
      try {
        wait({kReadyKey}, options_.timeout);
      } catch (const TimeoutError&) {
        GRADWIRE_THROW(TimeoutError)
            << "TCPStore at " << client_->address() << ": only " << add(kJoinedKey, 0) << " of "
            << options_.world_size << " workers connected within " << options_.timeout.count()
            << " ms";
      }
    }
  }
}

TCPStore::~TCPStore() {
  client_.reset();  // before the server, so the client's socket closes first
  server_.reset();
}

void TCPStore::do_set(const std::string& key, const Bytes& value) {
  StoreSpan span("set", key, value.size());
  client_->check_key(key);
  client_->check_value(key, value.size());
  client_->call(
      Op::kSet,
      [&](FrameWriter& w) {
        w.str(key);
        w.bytes(value.data(), value.size());
      },
      false, deadline_after(timeout()), "set");
}

Bytes TCPStore::do_get(const std::string& key, std::chrono::milliseconds timeout) {
  StoreSpan span("get", key);
  client_->check_key(key);
  Response r = client_->call(
      Op::kGet,
      [&](FrameWriter& w) {
        w.str(key);
        w.u64(static_cast<uint64_t>(timeout.count()));
      },
      true, deadline_after(timeout + options_.wait_grace), "get");
  expect_kind(r, Reply::kValue, "get", timeout);
  FrameReader reader = reader_of(r);
  const std::string_view v = reader.bytes(UINT32_MAX, "value");
  if (!reader.done()) GRADWIRE_THROW(StoreError) << "TCPStore get: malformed reply";
  span.add_bytes(v.size());
  return Bytes(v.begin(), v.end());
}

int64_t TCPStore::do_add(const std::string& key, int64_t delta) {
  StoreSpan span("add", key);
  client_->check_key(key);
  Response r = client_->call(
      Op::kAdd,
      [&](FrameWriter& w) {
        w.str(key);
        w.i64(delta);
      },
      true, deadline_after(timeout()), "add");
  expect_kind(r, Reply::kInt, "add", timeout());
  FrameReader reader = reader_of(r);
  const int64_t value = reader.i64();
  if (!reader.done()) GRADWIRE_THROW(StoreError) << "TCPStore add: malformed reply";
  return value;
}

Bytes TCPStore::do_compare_set(const std::string& key, const Bytes& expected,
                               const Bytes& desired) {
  StoreSpan span("compare_set", key, expected.size() + desired.size());
  client_->check_key(key);
  client_->check_value(key, expected.size());
  client_->check_value(key, desired.size());
  Response r = client_->call(
      Op::kCompareSet,
      [&](FrameWriter& w) {
        w.str(key);
        w.bytes(expected.data(), expected.size());
        w.bytes(desired.data(), desired.size());
      },
      true, deadline_after(timeout()), "compare_set");
  expect_kind(r, Reply::kValue, "compare_set", timeout());
  FrameReader reader = reader_of(r);
  const std::string_view v = reader.bytes(UINT32_MAX, "value");
  if (!reader.done()) GRADWIRE_THROW(StoreError) << "TCPStore compare_set: malformed reply";
  return Bytes(v.begin(), v.end());
}

void TCPStore::do_wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  StoreSpan span("wait", first_key(keys));
  client_->check_keys(keys);
  Response r = client_->call(
      Op::kWait,
      [&](FrameWriter& w) {
        w.u32(static_cast<uint32_t>(keys.size()));
        for (const std::string& k : keys)
          w.str(k);
        w.u64(static_cast<uint64_t>(timeout.count()));
      },
      true, deadline_after(timeout + options_.wait_grace), "wait");
  expect_kind(r, Reply::kOk, "wait", timeout);
}

bool TCPStore::do_check(const std::vector<std::string>& keys) {
  StoreSpan span("check", first_key(keys));
  client_->check_keys(keys);
  Response r = client_->call(
      Op::kCheck,
      [&](FrameWriter& w) {
        w.u32(static_cast<uint32_t>(keys.size()));
        for (const std::string& k : keys)
          w.str(k);
      },
      true, deadline_after(timeout()), "check");
  expect_kind(r, Reply::kBool, "check", timeout());
  FrameReader reader = reader_of(r);
  const bool all = reader.u8() != 0;
  if (!reader.done()) GRADWIRE_THROW(StoreError) << "TCPStore check: malformed reply";
  return all;
}

bool TCPStore::do_delete_key(const std::string& key) {
  StoreSpan span("delete_key", key);
  client_->check_key(key);
  Response r = client_->call(
      Op::kDelete, [&](FrameWriter& w) { w.str(key); }, true, deadline_after(timeout()),
      "delete_key");
  expect_kind(r, Reply::kBool, "delete_key", timeout());
  FrameReader reader = reader_of(r);
  const bool existed = reader.u8() != 0;
  if (!reader.done()) GRADWIRE_THROW(StoreError) << "TCPStore delete_key: malformed reply";
  return existed;
}

int64_t TCPStore::do_num_keys() {
  StoreSpan span("num_keys", {});
  Response r = client_->call(
      Op::kNumKeys, [](FrameWriter&) {}, true, deadline_after(timeout()), "num_keys");
  expect_kind(r, Reply::kInt, "num_keys", timeout());
  FrameReader reader = reader_of(r);
  const int64_t n = reader.i64();
  if (!reader.done()) GRADWIRE_THROW(StoreError) << "TCPStore num_keys: malformed reply";
  return n;
}

std::vector<Bytes> TCPStore::do_multi_get(const std::vector<std::string>& keys,
                                          std::chrono::milliseconds timeout) {
  StoreSpan span("multi_get", first_key(keys));
  client_->check_keys(keys);
  Response r = client_->call(
      Op::kMultiGet,
      [&](FrameWriter& w) {
        w.u32(static_cast<uint32_t>(keys.size()));
        for (const std::string& k : keys)
          w.str(k);
        w.u64(static_cast<uint64_t>(timeout.count()));
      },
      true, deadline_after(timeout + options_.wait_grace), "multi_get");
  expect_kind(r, Reply::kValues, "multi_get", timeout);
  return read_values(r, keys.size(), "multi_get");
}

void TCPStore::do_multi_set(const std::vector<std::string>& keys,
                            const std::vector<Bytes>& values) {
  uint64_t value_bytes = 0;
  for (const Bytes& v : values)
    value_bytes += v.size();
  StoreSpan span("multi_set", first_key(keys), value_bytes);
  client_->check_keys(keys);
  for (size_t i = 0; i < keys.size(); ++i)
    client_->check_value(keys[i], values[i].size());
  client_->call(
      Op::kMultiSet,
      [&](FrameWriter& w) {
        w.u32(static_cast<uint32_t>(keys.size()));
        for (size_t i = 0; i < keys.size(); ++i) {
          w.str(keys[i]);
          w.bytes(values[i].data(), values[i].size());
        }
      },
      false, deadline_after(timeout()), "multi_set");
}

void TCPStore::do_append(const std::string& key, const Bytes& value) {
  StoreSpan span("append", key, value.size());
  client_->check_key(key);
  client_->check_value(key, value.size());
  Response r = client_->call(
      Op::kAppend,
      [&](FrameWriter& w) {
        w.str(key);
        w.bytes(value.data(), value.size());
      },
      true, deadline_after(timeout()), "append");
  expect_kind(r, Reply::kOk, "append", timeout());
}

std::vector<std::string> TCPStore::do_list_keys() {
  StoreSpan span("list_keys", {});
  Response r = client_->call(
      Op::kListKeys, [](FrameWriter&) {}, true, deadline_after(timeout()), "list_keys");
  expect_kind(r, Reply::kKeys, "list_keys", timeout());
  return read_keys(r, "list_keys");
}

int64_t TCPStore::server_time_ns() {
  StoreSpan span("time", {});
  Response r = client_->call(
      Op::kTime, [](FrameWriter&) {}, true, deadline_after(timeout()), "server_time");
  expect_kind(r, Reply::kInt, "server_time", timeout());
  FrameReader reader = reader_of(r);
  const int64_t ns = reader.i64();
  if (!reader.done()) GRADWIRE_THROW(StoreError) << "TCPStore server_time: malformed reply";
  return ns;
}

ClockProbe TCPStore::probe_clock(int samples) {
  GRADWIRE_CHECK_ARG(samples >= 1 && samples <= 1000)
      << "TCPStore::probe_clock: samples = " << samples << " is invalid: expected 1 .. 1000";
  ClockProbe best;
  best.address = client_->address();
  best.rtt_ns = INT64_MAX;
  for (int i = 0; i < samples; ++i) {
    const int64_t sent = trace::now_ns();
    const int64_t server = server_time_ns();
    const int64_t received = trace::now_ns();
    const int64_t rtt = received - sent;
    if (rtt < best.rtt_ns) {
      best.rtt_ns = rtt;
      best.offset_ns = server - (sent + rtt / 2);
    }
  }
  best.samples = samples;
  return best;
}

bool record_trace_clock_offset(const std::shared_ptr<Store>& store, int samples) {
  if (!trace::enabled()) return false;
  Store* s = store.get();
  while (auto* prefix = dynamic_cast<PrefixStore*>(s))
    s = prefix->underlying_store().get();
  auto* tcp = dynamic_cast<TCPStore*>(s);
  if (tcp == nullptr) return false;
  try {
    const ClockProbe p = tcp->probe_clock(samples);
    std::string address;
    for (char ch : p.address) {
      // host:port of a store: letters, digits and . : [ ] - only; anything else is dropped.
      if (std::isalnum(static_cast<unsigned char>(ch)) || std::strchr(".:[]-_", ch) != nullptr)
        address.push_back(ch);
    }
    trace::set_metadata("clock_offset", "{\"offset_ns\":" + std::to_string(p.offset_ns) +
                                            ",\"rtt_ns\":" + std::to_string(p.rtt_ns) +
                                            ",\"samples\":" + std::to_string(p.samples) +
                                            ",\"store\":\"" + address + "\"}");
    return true;
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kWarning) << "trace: could not measure the clock offset to the store: "
                           << e.what();
    return false;
  }
}

}  // namespace gradwire::c10d
