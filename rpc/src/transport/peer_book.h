// What this process has verified about the peers of its connections, shared by the stream
// transports of one agent (its tcp, local and unix contexts and the mpt channel's lanes).
//
// Two questions are answered from it, never from what a peer claims:
//
// - Which connection may take a connection request? TensorPipe's listener routes an
//   incoming RequestedConnection to a pipe by a registration id, a small counter that any
//   peer can guess, and the mpt channel's lanes route a lane's ClientHello the same way. A
//   server-side connection that sends its peer registration ids (TensorPipe's
//   BrochureAnswer, mpt's ServerHello) records an offer here for the identity its handshake
//   proved; a connection whose first frame asks for an id is admitted only when an offer of
//   that id stands for the identity its own handshake proved. An offer is used up by the
//   connection that takes it, and expires after `ttl` (TensorPipe's own side opens the
//   connections at once; the connection that carried the offer may be closed before they
//   come, when the pipe moves to another transport).
// - Which process is behind a worker? On "local" and "unix" connections the kernel says
//   which process is at the other end (SO_PEERCRED). A server-side connection admitted as
//   a worker records (worker, process); a client-side connection that TensorPipe opened for
//   a pipe records (the address the pipe was dialled at, process), matched through the
//   registration ids of the pipe's BrochureAnswer. Direct copies read only a process found
//   here (tensorpipe/loans.h), and the xth and cma channels are given only connections
//   whose process is known (tensorpipe/verified_channels.h).
//
// Offers and expectations expire after `ttl` and are at most kMaxPending of each (the
// oldest go first); what a connection learnt of its peer's process goes with it.
//
// Thread-safety: every function may be called from any thread.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"
#include "transport/handshake.h"

namespace gradwire::rpc::transport {

// The process at the other end of a "local" or "unix" connection, as the kernel reports it.
struct PeerProcess {
  pid_t pid{0};
  uid_t uid{0};
};

class PeerBook {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr size_t kMaxPending = size_t{1} << 16;

  explicit PeerBook(std::chrono::milliseconds ttl = std::chrono::seconds(60)) : ttl_(ttl) {}

  // The key of TensorPipe's own listener among the listeners offers are made on (an mpt
  // lane's listener is keyed by its address).
  static inline const std::string kPipeListener;

  // ---- connection requests

  // A server-side connection whose handshake claimed `who` told its peer the
  // registration ids `ids` of listener `listener`.
  void offer(const std::string& listener, const std::vector<uint64_t>& ids,
             const PeerIdentity& who);
  // A connection whose handshake claimed `who` asks for registration `id` of `listener`:
  // "" when it may have it (the offer is used up), else why not.
  std::string take(const std::string& listener, uint64_t id, const PeerIdentity& who);

  // ---- processes

  // Server side: connection `owner`, admitted as `who`, comes from `process`.
  void admitted(uint64_t owner, const PeerIdentity& who, PeerProcess process);
  // Client side: the peer dialled at `dialed` answered (BrochureAnswer) that the pipe's
  // further connections go to `address` with registration ids `ids`.
  void expect(const std::string& dialed, const std::string& address,
              const std::vector<uint64_t>& ids);
  // Client side: connection `owner`, opened to `address`, asked for registration `id` and
  // reached `process`.
  void reached(uint64_t owner, const std::string& address, uint64_t id, PeerProcess process);

  // The process of a live connection admitted as worker `name` of rank `rank`.
  std::optional<PeerProcess> process_of_worker(const std::string& name, int rank) const;
  // The process of a live connection opened for a pipe dialled at `dialed` (an address as
  // given to connect(), without a scheme).
  std::optional<PeerProcess> process_of_dialed(const std::string& dialed) const;

  // Connection `owner` is gone: the process it saw goes with it.
  void forget(uint64_t owner);

  // Entries held (for tests: the book does not grow with dead connections).
  size_t size() const;

 private:
  struct Offer {
    PeerIdentity who;
    Clock::time_point expires;
  };
  struct Expectation {
    std::string dialed;
    Clock::time_point expires;
  };
  struct Seen {
    std::string key;  // "w:<rank>:<name>" or "d:<dialed>"
    PeerProcess process;
  };
  using Slot = std::pair<std::string, uint64_t>;  // (listener or address, registration id)

  std::optional<PeerProcess> find(const std::string& key) const GRADWIRE_REQUIRES(mutex_);
  // Drops expired offers and expectations, and the oldest beyond kMaxPending.
  void expire(Clock::time_point now) GRADWIRE_REQUIRES(mutex_);

  const std::chrono::milliseconds ttl_;
  mutable Mutex mutex_;
  std::map<Slot, Offer> offers_ GRADWIRE_GUARDED_BY(mutex_);
  std::map<Slot, Expectation> expected_ GRADWIRE_GUARDED_BY(mutex_);
  // Both, in the order they were made (their expiry order): (slot, expiry) pairs, some of
  // them already taken.
  std::deque<std::pair<Slot, Clock::time_point>> offer_order_ GRADWIRE_GUARDED_BY(mutex_);
  std::deque<std::pair<Slot, Clock::time_point>> expected_order_ GRADWIRE_GUARDED_BY(mutex_);
  // By owner; the newest owner (the highest serial) wins a lookup.
  std::map<uint64_t, Seen> seen_ GRADWIRE_GUARDED_BY(mutex_);
};

// Whether two claims are the same worker's (name, rank and incarnation).
bool same_claim(const PeerIdentity& a, const PeerIdentity& b);

}  // namespace gradwire::rpc::transport
