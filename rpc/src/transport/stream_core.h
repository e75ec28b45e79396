// What the parts of gradwire's stream transports (stream_transport.h) share: a context's
// Core (its loop, its options, the live connections and listeners, the refusal log), the
// transports' errors, socket addresses, and TensorPipe control frames decoded with a guard.
// The parts: the listener (stream_listener.h), a connection (stream_connection.h: its
// handshake gate, its I/O and its shared-memory rings) and the context that makes both
// (stream_transport.cc). Internal to rpc/src/transport/.
//
// Thread-safety: the free functions are pure. Core: `options` is constant; the rest is the
// loop thread's, but for run_on_loop and `closing`, which any thread may use.
#pragma once

#include <sys/socket.h>

#include <tensorpipe/common/error.h>
#include <tensorpipe/common/nop.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <unordered_set>

#include "gradwire/core/background_log.h"
#include "transport/handshake.h"
#include "transport/peer_book.h"
#include "transport/reactor.h"
#include "transport/stream_transport.h"

namespace gradwire::rpc::transport::detail {

namespace tp = tensorpipe;

constexpr auto kRefusalLogPeriod = std::chrono::seconds(10);

// A TensorPipe error carrying `message`; the error of a connection closed by its owner.
tp::Error make_error(std::string message);
tp::Error closed_error();
std::string errno_text(int err);

// Decodes a whole frame into `holder`; "" or why not.
//
// TensorPipe's NopReader does not bounds-check the one-byte reads libnop makes for every
// value's prefix, so a truncated control frame would make decoding read past the frame (a
// null pointer when it ends exactly there). Frames are therefore
// decoded with a guard after them, whose bytes are a prefix no encoding accepts (libnop
// reserves 0x8a), so decoding past the end fails at its next prefix; and a decode counts
// only if the object it produced encodes back to exactly the frame's size, so nothing of
// the guard was taken as data. Before libnop sees it, the frame is scanned (nop_scan.h): one
// that holds more than `max_values` values, or an encoding TensorPipe never writes, is
// refused without anything allocated for it.
std::string decode_nop(tp::AbstractNopHolder& holder, const char* data, size_t size,
                       size_t max_values);
// Hellos (TensorPipe's, the mpt channel's lane hello) hold a few values.
constexpr size_t kMaxHelloValues = 64;

bool unix_socket(StreamOptions::Family family);
// "tcp", "local" or "unix".
const char* family_name(StreamOptions::Family family);

struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
};

// "host:port", "[v6]:port" (tcp) or a name (local). Throws std::runtime_error with why.
Address parse_address(StreamOptions::Family family, const std::string& addr);
std::string format_address(StreamOptions::Family family, const sockaddr_storage& storage,
                           socklen_t length);
std::string read_first_line(const char* path);

class ConnImpl;
class ListenerImpl;

// What one context's connections and listeners share: the loop, the options, and (loop
// thread only) the live objects, so that closing the context closes them.
struct Core : std::enable_shared_from_this<Core> {
  explicit Core(StreamOptions o)
      : options(with_stats(std::move(o))),
        reactor(std::string(family_name(options.family)) + " " + options.name, options.spin,
                options.spin_awaiting, options.awaiting, options.spin_backoff,
                [stats = options.stats] {
                  stats->polls_backed_off.fetch_add(1, std::memory_order_relaxed);
                }) {}

  static StreamOptions with_stats(StreamOptions o) {
    if (!o.stats) o.stats = std::make_shared<TransportStats>();
    if (!o.book) o.book = std::make_shared<PeerBook>();
    return o;
  }

  const char* kind() const { return family_name(options.family); }

  // Runs fn on the loop, or returns false when the loop has stopped.
  bool run_on_loop(std::function<void()> fn) { return reactor.defer(std::move(fn)); }

  // Loop thread: a refused incoming connection, logged at most once per period with a
  // count of those not logged. Lines go through a background thread: the loop never
  // waits for a log that is not draining.
  void note_refused(const std::string& peer, const std::string& why);

  void flush_refusals();

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
  std::string check_peer_user(int fd) const;

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

}  // namespace gradwire::rpc::transport::detail
