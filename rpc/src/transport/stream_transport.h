// gradwire's own TensorPipe transports: "tcp" (TCP, for every peer), "local" (for peers on
// the same host: shared-memory rings, transport/ring.h, set up over a Unix socket in the
// abstract namespace that then carries only wake-ups) and "unix" (the same Unix socket
// carrying the bytes itself, for comparison). All are registered in a TensorPipe context
// through its public transport interface, run on one epoll thread per context that spins
// briefly after traffic and then sleeps, and begin every connection with gradwire's
// handshake (transport/handshake.h) before TensorPipe sees a byte of it:
//
// - A connection that fails the handshake, or does not finish it within
//   handshake_timeout, is closed and counted in TransportStats::refused, with a
//   rate-limited log line; it never reaches TensorPipe.
// - "local" and "unix" admit only peers of the same user (SO_PEERCRED, both ends), unless
//   allow_other_uids.
// - An accepted connection is handed to TensorPipe's listener only once its first frame
//   (TensorPipe's hello packet) has arrived whole and parses: a peer that goes away or
//   sends garbage there cannot touch the listener, whose errors TensorPipe makes sticky.
//   A connection speaks for the worker its handshake named alone: a TensorPipe hello that
//   names another is refused, and verify_peer decides whether the claim is admitted.
// - Bounded reads: every frame is a u64 length and its bytes; a length is checked (against
//   the size TensorPipe expects, or max_frame_bytes) before anything is allocated for it,
//   and a frame that does not decode fails its connection with an error, never the
//   process. The rings are the peer's memory as much as ours: their positions are checked
//   on every use, and their segment must be sealed against shrinking (transport/ring.h).
// - A peer process that dies closes its end of the socket, which wakes a sleeping loop: its
//   connections fail at once.
//
// Thread-safety: the TensorPipe interface objects may be used from any thread, as
// TensorPipe requires; callbacks run on the context's loop thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <tensorpipe/core/nop_types.h>
#include <tensorpipe/transport/context.h>

#include "transport/handshake.h"
#include "transport/peer_book.h"

namespace gradwire::rpc::transport {

// Counters shared by the transports of one agent.
struct TransportStats {
  std::atomic<uint64_t> accepted{0};    // incoming connections that reached TensorPipe
  std::atomic<uint64_t> refused{0};     // incoming connections closed before that
  std::atomic<uint64_t> bad_frames{0};  // established connections closed for a bad frame
  // Times the loop stopped polling early because a yield kept it off its core (SpinBackoff).
  std::atomic<uint64_t> polls_backed_off{0};
};

struct StreamOptions {
  enum class Family { kTcp, kLocal, kUnix };
  Family family = Family::kTcp;
  // kLocal: one ring's capacity per direction (a power of two in [4 KiB, 64 MiB]). The ring
  // channel writes tensors below the agent's direct_copy_min_bytes (up to 1 MiB) through a
  // connection of their own: most go in one piece; one that fills the ring (1 MiB, with its
  // frame's header) is written on as the reader drains it.
  size_t ring_bytes{size_t{1} << 20};
  // Shared secret for the handshake; empty: none.
  std::string secret;
  std::chrono::milliseconds handshake_timeout{10'000};
  // How long the loop keeps polling after activity before it sleeps (Reactor): trades a
  // little CPU right after traffic for wake-up latency. 0: always sleep at once.
  std::chrono::microseconds spin{500};
  // While `awaiting` says an answer is awaited, the loop polls up to this long after activity
  // (Reactor). `awaiting` is asked on the loop thread on every turn: cheap, never blocking.
  std::chrono::microseconds spin_awaiting{0};
  std::function<bool()> awaiting;
  // A poll that yielded its core for this long or longer ends the polling until the next
  // activity (Reactor, SpinBackoff). 0: polling never ends early.
  std::chrono::microseconds spin_backoff{0};
  // The largest frame whose size TensorPipe does not know in advance (its control messages).
  size_t max_frame_bytes{size_t{80} << 20};
  // The most values (container elements, structure members, map keys and values) one control
  // frame may hold: libnop would build each, at tens of bytes apiece, whatever the frame
  // weighs. The agent sets it from its envelope limits (a Descriptor holds a few values per
  // tensor); frames over it are refused before they are decoded (nop_scan.h).
  size_t max_frame_values{size_t{1} << 20};
  // Incoming connections still in their handshake at once; more are refused at once.
  int max_handshaking{1024};
  std::shared_ptr<TransportStats> stats;
  // Names this context in log lines (the worker's name).
  std::string name;
  // What an accepted connection's first frame must be before it is handed over: TensorPipe's
  // hello (a context's listener) or the mpt channel's lane hello (its lane listeners).
  enum class FirstFrame { kTensorPipeHello, kMptLaneHello };
  FirstFrame first_frame = FirstFrame::kTensorPipeHello;
  // Who this end claims to be in the handshake of each connection it opens (asked then, on
  // the connecting thread). Null: {name, -1, 0}.
  std::function<PeerIdentity()> identity;
  // Whether an incoming connection's claimed identity is admitted, asked on the loop thread
  // once its handshake is done and its first frame has arrived (a TensorPipe hello must
  // already name the same worker as the handshake, or the connection is refused before
  // this; after a handshake that claimed no name, the hello's name is the claim, with the
  // handshake's rank): call `done("")` to admit it, `done(why)` to refuse it, at once or
  // later from any thread. Until then the connection waits, within handshake_timeout.
  // Null: all admitted.
  using VerifyDone = std::function<void(std::string why)>;
  std::function<void(const PeerIdentity& peer, VerifyDone done)> verify_peer;
  // What this agent's transports have verified about their peers (peer_book.h): shared by
  // every stream context of one TensorPipe context and its mpt lanes, so that a connection
  // request made on one is checked against the offer made on another. Null: one of its own.
  std::shared_ptr<PeerBook> book;
  // The client side of a pipe trusts the BrochureAnswer its peer sends (TensorPipe checks it
  // in debug builds only): when set, each one read is checked here first, "" or why it is
  // refused (the connection then fails instead of TensorPipe acting on it).
  std::function<std::string(const tensorpipe::BrochureAnswer& answer)> check_answer;
  // The same for the listening side: each Brochure read on an accepted connection is checked
  // here before TensorPipe picks from it.
  std::function<std::string(const tensorpipe::Brochure& brochure)> check_brochure;
  // The number of lanes of the mpt channel registered beside this transport (0: none): a
  // ServerHello advertising another number is refused before the channel indexes it.
  size_t mpt_lanes{0};
  // kLocal and kUnix: admit peers whose process runs as another user (checked on both ends
  // with SO_PEERCRED before the handshake). Default: the same effective uid only.
  bool allow_other_uids = false;
};

class StreamContext : public tensorpipe::transport::Context {
 public:
  // Why the first listen() on this context failed ("" if none did): TensorPipe has no way
  // to report it at once, so the agent asks after listening.
  virtual std::string listen_error() const = 0;
};

std::shared_ptr<StreamContext> create_stream_context(StreamOptions options);

// The process at the other end of `connection` when it is a "local" or "unix" connection of
// gradwire's (SO_PEERCRED, taken when it was made); nullopt for anything else.
std::optional<PeerProcess> peer_process(const tensorpipe::transport::Connection& connection);

// A fresh name for a "local" or "unix" listener (abstract Unix socket namespace).
std::string unique_local_name();

}  // namespace gradwire::rpc::transport
