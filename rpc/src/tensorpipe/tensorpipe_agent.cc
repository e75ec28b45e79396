// The TensorPipe agent. See gradwire/rpc/tensorpipe_agent.h for what it does; the comments
// here say how.
//
// The agent is the TensorPipe transport around three transport-free parts: the group
// directory (group.h: who is in the group, the store records, the shutdown barriers), the
// call table (call_table.h: pending calls, deadlines, the timer) and the dispatcher
// (dispatcher.h: handlers, interceptors, serving a request and building its reply). What
// stays here is the I/O: connections, reading descriptors and messages, the per-peer
// in-flight byte budget, loans (direct copies) and writing.
//
// Threads: TensorPipe's loop threads run the read/write/accept callbacks, which only
// decode, complete futures or post work; handlers run on the agent's ThreadPool; the call
// table's timer thread fails calls whose deadline passed. No TensorPipe function is called
// with mutex_ held, because TensorPipe may run a callback inline when called from its own
// loop.
//
// Lifetime: the handle make_tensorpipe_agent returns owns the agent through a deleter that
// shuts it down (forced) on the user's thread when the last handle goes, so the
// TensorPipe context is never joined from one of its own threads. Callbacks hold weak
// references.
#include "gradwire/rpc/tensorpipe_agent.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <iostream>
#include <map>
#include <optional>

#include <tensorpipe/channel/channel.h>
#include <tensorpipe/tensorpipe.h>

#include "call_table.h"
#include "dispatcher.h"
#include "gradwire/c10d/rendezvous.h"
#include "gradwire/c10d/store.h"
#include "gradwire/c10d/tcp_store.h"
#include "gradwire/core/auth.h"
#include "gradwire/core/env.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/net.h"
#include "gradwire/core/printable.h"
#include "gradwire/core/signals.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/core/trace.h"
#include "gradwire/rpc/fault_injection.h"
#include "gradwire/rpc/stats.h"
#include "gradwire/tensor/factory.h"
#include "group.h"
#include "tensorpipe/loans.h"
#include "tensorpipe/negotiation.h"
#include "tensorpipe/verified_channels.h"
#include "text.h"
#include "transport/stream_transport.h"
#include "wire.h"

namespace gradwire::rpc {
namespace {

// Replies whose lent tensors total at most this are copied on the transport's thread.
constexpr size_t kCopyOnLoopMaxBytes = size_t{1} << 20;

namespace tp = tensorpipe;
using Clock = std::chrono::steady_clock;
using detail::describe_call;
using detail::LateCall;
using detail::ms_text;
using detail::PendingCall;
using detail::SendingMark;

// What a message takes on the wire: its payload and the tensors that travel beside it
// (lent tensors, copied by the receiver, are not counted).
size_t wire_bytes(const EncodedMessage& message) {
  size_t n = message.payload.size();
  for (const Tensor& t : message.tensors)
    n += t.nbytes();
  return n;
}

// What the "ring" channel sent (tensors and their bytes), ever.
struct RingCounters {
  std::atomic<uint64_t> tensors{0};
  std::atomic<uint64_t> bytes{0};
};

// Transports: TensorPipe picks, per peer, the highest-priority one both ends can use.
constexpr int64_t kUvPriority = 0;
constexpr int64_t kTcpPriority = 50;
constexpr int64_t kShmPriority = 100;
constexpr int64_t kUnixPriority = 120;
constexpr int64_t kLocalPriority = 150;
constexpr int64_t kBasicPriority = 0;
constexpr int64_t kMptPriority = 100;
constexpr int64_t kCmaPriority = 200;
constexpr int64_t kRingPriority = 250;
constexpr int64_t kXthPriority = 300;

// TensorPipe wants a pointer even for an empty tensor.
uint8_t empty_tensor_byte = 0;

void* buffer_of(const Tensor& t) {
  void* p = t.nbytes() == 0 ? nullptr : t.data_ptr();
  return p != nullptr ? p : &empty_tensor_byte;
}

std::string unique_shm_name() {
  static std::atomic<uint64_t> counter{0};
  return "gradwire-rpc-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" +
         std::to_string(Clock::now().time_since_epoch().count());
}

// Loan table slots: loans outstanding at once per agent; beyond, tensors are sent.
constexpr uint32_t kLoanSlots = 4096;

// Thread-safety: see RpcAgent. mutex_ guards the agent's state, its incoming connections,
// the in-flight budget and the count of requests being served; the connections to peers are
// atomic slots that a sender reads without it (they change under it). The directory is
// immutable once joined_ is set; the call table and the dispatcher synchronise themselves.
class TensorPipeAgent final : public RpcAgent,
                              public detail::ReplyWriter,
                              public std::enable_shared_from_this<TensorPipeAgent> {
 public:
  TensorPipeAgent(WorkerInfo self, int world_size, std::shared_ptr<c10d::Store> store,
                  AgentOptions options)
      : self_(std::move(self)),
        world_size_(world_size),
        store_(std::move(store)),
        options_(std::move(options)),
        group_(self_, world_size_, store_, options_.join_timeout),
        calls_(self_.describe()),
        dispatcher_(self_, *this),
        clients_(new std::atomic<std::shared_ptr<Connection>>[static_cast<size_t>(world_size_)]),
        lost_peers_(new std::atomic<bool>[static_cast<size_t>(world_size_)]),
        rejoined_(new std::atomic<int>[static_cast<size_t>(world_size_)]) {
    for (int i = 0; i < world_size_; ++i) {
      lost_peers_[static_cast<size_t>(i)].store(false);
      rejoined_[static_cast<size_t>(i)].store(0);
    }
  }

  ~TensorPipeAgent() override { close(); }

  void start() override;
  void start_serving();

  const WorkerInfo& worker_info() const override { return self_; }
  WorkerInfo get_worker_info(const Destination& worker) const override;
  std::string transport_to(const Destination& worker) const override;
  std::vector<WorkerInfo> get_worker_infos() const override {
    if (!joined_.load(std::memory_order_acquire)) return {};
    return group_.workers();
  }
  const AgentOptions& options() const override { return options_; }
  std::shared_ptr<Executor> executor() const override { return pool_; }

  void release_unsent(const Request& request) const override;
  void send_request(const Destination& to, Request request, CallOptions options,
                    ReplyCallback done) override;
  void register_handler(uint32_t id, std::string name, MessageHandler handler,
                        Execution execution) override {
    dispatcher_.register_handler(id, std::move(name), std::move(handler), execution, nullptr);
  }
  void register_handler(uint32_t id, std::string name, MessageHandler handler,
                        ExecutionChooser choose) override {
    if (!choose) {
      throw InvalidArgument("rpc: register_handler(" + std::to_string(id) + ", '" + name +
                            "') was given an empty execution chooser");
    }
    dispatcher_.register_handler(id, std::move(name), std::move(handler), Execution::kPool,
                                 std::move(choose));
  }
  void add_interceptor(std::shared_ptr<Interceptor> interceptor) override {
    dispatcher_.add_interceptor(std::move(interceptor));
  }
  CapturedState capture_thread_state() const override {
    std::vector<std::shared_ptr<ServeScope>> scopes;
    for (const auto& interceptor : *dispatcher_.interceptors()) {
      if (auto scope = interceptor->capture_thread_state()) scopes.push_back(std::move(scope));
    }
    return CapturedState(std::move(scopes));
  }
  void shutdown(bool graceful) override;
  bool is_shut_down() const override { return !running_.load(std::memory_order_acquire); }
  AgentMetrics metrics() const override;
  RpcStats stats() const override {
    return RpcStats{call_stats_.snapshot(), dispatcher_.served_stats().snapshot()};
  }
  int incarnation() const override { return group_.incarnation(); }

  // Forced close: fails what is pending, closes TensorPipe, stops the threads. Idempotent.
  void close();

  // ReplyWriter: how the dispatcher's replies travel.
  bool write_reply(const std::shared_ptr<detail::Link>& link, const Request& request,
                   const Response& response, bool plain, size_t* bytes) override;
  void request_done(const detail::Link& link, size_t tensor_bytes) override;

 private:
  enum class State { kStarting, kRunning, kClosing, kClosed };

  struct Connection : detail::Link {
    uint64_t serial{0};
    std::shared_ptr<tp::Pipe> pipe;
    bool outgoing{false};
    // Outgoing: the address the pipe was opened to (host:port, no scheme).
    std::string dialed;
    // Closed by a fault rule (AgentOptions::faults), which is then the reason given.
    std::atomic<bool> cut{false};
    // This connection's share of the in-flight budget (guarded by the agent's mutex_).
    size_t inflight_bytes{0};
    size_t queued_requests{0};
  };
  // What one received message holds of the in-flight budget until it is done with.
  struct Held {
    size_t bytes{0};
    bool request{false};
  };

  void validate_options() const;
  std::string resolve_host() const;
  // This worker's host id as it appears in domain and device descriptors (no whitespace).
  std::string descriptor_host_id() const;
  // `inner` registered so that it is only used toward workers of this host and namespace.
  std::shared_ptr<tp::transport::Context> namespace_bound(
      std::shared_ptr<tp::transport::Context> inner) const;
  transport::StreamOptions stream_options(transport::StreamOptions::Family family) const;
  // Registers them in context_; returns the URLs to listen on (tcp's first).
  std::vector<std::string> register_transports_and_channels(const std::string& host);
  // Registers one in context_ and in negotiation_.
  void register_transport(int64_t priority, const std::string& name,
                          std::shared_ptr<tp::transport::Context> context);
  void register_channel(int64_t priority, const std::string& name,
                        std::shared_ptr<tp::channel::Context> context);

  // The error a refused operation throws: the agent's first failure, else that it is not
  // running. Requires mutex_.
  [[noreturn]] void refuse_locked(const std::string& what) const GRADWIRE_REQUIRES(mutex_);
  // The connection to `target`, made on first use; refuses (throws) unless running.
  std::shared_ptr<Connection> connection_to(const WorkerInfo& target, const Request& request);
  // The in-flight budget (AgentOptions::max_inflight_bytes*, max_queued_requests*): takes
  // `held` for a message received on `conn`, or returns which limit it would pass ("" when
  // taken).
  std::string reserve_inflight(Connection& conn, const Held& held);
  void release_inflight(Connection& conn, const Held& held);
  void release_inflight_locked(Connection& conn, const Held& held) GRADWIRE_REQUIRES(mutex_);
  // Answers a request refused by the in-flight budget with a BusyError, and keeps reading
  // the connection when nothing of the message is left unread.
  void refuse_busy(const std::shared_ptr<Connection>& conn, uint64_t request_id,
                   const std::string& why, bool close_after);

  void accept_next();
  void read_next(const std::shared_ptr<Connection>& conn);
  // Closes `pipe` as a marked entry into TensorPipe (SendingMark): the calling thread may run
  // TensorPipe's loop meanwhile. Never with mutex_ held (the loop's callbacks take it).
  static void close_pipe(const std::shared_ptr<tp::Pipe>& pipe);
  void on_descriptor(const std::shared_ptr<Connection>& conn, tp::Descriptor descriptor);
  void on_message(const std::shared_ptr<Connection>& conn,
                  std::shared_ptr<const ParsedEnvelope> parsed, std::string metadata,
                  std::vector<Tensor> tensors, const std::vector<Device>& targets,
                  std::vector<detail::LoanCopy> lent, Held held);
  void on_malformed(const std::shared_ptr<Connection>& conn, const std::string& metadata,
                    const std::string& why, bool close_after);
  // A message whose lent tensors could not be copied: the request is answered with a
  // NetworkError, the call of a reply fails with one.
  void on_lost_loans(const std::shared_ptr<Connection>& conn, const std::string& metadata,
                     const std::string& why);

  // Direct copies (loans.h).
  // One message's loans: to whom, over which connection, and those taken so far.
  struct Lending {
    int peer;
    uint64_t connection;
    std::vector<Loan> taken;
  };
  // Two pointers: small enough for std::function to hold without allocating per message.
  Lender lender_for(Lending& lending);
  void return_loans(const std::vector<Loan>& taken, uint64_t connection);
  std::string copy_lent(const std::shared_ptr<Connection>& conn,
                        const std::vector<detail::LoanCopy>& lent);
  void on_release(const std::shared_ptr<Connection>& conn, const Release& release);
  size_t outstanding_loans() const { return loans_ ? loans_->outstanding() : 0; }
  void on_connection_error(const std::shared_ptr<Connection>& conn, const std::string& what);
  void write(const std::shared_ptr<Connection>& conn, EncodedMessage message,
             std::function<void(const std::string& error)> on_done);
  // Asks options_.faults about a message to `to` (kSend without one).
  FaultDecision decide_fault(const WorkerInfo& to, bool is_reply, uint32_t handler,
                             const std::string& function) const;
  // A message `decision` will never write (dropped, or its connection cut) lends nothing:
  // its loans end here, before its completion is built from what is left of them.
  void return_unsent_loans(const FaultDecision& decision, Lending& lending);
  // Writes `message` on `conn` as `decision` says: now, later, or never (dropped, or with
  // the connection closed).
  void apply_fault(const FaultDecision& decision, const std::shared_ptr<Connection>& conn,
                   EncodedMessage message, std::function<void(const std::string&)> on_done);

  // `bytes`: what the reply took on the wire (its in-flight cost).
  void complete_call(const std::shared_ptr<Connection>& conn, Response response, size_t bytes);
  // A peer whose connection was lost may have been replaced (AgentOptions::rejoin): re-reads
  // its record, and tells the listeners when a new incarnation has taken over.
  void check_rejoined(int id);
  void wait_until_idle(Clock::time_point deadline);

  const WorkerInfo self_;
  const int world_size_;
  const std::shared_ptr<c10d::Store> store_;
  const AgentOptions options_;
  detail::GroupDirectory group_;  // joined by start(); see joined_
  // Which incoming connections speak for which worker (opened once group_ is joined).
  mutable detail::PeerAdmission admission_{group_, std::chrono::milliseconds(5'000)};
  detail::CallTable calls_;
  detail::Dispatcher dispatcher_;
  // The calls this worker makes, per (function, callee) (RpcAgent::stats).
  detail::StatsTable call_stats_;

  // Set by start(), then constant.
  std::shared_ptr<ThreadPool> pool_;
  std::shared_ptr<tp::Context> context_;
  std::shared_ptr<tp::Listener> listener_;
  // gradwire's transports (local_ only when asked for) and what they count.
  std::shared_ptr<transport::StreamContext> tcp_;
  std::shared_ptr<transport::StreamContext> local_;
  std::shared_ptr<transport::StreamContext> unix_;
  const std::shared_ptr<transport::TransportStats> transport_stats_ =
      std::make_shared<transport::TransportStats>();
  // What the transports that exist per network namespace (local, unix) count, apart.
  const std::shared_ptr<transport::TransportStats> local_stats_ =
      std::make_shared<transport::TransportStats>();
  // Where this worker runs, read when the agent is made (GRADWIRE_HOST_ID may change later).
  const std::string host_id_ = net::host_id();
  const uint64_t netns_ = net::network_namespace_id();
  // GRADWIRE_RPC_STATS=1: print stats() to stderr when the agent closes.
  const bool print_stats_ = env_bool("GRADWIRE_RPC_STATS", false);
  // The transports registered by start(), in the order of preference.
  std::vector<std::string> transports_;
  std::string secret_;  // resolved at start; empty: connections are not authenticated
  // Direct copies: this worker's loan table (null when they are off).
  std::unique_ptr<detail::LoanTable> loans_;
  std::atomic<bool> joined_{false};  // group_ is joined
  // A graceful shutdown has reached its last barrier: every worker has agreed to leave, so
  // a peer's connection that closes from now on is a departure, not a loss.
  std::atomic<bool> departing_{false};
  // state_ == kRunning, readable without mutex_ (a send checks it without locking).
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> tensors_lent_{0};
  std::atomic<uint64_t> bytes_lent_{0};
  const std::shared_ptr<RingCounters> ring_counters_ = std::make_shared<RingCounters>();
  // What the transports verified about their peers (transport/peer_book.h), and what this
  // worker registered in TensorPipe, against which the answers to its pipes are checked.
  const std::shared_ptr<transport::PeerBook> book_ = std::make_shared<transport::PeerBook>();
  const std::shared_ptr<detail::Negotiation> negotiation_ = std::make_shared<detail::Negotiation>();
  const std::shared_ptr<detail::ChannelRefusals> channel_refusals_ =
      std::make_shared<detail::ChannelRefusals>();
  std::atomic<uint64_t> tensors_copied_in_{0};
  std::atomic<uint64_t> bytes_copied_in_{0};
  std::atomic<uint64_t> busy_refusals_{0};
  // Outgoing connections, per peer id: read without mutex_, made and cleared under it.
  const std::unique_ptr<std::atomic<std::shared_ptr<Connection>>[]> clients_;
  // Per peer id: a connection to or from it was lost since it was last seen (re-read its
  // record before connecting), and the newest incarnation the listeners were told of.
  const std::unique_ptr<std::atomic<bool>[]> lost_peers_;
  const std::unique_ptr<std::atomic<int>[]> rejoined_;

  mutable Mutex mutex_;
  std::condition_variable idle_cv_;
  State state_ GRADWIRE_GUARDED_BY(mutex_) = State::kStarting;
  bool shutdown_started_ GRADWIRE_GUARDED_BY(mutex_) = false;
  uint64_t next_serial_ GRADWIRE_GUARDED_BY(mutex_) = 1;
  int active_handlers_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  std::map<uint64_t, std::shared_ptr<Connection>> servers_ GRADWIRE_GUARDED_BY(mutex_);
  // Pipes opened by senders that lost the race to connect first; closed with the context.
  std::vector<std::shared_ptr<tp::Pipe>> spare_pipes_ GRADWIRE_GUARDED_BY(mutex_);
  std::exception_ptr failure_ GRADWIRE_GUARDED_BY(mutex_);  // the first failure, if any
  // The in-flight budget of all connections together (each connection holds its share).
  size_t inflight_bytes_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  size_t queued_requests_ GRADWIRE_GUARDED_BY(mutex_) = 0;
};

// ---- start-up

void TensorPipeAgent::validate_options() const {
  const std::string who = "rpc agent " + self_.describe() + ": ";
  if (options_.rpc_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::rpc_timeout must be > 0, got " +
                          ms_text(options_.rpc_timeout));
  }
  if (options_.join_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::join_timeout must be > 0, got " +
                          ms_text(options_.join_timeout));
  }
  if (options_.num_worker_threads < 1 || options_.num_worker_threads > 1024) {
    throw InvalidArgument(who + "AgentOptions::num_worker_threads must be in [1, 1024], got " +
                          std::to_string(options_.num_worker_threads));
  }
  if (options_.mpt_lanes < 1 || options_.mpt_lanes > 64) {
    throw InvalidArgument(who + "AgentOptions::mpt_lanes must be in [1, 64], got " +
                          std::to_string(options_.mpt_lanes));
  }
  if (options_.direct_copy_threads < 0 || options_.direct_copy_threads > 64) {
    throw InvalidArgument(who + "AgentOptions::direct_copy_threads must be in [0, 64], got " +
                          std::to_string(options_.direct_copy_threads));
  }
  for (const std::string& t : options_.transports) {
    if (t != "tcp" && t != "local" && t != "unix" && t != "shm" && t != "uv") {
      throw InvalidArgument(who + "unknown transport '" + t +
                            "' (known: tcp, local, unix, shm, uv)");
    }
  }
  for (const std::string& c : options_.channels) {
    if (c != "xth" && c != "ring" && c != "cma" && c != "mpt" && c != "mpt_uv" && c != "basic") {
      throw InvalidArgument(who + "unknown channel '" + c +
                            "' (known: xth, ring, cma, mpt, mpt_uv, basic)");
    }
  }
  if (std::find(options_.transports.begin(), options_.transports.end(), "tcp") ==
          options_.transports.end() &&
      std::find(options_.transports.begin(), options_.transports.end(), "uv") ==
          options_.transports.end()) {
    throw InvalidArgument(who +
                          "AgentOptions::transports needs \"tcp\" (or TensorPipe's \"uv\"): it "
                          "carries the first connection to every peer");
  }
  // A pipe's later connections (over local or unix) are admitted only for the peer that its
  // first connection's handshake proved, which gradwire's tcp carries and TensorPipe's uv
  // does not.
  const auto wanted = [&](const char* t) {
    return std::find(options_.transports.begin(), options_.transports.end(), t) !=
           options_.transports.end();
  };
  if ((wanted("local") || wanted("unix")) && !wanted("tcp")) {
    throw InvalidArgument(who +
                          "AgentOptions::transports has \"local\" or \"unix\" without "
                          "\"tcp\": their connections are admitted only for the peer that the "
                          "first connection's handshake proved, which \"uv\" does not carry");
  }
  if (options_.transport_spin.count() < 0 || options_.transport_spin > std::chrono::seconds(1)) {
    throw InvalidArgument(who + "AgentOptions::transport_spin must be in [0, 1 s], got " +
                          std::to_string(options_.transport_spin.count()) + " us");
  }
  if (options_.transport_spin_backoff.count() < 0 ||
      options_.transport_spin_backoff > std::chrono::seconds(1)) {
    throw InvalidArgument(who + "AgentOptions::transport_spin_backoff must be in [0, 1 s], got " +
                          std::to_string(options_.transport_spin_backoff.count()) + " us");
  }
  if (options_.transport_spin_awaiting.count() < 0 ||
      options_.transport_spin_awaiting > std::chrono::seconds(1)) {
    throw InvalidArgument(who + "AgentOptions::transport_spin_awaiting must be in [0, 1 s], got " +
                          std::to_string(options_.transport_spin_awaiting.count()) + " us");
  }
  if (options_.handshake_timeout.count() <= 0) {
    throw InvalidArgument(who + "AgentOptions::handshake_timeout must be > 0, got " +
                          ms_text(options_.handshake_timeout));
  }
  if (options_.channels.empty()) {
    throw InvalidArgument(who + "AgentOptions::channels is empty: tensors need a channel");
  }
  for (const auto& [name, value] :
       {std::pair<const char*, size_t>{"max_inflight_bytes_per_peer",
                                       options_.max_inflight_bytes_per_peer},
        {"max_inflight_bytes", options_.max_inflight_bytes},
        {"max_queued_requests_per_peer", options_.max_queued_requests_per_peer},
        {"max_queued_requests", options_.max_queued_requests}}) {
    if (value == 0) throw InvalidArgument(who + "AgentOptions::" + name + " must be > 0");
  }
  if (options_.close_timeout.count() < 0) {
    throw InvalidArgument(who + "AgentOptions::close_timeout must be >= 0, got " +
                          ms_text(options_.close_timeout));
  }
  detail::GroupDirectory::validate_device_maps(who, options_.device_maps);
}

std::string TensorPipeAgent::resolve_host() const {
  if (!options_.host.empty()) return options_.host;
  // GRADWIRE_RPC_HOST, GRADWIRE_SOCKET_IFNAME, else the interface that routes to the
  // rendezvous master (core/net.h).
  const std::string master = c10d::master_host(store_.get());
  try {
    return net::advertised_host(master);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument("rpc agent " + self_.describe() +
                          ": cannot choose the address to listen on: " + e.what());
  } catch (const NetworkError& e) {
    throw NetworkError(
        "rpc agent " + self_.describe() +
        ": cannot choose the address to listen on (toward the master '" + master +
        "'; set AgentOptions::host, GRADWIRE_RPC_HOST or GRADWIRE_SOCKET_IFNAME): " + e.what());
  }
}

// "host:port", with an IPv6 host in brackets.
std::string host_port(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

transport::StreamOptions TensorPipeAgent::stream_options(
    transport::StreamOptions::Family family) const {
  transport::StreamOptions o;
  o.family = family;
  o.secret = secret_;
  o.handshake_timeout = options_.handshake_timeout;
  o.spin = options_.transport_spin;
  o.spin_awaiting = options_.transport_spin_awaiting;
  o.spin_backoff = options_.transport_spin_backoff;
  o.awaiting = [count = calls_.pending_count()] {
    return count->load(std::memory_order_relaxed) != 0;
  };
  // TensorPipe's control frames carry a message's payload plus its tensors' descriptions.
  o.max_frame_bytes = options_.limits.max_payload_bytes + (size_t{16} << 20);
  // A Descriptor holds a few values per tensor; the other control frames hold a few dozen.
  o.max_frame_values = 16 * options_.limits.max_tensors + 4096;
  o.book = book_;
  // Weak: the negotiation holds the transports, whose options hold these.
  std::weak_ptr<const detail::Negotiation> negotiation = negotiation_;
  o.check_answer = [negotiation](const tp::BrochureAnswer& answer) -> std::string {
    auto n = negotiation.lock();
    return n ? n->check(answer) : "this worker is closing";
  };
  o.check_brochure = [negotiation](const tp::Brochure& brochure) -> std::string {
    auto n = negotiation.lock();
    return n ? n->check_brochure(brochure) : "this worker is closing";
  };
  const bool mpt = std::find(options_.channels.begin(), options_.channels.end(), "mpt") !=
                       options_.channels.end() ||
                   std::find(options_.channels.begin(), options_.channels.end(), "mpt_uv") !=
                       options_.channels.end();
  o.mpt_lanes = mpt ? static_cast<size_t>(options_.mpt_lanes) : 0;
  o.stats = family == transport::StreamOptions::Family::kTcp ? transport_stats_ : local_stats_;
  o.name = self_.name;
  // Each connection claims this worker in its handshake, and incoming ones are admitted
  // only as the worker they claim (group.h, PeerAdmission).
  std::weak_ptr<const TensorPipeAgent> weak = weak_from_this();
  o.identity = [weak, name = self_.name, rank = self_.id] {
    auto self = weak.lock();
    return transport::PeerIdentity{name, rank, self ? self->group_.incarnation() : 0};
  };
  o.verify_peer = [weak](const transport::PeerIdentity& peer,
                         transport::StreamOptions::VerifyDone done) {
    auto self = weak.lock();
    if (self == nullptr) {
      done("this worker is shutting down");
      return;
    }
    self->admission_.verify({peer.name, peer.rank, peer.incarnation}, std::move(done));
  };
  o.allow_other_uids =
      options_.local_allow_other_uids || env_bool("GRADWIRE_RPC_LOCAL_ALLOW_OTHER_UIDS", false);
  return o;
}

namespace {

// A transport whose connections exist only within one network namespace of one host
// (abstract Unix sockets, and what is passed over them), registered with a domain
// descriptor that adds this worker's host id and namespace inode to its own. TensorPipe
// offers a transport to a pair of workers only when their descriptors are equal, so such
// a transport is used between two workers exactly when they share host and namespace (what
// GroupDirectory::same_namespace says from the store), whatever its priority, and tcp
// otherwise: two containers of one host never try each other's abstract sockets.
class NamespaceBound final : public tp::transport::Context {
 public:
  NamespaceBound(std::shared_ptr<tp::transport::Context> inner, const std::string& host_id,
                 uint64_t netns)
      : inner_(std::move(inner)),
        domain_(inner_->domainDescriptor() + detail::namespace_suffix(host_id, netns)) {}

  std::shared_ptr<tp::transport::Connection> connect(std::string addr) override {
    return inner_->connect(std::move(addr));
  }
  std::shared_ptr<tp::transport::Listener> listen(std::string addr) override {
    return inner_->listen(std::move(addr));
  }
  bool isViable() const override { return inner_->isViable(); }
  const std::string& domainDescriptor() const override { return domain_; }
  bool canCommunicateWithRemote(const std::string& remote) const override {
    return remote == domain_;
  }
  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }
  void join() override { inner_->join(); }

 private:
  const std::shared_ptr<tp::transport::Context> inner_;
  const std::string domain_;
};

// A channel of the "ring" channel's context (below): counts what it sends
// (AgentMetrics::tensors_through_rings) and otherwise is the channel it wraps.
class CountingChannel final : public tp::channel::Channel {
 public:
  CountingChannel(std::shared_ptr<tp::channel::Channel> inner,
                  std::shared_ptr<RingCounters> counters)
      : inner_(std::move(inner)), counters_(std::move(counters)) {}
  void send(tp::Buffer buffer, size_t length, tp::channel::TSendCallback callback) override {
    counters_->tensors.fetch_add(1, std::memory_order_relaxed);
    counters_->bytes.fetch_add(length, std::memory_order_relaxed);
    inner_->send(buffer, length, std::move(callback));
  }
  void recv(tp::Buffer buffer, size_t length, tp::channel::TRecvCallback callback) override {
    inner_->recv(buffer, length, std::move(callback));
  }
  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }

 private:
  const std::shared_ptr<tp::channel::Channel> inner_;
  const std::shared_ptr<RingCounters> counters_;
};

// The "ring" channel: TensorPipe's basic channel (tensors written through a connection of
// the pipe's own transport) registered with device descriptors that, like NamespaceBound,
// carry this worker's host id and namespace inode. It is registered only with the local
// transport, so TensorPipe picks it exactly for pipes that run over local: a tensor then
// goes through that transport's shared-memory rings (a copy in on the sender, one out on
// the receiver) instead of a process_vm_readv of the sender's memory (cma).
class NamespaceBoundChannel final : public tp::channel::Context {
 public:
  NamespaceBoundChannel(std::shared_ptr<tp::channel::Context> inner, const std::string& host_id,
                        uint64_t netns, std::shared_ptr<RingCounters> counters)
      : inner_(std::move(inner)),
        suffix_(detail::namespace_suffix(host_id, netns)),
        counters_(std::move(counters)) {
    for (const auto& [device, descriptor] : inner_->deviceDescriptors())
      descriptors_.emplace(device, descriptor + suffix_);
  }

  bool isViable() const override { return inner_->isViable(); }
  size_t numConnectionsNeeded() const override { return inner_->numConnectionsNeeded(); }
  const std::unordered_map<tp::Device, std::string>& deviceDescriptors() const override {
    return descriptors_;
  }
  bool canCommunicateWithRemote(const std::string& local,
                                const std::string& remote) const override {
    return detail::suffixed_descriptors_match(*inner_, suffix_, local, remote);
  }
  std::shared_ptr<tp::channel::Channel> createChannel(
      std::vector<std::shared_ptr<tp::transport::Connection>> connections,
      tp::channel::Endpoint endpoint) override {
    return std::make_shared<CountingChannel>(
        inner_->createChannel(std::move(connections), endpoint), counters_);
  }
  void setId(std::string id) override { inner_->setId(std::move(id)); }
  void close() override { inner_->close(); }
  void join() override { inner_->join(); }

 private:
  const std::shared_ptr<tp::channel::Context> inner_;
  const std::string suffix_;
  const std::shared_ptr<RingCounters> counters_;
  std::unordered_map<tp::Device, std::string> descriptors_;
};

}  // namespace

std::shared_ptr<tp::transport::Context> TensorPipeAgent::namespace_bound(
    std::shared_ptr<tp::transport::Context> inner) const {
  return std::make_shared<NamespaceBound>(std::move(inner), descriptor_host_id(), netns_);
}

std::string TensorPipeAgent::descriptor_host_id() const {
  std::string host = host_id_;
  for (char& c : host) {
    if (std::isspace(static_cast<unsigned char>(c))) c = '_';
  }
  return host;
}

std::string TensorPipeAgent::transport_to(const Destination& worker) const {
  const WorkerInfo peer = get_worker_info(worker);
  const bool same = group_.same_namespace(peer.id);
  const std::vector<std::string> theirs = group_.transports_of(peer.id);
  for (const std::string& t : transports_) {
    const bool per_namespace = t == "local" || t == "unix" || t == "shm";
    if (per_namespace && !same) continue;
    if (std::find(theirs.begin(), theirs.end(), t) != theirs.end()) return t;
  }
  // Unreachable in a group that started: every worker registers tcp or uv.
  return "none";
}

void TensorPipeAgent::register_transport(int64_t priority, const std::string& name,
                                         std::shared_ptr<tp::transport::Context> context) {
  negotiation_->add_transport(name, context);
  context_->registerTransport(priority, name, std::move(context));
}

void TensorPipeAgent::register_channel(int64_t priority, const std::string& name,
                                       std::shared_ptr<tp::channel::Context> context) {
  negotiation_->add_channel(priority, name, context);
  context_->registerChannel(priority, name, std::move(context));
}

std::vector<std::string> TensorPipeAgent::register_transports_and_channels(
    const std::string& host) {
  auto wants = [](const std::vector<std::string>& list, const char* name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  // The first connection to every peer goes over tcp (or, without it, TensorPipe's uv):
  // its URL comes first and is the one announced.
  std::vector<std::string> urls;
  if (wants(options_.transports, "tcp")) {
    tcp_ = transport::create_stream_context(stream_options(transport::StreamOptions::Family::kTcp));
    register_transport(kTcpPriority, "tcp", tcp_);
    urls.push_back("tcp://" + host_port(host, 0));
  }
  if (wants(options_.transports, "local")) {
    local_ =
        transport::create_stream_context(stream_options(transport::StreamOptions::Family::kLocal));
    if (local_->isViable()) {
      register_transport(kLocalPriority, "local", namespace_bound(local_));
      urls.push_back("local://" + transport::unique_local_name());
    } else {
      GRADWIRE_LOG(kWarning) << "rpc agent " << self_.describe()
                             << ": the local transport needs memfd segments, which this "
                                "kernel refuses; peers on this host use the next transport";
      local_.reset();
    }
  }
  if (wants(options_.transports, "unix")) {
    unix_ =
        transport::create_stream_context(stream_options(transport::StreamOptions::Family::kUnix));
    register_transport(kUnixPriority, "unix", namespace_bound(unix_));
    urls.push_back("unix://" + transport::unique_local_name());
  }
  if (wants(options_.transports, "uv")) {
    register_transport(kUvPriority, "uv", tp::transport::uv::create());
    urls.push_back("uv://" + host_port(host, 0));
  }
  bool shm_registered = false;
  if (wants(options_.transports, "shm")) {
    auto shm = tp::transport::shm::create();
    if (shm->isViable()) {
      register_transport(kShmPriority, "shm", namespace_bound(shm));
      shm_registered = true;
      urls.push_back("shm://" + unique_shm_name());
    }
  }
  // In TensorPipe's order of preference (the priorities above).
  if (local_ != nullptr) transports_.push_back("local");
  if (unix_ != nullptr) transports_.push_back("unix");
  if (shm_registered) transports_.push_back("shm");
  if (tcp_ != nullptr) transports_.push_back("tcp");
  if (wants(options_.transports, "uv")) transports_.push_back("uv");
  if (wants(options_.channels, "basic")) {
    register_channel(kBasicPriority, "basic", tp::channel::basic::create());
  }
  // mpt opens connections of its own, on one listener per lane: over gradwire's tcp (with
  // the handshake) as "mpt", or over TensorPipe's uv as "mpt_uv".
  if (wants(options_.channels, "mpt") || wants(options_.channels, "mpt_uv")) {
    const bool ours = wants(options_.channels, "mpt");
    std::vector<std::shared_ptr<tp::transport::Context>> lanes;
    std::vector<std::shared_ptr<tp::transport::Listener>> listeners;
    for (int i = 0; i < options_.mpt_lanes; ++i) {
      std::shared_ptr<tp::transport::Context> lane;
      if (ours) {
        transport::StreamOptions o = stream_options(transport::StreamOptions::Family::kTcp);
        o.first_frame = transport::StreamOptions::FirstFrame::kMptLaneHello;
        auto stream = transport::create_stream_context(std::move(o));
        listeners.push_back(stream->listen(host_port(host, 0)));
        if (std::string error = stream->listen_error(); !error.empty()) {
          throw NetworkError("rpc agent " + self_.describe() + ": the mpt channel's lane " +
                             std::to_string(i) + ": " + error);
        }
        lane = std::move(stream);
      } else {
        lane = tp::transport::uv::create();
        listeners.push_back(lane->listen(host));
      }
      lanes.push_back(std::move(lane));
    }
    register_channel(kMptPriority, ours ? "mpt" : "mpt_uv",
                     tp::channel::mpt::create(std::move(lanes), std::move(listeners)));
  }
  if (wants(options_.channels, "ring") && local_ != nullptr) {
    register_channel(
        kRingPriority, "ring",
        std::make_shared<NamespaceBoundChannel>(tp::channel::basic::create(), descriptor_host_id(),
                                                netns_, ring_counters_));
  }
  // xth and cma read memory by address: they are registered wrapped (verified_channels.h),
  // and only beside a transport over Unix sockets, whose connections name their process.
  const bool unix_sockets = local_ != nullptr || unix_ != nullptr;
  channel_refusals_->worker = self_.name;
  if (wants(options_.channels, "cma") && unix_sockets) {
    auto cma = tp::channel::cma::create();
    if (cma->isViable()) {
      register_channel(
          kCmaPriority, "cma",
          detail::verified_process_channel(
              cma, detail::namespace_suffix(descriptor_host_id(), netns_), channel_refusals_));
    }
  }
  if (wants(options_.channels, "xth") && unix_sockets) {
    auto xth = tp::channel::xth::create();
    if (xth->isViable()) {
      register_channel(kXthPriority, "xth", detail::same_process_channel(xth, channel_refusals_));
    }
  }
  negotiation_->set_first_transport(tcp_ != nullptr ? "tcp" : "uv");
  return urls;
}

void TensorPipeAgent::start() {
  // TensorPipe's uv transport writes without MSG_NOSIGNAL: a peer that goes away mid-write
  // must fail calls with an error naming it, not kill this process.
  ignore_sigpipe();
  {
    MutexLock lock(mutex_);
    if (state_ != State::kStarting || pool_ != nullptr) {
      throw InvalidArgument("rpc agent " + self_.describe() + ": start() was already called");
    }
  }
  // Trace files of this process are named after its worker (the last agent started).
  trace::set_process_name(self_.name);
  // The worker id, which gradwire-trace merge matches calls to their serving with, and the
  // offset of this process's clock to the store's, which puts every file on one time line.
  trace::set_metadata("worker_id", std::to_string(self_.id));
  c10d::record_trace_clock_offset(store_);
  try {
    start_serving();
  } catch (...) {
    close();
    throw;
  }
}

void TensorPipeAgent::start_serving() {
  validate_options();
  if (store_ == nullptr) {
    throw InvalidArgument("rpc agent " + self_.describe() + ": no store was given");
  }
  {
    MutexLock lock(mutex_);
    if (state_ != State::kStarting || pool_ != nullptr) {
      throw InvalidArgument("rpc agent " + self_.describe() + ": start() was already called");
    }
    pool_ = std::make_shared<ThreadPool>(
        ThreadPoolOptions{.num_threads = options_.num_worker_threads, .name = "rpc"});
  }
  dispatcher_.start(pool_);
  if (options_.direct_copy_threads > 0) loans_ = std::make_unique<detail::LoanTable>(kLoanSlots);
  const std::string host = resolve_host();
  context_ = std::make_shared<tp::Context>(tp::ContextOptions().name(self_.name));
  secret_ = resolve_secret(options_.secret);
  if (secret_.empty()) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe()
                        << ": no secret is set (AgentOptions::secret, GRADWIRE_SECRET or "
                           "GRADWIRE_SECRET_FILE): anyone who can reach its port can join";
  }
  const std::vector<std::string> urls = register_transports_and_channels(host);
  listener_ = context_->listen(urls);
  for (const auto& stream : {tcp_, local_, unix_}) {
    if (stream == nullptr) continue;
    if (std::string error = stream->listen_error(); !error.empty()) {
      throw NetworkError("rpc agent " + self_.describe() + ": " + error);
    }
  }
  const std::string my_url = listener_->url(tcp_ != nullptr ? "tcp" : "uv");
  calls_.start();
  detail::GroupDirectory::Announcement me{my_url,       cuda_device_count(), options_.device_maps,
                                          std::nullopt, std::string(),       host_id_,
                                          netns_,       transports_};
  if (loans_) me.boot_id = detail::boot_id();
  if (loans_ && !me.boot_id.empty()) me.loans = loans_->address();
  group_.join(me, /*direct_copies=*/loans_ != nullptr, options_.rejoin);
  if (options_.rejoin) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe()
                        << " rejoined its group as incarnation " << group_.incarnation();
  }
  group_.check_device_maps();
  joined_.store(true, std::memory_order_release);
  // A newer incarnation's record is re-read on the pool; the task keeps the agent alive.
  admission_.open([weak = weak_from_this()](std::function<void()> task) {
    auto self = weak.lock();
    if (self == nullptr) throw Error("the worker has closed");
    self->pool_->execute([self, task = std::move(task)] { task(); });
  });
  {
    MutexLock lock(mutex_);
    state_ = State::kRunning;
    running_.store(true, std::memory_order_release);
  }
  accept_next();
  GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << " listening on " << my_url;
}

// ---- lookups

WorkerInfo TensorPipeAgent::get_worker_info(const Destination& worker) const {
  if (!joined_.load(std::memory_order_acquire)) {
    throw Error("rpc agent " + self_.describe() +
                " has not been started; it knows no other worker yet");
  }
  return group_.find(worker);
}

// ---- sending

void TensorPipeAgent::refuse_locked(const std::string& what) const {
  if (failure_) std::rethrow_exception(failure_);
  if (state_ == State::kStarting) {
    throw Error("rpc agent " + self_.describe() + " has not been started; cannot " + what);
  }
  throw Error("rpc agent " + self_.describe() + " is shut down; cannot " + what);
}

std::shared_ptr<TensorPipeAgent::Connection> TensorPipeAgent::connection_to(
    const WorkerInfo& target, const Request& request) {
  std::atomic<std::shared_ptr<Connection>>& slot = clients_[static_cast<size_t>(target.id)];
  // The common case takes no lock: a running agent with a connection to the peer.
  if (running_.load(std::memory_order_acquire)) {
    if (std::shared_ptr<Connection> conn = slot.load(std::memory_order_acquire)) return conn;
  }
  uint64_t serial = 0;
  {
    MutexLock lock(mutex_);
    if (state_ != State::kRunning) {
      refuse_locked("send " + describe_call(request.handler, request.function) + " to worker " +
                    target.describe());
    }
    if (std::shared_ptr<Connection> conn = slot.load(std::memory_order_acquire)) return conn;
    serial = next_serial_++;
  }
  // connect() is called with no lock held: TensorPipe may run other connections' callbacks
  // on this thread meanwhile, and those take mutex_ (holding it here deadlocked a worker
  // whose first sends to several peers met their first messages). The pipe is set before
  // any other sender can see the connection; a sender that lost the race uses the winner's.
  auto made = std::make_shared<Connection>();
  made->serial = serial;
  made->peer = target;
  made->outgoing = true;
  // A peer lost earlier may be back at another address.
  if (lost_peers_[static_cast<size_t>(target.id)].load(std::memory_order_acquire))
    check_rejoined(target.id);
  {
    const SendingMark sending;
    const std::string url = group_.url(target.id);
    made->dialed = url.substr(url.find("://") == std::string::npos ? 0 : url.find("://") + 3);
    made->pipe = context_->connect(url, tp::PipeOptions().remoteName(target.name));
  }
  std::shared_ptr<Connection> existing;
  if (!slot.compare_exchange_strong(existing, made, std::memory_order_acq_rel)) {
    // The losing pipe is kept open until the context closes: closing it now can reach the
    // peer before its listener has read the pipe's first packet, and TensorPipe's listener
    // takes such an error as its own and stops accepting for good.
    MutexLock lock(mutex_);
    spare_pipes_.push_back(std::move(made->pipe));
    return existing;
  }
  bool closing = false;
  {
    // A close that began meanwhile has cleared the slots already or is about to.
    MutexLock lock(mutex_);
    if (state_ != State::kRunning) {
      std::shared_ptr<Connection> mine = made;
      slot.compare_exchange_strong(mine, nullptr);
      closing = true;
    }
  }
  if (closing) {
    close_pipe(made->pipe);  // outside mutex_
    MutexLock lock(mutex_);
    refuse_locked("send " + describe_call(request.handler, request.function) + " to worker " +
                  target.describe());
  }
  read_next(made);
  return made;
}

void TensorPipeAgent::release_unsent(const Request& request) const {
  for (const auto& interceptor : *dispatcher_.interceptors()) {
    try {
      interceptor->on_request_not_sent(request);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << self_.describe()
                           << ": an interceptor's on_request_not_sent threw: " << e.what();
    }
  }
}

void TensorPipeAgent::send_request(const Destination& to, Request request, CallOptions options,
                                   ReplyCallback done) {
  WorkerInfo target;
  std::shared_ptr<Connection> conn;
  try {
    target = get_worker_info(to);
    if (options.timeout.count() < 0) {
      throw InvalidArgument("rpc: " + describe_call(request.handler, request.function) +
                            " to worker " + target.describe() + " was given a negative timeout (" +
                            ms_text(options.timeout) + ")");
    }
    conn = connection_to(target, request);
  } catch (...) {
    // No interceptor saw the request: they learn here that it never left.
    release_unsent(request);
    throw;
  }
  const std::chrono::milliseconds timeout = effective_timeout(options);
  const uint64_t id = calls_.next_id();
  request.id = id;
  std::shared_ptr<const detail::Dispatcher::Interceptors> interceptors = dispatcher_.interceptors();
  // The wire says "no timeout" with 0.
  request.timeout = timeout == kNoTimeout ? std::chrono::milliseconds(0) : timeout;
  PendingCall call{std::move(done),  target,  request.handler,
                   request.function, timeout, conn->serial,
                   interceptors,     {},      id};
  call.states.reserve(interceptors->size());
  call.started_ns = trace::now_ns();
  if (request.handler == kCallHandler)
    call.stats = &call_stats_.entry(request.function, target.id, target.name);
  // Loans are tied to the connection they travel on: losing it ends them.
  Lending lending{target.id, conn->serial, {}};
  EncodedMessage message;
  FaultDecision fault;
  try {
    for (const auto& interceptor : *interceptors)
      call.states.push_back(interceptor->on_outgoing_request(target, request));
    request.id = id;  // the agent's, whatever an interceptor did
    fault = decide_fault(target, /*is_reply=*/false, request.handler, request.function);
    message =
        encode(Envelope{std::move(request)}, detail::device_mapper(group_.route_to(target.id)),
               kDefaultInlineTensorBytes, lender_for(lending));
    call.bytes_out = wire_bytes(message);
  } catch (...) {
    return_loans(lending.taken, conn->serial);
    // The interceptors that saw the request learn that it never left; the caller gets the
    // error thrown, not through its callback. The one that refused it, and those after it,
    // are told as for a request that never reached them.
    call.done = nullptr;
    const size_t saw = call.states.size();
    calls_.finish(call, Value(), std::current_exception(), CallOutcome::kNotSent);
    for (size_t i = saw; i < interceptors->size(); ++i) {
      try {
        (*interceptors)[i]->on_request_not_sent(request);
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kError) << "rpc worker " << self_.describe()
                             << ": an interceptor's on_request_not_sent threw: " << e.what();
      }
    }
    throw;
  }
  // A close that began meanwhile refuses the call here, as it would have before encoding;
  // one that begins after add() fails it through its callback.
  std::optional<PendingCall> refused;
  if (!calls_.add(call)) {
    refused = std::move(call);
  } else if (!running_.load(std::memory_order_acquire)) {
    refused = calls_.take(id);
  }
  if (refused) {
    return_loans(lending.taken, conn->serial);
    refused->done = nullptr;
    calls_.finish(*refused, Value(), nullptr, CallOutcome::kShutDown);
    MutexLock lock(mutex_);
    refuse_locked("send " + refused->what() + " to worker " + target.describe());
  }
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  // A message that never left cannot be copied from: its loans end (the connection may
  // have been lost before they were made, so its own clean-up missed them).
  return_unsent_loans(fault, lending);
  auto on_written = [weak, id, target, taken = std::move(lending.taken),
                     serial = conn->serial](const std::string& error) {
    if (error.empty()) return;
    auto self = weak.lock();
    if (self == nullptr) return;
    self->return_loans(taken, serial);
    std::optional<PendingCall> lost = self->calls_.take(id, serial);
    if (!lost) return;
    self->calls_.finish(
        *lost, Value(),
        std::make_exception_ptr(NetworkError("rpc: " + lost->what() + " to worker " +
                                             target.describe() + " could not be sent: " + error)),
        CallOutcome::kNotSent);
  };
  // A dropped request stays pending until its deadline, as one lost on the way would.
  apply_fault(fault, conn, std::move(message), std::move(on_written));
}

FaultDecision TensorPipeAgent::decide_fault(const WorkerInfo& to, bool is_reply, uint32_t handler,
                                            const std::string& function) const {
  if (!options_.faults) return {};
  return options_.faults->decide(OutgoingMessage{self_, to, is_reply, handler, function});
}

void TensorPipeAgent::return_unsent_loans(const FaultDecision& decision, Lending& lending) {
  if (decision.verdict != FaultDecision::Verdict::kDrop &&
      decision.verdict != FaultDecision::Verdict::kCut)
    return;
  return_loans(lending.taken, lending.connection);
  lending.taken.clear();
}

void TensorPipeAgent::apply_fault(const FaultDecision& decision,
                                  const std::shared_ptr<Connection>& conn, EncodedMessage message,
                                  std::function<void(const std::string&)> on_done) {
  switch (decision.verdict) {
    case FaultDecision::Verdict::kSend:
      write(conn, std::move(message), std::move(on_done));
      return;
    case FaultDecision::Verdict::kDrop:
      return;
    case FaultDecision::Verdict::kCut:
      // Both ends then see the connection lost; the reason this side gives names the rule.
      conn->cut.store(true, std::memory_order_release);
      close_pipe(conn->pipe);
      return;
    case FaultDecision::Verdict::kDelay: {
      std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
      auto held = std::make_shared<EncodedMessage>(std::move(message));
      options_.faults->run_later(decision.delay, [weak, conn, held, on_done = std::move(on_done)] {
        // An agent that has gone meanwhile sends nothing; its calls have failed already.
        if (auto self = weak.lock()) self->write(conn, std::move(*held), on_done);
      });
      return;
    }
  }
}

void TensorPipeAgent::write(const std::shared_ptr<Connection>& conn, EncodedMessage message,
                            std::function<void(const std::string&)> on_done) {
  auto keep = std::make_shared<std::vector<Tensor>>(std::move(message.tensors));
  tp::Message out;
  out.metadata = std::move(message.payload);
  out.tensors.reserve(keep->size());
  for (const Tensor& t : *keep) {
    tp::Message::Tensor tensor;
    tensor.buffer = tp::CpuBuffer{buffer_of(t)};
    tensor.length = t.nbytes();
    // The receiver always takes TensorPipe's part of a message into host memory (a device
    // map is applied after). Saying so up front lets TensorPipe send the tensor's bytes with
    // its descriptor; without a target it first waits for the receiver to name one (a
    // descriptor reply: a round trip more for every message that carries a tensor).
    tensor.targetDevice = tp::Device{tp::kCpuDeviceType, 0};
    out.tensors.push_back(std::move(tensor));
  }
  // This thread may run TensorPipe's loop meanwhile, and so take other messages: no
  // request among them runs here (SendingMark).
  const SendingMark sending;
  conn->pipe->write(std::move(out), [keep, on_done = std::move(on_done)](const tp::Error& error) {
    if (on_done) on_done(error ? error.what() : std::string());
  });
}

// ---- receiving

void TensorPipeAgent::accept_next() {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  listener_->accept([weak](const tp::Error& error, std::shared_ptr<tp::Pipe> pipe) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      if (!self->is_shut_down()) {
        GRADWIRE_LOG(kWarning) << "rpc worker " << self->self_.describe()
                               << " stopped accepting connections: " << error.what();
      }
      return;
    }
    auto conn = std::make_shared<Connection>();
    conn->pipe = std::move(pipe);
    const std::string& remote = conn->pipe->getRemoteName();
    const int id = self->group_.id_of(remote);
    conn->peer = id < 0 ? WorkerInfo{printable(remote), -1} : self->group_.worker(id);
    // Told before any of the new process's messages is read.
    if (id >= 0 && self->lost_peers_[static_cast<size_t>(id)].load(std::memory_order_acquire))
      self->check_rejoined(id);
    {
      MutexLock lock(self->mutex_);
      if (self->state_ == State::kClosed) return;
      conn->serial = self->next_serial_++;
      self->servers_.emplace(conn->serial, conn);
    }
    self->read_next(conn);
    self->accept_next();
  });
}

void TensorPipeAgent::close_pipe(const std::shared_ptr<tp::Pipe>& pipe) {
  const SendingMark entering;
  pipe->close();
}

void TensorPipeAgent::read_next(const std::shared_ptr<Connection>& conn) {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  const SendingMark entering;  // called off the loop too (a new connection's first read)
  conn->pipe->readDescriptor([weak, conn](const tp::Error& error, tp::Descriptor descriptor) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      self->on_connection_error(conn, error.what());
      return;
    }
    self->on_descriptor(conn, std::move(descriptor));
  });
}

void TensorPipeAgent::on_descriptor(const std::shared_ptr<Connection>& conn,
                                    tp::Descriptor descriptor) {
  std::vector<IncomingTensor> announced;
  // Parsed once, here; decoded from the same parse when the tensor data has arrived.
  std::shared_ptr<const ParsedEnvelope> parsed;
  try {
    if (!descriptor.payloads.empty()) {
      throw InvalidArgument("malformed rpc envelope: a message with " +
                            std::to_string(descriptor.payloads.size()) + " payloads");
    }
    // Only host memory travels through TensorPipe here (device tensors are copied to the host
    // first): a tensor said to come from elsewhere would have no channel to arrive by.
    const tp::Device cpu{tp::kCpuDeviceType, 0};
    for (size_t i = 0; i < descriptor.tensors.size(); ++i) {
      const tp::Descriptor::Tensor& t = descriptor.tensors[i];
      if (!(t.sourceDevice == cpu) || (t.targetDevice.has_value() && !(*t.targetDevice == cpu))) {
        throw InvalidArgument("malformed rpc envelope: tensor " + std::to_string(i) +
                              " is sent from device " + printable(t.sourceDevice.type) + ":" +
                              std::to_string(t.sourceDevice.index) +
                              "; only host memory travels between workers");
      }
    }
    parsed = std::make_shared<const ParsedEnvelope>(descriptor.metadata, options_.limits);
    announced = peek_tensors(*parsed, options_.limits);
    const size_t sent = static_cast<size_t>(
        std::count_if(announced.begin(), announced.end(),
                      [](const IncomingTensor& t) { return !t.loan.has_value(); }));
    if (sent != descriptor.tensors.size()) {
      throw InvalidArgument("malformed rpc envelope: " + std::to_string(sent) +
                            " tensors announced, " + std::to_string(descriptor.tensors.size()) +
                            " sent");
    }
    size_t total = 0;
    for (size_t i = 0, j = 0; i < announced.size(); ++i) {
      if (!announced[i].loan && announced[i].nbytes() != descriptor.tensors[j++].length) {
        throw InvalidArgument("malformed rpc envelope: tensor " + std::to_string(i) +
                              " is announced as " + std::to_string(announced[i].nbytes()) +
                              " bytes but " + std::to_string(descriptor.tensors[j - 1].length) +
                              " are sent");
      }
      total += announced[i].nbytes();
    }
    if (total > options_.limits.max_tensor_bytes) {
      throw InvalidArgument("malformed rpc envelope: " + std::to_string(total) +
                            " tensor bytes, more than the limit of " +
                            std::to_string(options_.limits.max_tensor_bytes));
    }
  } catch (const std::exception& e) {
    on_malformed(conn, descriptor.metadata, e.what(), /*close_after=*/true);
    return;
  }
  Held held;
  held.bytes = descriptor.metadata.size();
  for (const IncomingTensor& a : announced)
    held.bytes += a.logical_nbytes();
  held.request = parsed->is_request();
  if (std::string limit = reserve_inflight(*conn, held); !limit.empty()) {
    // Nothing is left unread when every tensor travelled inside the envelope.
    const bool unread = !announced.empty();
    if (held.request) {
      refuse_busy(conn, parsed->id(), "worker " + self_.describe() + " is busy: " + limit, unread);
    } else {
      if (parsed->is_response()) {
        calls_.fail(parsed->id(),
                    std::make_exception_ptr(BusyError("rpc: the reply from worker " +
                                                      conn->peer.describe() + " to worker " +
                                                      self_.describe() + " was refused: " + limit)),
                    CallOutcome::kReplied, conn->serial);
      }
      close_pipe(conn->pipe);
    }
    return;
  }
  tp::Allocation allocation;
  std::vector<Tensor> tensors;
  std::vector<Device> targets;
  std::vector<detail::LoanCopy> lent;
  try {
    // Runs on TensorPipe's loop thread: an allocation failure must become an error reply,
    // not an exception escaping into the loop.
    tensors.reserve(announced.size());
    for (const IncomingTensor& a : announced) {
      Tensor t = gradwire::empty(a.sizes, a.dtype);
      if (a.loan) {
        lent.push_back(
            detail::LoanCopy{*a.loan, t.nbytes() == 0 ? nullptr : t.data_ptr(), t.nbytes()});
      } else {
        tp::Allocation::Tensor slot;
        slot.buffer = tp::CpuBuffer{buffer_of(t)};
        allocation.tensors.push_back(std::move(slot));
      }
      tensors.push_back(std::move(t));
      targets.push_back(a.device);
    }
  } catch (const std::exception& e) {
    release_inflight(*conn, held);
    on_malformed(
        conn, descriptor.metadata,
        "cannot allocate the " + std::to_string(held.bytes) + " bytes announced: " + e.what(),
        /*close_after=*/true);
    return;
  }
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  const SendingMark entering;
  conn->pipe->read(
      std::move(allocation),
      [weak, conn, held, parsed = std::move(parsed), metadata = std::move(descriptor.metadata),
       tensors = std::move(tensors), targets = std::move(targets),
       lent = std::move(lent)](const tp::Error& error) mutable {
        auto self = weak.lock();
        if (self == nullptr) return;
        if (error) {
          self->release_inflight(*conn, held);
          self->on_connection_error(conn, error.what());
          return;
        }
        self->read_next(conn);
        self->on_message(conn, std::move(parsed), std::move(metadata), std::move(tensors), targets,
                         std::move(lent), held);
      });
}

std::string TensorPipeAgent::reserve_inflight(Connection& conn, const Held& held) {
  MutexLock lock(mutex_);
  const auto past = [](const char* name, size_t limit, size_t now, size_t more, const char* unit) {
    return std::string(name) + " (" + std::to_string(limit) + unit +
           ") would be passed: " + std::to_string(now) + unit + " held, " + std::to_string(more) +
           unit + " more";
  };
  if (conn.inflight_bytes + held.bytes > options_.max_inflight_bytes_per_peer) {
    return past("max_inflight_bytes_per_peer", options_.max_inflight_bytes_per_peer,
                conn.inflight_bytes, held.bytes, " bytes");
  }
  if (inflight_bytes_ + held.bytes > options_.max_inflight_bytes) {
    return past("max_inflight_bytes", options_.max_inflight_bytes, inflight_bytes_, held.bytes,
                " bytes");
  }
  if (held.request) {
    if (conn.queued_requests + 1 > options_.max_queued_requests_per_peer) {
      return past("max_queued_requests_per_peer", options_.max_queued_requests_per_peer,
                  conn.queued_requests, 1, " requests");
    }
    if (queued_requests_ + 1 > options_.max_queued_requests) {
      return past("max_queued_requests", options_.max_queued_requests, queued_requests_, 1,
                  " requests");
    }
    ++conn.queued_requests;
    ++queued_requests_;
  }
  conn.inflight_bytes += held.bytes;
  inflight_bytes_ += held.bytes;
  return std::string();
}

void TensorPipeAgent::release_inflight(Connection& conn, const Held& held) {
  MutexLock lock(mutex_);
  release_inflight_locked(conn, held);
}

void TensorPipeAgent::release_inflight_locked(Connection& conn, const Held& held) {
  conn.inflight_bytes -= std::min(conn.inflight_bytes, held.bytes);
  inflight_bytes_ -= std::min(inflight_bytes_, held.bytes);
  if (held.request) {
    conn.queued_requests -= std::min<size_t>(conn.queued_requests, 1);
    queued_requests_ -= std::min<size_t>(queued_requests_, 1);
  }
}

void TensorPipeAgent::refuse_busy(const std::shared_ptr<Connection>& conn, uint64_t request_id,
                                  const std::string& why, bool close_after) {
  busy_refusals_.fetch_add(1, std::memory_order_relaxed);
  GRADWIRE_LOG(kDebug) << "rpc worker " << self_.describe() << ": refused request " << request_id
                       << " from " << conn->peer.describe() << ": " << why;
  Response reply;
  reply.id = request_id;
  reply.result = ErrorReply{ErrorKind::kBusy, why, self_.name, /*rejected=*/true};
  std::shared_ptr<tp::Pipe> pipe = conn->pipe;
  write(conn, encode(Envelope{std::move(reply)}), [pipe, close_after](const std::string&) {
    if (close_after) close_pipe(pipe);
  });
  if (close_after) return;
  // The message had no separate tensor data: complete its (empty) read and go on.
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  const SendingMark entering;
  conn->pipe->read(tp::Allocation{}, [weak, conn](const tp::Error& error) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      self->on_connection_error(conn, error.what());
      return;
    }
    self->read_next(conn);
  });
}

void TensorPipeAgent::on_message(const std::shared_ptr<Connection>& conn,
                                 std::shared_ptr<const ParsedEnvelope> parsed, std::string metadata,
                                 std::vector<Tensor> tensors, const std::vector<Device>& targets,
                                 std::vector<detail::LoanCopy> lent, Held held) {
  const bool to_device =
      std::any_of(targets.begin(), targets.end(), [](const Device& d) { return d.is_cuda(); });
  const bool has_loans = !lent.empty();
  size_t lent_bytes = 0;
  for (const detail::LoanCopy& c : lent)
    lent_bytes += c.nbytes;
  // A reply whose lent tensors are small is copied right here: the copy (one thread, tens of
  // microseconds) costs less than waking a pool thread for it, and the call then completes
  // without a hand-off. Larger copies, and every request, go to the pool.
  const bool copy_here = !parsed->is_request() && lent_bytes <= kCopyOnLoopMaxBytes;
  auto process = [self = shared_from_this(), conn, to_device, has_loans, parsed = std::move(parsed),
                  metadata = std::move(metadata), tensors = std::move(tensors),
                  lent = std::move(lent), held]() mutable {
    if (!lent.empty()) {
      const std::string failure = self->copy_lent(conn, lent);
      if (!failure.empty()) {
        self->release_inflight(*conn, held);
        self->on_lost_loans(conn, metadata, failure);
        return;
      }
    }
    Envelope envelope;
    try {
      envelope = decode(*parsed, tensors, self->options_.limits);
    } catch (const std::exception& e) {
      self->release_inflight(*conn, held);
      self->on_malformed(conn, metadata, e.what(), /*close_after=*/false);
      return;
    }
    if (Request* request = std::get_if<Request>(&envelope.body)) {
      {
        MutexLock lock(self->mutex_);
        if (self->state_ == State::kClosed) return;
        ++self->active_handlers_;
      }
      // The request's tensors are the handler's until its reply is written; request_done
      // returns what it holds of the budget.
      // Here on the pool when tensors were copied first: the request runs on, no second hop.
      self->dispatcher_.serve(self, conn, std::move(*request), held.bytes,
                              /*on_executor=*/to_device || has_loans);
      return;
    }
    self->release_inflight(*conn, held);
    if (Response* response = std::get_if<Response>(&envelope.body)) {
      self->complete_call(conn, std::move(*response), held.bytes);
    } else {
      self->on_release(conn, std::get<Release>(envelope.body));
    }
  };
  // Requests always run on the pool. Replies complete their call here, on the I/O thread,
  // unless tensors must first be copied to a device or out of the sender's memory.
  if (!to_device && (!has_loans || copy_here)) {
    process();
  } else {
    try {
      pool_->execute(std::move(process));
    } catch (const Error&) {
      // The pool is shut down: the agent is closing and the message is moot.
    }
  }
}

void TensorPipeAgent::on_malformed(const std::shared_ptr<Connection>& conn,
                                   const std::string& metadata, const std::string& why,
                                   bool close_after) {
  GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe() << ": malformed message from "
                         << conn->peer.describe() << ": " << why;
  std::optional<EnvelopeHeader> header = peek_header(metadata, options_.limits);
  if (header && header->is_request) {
    Response reply;
    reply.id = header->id;
    reply.result = ErrorReply{ErrorKind::kInvalidArgument, why, self_.name, /*rejected=*/true};
    // Unread tensor data of a bad descriptor cannot be skipped: after the reply, the
    // connection goes.
    std::shared_ptr<tp::Pipe> pipe = conn->pipe;
    write(conn, encode(Envelope{std::move(reply)}), [pipe, close_after](const std::string&) {
      if (close_after) close_pipe(pipe);
    });
    return;
  }
  if (header) {
    calls_.fail(header->id,
                std::make_exception_ptr(InvalidArgument("rpc: worker " + conn->peer.describe() +
                                                        " sent a malformed reply: " + why)),
                CallOutcome::kReplied, conn->serial);
  }
  if (close_after) close_pipe(conn->pipe);
}

void TensorPipeAgent::on_lost_loans(const std::shared_ptr<Connection>& conn,
                                    const std::string& metadata, const std::string& why) {
  const std::string text = "worker " + self_.describe() +
                           " could not copy the tensors lent by worker " + conn->peer.describe() +
                           ": " + why;
  GRADWIRE_LOG(kWarning) << "rpc: " << text;
  std::optional<EnvelopeHeader> header = peek_header(metadata, options_.limits);
  if (!header) return;
  if (header->is_request) {
    Response reply;
    reply.id = header->id;
    reply.result = ErrorReply{ErrorKind::kNetwork, text, self_.name, /*rejected=*/true};
    write(conn, encode(Envelope{std::move(reply)}), nullptr);
    return;
  }
  calls_.fail(header->id, std::make_exception_ptr(NetworkError("rpc: the reply " + text)),
              CallOutcome::kReplied, conn->serial);
}

// ---- direct copies

AgentMetrics TensorPipeAgent::metrics() const {
  AgentMetrics m;
  {
    MutexLock lock(mutex_);
    m.running_handlers = active_handlers_;
    m.inflight_bytes = inflight_bytes_;
    m.queued_requests = queued_requests_;
    m.shutting_down = shutdown_started_ && state_ == State::kRunning;
  }
  m.pending_calls = static_cast<int64_t>(calls_.size());
  m.loans_outstanding = static_cast<int64_t>(outstanding_loans());
  m.tensors_lent = tensors_lent_.load(std::memory_order_relaxed);
  m.bytes_lent = bytes_lent_.load(std::memory_order_relaxed);
  m.tensors_through_rings = ring_counters_->tensors.load(std::memory_order_relaxed);
  m.bytes_through_rings = ring_counters_->bytes.load(std::memory_order_relaxed);
  m.tensors_copied_in = tensors_copied_in_.load(std::memory_order_relaxed);
  m.bytes_copied_in = bytes_copied_in_.load(std::memory_order_relaxed);
  m.local_connections_accepted = local_stats_->accepted.load(std::memory_order_relaxed);
  m.connections_accepted =
      transport_stats_->accepted.load(std::memory_order_relaxed) + m.local_connections_accepted;
  m.connections_refused = transport_stats_->refused.load(std::memory_order_relaxed) +
                          local_stats_->refused.load(std::memory_order_relaxed);
  m.frames_refused = transport_stats_->bad_frames.load(std::memory_order_relaxed) +
                     local_stats_->bad_frames.load(std::memory_order_relaxed);
  m.transport_polls_backed_off =
      transport_stats_->polls_backed_off.load(std::memory_order_relaxed) +
      local_stats_->polls_backed_off.load(std::memory_order_relaxed);
  m.requests_refused_busy = busy_refusals_.load(std::memory_order_relaxed);
  m.channels_refused = channel_refusals_->count.load(std::memory_order_relaxed);
  return m;
}

Lender TensorPipeAgent::lender_for(Lending& lending) {
  const int peer = lending.peer;
  if (!loans_ || !group_.lends_to(peer)) {
    return nullptr;
  }
  return [this, &lending](const Tensor& t) -> std::optional<Loan> {
    if (t.nbytes() < options_.direct_copy_min_bytes || t.nbytes() == 0) return std::nullopt;
    std::optional<Loan> loan = loans_->lend(t, lending.peer, lending.connection);
    if (loan) {
      lending.taken.push_back(*loan);
      tensors_lent_.fetch_add(1, std::memory_order_relaxed);
      bytes_lent_.fetch_add(t.nbytes(), std::memory_order_relaxed);
    }
    return loan;
  };
}

void TensorPipeAgent::return_loans(const std::vector<Loan>& taken, uint64_t connection) {
  for (const Loan& loan : taken)
    loans_->release(loan, connection);
  if (taken.empty()) return;
  MutexLock lock(mutex_);
  idle_cv_.notify_all();
}

std::string TensorPipeAgent::copy_lent(const std::shared_ptr<Connection>& conn,
                                       const std::vector<detail::LoanCopy>& lent) {
  const int peer = conn->peer.id;
  // The copy out of the lender's memory, before the message is handled.
  trace::Span span("rpc.copy_in", "rpc", trace::Arg("peer", peer),
                   trace::Arg("tensors", static_cast<uint64_t>(lent.size())));
  if (span.active()) {
    uint64_t bytes = 0;
    for (const detail::LoanCopy& c : lent)
      bytes += c.nbytes;
    span.arg(trace::Arg("bytes", bytes));
  }
  std::string why;
  const std::optional<detail::LoanTableAddress>& table = group_.readable(peer);
  // The lender's process: the one the kernel names at the other end of this pipe's local
  // connections (opened to the address this worker dialled, or admitted as the lender).
  const std::optional<transport::PeerProcess> process =
      conn->outgoing ? book_->process_of_dialed(conn->dialed)
                     : book_->process_of_worker(conn->peer.name, conn->peer.id);
  if (!table) {
    why = "its memory cannot be read from here (no direct copies between these workers)";
  } else if (!process) {
    why = "no local connection with it names its process, so its memory is not read";
  } else {
    detail::LoanTableAddress verified = *table;
    verified.pid = process->pid;
    why = detail::read_loans(verified, self_.id, lent, options_.direct_copy_threads, pool_.get());
  }
  if (why.empty()) {
    for (const detail::LoanCopy& c : lent) {
      tensors_copied_in_.fetch_add(1, std::memory_order_relaxed);
      bytes_copied_in_.fetch_add(c.nbytes, std::memory_order_relaxed);
    }
  }
  // Released in every case: the lender must not hold the memory for a copy that failed.
  Release release;
  for (const detail::LoanCopy& c : lent)
    release.loans.push_back(c.loan);
  write(conn, encode(Envelope{std::move(release)}), nullptr);
  return why;
}

void TensorPipeAgent::on_release(const std::shared_ptr<Connection>& conn, const Release& release) {
  for (const Loan& loan : release.loans) {
    if (!loans_ || !loans_->release(loan, conn->serial)) {
      GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe() << ": worker "
                             << conn->peer.describe() << " released loan " << loan.slot
                             << ", which it does not hold";
    }
  }
  MutexLock lock(mutex_);
  idle_cv_.notify_all();
}

void TensorPipeAgent::on_connection_error(const std::shared_ptr<Connection>& conn,
                                          const std::string& error) {
  const std::string what =
      conn->cut.load(std::memory_order_acquire) ? "cut by a fault rule" : error;
  // Loans made over this connection end with it: no release can come back on it.
  if (loans_) loans_->release_connection(conn->serial);
  bool closing = false;
  {
    MutexLock lock(mutex_);
    closing = state_ != State::kRunning;
    if (conn->outgoing) {
      // Only this connection's slot: a newer connection to the peer stays.
      std::shared_ptr<Connection> expected = conn;
      clients_[static_cast<size_t>(conn->peer.id)].compare_exchange_strong(expected, nullptr);
    } else {
      servers_.erase(conn->serial);
    }
  }
  // In a graceful shutdown's last phase, peers close their connections as they leave.
  closing = closing || departing_.load(std::memory_order_acquire);
  std::vector<PendingCall> lost;
  if (conn->outgoing) lost = calls_.take_connection(conn->serial);
  if (!closing && conn->outgoing) {
    GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": connection to "
                        << conn->peer.describe() << " lost: " << what;
  }
  // A peer of the group that went away while this agent runs: the modules above release
  // what it held (a connection from outside the group has id -1). They are told once per
  // loss, whichever of its connections goes first, until a replacement rejoins.
  if (!closing && conn->peer.id >= 0 && conn->peer.id < world_size_ && conn->peer.id != self_.id &&
      !lost_peers_[static_cast<size_t>(conn->peer.id)].exchange(true, std::memory_order_acq_rel))
    notify_worker_lost(conn->peer, what);
  for (PendingCall& call : lost) {
    calls_.finish(call, Value(),
                  std::make_exception_ptr(
                      NetworkError("rpc: " + call.what() + " to worker " + call.to.describe() +
                                   " failed: the connection to it was lost (" + what + ")")),
                  CallOutcome::kConnectionLost);
  }
}

// ---- serving

bool TensorPipeAgent::write_reply(const std::shared_ptr<detail::Link>& link, const Request& request,
                                  const Response& response, bool plain, size_t* bytes) {
  std::shared_ptr<Connection> conn = std::static_pointer_cast<Connection>(link);
  const FaultDecision fault =
      decide_fault(conn->peer, /*is_reply=*/true, request.handler, request.function);
  const bool written = fault.verdict != FaultDecision::Verdict::kDrop;
  if (plain) {
    EncodedMessage message = encode(Envelope{response});
    if (bytes != nullptr) *bytes = wire_bytes(message);
    apply_fault(fault, conn, std::move(message), nullptr);
    return written;
  }
  // A caller outside the group gets no route; with CUDA devices here it still needs one,
  // to be told that its tensors have nowhere to go.
  const detail::DeviceRoute* route = group_.route_back(conn->peer.id);
  std::optional<detail::DeviceRoute> stray;
  if (route == nullptr && group_.maps_devices()) {
    route = &stray.emplace(conn->peer, DeviceMap{}, detail::DeviceRoute::Direction::kReply);
  }
  Lending lending{conn->peer.id, conn->serial, {}};
  EncodedMessage message;
  try {
    message = encode(Envelope{response}, detail::device_mapper(route), kDefaultInlineTensorBytes,
                     lender_for(lending));
    if (bytes != nullptr) *bytes = wire_bytes(message);
  } catch (...) {
    return_loans(lending.taken, conn->serial);
    throw;
  }
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  return_unsent_loans(fault, lending);
  apply_fault(
      fault, conn, std::move(message),
      [weak, taken = std::move(lending.taken), serial = conn->serial](const std::string& error) {
        if (error.empty() || taken.empty()) return;
        if (auto self = weak.lock()) self->return_loans(taken, serial);
      });
  return written;
}

void TensorPipeAgent::request_done(const detail::Link& link, size_t held_bytes) {
  MutexLock lock(mutex_);
  // Every Link this agent serves from is one of its Connections.
  release_inflight_locked(const_cast<Connection&>(static_cast<const Connection&>(link)),
                          Held{held_bytes, /*request=*/true});
  --active_handlers_;
  idle_cv_.notify_all();
}

// ---- completing calls

void TensorPipeAgent::complete_call(const std::shared_ptr<Connection>& conn, Response response,
                                    size_t bytes) {
  std::optional<PendingCall> call = calls_.take(response.id, conn->serial);
  if (!call) {
    // A call that timed out: what the reply carries is still shown to the interceptors
    // that saw its request.
    if (std::optional<LateCall> late = calls_.take_late(response.id, conn->serial)) {
      for (size_t i = 0; i < late->states.size() && i < late->interceptors->size(); ++i) {
        try {
          (*late->interceptors)[i]->on_late_response(late->to, response, late->states[i]);
        } catch (const std::exception& e) {
          GRADWIRE_LOG(kError) << "rpc worker " << self_.describe()
                               << ": an interceptor's on_late_response threw: " << e.what();
        }
      }
    }
    GRADWIRE_LOG(kDebug) << "rpc worker " << self_.describe() << ": dropped the reply "
                         << response.id << " from " << conn->peer.describe()
                         << " (its call timed out or was never made)";
    return;
  }
  call->bytes_in = bytes;
  try {
    for (size_t i = 0; i < call->states.size(); ++i)
      (*call->interceptors)[i]->on_incoming_response(call->to, response, call->states[i]);
  } catch (...) {
    calls_.finish(*call, Value(), std::current_exception(), CallOutcome::kReplied);
    return;
  }
  if (Value* value = std::get_if<Value>(&response.result)) {
    calls_.finish(*call, std::move(*value), nullptr, CallOutcome::kReplied);
  } else {
    calls_.finish(*call, Value(),
                  detail::Dispatcher::reply_error(std::get<ErrorReply>(response.result), call->to,
                                                  call->handler, call->function),
                  CallOutcome::kReplied);
  }
}

// ---- shutdown

void TensorPipeAgent::check_rejoined(int id) {
  const int incarnation =
      group_.refresh(id, std::min(options_.rpc_timeout, std::chrono::milliseconds(5'000)));
  std::atomic<int>& told = rejoined_[static_cast<size_t>(id)];
  int before = told.load(std::memory_order_acquire);
  while (incarnation > before) {
    if (told.compare_exchange_weak(before, incarnation, std::memory_order_acq_rel)) {
      lost_peers_[static_cast<size_t>(id)].store(false, std::memory_order_release);
      GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": worker "
                          << group_.worker(id).describe() << " rejoined as incarnation "
                          << incarnation;
      notify_worker_rejoined(group_.worker(id), incarnation);
      return;
    }
  }
}

void TensorPipeAgent::wait_until_idle(Clock::time_point deadline) {
  // Pending calls, running handlers and loans (a peer may still be copying a reply this
  // worker lent it) must all be done at once: a handler may still make a call, so the
  // table is checked again once the handlers are done.
  for (;;) {
    const bool calls_done = calls_.wait_until_idle(deadline);
    MutexLock lock(mutex_);
    auto busy = [&]() GRADWIRE_REQUIRES(mutex_) {
      return active_handlers_ > 0 || outstanding_loans() > 0;
    };
    bool timed_out = !calls_done;
    while (!timed_out && busy()) {
      timed_out = lock.wait_until(idle_cv_, deadline) == std::cv_status::timeout && busy();
    }
    const size_t pending = calls_.size();
    if (!timed_out && pending == 0) return;
    if (timed_out) {
      throw TimeoutError("rpc agent " + self_.describe() + ": graceful shutdown waited " +
                         ms_text(options_.join_timeout) + " for " + std::to_string(pending) +
                         " pending calls, " + std::to_string(active_handlers_) +
                         " running handlers and " + std::to_string(outstanding_loans()) +
                         " tensors lent to peers");
    }
  }
}

void TensorPipeAgent::shutdown(bool graceful) {
  if (dispatcher_.serving_on_this_thread()) {
    throw InvalidArgument("rpc agent " + self_.describe() +
                          ": shutdown() was called from a request this agent is serving; it "
                          "would wait for that request itself. Shut the agent down from "
                          "outside its handlers");
  }
  {
    MutexLock lock(mutex_);
    // A second shutdown returns at once; calls may still be made while a graceful one
    // waits for the other workers.
    if (state_ != State::kRunning || shutdown_started_) return;
    shutdown_started_ = true;
  }
  if (graceful) {
    const Clock::time_point deadline = Clock::now() + options_.join_timeout;
    try {
      // The modules above send their last messages (rref/: deletes) while every worker
      // still serves.
      notify_graceful_shutdown(deadline);
      // Each worker first finishes its own calls; once all agree, no new call can depend
      // on a worker that has gone, and a second round lets replies still in flight land.
      wait_until_idle(deadline);
      group_.barrier("1", deadline);
      wait_until_idle(deadline);
      // Every worker is past the first barrier: none sends anything new, and a peer closes
      // its connections only once it is past the second, which this worker enters now (a
      // peer that dies instead is named by that barrier's timeout).
      departing_.store(true, std::memory_order_release);
      group_.barrier("2", deadline);
      group_.depart(deadline);
    } catch (...) {
      {
        // Later operations fail with this error, not a generic "shut down".
        MutexLock lock(mutex_);
        if (failure_ == nullptr) failure_ = std::current_exception();
      }
      close();
      throw;
    }
  }
  close();
}

void TensorPipeAgent::close() {
  {
    MutexLock lock(mutex_);
    if (state_ == State::kClosed || state_ == State::kClosing) return;
    state_ = State::kClosing;
    running_.store(false, std::memory_order_release);
    idle_cv_.notify_all();
  }
  if (print_stats_) {
    // One write, so the tables of agents closing together do not interleave.
    const std::string text = "rpc worker " + self_.describe() + " statistics:\n" + stats().table();
    std::cerr.write(text.data(), static_cast<std::streamsize>(text.size()));
    std::cerr.flush();
  }
  // Fails what is pending and stops the timer.
  calls_.close([this](const PendingCall& call) {
    return std::make_exception_ptr(Error("rpc agent " + self_.describe() +
                                         " was shut down before " + call.what() + " to worker " +
                                         call.to.describe() + " completed"));
  });
  admission_.close("this worker is shutting down");
  if (listener_) listener_->close();
  if (context_) {
    context_->close();
    context_->join();
  }
  // Queued requests have lost their connections: drop them; handlers still running get
  // close_timeout to return, then are left to finish on their own.
  if (pool_) pool_->shutdown_now(options_.close_timeout);
  if (loans_) loans_->release_all();
  std::vector<std::shared_ptr<Connection>> clients;
  std::map<uint64_t, std::shared_ptr<Connection>> servers;
  std::vector<std::shared_ptr<tp::Pipe>> spare;
  {
    MutexLock lock(mutex_);
    state_ = State::kClosed;
    spare.swap(spare_pipes_);
    for (int r = 0; r < world_size_; ++r)
      clients.push_back(clients_[static_cast<size_t>(r)].exchange(nullptr));
    servers.swap(servers_);
  }
  notify_closed();
}

}  // namespace

std::shared_ptr<RpcAgent> create_tensorpipe_agent(std::string name, int rank, int world_size,
                                                  std::shared_ptr<c10d::Store> store,
                                                  AgentOptions options) {
  if (!detail::valid_worker_name(name)) {
    throw InvalidArgument("rpc: invalid worker name '" + name +
                          "': use 1 to 128 characters from [A-Za-z0-9_.:-]");
  }
  if (world_size < 1) {
    throw InvalidArgument("rpc: world_size must be >= 1, got " + std::to_string(world_size));
  }
  if (rank < 0 || rank >= world_size) {
    throw InvalidArgument("rpc: rank " + std::to_string(rank) + " is outside [0, " +
                          std::to_string(world_size) + ")");
  }
  auto agent = std::make_shared<TensorPipeAgent>(WorkerInfo{std::move(name), rank}, world_size,
                                                 std::move(store), std::move(options));
  // The handle's deleter closes the agent on the thread that drops the last handle.
  RpcAgent* raw = agent.get();
  std::shared_ptr<RpcAgent> handle(raw, [agent](RpcAgent*) mutable {
    agent->close();
    agent.reset();
  });
  install_agent_extensions(handle);
  return handle;
}

std::shared_ptr<RpcAgent> make_tensorpipe_agent(std::string name, int rank, int world_size,
                                                std::shared_ptr<c10d::Store> store,
                                                AgentOptions options) {
  std::shared_ptr<RpcAgent> agent = create_tensorpipe_agent(std::move(name), rank, world_size,
                                                            std::move(store), std::move(options));
  agent->start();
  return agent;
}

}  // namespace gradwire::rpc
