// TCPStore's connection to its server: blocking sockets, requests pipelined over one
// connection.
//
// Each request carries an id. A caller registers its reply slot, writes its frame under
// the write mutex, and then waits for the slot. There is no reader thread: whichever
// waiting caller finds nobody reading takes the reader role, reads what has arrived,
// hands every complete reply to its slot, and gives the role back, so a single-threaded
// caller reads its own reply directly, and a thread parked in a long get never blocks
// another thread's set. When the socket reports end-of-file or an error, every pending
// caller fails with NetworkError and the connection is replaced on the next call.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "gradwire/core/error.h"
#include "gradwire/core/fd.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/thread_annotations.h"

namespace gradwire::c10d::store_client {

using Clock = std::chrono::steady_clock;

// Longest a blocked receive lasts before the reader re-checks its deadline.
inline constexpr std::chrono::milliseconds kReceiveSlice{100};

std::string errno_text(int err);

struct ServerLimits {
  uint32_t max_key = 0;
  uint32_t max_value = 0;
  uint32_t max_keys = 0;
  uint32_t max_frame = 0;
};

// One reply: its kind and payload.
struct Response {
  uint8_t kind = 0;
  std::string payload;
};

// The message of a kLimit reply: which limit, its value, and the server's explanation.
std::string limit_message(const std::string& payload);

// One TCP connection to the server, shared by every thread of a TCPStore.
class Connection {
 public:
  // `fd`: a connected socket past its handshake.
  Connection(UniqueFd fd, std::string address, ServerLimits limits)
      : fd_(std::move(fd)), address_(std::move(address)), limits_(limits) {}
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  const ServerLimits& limits() const { return limits_; }
  const std::string& address() const { return address_; }

  bool broken() GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    return broken_.has_value();
  }

  // Liveness probe for a connection that has been idle: a server that went away has left
  // an end-of-file (or a reset) in the socket, which peeking finds without consuming
  // data, so the next call reconnects instead of writing into a dead socket. A connection
  // that received a reply within the last millisecond is not probed (it saves a system
  // call per request in bursts); like any probe, this is best effort.
  void probe() GRADWIRE_EXCLUDES(mutex_);

  // Sends one request; with `reply`, waits for its response until `deadline`.
  // Throws NetworkError when the connection is or becomes broken, TimeoutError at the
  // deadline. `what` names the operation for messages.
  Response call(const std::string& frame, uint32_t id, bool reply, Clock::time_point deadline,
                std::string_view what) GRADWIRE_EXCLUDES(mutex_, write_mutex_);

 private:
  struct Slot {
    bool done = false;
    Response response;
  };

  bool send_all(const std::string& frame) GRADWIRE_EXCLUDES(write_mutex_);

  void forget(uint32_t id) GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    pending_.erase(id);
  }

  void mark_broken(const std::string& why) GRADWIRE_EXCLUDES(mutex_) {
    MutexLock lock(mutex_);
    if (!broken_) broken_ = why;
    changed_.notify_all();
  }

  [[noreturn]] void throw_broken(std::string_view what) GRADWIRE_EXCLUDES(mutex_);

  void throw_if_broken_locked(std::string_view what) GRADWIRE_REQUIRES(mutex_);

  // A one-way write (set, multi_set) that the server rejected is reported by the next call.
  void throw_deferred_locked() GRADWIRE_REQUIRES(mutex_);

  Response wait_for(Slot& slot, uint32_t id, Clock::time_point deadline, std::string_view what)
      GRADWIRE_EXCLUDES(mutex_);

  // The reader role: reads once (waiting at most kReceiveSlice), dispatches every
  // complete frame, and releases the role. inbuf_ belongs to whoever holds the role.
  void read_and_dispatch() GRADWIRE_EXCLUDES(mutex_);

  const UniqueFd fd_;
  const std::string address_;
  const ServerLimits limits_;
  Mutex write_mutex_;  // one frame at a time on the socket
  Mutex mutex_;
  std::condition_variable changed_;
  std::unordered_map<uint32_t, Slot*> pending_ GRADWIRE_GUARDED_BY(mutex_);
  bool reader_active_ GRADWIRE_GUARDED_BY(mutex_) = false;
  std::optional<std::string> broken_ GRADWIRE_GUARDED_BY(mutex_);
  std::string deferred_ GRADWIRE_GUARDED_BY(mutex_);
  ErrorKind deferred_kind_ GRADWIRE_GUARDED_BY(mutex_) = ErrorKind::kStore;
  std::string inbuf_;  // owned by the thread holding the reader role
  std::atomic<int64_t> last_reply_ns_{0};
};

}  // namespace gradwire::c10d::store_client
