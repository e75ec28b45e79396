#include "transport/stream_transport.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <tensorpipe/channel/mpt/nop_types.h>
#include <tensorpipe/common/error.h>
#include <tensorpipe/common/nop.h>
#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/connection.h>
#include <tensorpipe/transport/error.h>
#include <tensorpipe/transport/listener.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <unordered_set>

#include "gradwire/core/auth.h"
#include "gradwire/core/background_log.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/printable.h"
#include "transport/handshake.h"
#include "transport/reactor.h"
#include "transport/ring.h"

namespace gradwire::rpc::transport {

namespace tp = tensorpipe;
using tp::transport::Connection;
using tp::transport::Listener;

namespace {

constexpr size_t kStagingBytes = 64u << 10;
// Payload reads at least this large go straight into their destination.
constexpr size_t kDirectReadBytes = 16u << 10;
// TensorPipe's hello packet: a context name and a registration id.
constexpr size_t kMaxHelloFrameBytes = 64u << 10;
constexpr int kMaxIov = 64;
constexpr auto kRefusalLogPeriod = std::chrono::seconds(10);

class TransportError final : public tp::BaseError {
 public:
  explicit TransportError(std::string message) : message_(std::move(message)) {}
  std::string what() const override { return message_; }

 private:
  std::string message_;
};

tp::Error make_error(std::string message) {
  return tp::Error(std::make_shared<TransportError>(std::move(message)), "gradwire transport", 0);
}

tp::Error closed_error() {
  return tp::Error(std::make_shared<tp::transport::ConnectionClosedError>(), "gradwire transport",
                   0);
}

std::string errno_text(int err) {
  return std::strerror(err);
}

// TensorPipe's NopReader does not bounds-check the one-byte reads libnop makes for every
// value's prefix, so a truncated control frame would make decoding read past the frame (a
// null pointer when it ends exactly there; found by fuzz_transport). Frames are therefore
// decoded with a guard after them, whose bytes are a prefix no encoding accepts (libnop
// reserves 0x8a), so decoding past the end fails at its next prefix; and a decode counts
// only if the object it produced encodes back to exactly the frame's size, so nothing of
// the guard was taken as data.
constexpr size_t kNopGuardBytes = 4096;
const uint8_t* nop_guard() {
  static const std::vector<uint8_t> guard(kNopGuardBytes, 0x8a);
  return guard.data();
}

// Decodes a whole frame into `holder`; "" or why not.
std::string decode_nop(tp::AbstractNopHolder& holder, const char* data, size_t size) {
  tp::NopReader reader(reinterpret_cast<const uint8_t*>(data), size, nop_guard(), kNopGuardBytes);
  nop::Status<void> status = holder.read(reader);
  if (status.has_error()) return status.GetErrorMessage();
  if (holder.getSize() != size) {
    return "it holds " + std::to_string(size) + " bytes where its content takes " +
           std::to_string(holder.getSize());
  }
  return "";
}

bool unix_socket(StreamOptions::Family family) {
  return family != StreamOptions::Family::kTcp;
}

const char* family_name(StreamOptions::Family family) {
  switch (family) {
    case StreamOptions::Family::kTcp:
      return "tcp";
    case StreamOptions::Family::kLocal:
      return "local";
    case StreamOptions::Family::kUnix:
      return "unix";
  }
  return "?";
}

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

// "host:port", "[v6]:port" (tcp) or a name (local). Throws std::runtime_error with why.
Address parse_address(StreamOptions::Family family, const std::string& addr) {
  Address out;
  if (unix_socket(family)) {
    auto* un = reinterpret_cast<sockaddr_un*>(&out.storage);
    un->sun_family = AF_UNIX;
    if (addr.empty() || addr.size() + 1 > sizeof(un->sun_path)) {
      throw std::runtime_error("a local transport name must have 1 to " +
                               std::to_string(sizeof(un->sun_path) - 1) + " characters");
    }
    // The abstract namespace: a leading NUL, no file.
    un->sun_path[0] = '\0';
    std::memcpy(un->sun_path + 1, addr.data(), addr.size());
    out.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + addr.size());
    return out;
  }
  std::string host;
  std::string port;
  if (!addr.empty() && addr.front() == '[') {
    const size_t close = addr.find(']');
    if (close == std::string::npos || close + 1 >= addr.size() || addr[close + 1] != ':') {
      throw std::runtime_error("'" + addr + "' is not [host]:port");
    }
    host = addr.substr(1, close - 1);
    port = addr.substr(close + 2);
  } else {
    const size_t colon = addr.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("'" + addr + "' is not host:port");
    host = addr.substr(0, colon);
    port = addr.substr(colon + 1);
  }
  if (host.empty() || port.empty()) throw std::runtime_error("'" + addr + "' is not host:port");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throw std::runtime_error("cannot resolve '" + addr + "': " + ::gai_strerror(rc));
  }
  std::memcpy(&out.storage, found->ai_addr, found->ai_addrlen);
  out.length = found->ai_addrlen;
  ::freeaddrinfo(found);
  return out;
}

std::string format_address(StreamOptions::Family family, const sockaddr_storage& storage,
                           socklen_t length) {
  if (unix_socket(family)) {
    const auto* un = reinterpret_cast<const sockaddr_un*>(&storage);
    const size_t base = offsetof(sockaddr_un, sun_path);
    if (length <= base + 1) return "a local peer";
    return std::string(un->sun_path + 1, length - base - 1);
  }
  char text[INET6_ADDRSTRLEN] = {0};
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    return std::string(text) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    return "[" + std::string(text) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "an unknown address";
}

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

class ConnImpl;
class ListenerImpl;

// What one context's connections and listeners share: the loop, the options, and (loop
// thread only) the live objects, so that closing the context closes them.
struct Core : std::enable_shared_from_this<Core> {
  explicit Core(StreamOptions o)
      : options(std::move(o)),
        reactor(std::string(family_name(options.family)) + " " + options.name, options.spin) {
    if (!options.stats) options.stats = std::make_shared<TransportStats>();
  }

  const char* kind() const { return family_name(options.family); }

  // Runs fn on the loop, or returns false when the loop has stopped.
  bool run_on_loop(std::function<void()> fn) { return reactor.defer(std::move(fn)); }

  // Loop thread: a refused incoming connection, logged at most once per period with a
  // count of those not logged. Lines go through a background thread: the loop never
  // waits for a log that is not draining.
  void note_refused(const std::string& peer, const std::string& why) {
    options.stats->refused.fetch_add(1, std::memory_order_relaxed);
    if (refusals.note("from " + peer + ": " + why)) {
      log.log(LogLevel::kWarning, prefix() + "refused a connection from " + peer + ": " + why +
                                      " (further refusals are summarised every " +
                                      std::to_string(kRefusalLogPeriod.count()) + " s)");
      return;
    }
    if (!summary_armed) {
      summary_armed = true;
      std::weak_ptr<Core> weak = weak_from_this();
      reactor.add_timer(refusals.due(), [weak] {
        if (auto self = weak.lock()) self->flush_refusals();
      });
    }
  }

  void flush_refusals() {
    summary_armed = false;
    if (auto line = refusals.summarise("connections refused")) {
      log.log(LogLevel::kWarning, prefix() + *line);
    }
  }

  std::string prefix() const {
    return std::string("rpc transport ") + kind() + " of '" + options.name + "': ";
  }

  // What this end claims when it connects.
  PeerIdentity own_identity() const {
    if (options.identity) return options.identity();
    return PeerIdentity{options.name, -1, 0};
  }

  // "local" and "unix": "" when the process at the other end of `fd` may be admitted
  // (SO_PEERCRED), else why not.
  std::string check_peer_user(int fd) const {
    if (!unix_socket(options.family) || options.allow_other_uids) return "";
    ucred cred{};
    socklen_t len = sizeof(cred);
    if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
      return std::string("cannot learn the peer's user (SO_PEERCRED): ") + errno_text(errno);
    }
    const uid_t mine = ::geteuid();
    if (cred.uid == mine) return "";
    return "its process (pid " + std::to_string(cred.pid) + ") runs as uid " +
           std::to_string(cred.uid) + ", this one as uid " + std::to_string(mine) + "; the " +
           kind() +
           " transport admits only the same user unless other users are allowed "
           "(AgentOptions::local_allow_other_uids, GRADWIRE_RPC_LOCAL_ALLOW_OTHER_UIDS)";
  }

  StreamOptions options;
  Reactor reactor;
  std::atomic<bool> closing{false};
  // Loop thread only.
  bool closed = false;
  std::unordered_set<std::shared_ptr<ConnImpl>> conns;
  std::unordered_set<std::shared_ptr<ListenerImpl>> listeners;
  EventSummary refusals{std::chrono::duration_cast<std::chrono::seconds>(kRefusalLogPeriod)};
  bool summary_armed = false;
  BackgroundLog& log = BackgroundLog::shared();
};

// One connection, client or server side. All state is touched on the loop thread only;
// the public entry points defer to it.
class ConnImpl : public std::enable_shared_from_this<ConnImpl> {
 public:
  enum class Role { kClient, kServer };
  // The listener's notice that an incoming connection is ready for TensorPipe (or gone).
  using ReadyFn = std::function<void(const std::shared_ptr<ConnImpl>&, bool ok)>;

  ConnImpl(std::shared_ptr<Core> core, int fd, Role role, std::string peer)
      : core_(std::move(core)),
        fd_(fd),
        role_(role),
        peer_(std::move(peer)),
        handshake_(role == Role::kClient ? Handshake::Role::kClient : Handshake::Role::kServer,
                   core_->options.secret,
                   role == Role::kClient ? core_->own_identity() : PeerIdentity{}),
        staging_(new char[kStagingBytes]) {}

  ~ConnImpl() {
    if (fd_ >= 0) ::close(fd_);
    if (pending_fd_ >= 0) ::close(pending_fd_);
    if (received_fd_ >= 0) ::close(received_fd_);
  }

  // Loop thread. `connect_error` != 0: the non-blocking connect already failed.
  void start(bool connecting, int connect_error, ReadyFn on_ready,
             const std::string& bad_address = std::string()) {
    on_ready_ = std::move(on_ready);
    if (core_->closed) {
      fail(tp::Error(std::make_shared<tp::transport::ContextClosedError>(), "gradwire transport",
                     0));
      return;
    }
    core_->conns.insert(shared_from_this());
    if (!bad_address.empty()) {
      fail(make_error("cannot connect to " + peer_ + ": " + bad_address));
      return;
    }
    if (connect_error != 0 || fd_ < 0) {
      fail(make_error("connecting to " + peer_ + " failed: " + errno_text(connect_error)));
      return;
    }
    std::weak_ptr<ConnImpl> weak = weak_from_this();
    state_ = connecting ? State::kConnecting : State::kHandshake;
    events_ = EPOLLIN | EPOLLOUT;
    core_->reactor.add(fd_, events_, [weak](uint32_t ev) {
      if (auto self = weak.lock()) self->on_events(ev);
    });
    deadline_ =
        core_->reactor.add_timer(Reactor::Clock::now() + core_->options.handshake_timeout, [weak] {
          if (auto self = weak.lock()) self->on_deadline();
        });
    if (!connecting) send_handshake_output();
  }

  // ---- entry points (any thread)

  void read(Connection::read_callback_fn fn) {
    ReadOp op;
    op.kind = ReadOp::kUnsized;
    op.rfn = std::move(fn);
    submit_read(std::move(op));
  }
  void read(void* ptr, size_t length, Connection::read_callback_fn fn) {
    ReadOp op;
    op.kind = ReadOp::kSized;
    op.ptr = static_cast<char*>(ptr);
    op.expected = length;
    op.rfn = std::move(fn);
    submit_read(std::move(op));
  }
  void read(tp::AbstractNopHolder& object, Connection::read_nop_callback_fn fn) {
    ReadOp op;
    op.kind = ReadOp::kNop;
    op.nop = &object;
    op.nfn = std::move(fn);
    submit_read(std::move(op));
  }
  void write(const void* ptr, size_t length, Connection::write_callback_fn fn) {
    WriteOp op;
    op.header = length;
    op.ptr = static_cast<const char*>(ptr);
    op.length = length;
    op.fn = std::move(fn);
    if (!try_direct(op)) submit_write(std::move(op));
  }
  void write(const tp::AbstractNopHolder& object, Connection::write_callback_fn fn) {
    // Encoded now, on the caller's thread: the object need not outlive this call.
    WriteOp op;
    op.length = object.getSize();
    op.header = op.length;
    op.owned.reset(new char[op.length == 0 ? 1 : op.length]);
    tp::NopWriter writer(reinterpret_cast<uint8_t*>(op.owned.get()), op.length);
    nop::Status<void> status = object.write(writer);
    if (status.has_error()) {
      // Our own encoder failing is a bug; report it on the callback, not by throwing.
      fn(make_error(std::string("encoding a TensorPipe control frame failed: ") +
                    status.GetErrorMessage()));
      return;
    }
    op.ptr = op.owned.get();
    op.fn = std::move(fn);
    if (!try_direct(op)) submit_write(std::move(op));
  }
  void close() {
    auto self = shared_from_this();
    core_->run_on_loop([self] { self->fail(closed_error()); });
  }

  // Loop thread: closes it (the listener handing it over, or the context closing).
  void fail(tp::Error error);

 private:
  // kRingSetup: a "local" server waits for the client's ring segment. kVerifying: a server
  // waits for verify_peer's answer about the client's claimed identity.
  enum class State { kConnecting, kHandshake, kRingSetup, kPrefetch, kVerifying, kOpen, kClosed };

  struct ReadOp {
    enum Kind { kUnsized, kSized, kNop, kPrefetch } kind = kUnsized;
    char* ptr = nullptr;
    size_t expected = 0;
    tp::AbstractNopHolder* nop = nullptr;
    Connection::read_callback_fn rfn;
    Connection::read_nop_callback_fn nfn;
    uint8_t header[8] = {0};
    size_t header_got = 0;
    uint64_t length = 0;
    size_t got = 0;
    std::unique_ptr<char[]> owned;
    char* dest = nullptr;
  };
  struct WriteOp {
    uint64_t header = 0;
    const char* ptr = nullptr;
    size_t length = 0;
    std::unique_ptr<char[]> owned;
    size_t done = 0;  // of sizeof(header) + length
    Connection::write_callback_fn fn;
  };

  void submit_read(ReadOp op) {
    auto self = shared_from_this();
    auto holder = std::make_shared<ReadOp>(std::move(op));
    if (!core_->run_on_loop([self, holder] { self->start_read(std::move(*holder)); })) {
      fail_op(*holder, tp::Error(std::make_shared<tp::transport::ContextClosedError>(),
                                 "gradwire transport", 0));
    }
  }
  void submit_write(WriteOp op) {
    auto self = shared_from_this();
    auto holder = std::make_shared<WriteOp>(std::move(op));
    {
      MutexLock lock(write_mutex_);
      ++submitted_;
    }
    if (!core_->run_on_loop([self, holder] { self->start_write(std::move(*holder)); })) {
      {
        MutexLock lock(write_mutex_);
        --submitted_;
      }
      holder->fn(tp::Error(std::make_shared<tp::transport::ContextClosedError>(),
                           "gradwire transport", 0));
    }
  }

  // The common case, on the caller's thread: an open connection with nothing queued sends
  // the frame at once, without a hand-off to the loop. Returns false (op untouched) when
  // the frame must go through the loop; true when it was sent (its callback has run) or
  // queued behind a partial send that the loop finishes.
  bool try_direct(WriteOp& op) {
    bool queued = false;
    {
      MutexLock lock(write_mutex_);
      if (direct_fd_ < 0 || submitted_ > 0 || !writes_.empty()) return false;
      iovec iov[2] = {{&op.header, sizeof(op.header)}, {const_cast<char*>(op.ptr), op.length}};
      const ssize_t n = write_some_locked(direct_fd_, iov, op.length > 0 ? 2 : 1);
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;  // the loop reports it
      const size_t sent = n < 0 ? 0 : static_cast<size_t>(n);
      if (sent < sizeof(op.header) + op.length) {
        op.done = sent;
        writes_.push_back(std::move(op));
        queued = true;
      }
    }
    if (queued) {
      auto self = shared_from_this();
      core_->run_on_loop([self] { self->pump_writes(); });
      return true;
    }
    op.fn(tp::Error::kSuccess);
    return true;
  }

  static void fail_op(ReadOp& op, const tp::Error& error) {
    if (op.kind == ReadOp::kNop) {
      op.nfn(error);
    } else if (op.rfn) {
      op.rfn(error, nullptr, 0);
    }
  }

  void start_read(ReadOp op) {
    // TensorPipe's first read of an accepted connection is its hello, already here whole.
    if (prefetched_) {
      std::string frame = std::move(*prefetched_);
      prefetched_.reset();
      deliver_prefetched(std::move(op), frame);
      return;
    }
    if (state_ == State::kClosed) {
      fail_op(op, error_);
      return;
    }
    reads_.push_back(std::move(op));
    if (state_ == State::kOpen) {
      pump_reads();
    }
  }

  void deliver_prefetched(ReadOp op, const std::string& frame) {
    if (op.kind == ReadOp::kSized) {
      if (op.expected != frame.size()) {
        fail_op(op, make_error("frame size mismatch on the first frame"));
        return;
      }
      std::memcpy(op.ptr, frame.data(), frame.size());
      op.rfn(tp::Error::kSuccess, op.ptr, frame.size());
      return;
    }
    if (op.kind == ReadOp::kNop) {
      const std::string why = decode_nop(*op.nop, frame.data(), frame.size());
      op.nfn(why.empty() ? tp::Error() : make_error("the first frame does not decode: " + why));
      return;
    }
    op.rfn(tp::Error::kSuccess, frame.data(), frame.size());
  }

  void start_write(WriteOp op) {
    {
      MutexLock lock(write_mutex_);
      --submitted_;
      if (state_ != State::kClosed) writes_.push_back(std::move(op));
    }
    if (state_ == State::kClosed) {
      op.fn(error_);
      return;
    }
    if (state_ == State::kOpen) pump_writes();
  }

  void on_events(uint32_t ev) {
    if (state_ == State::kClosed) return;
    if (state_ == State::kConnecting) {
      if ((ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
      int err = 0;
      socklen_t len = sizeof(err);
      ::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        fail(make_error("connecting to " + peer_ + " failed: " + errno_text(err)));
        return;
      }
      // Whoever listens under a local name: the same user only (a name is anyone's to take).
      if (const std::string why = core_->check_peer_user(fd_); !why.empty()) {
        refuse_or_fail(why);
        return;
      }
      state_ = State::kHandshake;
      send_handshake_output();
      if (state_ == State::kClosed) return;
    }
    if (ring_mode_) {
      // The socket carries wake-ups only; its end tells us the peer has gone.
      if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0 && drain_wake_socket()) {
        return;
      }
      pump_reads();
      if (state_ == State::kClosed) return;
      pump_writes();
      if (state_ != State::kClosed) update_interest();
      return;
    }
    if ((ev & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP)) != 0) pump_reads();
    if (state_ == State::kClosed) return;
    if ((ev & EPOLLOUT) != 0) pump_writes();
    if (state_ != State::kClosed) update_interest();
  }

  void on_deadline() {
    deadline_ = 0;
    if (state_ == State::kOpen || state_ == State::kClosed) return;
    refuse_or_fail("did not complete the handshake within " +
                   std::to_string(core_->options.handshake_timeout.count()) + " ms");
  }

  // A handshake (or first-frame) failure: an incoming connection is refused and counted; an
  // outgoing one fails with the reason.
  void refuse_or_fail(const std::string& why) {
    if (role_ == Role::kServer) {
      const PeerIdentity& claim = handshake_.peer();
      core_->note_refused(claim.name.empty()
                              ? peer_
                              : peer_ + " (claiming worker '" + printable(claim.name) + "', rank " +
                                    std::to_string(claim.rank) + ")",
                          why);
      fail(make_error("refused: " + why));
    } else {
      fail(make_error("connection to " + peer_ + ": " + why));
    }
  }

  void send_handshake_output() {
    if (handshake_.has_output()) handshake_out_ += handshake_.take_output();
    pump_writes();
  }

  void on_handshake_done() {
    const bool rings = core_->options.family == StreamOptions::Family::kLocal;
    if (role_ == Role::kClient) {
      if (rings) {
        std::string error;
        segment_ = RingSegment::create(core_->options.ring_bytes, &error);
        if (segment_ == nullptr) {
          fail(make_error("connection to " + peer_ +
                          ": cannot set up shared-memory rings: " + error));
          return;
        }
        handshake_out_ += segment_->setup_message();
        pending_fd_ = segment_->release_fd();
        enter_ring_mode(/*read_ring=*/1, /*write_ring=*/0);
        send_handshake_output();
        if (state_ == State::kClosed) return;
      }
      finish_opening();
      return;
    }
    if (rings) {
      state_ = State::kRingSetup;
      return;
    }
    begin_prefetch();
  }

  // The server holds the connection until TensorPipe's hello frame is here whole.
  void begin_prefetch() {
    state_ = State::kPrefetch;
    ReadOp op;
    op.kind = ReadOp::kPrefetch;
    reads_.push_front(std::move(op));
  }

  void finish_opening() {
    state_ = State::kOpen;
    {
      MutexLock lock(write_mutex_);
      direct_fd_ = fd_;
      ring_writing_ = ring_mode_;
    }
    if (deadline_ != 0) {
      core_->reactor.cancel_timer(deadline_);
      deadline_ = 0;
    }
    if (role_ == Role::kServer) {
      core_->options.stats->accepted.fetch_add(1, std::memory_order_relaxed);
      if (on_ready_) {
        ReadyFn ready = std::move(on_ready_);
        on_ready_ = nullptr;
        ready(shared_from_this(), true);
      }
    }
    pump_writes();
  }

  size_t staged() const { return staged_end_ - staged_begin_; }

  // Moves staged bytes into the handshake or the pending reads, completing what it can.
  void consume_staging() {
    while (staged() > 0 && state_ != State::kClosed) {
      if (state_ == State::kHandshake) {
        const size_t used = handshake_.feed(
            reinterpret_cast<const uint8_t*>(staging_.get() + staged_begin_), staged());
        staged_begin_ += used;
        if (handshake_.has_output()) send_handshake_output();
        if (state_ == State::kClosed) return;
        if (handshake_.state() == Handshake::State::kFailed) {
          refuse_or_fail(handshake_.error());
          return;
        }
        if (handshake_.state() == Handshake::State::kDone) {
          on_handshake_done();
          continue;
        }
        return;  // needs more bytes
      }
      if (state_ == State::kRingSetup) {
        const size_t take = std::min(kRingSetupBytes - setup_.size(), staged());
        setup_.append(staging_.get() + staged_begin_, take);
        staged_begin_ += take;
        if (setup_.size() < kRingSetupBytes) return;
        if (!attach_rings()) return;
        begin_prefetch();
        return;
      }
      if (state_ != State::kOpen && state_ != State::kPrefetch) return;
      if (reads_.empty()) return;
      ReadOp& op = reads_.front();
      if (op.header_got < sizeof(op.header)) {
        const size_t take = std::min(sizeof(op.header) - op.header_got, staged());
        std::memcpy(op.header + op.header_got, staging_.get() + staged_begin_, take);
        op.header_got += take;
        staged_begin_ += take;
        if (op.header_got < sizeof(op.header)) return;
        if (!begin_payload(op)) return;
      }
      if (op.got < op.length) {
        const size_t take = std::min<size_t>(op.length - op.got, staged());
        std::memcpy(op.dest + op.got, staging_.get() + staged_begin_, take);
        op.got += take;
        staged_begin_ += take;
      }
      if (op.got == op.length) complete_front();
    }
  }

  // The frame's length is known: check it before anything is allocated for it.
  bool begin_payload(ReadOp& op) {
    std::memcpy(&op.length, op.header, sizeof(op.length));
    if (op.kind == ReadOp::kSized) {
      if (op.length != op.expected) {
        bad_frame("the peer sent a frame of " + std::to_string(op.length) + " bytes where one of " +
                  std::to_string(op.expected) + " was expected");
        return false;
      }
      op.dest = op.ptr;
      return true;
    }
    const size_t limit =
        op.kind == ReadOp::kPrefetch ? kMaxHelloFrameBytes : core_->options.max_frame_bytes;
    if (op.length > limit) {
      bad_frame("the peer sent a frame of " + std::to_string(op.length) +
                " bytes, over the limit of " + std::to_string(limit));
      return false;
    }
    op.owned.reset(new char[op.length == 0 ? 1 : op.length]);
    op.dest = op.owned.get();
    return true;
  }

  void bad_frame(const std::string& why) {
    if (state_ == State::kPrefetch) {
      refuse_or_fail(why);
      return;
    }
    core_->options.stats->bad_frames.fetch_add(1, std::memory_order_relaxed);
    fail(make_error("connection with " + peer_ + " closed: " + why));
  }

  void complete_front() {
    ReadOp op = std::move(reads_.front());
    reads_.pop_front();
    switch (op.kind) {
      case ReadOp::kSized:
        op.rfn(tp::Error::kSuccess, op.ptr, op.length);
        return;
      case ReadOp::kUnsized:
        op.rfn(tp::Error::kSuccess, op.dest, op.length);
        return;
      case ReadOp::kNop: {
        const std::string why = decode_nop(*op.nop, op.dest, op.length);
        if (!why.empty()) {
          const tp::Error error =
              make_error("connection with " + peer_ +
                         " closed: a TensorPipe control frame does not decode (" + why + ")");
          core_->options.stats->bad_frames.fetch_add(1, std::memory_order_relaxed);
          op.nfn(error);
          fail(error);
          return;
        }
        op.nfn(tp::Error::kSuccess);
        return;
      }
      case ReadOp::kPrefetch: {
        if (const std::string why = check_first_frame(op.dest, op.length); !why.empty()) {
          refuse_or_fail(why);
          return;
        }
        prefetched_ = std::string(op.dest, op.length);
        begin_verify();
        return;
      }
    }
  }

  // "" when the first frame is what this listener expects from a peer that claimed
  // handshake_.peer(), else why not. Sets claim_: what verify_peer is asked about.
  std::string check_first_frame(const char* data, size_t size) {
    claim_ = handshake_.peer();
    if (core_->options.first_frame == StreamOptions::FirstFrame::kMptLaneHello) {
      // The mpt channel dereferences the ClientHello it expects without checking for it.
      tp::NopHolder<tp::channel::mpt::Packet> hello;
      if (decode_nop(hello, data, size).empty() &&
          hello.getObject().is<tp::channel::mpt::ClientHello>()) {
        return "";
      }
      return "its first frame is not an mpt lane hello";
    }
    tp::NopHolder<tp::Packet> hello;
    if (!decode_nop(hello, data, size).empty()) return "its first frame is not a TensorPipe hello";
    if (hello.getObject().is<tp::RequestedConnection>()) return "";
    if (!hello.getObject().is<tp::SpontaneousConnection>()) {
      return "its first frame is not a TensorPipe hello";
    }
    // The pipe TensorPipe opens for it is known by this name: it must be the one the
    // handshake claimed (and verify_peer admits), or a peer could speak for another. A
    // handshake that claimed nobody leaves the hello's name to verify_peer, with no rank.
    const std::string& named = hello.getObject().get<tp::SpontaneousConnection>()->contextName;
    if (claim_.name.empty()) claim_.name = named;
    if (named == claim_.name) return "";
    return "its TensorPipe hello names worker '" + printable(named) +
           "', but its handshake claimed '" + printable(claim_.name) + "'";
  }

  // The server: asks verify_peer about the client's claim before TensorPipe sees it.
  void begin_verify() {
    if (!core_->options.verify_peer) {
      finish_opening();
      return;
    }
    state_ = State::kVerifying;
    std::weak_ptr<ConnImpl> weak = weak_from_this();
    std::shared_ptr<Core> core = core_;
    core_->options.verify_peer(claim_, [weak, core](std::string why) {
      core->run_on_loop([weak, why = std::move(why)] {
        auto self = weak.lock();
        if (self == nullptr || self->state_ != State::kVerifying) return;
        if (!why.empty()) {
          self->refuse_or_fail(why);
          return;
        }
        self->finish_opening();
      });
    });
  }

  void pump_reads() {
    for (;;) {
      consume_staging();
      if (state_ == State::kClosed) return;
      if (staged() == 0) staged_begin_ = staged_end_ = 0;
      char* into = nullptr;
      size_t room = 0;
      bool direct = false;
      const bool reading = state_ == State::kOpen || state_ == State::kPrefetch;
      if (reading && !reads_.empty() && staged() == 0) {
        ReadOp& op = reads_.front();
        if (op.header_got == sizeof(op.header) && op.length - op.got >= kDirectReadBytes) {
          into = op.dest + op.got;
          room = op.length - op.got;
          direct = true;
        }
      }
      if (!direct) {
        if (staged_end_ == kStagingBytes && staged_begin_ > 0) {
          std::memmove(staging_.get(), staging_.get() + staged_begin_, staged());
          staged_end_ -= staged_begin_;
          staged_begin_ = 0;
        }
        if (staged_end_ == kStagingBytes) {
          // Full and nobody reading: stop reading until a read is posted.
          reading_paused_ = true;
          update_interest();
          return;
        }
        into = staging_.get() + staged_end_;
        room = kStagingBytes - staged_end_;
      }
      const ssize_t n = read_some(into, room);
      if (fd_abuse_) {
        refuse_or_fail("it passed file descriptors where none, or one ring segment, belong");
        return;
      }
      if (n < 0 && ring_corrupt_.load(std::memory_order_relaxed)) {
        bad_frame("the peer corrupted the positions of the shared-memory ring");
        return;
      }
      if (n > 0) {
        if (direct) {
          ReadOp& op = reads_.front();
          op.got += static_cast<size_t>(n);
          if (op.got == op.length) complete_front();
        } else {
          staged_end_ += static_cast<size_t>(n);
        }
        continue;
      }
      if (n == 0) {
        if (opening()) {
          refuse_or_fail("the peer closed the connection during the handshake");
        } else {
          fail(make_error("the connection with " + peer_ + " was closed by the peer"));
        }
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      const int err = errno;
      if (opening()) {
        refuse_or_fail("reading failed: " + errno_text(err));
      } else {
        fail(make_error("connection with " + peer_ + " lost: " + errno_text(err)));
      }
      return;
    }
    reading_paused_ = false;
    update_interest();
  }

  void pump_writes() {
    while (!handshake_out_.empty()) {
      const ssize_t n = pending_fd_ >= 0 ? send_with_segment()
                                         : ::send(fd_, handshake_out_.data(), handshake_out_.size(),
                                                  MSG_NOSIGNAL);
      if (n > 0) {
        handshake_out_.erase(0, static_cast<size_t>(n));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        update_interest();
        return;
      }
      refuse_or_fail("writing the handshake failed: " + errno_text(errno));
      return;
    }
    if (state_ != State::kOpen) {
      update_interest();
      return;
    }
    std::vector<Connection::write_callback_fn> done;
    int lost = 0;
    {
      MutexLock lock(write_mutex_);
      lost = send_queued_locked(done);
    }
    if (lost != 0) {
      for (auto& fn : done)
        fn(tp::Error::kSuccess);
      if (ring_corrupt_.load(std::memory_order_relaxed)) {
        bad_frame("the peer corrupted the positions of the shared-memory ring");
      } else {
        fail(make_error("connection with " + peer_ + " lost: " + errno_text(lost)));
      }
      return;
    }
    update_interest();
    for (auto& fn : done)
      fn(tp::Error::kSuccess);
  }

  // Sends what is queued until done or the socket is full; the callbacks of the frames
  // sent whole go to `done`. Returns 0, or the errno that lost the connection.
  int send_queued_locked(std::vector<Connection::write_callback_fn>& done)
      GRADWIRE_REQUIRES(write_mutex_) {
    while (!writes_.empty()) {
      iovec iov[kMaxIov];
      int count = 0;
      for (auto it = writes_.begin(); it != writes_.end() && count + 2 <= kMaxIov; ++it) {
        if (it->done < sizeof(it->header)) {
          iov[count++] = {reinterpret_cast<char*>(&it->header) + it->done,
                          sizeof(it->header) - it->done};
          if (it->length > 0) iov[count++] = {const_cast<char*>(it->ptr), it->length};
        } else {
          const size_t off = it->done - sizeof(it->header);
          iov[count++] = {const_cast<char*>(it->ptr) + off, it->length - off};
        }
      }
      const ssize_t n = write_some_locked(fd_, iov, count);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return errno;
      }
      size_t left = static_cast<size_t>(n);
      while (left > 0) {
        WriteOp& op = writes_.front();
        const size_t need = sizeof(op.header) + op.length - op.done;
        const size_t take = std::min(need, left);
        op.done += take;
        left -= take;
        if (op.done == sizeof(op.header) + op.length) {
          done.push_back(std::move(op.fn));
          writes_.pop_front();
        }
      }
      // A zero-length frame is complete once its header is out.
      while (!writes_.empty() &&
             writes_.front().done == sizeof(writes_.front().header) + writes_.front().length) {
        done.push_back(std::move(writes_.front().fn));
        writes_.pop_front();
      }
    }
    return 0;
  }

  void update_interest() {
    if (state_ == State::kClosed) return;
    uint32_t want = 0;
    if (!reading_paused_ || ring_mode_) want |= EPOLLIN;
    bool queued = false;
    {
      MutexLock lock(write_mutex_);
      queued = !writes_.empty();
    }
    if (state_ == State::kConnecting || !handshake_out_.empty() ||
        (state_ == State::kOpen && queued && !ring_mode_)) {
      want |= EPOLLOUT;
    }
    if (want != events_) {
      events_ = want;
      core_->reactor.modify(fd_, events_);
    }
  }

  bool opening() const {
    return state_ == State::kHandshake || state_ == State::kRingSetup ||
           state_ == State::kPrefetch || state_ == State::kVerifying;
  }

  // Loop thread: bytes from the peer, like recv(): > 0, 0 at the end of the stream, or -1
  // with errno (EAGAIN: nothing now). In ring mode they come from the inbound ring (whose
  // end is learnt from the socket instead, drain_wake_socket).
  ssize_t read_some(char* into, size_t room) {
    if (ring_mode_) {
      bool corrupt = false;
      const size_t n = in_.read(into, room, &corrupt);
      if (corrupt) {
        ring_corrupt_.store(true, std::memory_order_relaxed);
        errno = EPROTO;
        return -1;
      }
      if (n == 0) {
        errno = EAGAIN;
        return -1;
      }
      if (in_.producer_wants_wake()) send_wake(fd_);
      return static_cast<ssize_t>(n);
    }
    // A "local" server may receive its ring segment's descriptor (only) before the rings are
    // set up; anything else passed is refused.
    const bool may_pass_fd = core_->options.family == StreamOptions::Family::kLocal &&
                             role_ == Role::kServer &&
                             (state_ == State::kHandshake || state_ == State::kRingSetup);
    for (;;) {
      ssize_t n = -1;
      if (may_pass_fd) {
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
        iovec iov{into, room};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof(control);
        n = ::recvmsg(fd_, &msg, MSG_CMSG_CLOEXEC);
        if (n >= 0) take_descriptors(msg);
      } else {
        n = ::recv(fd_, into, room, 0);
      }
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  void take_descriptors(msghdr& msg) {
    if ((msg.msg_flags & MSG_CTRUNC) != 0) fd_abuse_ = true;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd = -1;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        if (received_fd_ < 0 && !fd_abuse_) {
          received_fd_ = fd;
        } else {
          ::close(fd);
          fd_abuse_ = true;
        }
      }
    }
  }

  // Any thread holding write_mutex_ (or the loop): frame bytes to the peer, like sendmsg():
  // > 0, or -1 with errno (EAGAIN: no room now). In ring mode into the outbound ring; a full
  // ring asks the consumer for a wake-up when it has read.
  ssize_t write_some_locked(int fd, const iovec* iov, int count) GRADWIRE_REQUIRES(write_mutex_) {
    if (ring_writing_) {
      for (;;) {
        bool corrupt = false;
        const size_t n = out_.write(iov, count, &corrupt);
        if (!corrupt && n > 0) {
          want_space_.store(false, std::memory_order_relaxed);
          if (out_.consumer_wants_wake()) send_wake(fd);
          return static_cast<ssize_t>(n);
        }
        if (!corrupt && out_.wait_for_space(&corrupt)) continue;
        if (corrupt) {
          ring_corrupt_.store(true, std::memory_order_relaxed);
          errno = EPROTO;
          return -1;
        }
        want_space_.store(true, std::memory_order_relaxed);
        errno = EAGAIN;
        return -1;
      }
    }
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(count);
    for (;;) {
      const ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && errno == EINTR) continue;
      return n;
    }
  }

  // One byte on the socket wakes the peer's loop. EAGAIN: bytes it has not read are there
  // already, so it wakes anyway.
  static void send_wake(int fd) {
    const char byte = 'w';
    ssize_t n = -1;
    do {
      n = ::send(fd, &byte, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    } while (n < 0 && errno == EINTR);
  }

  // The client's setup message, its first byte carrying the ring segment's descriptor.
  ssize_t send_with_segment() {
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov{handshake_out_.data(), handshake_out_.size()};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &pending_fd_, sizeof(int));
    const ssize_t n = ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      // Passed with the first byte: the mapping stays, our descriptor is no longer needed.
      ::close(pending_fd_);
      pending_fd_ = -1;
    }
    return n;
  }

  // Ring mode, the socket is readable: wake-ups are dropped; its end means the peer has
  // gone. Returns true when that closed the connection.
  bool drain_wake_socket() {
    char sink[256];
    for (;;) {
      const ssize_t n = ::recv(fd_, sink, sizeof(sink), 0);
      if (n > 0) continue;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
      const std::string why = n == 0 ? std::string("closed by the peer") : errno_text(errno);
      // What the peer wrote before it went is delivered first.
      pump_reads();
      if (state_ == State::kClosed) return true;
      if (opening()) {
        refuse_or_fail("the peer closed the connection during the handshake");
      } else {
        fail(
            make_error("the connection with " + peer_ + " was " + (n == 0 ? why : "lost: " + why)));
      }
      return true;
    }
  }

  // The server: the client's setup message is here whole; maps its segment.
  bool attach_rings() {
    std::string error;
    const size_t capacity =
        RingSegment::parse_setup(reinterpret_cast<const uint8_t*>(setup_.data()), &error);
    if (capacity == 0) {
      refuse_or_fail(error);
      return false;
    }
    if (received_fd_ < 0) {
      refuse_or_fail("its ring setup came without a shared-memory segment");
      return false;
    }
    const int fd = received_fd_;
    received_fd_ = -1;
    segment_ = RingSegment::attach(fd, capacity, &error);
    if (segment_ == nullptr) {
      refuse_or_fail(error);
      return false;
    }
    enter_ring_mode(/*read_ring=*/0, /*write_ring=*/1);
    return true;
  }

  void enter_ring_mode(int read_ring, int write_ring) {
    const size_t capacity = segment_->capacity();
    in_ = RingReader(segment_->control(read_ring), segment_->data(read_ring), capacity);
    {
      MutexLock lock(write_mutex_);
      out_ = RingWriter(segment_->control(write_ring), segment_->data(write_ring), capacity);
    }
    ring_mode_ = true;
    // Bytes still staged came over the socket after the handshake: wake-ups, not frames.
    staged_begin_ = staged_end_ = 0;
    std::weak_ptr<ConnImpl> weak = weak_from_this();
    poller_ = core_->reactor.add_poller([weak](bool arm) {
      auto self = weak.lock();
      return self != nullptr && self->poll_ring(arm);
    });
  }

  // The loop's poller (Reactor::add_poller): while it spins, reads what the ring holds and
  // writes what waited for space; before it sleeps, arms the ring's wake-up.
  bool poll_ring(bool arm) {
    if (state_ == State::kClosed || !ring_mode_) return false;
    bool corrupt = false;
    bool found = false;
    if (arm) {
      found = in_.arm(&corrupt) && !reading_paused_;
    } else {
      in_.disarm();
      if (!reading_paused_ && in_.readable(&corrupt) && !corrupt) {
        const uint64_t before = in_.position();
        pump_reads();
        if (state_ == State::kClosed) return true;
        found = in_.position() != before;
      }
    }
    if (!corrupt && want_space_.load(std::memory_order_relaxed)) {
      bool space = false;
      {
        MutexLock lock(write_mutex_);
        space = out_.writable(&corrupt);
      }
      if (space && !corrupt) {
        if (arm) return true;
        pump_writes();
        found = true;
      }
    }
    if (corrupt) {
      bad_frame("the peer corrupted the positions of the shared-memory ring");
      return true;
    }
    return found;
  }

  friend class ListenerImpl;

  std::shared_ptr<Core> core_;
  int fd_;
  Role role_;
  std::string peer_;
  Handshake handshake_;
  ReadyFn on_ready_;
  State state_ = State::kHandshake;
  tp::Error error_;
  uint32_t events_ = 0;
  uint64_t deadline_ = 0;
  bool reading_paused_ = false;
  std::unique_ptr<char[]> staging_;
  size_t staged_begin_ = 0;
  size_t staged_end_ = 0;
  std::string handshake_out_;
  PeerIdentity claim_;  // server: whom the peer claims to be, once its first frame is here
  std::optional<std::string> prefetched_;
  std::deque<ReadOp> reads_;
  // The write side is shared with the callers' threads (try_direct).
  Mutex write_mutex_;
  std::deque<WriteOp> writes_ GRADWIRE_GUARDED_BY(write_mutex_);
  int submitted_ GRADWIRE_GUARDED_BY(write_mutex_) = 0;   // on their way to the loop
  int direct_fd_ GRADWIRE_GUARDED_BY(write_mutex_) = -1;  // >= 0 while open
  // Ring mode ("local"): the shared segment, the loop's end of the inbound ring and the
  // writers' end of the outbound one.
  std::unique_ptr<RingSegment> segment_;
  bool ring_mode_ = false;  // loop thread
  RingReader in_;           // loop thread
  RingWriter out_ GRADWIRE_GUARDED_BY(write_mutex_);
  bool ring_writing_ GRADWIRE_GUARDED_BY(write_mutex_) = false;  // open, in ring mode
  std::atomic<bool> want_space_{false};                          // the outbound ring was full
  std::atomic<bool> ring_corrupt_{false};  // the peer broke the ring's invariants
  uint64_t poller_ = 0;
  int pending_fd_ = -1;   // client: the segment to pass with the setup message
  int received_fd_ = -1;  // server: the segment passed with it
  bool fd_abuse_ = false;
  std::string setup_;  // server: the setup message gathered so far
};

void ConnImpl::fail(tp::Error error) {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  error_ = error;
  if (deadline_ != 0) {
    core_->reactor.cancel_timer(deadline_);
    deadline_ = 0;
  }
  std::deque<WriteOp> writes;
  {
    // No caller's thread writes to the descriptor once this returns.
    MutexLock lock(write_mutex_);
    direct_fd_ = -1;
    ring_writing_ = false;
    writes.swap(writes_);
  }
  if (poller_ != 0) {
    core_->reactor.remove_poller(poller_);
    poller_ = 0;
  }
  ring_mode_ = false;
  if (fd_ >= 0) {
    core_->reactor.remove(fd_);
    ::close(fd_);
    fd_ = -1;
  }
  auto self = shared_from_this();
  core_->conns.erase(self);
  std::deque<ReadOp> reads;
  reads.swap(reads_);
  if (on_ready_) {
    ReadyFn ready = std::move(on_ready_);
    on_ready_ = nullptr;
    ready(self, false);
  }
  for (auto& op : reads) {
    if (op.kind != ReadOp::kPrefetch) fail_op(op, error);
  }
  for (auto& op : writes)
    op.fn(error);
}

// What TensorPipe holds: dropping it closes the connection.
class ConnHandle final : public Connection {
 public:
  explicit ConnHandle(std::shared_ptr<ConnImpl> impl) : impl_(std::move(impl)) {}
  ~ConnHandle() override { impl_->close(); }
  void read(read_callback_fn fn) override { impl_->read(std::move(fn)); }
  void read(void* ptr, size_t length, read_callback_fn fn) override {
    impl_->read(ptr, length, std::move(fn));
  }
  void write(const void* ptr, size_t length, write_callback_fn fn) override {
    impl_->write(ptr, length, std::move(fn));
  }
  void read(tp::AbstractNopHolder& object, read_nop_callback_fn fn) override {
    impl_->read(object, std::move(fn));
  }
  void write(const tp::AbstractNopHolder& object, write_callback_fn fn) override {
    impl_->write(object, std::move(fn));
  }
  void setId(std::string /*id*/) override {}
  void close() override { impl_->close(); }

 private:
  std::shared_ptr<ConnImpl> impl_;
};

class ListenerImpl : public std::enable_shared_from_this<ListenerImpl> {
 public:
  ListenerImpl(std::shared_ptr<Core> core, int fd, std::string addr, std::string error)
      : core_(std::move(core)), fd_(fd), addr_(std::move(addr)), error_(std::move(error)) {}
  ~ListenerImpl() {
    if (fd_ >= 0) ::close(fd_);
  }

  const std::string& addr() const { return addr_; }

  // Loop thread.
  void start() {
    if (fd_ < 0) return;
    if (core_->closed) {
      close_now();
      return;
    }
    core_->listeners.insert(shared_from_this());
    std::weak_ptr<ListenerImpl> weak = weak_from_this();
    core_->reactor.add(fd_, EPOLLIN, [weak](uint32_t) {
      if (auto self = weak.lock()) self->on_accept();
    });
  }

  void accept(Listener::accept_callback_fn fn) {
    auto self = shared_from_this();
    auto holder = std::make_shared<Listener::accept_callback_fn>(std::move(fn));
    if (!core_->run_on_loop([self, holder] {
          self->waiters_.push_back(std::move(*holder));
          self->deliver();
        })) {
      (*holder)(tp::Error(std::make_shared<tp::transport::ListenerClosedError>(),
                          "gradwire transport", 0),
                nullptr);
    }
  }

  void close() {
    auto self = shared_from_this();
    core_->run_on_loop([self] { self->close_now(); });
  }

  // Loop thread.
  void close_now() {
    if (closed_) return;
    closed_ = true;
    if (fd_ >= 0) {
      core_->reactor.remove(fd_);
      ::close(fd_);
      fd_ = -1;
    }
    core_->listeners.erase(shared_from_this());
    std::deque<std::shared_ptr<ConnImpl>> ready;
    ready.swap(ready_);
    for (auto& c : ready)
      c->fail(closed_error());
    deliver();
  }

 private:
  void deliver() {
    while (!waiters_.empty()) {
      if (closed_ || !error_.empty()) {
        Listener::accept_callback_fn fn = std::move(waiters_.front());
        waiters_.pop_front();
        if (!error_.empty()) {
          fn(make_error(error_), nullptr);
        } else {
          fn(tp::Error(std::make_shared<tp::transport::ListenerClosedError>(), "gradwire transport",
                       0),
             nullptr);
        }
        continue;
      }
      if (ready_.empty()) return;
      Listener::accept_callback_fn fn = std::move(waiters_.front());
      waiters_.pop_front();
      std::shared_ptr<ConnImpl> conn = std::move(ready_.front());
      ready_.pop_front();
      fn(tp::Error::kSuccess, std::make_shared<ConnHandle>(std::move(conn)));
    }
  }

  void on_accept() {
    for (;;) {
      sockaddr_storage from{};
      socklen_t from_len = sizeof(from);
      const int fd = ::accept4(fd_, reinterpret_cast<sockaddr*>(&from), &from_len,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        // Out of descriptors or memory: stop accepting for a moment (level-triggered epoll
        // would spin), then go on; the listener itself never fails.
        const int err = errno;
        core_->log.log(LogLevel::kWarning, core_->prefix() + "accepting a connection failed: " +
                                               errno_text(err) + "; retrying in 100 ms");
        core_->reactor.modify(fd_, 0);
        std::weak_ptr<ListenerImpl> weak = weak_from_this();
        core_->reactor.add_timer(Reactor::Clock::now() + std::chrono::milliseconds(100), [weak] {
          auto self = weak.lock();
          if (self && !self->closed_) self->core_->reactor.modify(self->fd_, EPOLLIN);
        });
        return;
      }
      const std::string peer = format_address(core_->options.family, from, from_len);
      if (const std::string why = core_->check_peer_user(fd); !why.empty()) {
        ::close(fd);
        core_->note_refused(peer, why);
        continue;
      }
      if (handshaking_ >= core_->options.max_handshaking) {
        ::close(fd);
        core_->note_refused(
            peer, "too many connections in their handshake (" + std::to_string(handshaking_) + ")");
        continue;
      }
      if (!unix_socket(core_->options.family)) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      }
      auto conn = std::make_shared<ConnImpl>(core_, fd, ConnImpl::Role::kServer, peer);
      ++handshaking_;
      std::weak_ptr<ListenerImpl> weak = weak_from_this();
      conn->start(false, 0, [weak](const std::shared_ptr<ConnImpl>& c, bool ok) {
        auto self = weak.lock();
        if (self == nullptr) return;
        --self->handshaking_;
        if (!ok) return;
        if (self->closed_) {
          c->fail(closed_error());
          return;
        }
        self->ready_.push_back(c);
        self->deliver();
      });
    }
  }

  std::shared_ptr<Core> core_;
  int fd_;
  const std::string addr_;
  const std::string error_;
  // Loop thread only.
  bool closed_ = false;
  int handshaking_ = 0;
  std::deque<std::shared_ptr<ConnImpl>> ready_;
  std::deque<Listener::accept_callback_fn> waiters_;
};

class ListenerHandle final : public Listener {
 public:
  explicit ListenerHandle(std::shared_ptr<ListenerImpl> impl) : impl_(std::move(impl)) {}
  ~ListenerHandle() override { impl_->close(); }
  void accept(accept_callback_fn fn) override { impl_->accept(std::move(fn)); }
  std::string addr() const override { return impl_->addr(); }
  void setId(std::string /*id*/) override {}
  void close() override { impl_->close(); }

 private:
  std::shared_ptr<ListenerImpl> impl_;
};

std::string host_domain(StreamOptions::Family family) {
  // Abstract Unix sockets (and the descriptors passed over them) are shared by the
  // processes of one host and network namespace.
  struct stat st {};
  std::string netns = "0";
  if (::stat("/proc/self/ns/net", &st) == 0) netns = std::to_string(st.st_ino);
  return std::string("gradwire-") + family_name(family) + ":" +
         read_first_line("/proc/sys/kernel/random/boot_id") + ":" + netns;
}

class ContextImpl final : public StreamContext {
 public:
  explicit ContextImpl(StreamOptions options)
      : core_(std::make_shared<Core>(std::move(options))),
        domain_(unix_socket(core_->options.family) ? host_domain(core_->options.family)
                                                   : std::string("gradwire-tcp")),
        viable_(core_->options.family != StreamOptions::Family::kLocal || RingSegment::viable()) {}

  ~ContextImpl() override {
    close();
    join();
  }

  std::shared_ptr<Connection> connect(std::string addr) override {
    const bool tcp = !unix_socket(core_->options.family);
    int fd = -1;
    int err = 0;
    std::string bad_address;
    try {
      const Address a = parse_address(core_->options.family, addr);
      fd = ::socket(a.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        err = errno;
      } else {
        if (tcp) {
          const int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0 &&
            errno != EINPROGRESS) {
          err = errno;
        }
      }
    } catch (const std::exception& e) {
      bad_address = e.what();
    }
    if (fd >= 0 && err != 0) {
      ::close(fd);
      fd = -1;
    }
    auto conn = std::make_shared<ConnImpl>(core_, fd, ConnImpl::Role::kClient, addr);
    // A closed context runs nothing more: the connection's operations then fail at once.
    core_->run_on_loop([conn, err, bad_address] { conn->start(true, err, nullptr, bad_address); });
    return std::make_shared<ConnHandle>(std::move(conn));
  }

  std::shared_ptr<Listener> listen(std::string addr) override {
    std::string error;
    std::string bound = addr;
    int fd = -1;
    try {
      if (unix_socket(core_->options.family) && addr.empty()) {
        addr = unique_local_name();
      }
      const Address a = parse_address(core_->options.family, addr);
      fd = ::socket(a.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) throw std::runtime_error(std::string("socket: ") + errno_text(errno));
      const int one = 1;
      if (!unix_socket(core_->options.family)) {
        ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
      }
      if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.storage), a.length) != 0) {
        throw std::runtime_error("bind: " + errno_text(errno));
      }
      if (::listen(fd, 1024) != 0) throw std::runtime_error("listen: " + errno_text(errno));
      sockaddr_storage got{};
      socklen_t got_len = sizeof(got);
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&got), &got_len);
      bound = format_address(core_->options.family, got, got_len);
    } catch (const std::exception& e) {
      error = "listening on '" + addr + "' failed: " + e.what();
      if (fd >= 0) ::close(fd);
      fd = -1;
      MutexLock lock(mutex_);
      if (listen_error_.empty()) listen_error_ = error;
    }
    auto impl = std::make_shared<ListenerImpl>(core_, fd, bound, error);
    core_->run_on_loop([impl] { impl->start(); });
    return std::make_shared<ListenerHandle>(std::move(impl));
  }

  // "local" needs memfd segments (Linux 3.17 and a kernel that allows them).
  bool isViable() const override { return viable_; }
  const std::string& domainDescriptor() const override { return domain_; }
  void setId(std::string /*id*/) override {}

  void close() override {
    if (core_->closing.exchange(true)) return;
    std::shared_ptr<Core> core = core_;
    core->reactor.defer([core] {
      core->closed = true;
      auto listeners = core->listeners;
      for (auto& l : listeners)
        l->close_now();
      auto conns = core->conns;
      for (auto& c : conns)
        c->fail(tp::Error(std::make_shared<tp::transport::ContextClosedError>(),
                          "gradwire transport", 0));
      core->flush_refusals();
    });
    core->reactor.close();
  }

  void join() override {
    close();
    core_->reactor.join();
  }

  std::string listen_error() const override {
    MutexLock lock(mutex_);
    return listen_error_;
  }

 private:
  std::shared_ptr<Core> core_;
  const std::string domain_;
  const bool viable_;
  mutable Mutex mutex_;
  std::string listen_error_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace

std::shared_ptr<StreamContext> create_stream_context(StreamOptions options) {
  return std::make_shared<ContextImpl>(std::move(options));
}

std::string unique_local_name() {
  static std::atomic<uint64_t> counter{0};
  static const char* const kHex = "0123456789abcdef";
  std::string random;
  for (const char c : random_bytes(8)) {
    random.push_back(kHex[(static_cast<unsigned char>(c) >> 4) & 0xf]);
    random.push_back(kHex[static_cast<unsigned char>(c) & 0xf]);
  }
  return "gradwire-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) +
         "-" + random;
}

}  // namespace gradwire::rpc::transport
