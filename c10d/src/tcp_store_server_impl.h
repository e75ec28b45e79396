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
//
// The loop's work is spread over files by concept: tcp_store_server.cc sets the loop up and
// stops it, tcp_store_server_io.cc holds connections, reads, replies, back-pressure and the
// turn budget, tcp_store_server_auth.cc the handshake, tcp_store_server_requests.cc one
// handler per opcode, and tcp_store_server_state.cc the keys, the journal and parked waits.
#pragma once

#include <uv.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "gradwire/c10d/tcp_store_server.h"
#include "gradwire/core/background_log.h"
#include "gradwire/core/error.h"
#include "store_journal.h"
#include "tcp_protocol.h"

namespace gradwire::c10d {

namespace store_server {

// Bytes of a frame's header: length, opcode, request id.
inline constexpr uint64_t kFrameHeader = proto::kLengthBytes + proto::kMinFrame;

// The work one connection's requests may do in one loop turn, in bytes of request and
// reply, each request also counting kRequestWork (a stream of tiny requests is work too).
// Past it the connection waits for the next turn.
inline constexpr uint64_t kTurnWork = 256 * 1024;
inline constexpr uint64_t kRequestWork = 64;

// Hash and equality that accept std::string_view, so lookups never copy the key.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
struct StringEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

inline std::string uv_message(int status) {
  return std::string(uv_err_name(status)) + ": " + uv_strerror(status);
}

}  // namespace store_server

class TCPStoreServer::Impl {
 public:
  // Opens the journal, binds the listener and starts the loop thread; throws StoreError or
  // NetworkError with every handle closed again.
  explicit Impl(TCPStoreServerOptions options);
  ~Impl();

  uint16_t port() const { return port_; }
  int64_t num_clients() const { return num_clients_.load(std::memory_order_relaxed); }
  uint64_t num_refused() const { return num_refused_.load(std::memory_order_relaxed); }
  bool authenticated() const { return !secret_.empty(); }
  void set_request_hook(std::function<void(uint8_t)> hook) { request_hook_ = std::move(hook); }

 private:
  using FrameReader = proto::FrameReader;
  using FrameWriter = proto::FrameWriter;
  using Limit = proto::Limit;
  using Op = proto::Op;
  using Reply = proto::Reply;
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
    proto::Op op = proto::Op::kGet;
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

  // Set-up steps of the constructor, in order.
  void init_handles();
  // Closes every handle, runs the loop until they are closed, closes it, and throws
  // NetworkError naming `what`.
  void fail_setup(const std::string& what);
  // Listens on listen_fd or on the bind address; returns where, for the log.
  std::string listen();
  // Binds and listens on the first of `hosts` that resolves and accepts; false (with each
  // failure in `errors`) when none does.
  bool bind_first(const std::vector<std::string>& hosts, const std::string& port_text,
                  std::string& errors);
  void start_loop_thread();

  void accept_one();
  // Refuses a connection past max_connections: tells it why and closes it.
  void refuse_connection(Connection* c);
  void consume(Connection* c, const char* data, size_t size);
  // Handles one complete frame; false when the connection was closed. Exceptions of the
  // handlers are caught here: they close this connection only.
  bool handle_frame(Connection* c, const uint8_t* frame, size_t size);
  bool handle_hello(Connection* c, uint8_t op, uint32_t id, proto::FrameReader& r);
  bool handle_auth(Connection* c, uint8_t op, uint32_t id, proto::FrameReader& r);
  std::string proof(std::string_view label, const proto::Transcript& t) const;
  // Dispatches a request after the handshake to its opcode's handler. Each handler reads
  // its payload from `r`, answers it (or parks it) and returns false when the connection
  // was closed.
  bool handle_request(Connection* c, uint8_t op, uint32_t id, proto::FrameReader& r);
  bool handle_set(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_get(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_add(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_compare_set(Connection* c, uint32_t id, proto::FrameReader& r);
  // kWait and kMultiGet: the same payload, answered with nothing or with the values.
  bool handle_wait(Connection* c, proto::Op op, uint32_t id, proto::FrameReader& r);
  bool handle_check(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_delete(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_num_keys(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_multi_set(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_append(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_list_keys(Connection* c, uint32_t id, proto::FrameReader& r);
  bool handle_time(Connection* c, uint32_t id, proto::FrameReader& r);
  // A request that does not decode is a protocol violation: drops the client (false).
  bool malformed(Connection* c, uint32_t id, const char* what, const proto::FrameReader& r);
  // The keys of a multi-key request, each distinct one once.
  KeyList read_keys(proto::FrameReader& r) const;
  bool all_exist(const KeyList& keys) const;

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
  bool park(Connection* c, uint32_t id, proto::Op op, KeyList keys, uint64_t timeout_ms);
  // Answers a waiter whose keys all (may) exist; re-parks it if one was deleted since.
  void complete(Waiter* w);
  void reply_values(Connection* c, uint32_t id, proto::Op op, const KeyList& keys);
  void remove_waiter(Waiter* w);
  void rearm_timer();

  // Before a reply of `payload` bytes: refuses it with a kLimit reply naming the frame
  // limit when it is over (false), and drops the connection when its unsent replies would
  // pass the high water mark plus a frame (false; `c` is closing then).
  bool room_for(Connection* c, uint32_t id, uint64_t payload);
  proto::FrameWriter reply(Connection* c, proto::Reply kind, uint32_t id);
  void end_reply(Connection* c, proto::FrameWriter& w);
  void reply_error(Connection* c, uint32_t id, ErrorKind kind, const std::string& message);
  void reply_limit(Connection* c, uint32_t id, proto::Limit limit, uint64_t value,
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
                  std::optional<proto::Limit> limit = std::nullopt);
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

  std::unordered_map<std::string, std::string, store_server::StringHash, store_server::StringEq>
      data_;
  // The waiters listed under each missing key (each waiter once per distinct key), so that
  // removing a waiter costs its distinct keys.
  std::unordered_map<std::string, std::unordered_set<Waiter*>, store_server::StringHash,
                     store_server::StringEq>
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

}  // namespace gradwire::c10d
