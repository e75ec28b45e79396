// One connection of gradwire's stream transports, client or server side (ConnImpl), and the
// handle TensorPipe holds (ConnHandle). Its code is in three parts, by concept:
// - stream_gate.cc, the handshake gate: connecting, the handshake (transport/handshake.h),
//   the server's wait for TensorPipe's first frame and for verify_peer, refusals and the
//   handshake deadline; only a connection that passes all of it reaches TensorPipe;
// - stream_connection.cc, reading and writing frames (a u64 length and its bytes, each
//   length checked before anything is allocated for it), on the socket or the rings;
// - stream_rings.cc, the shared-memory rings of "local" (transport/ring.h): their setup,
//   descriptor passing, wake-ups and polling.
//
// Thread-safety: all state is the loop thread's; the entry points (read, write, close) may
// be called from any thread and defer to the loop, except a write that can be sent at once
// (try_direct), which takes write_mutex_.
#pragma once

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <tensorpipe/common/nop.h>
#include <tensorpipe/transport/connection.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/core/mutex.h"
#include "transport/handshake.h"
#include "transport/peer_book.h"
#include "transport/ring.h"
#include "transport/stream_core.h"

namespace gradwire::rpc::transport::detail {

using tp::transport::Connection;

constexpr size_t kStagingBytes = 64u << 10;
// Payload reads at least this large go straight into their destination.
constexpr size_t kDirectReadBytes = 16u << 10;
// TensorPipe's hello packet: a context name and a registration id.
constexpr size_t kMaxHelloFrameBytes = 64u << 10;
constexpr int kMaxIov = 64;

// All state is touched on the loop thread only; the public entry points defer to it.
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
        serial_(next_serial()),
        process_(peer_process_of(core_->options.family, fd_)),
        staging_(new char[kStagingBytes]) {}

  ~ConnImpl() {
    core_->options.book->forget(serial_);
    if (fd_ >= 0) ::close(fd_);
    if (pending_fd_ >= 0) ::close(pending_fd_);
    if (received_fd_ >= 0) ::close(received_fd_);
  }

  // Loop thread. `connect_error` != 0: the non-blocking connect already failed.
  void start(bool connecting, int connect_error, ReadyFn on_ready,
             const std::string& bad_address = std::string());

  // ---- entry points (any thread)

  void read(Connection::read_callback_fn fn);
  void read(void* ptr, size_t length, Connection::read_callback_fn fn);
  void read(tp::AbstractNopHolder& object, Connection::read_nop_callback_fn fn);
  void write(const void* ptr, size_t length, Connection::write_callback_fn fn);
  void write(const tp::AbstractNopHolder& object, Connection::write_callback_fn fn);
  void close();

  // Loop thread: closes it (the listener handing it over, or the context closing).
  void fail(tp::Error error);

  // "local" and "unix": the process at the other end, as the kernel reported it when the
  // connection was made (SO_PEERCRED); nullopt for tcp. Constant: any thread.
  const std::optional<PeerProcess>& process() const { return process_; }
  // A server connection of an mpt lane listener: that listener's address (the key of the
  // lane's connection requests in the PeerBook). Set before start().
  void set_listener_address(std::string address) { listener_address_ = std::move(address); }

 private:
  // Records the set-up span (trace_start_ns_) with its outcome, once.
  void trace_setup(const char* outcome);
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

  // ---- the handshake gate (stream_gate.cc)
  void deliver_prefetched(ReadOp op, const std::string& frame);
  void on_deadline();
  // A handshake (or first-frame) failure: an incoming connection is refused and counted; an
  // outgoing one fails with the reason.
  void refuse_or_fail(const std::string& why);
  void send_handshake_output();
  void on_handshake_done();
  // The server holds the connection until TensorPipe's hello frame is here whole.
  void begin_prefetch();
  void finish_opening();
  // "" when the first frame is what this listener expects from a peer that claimed
  // handshake_.peer(), else why not. Sets claim_: what verify_peer is asked about.
  std::string check_first_frame(const char* data, size_t size);
  // The server: asks verify_peer about the client's claim before TensorPipe sees it.
  void begin_verify();
  // What this connection tells its peer and learns from it that the PeerBook records:
  // connection requests offered (server), the pipe's further connections (client).
  // "" or why the frame must not go through (a reply TensorPipe would trust blindly).
  // Only a connection's first kObservedFrames control frames each way are looked at: the
  // brochure, its answer, the hellos and connection requests all come first (TensorPipe's
  // and mpt's handshakes), and a message's frames later pay nothing for it.
  void observe_written(const tp::AbstractNopHolder& object);
  std::string observe_read(tp::AbstractNopHolder& object);
  static uint64_t next_serial();
  static std::optional<PeerProcess> peer_process_of(StreamOptions::Family family, int fd);
  bool opening() const {
    return state_ == State::kHandshake || state_ == State::kRingSetup ||
           state_ == State::kPrefetch || state_ == State::kVerifying;
  }

  // ---- reading and writing frames (stream_connection.cc)
  void submit_read(ReadOp op);
  void submit_write(WriteOp op);
  // The common case, on the caller's thread: an open connection with nothing queued sends
  // the frame at once, without a hand-off to the loop. Returns false (op untouched) when
  // the frame must go through the loop; true when it was sent (its callback has run) or
  // queued behind a partial send that the loop finishes.
  bool try_direct(WriteOp& op);
  static void fail_op(ReadOp& op, const tp::Error& error);
  void start_read(ReadOp op);
  void start_write(WriteOp op);
  void on_events(uint32_t ev);
  size_t staged() const { return staged_end_ - staged_begin_; }
  // Moves staged bytes into the handshake or the pending reads, completing what it can.
  void consume_staging();
  // The frame's length is known: check it before anything is allocated for it.
  bool begin_payload(ReadOp& op);
  void bad_frame(const std::string& why);
  void complete_front();
  void pump_reads();
  void pump_writes();
  // Sends what is queued until done or the socket is full; the callbacks of the frames
  // sent whole go to `done`. Returns 0, or the errno that lost the connection.
  int send_queued_locked(std::vector<Connection::write_callback_fn>& done)
      GRADWIRE_REQUIRES(write_mutex_);
  void update_interest();
  // Loop thread: bytes from the peer, like recv(): > 0, 0 at the end of the stream, or -1
  // with errno (EAGAIN: nothing now). In ring mode they come from the inbound ring (whose
  // end is learnt from the socket instead, drain_wake_socket).
  ssize_t read_some(char* into, size_t room);
  // Any thread holding write_mutex_ (or the loop): frame bytes to the peer, like sendmsg():
  // > 0, or -1 with errno (EAGAIN: no room now). In ring mode into the outbound ring; a full
  // ring asks the consumer for a wake-up when it has read.
  ssize_t write_some_locked(int fd, const iovec* iov, int count) GRADWIRE_REQUIRES(write_mutex_);

  // ---- the shared-memory rings of "local" (stream_rings.cc)
  void take_descriptors(msghdr& msg);
  // One byte on the socket wakes the peer's loop. EAGAIN: bytes it has not read are there
  // already, so it wakes anyway.
  static void send_wake(int fd);
  // The client's setup message, its first byte carrying the ring segment's descriptor.
  ssize_t send_with_segment();
  // Ring mode, the socket is readable: wake-ups are dropped; its end means the peer has
  // gone. Returns true when that closed the connection.
  bool drain_wake_socket();
  // The server: the client's setup message is here whole; maps its segment.
  bool attach_rings();
  void enter_ring_mode(int read_ring, int write_ring);
  // The loop's poller (Reactor::add_poller): while it spins, reads what the ring holds and
  // writes what waited for space; before it sleeps, arms the ring's wake-up.
  bool poll_ring(bool arm);

  friend class ListenerImpl;

  std::shared_ptr<Core> core_;
  int fd_;
  Role role_;
  std::string peer_;
  Handshake handshake_;
  const uint64_t serial_;  // this connection's key in the PeerBook
  static constexpr int kObservedFrames = 2;
  std::atomic<int> writes_observed_{0};  // control frames written so far (any thread), up to
                                         // kObservedFrames
  int reads_observed_ = 0;               // loop thread
  const std::optional<PeerProcess> process_;
  std::string listener_address_;
  ReadyFn on_ready_;
  State state_ = State::kHandshake;
  tp::Error error_;
  uint32_t events_ = 0;
  uint64_t deadline_ = 0;
  // now_ns() when the connection began, while tracing was on (0: not traced): its set-up is
  // recorded as one span, rpc.connect or rpc.accept, when it opens or fails (stream_gate.cc).
  int64_t trace_start_ns_ = 0;
  int64_t trace_handshake_ns_ = 0;  // the handshake's end (0: not reached)
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
  const ConnImpl& impl() const { return *impl_; }

 private:
  std::shared_ptr<ConnImpl> impl_;
};

}  // namespace gradwire::rpc::transport::detail
