// The TensorPipe agent's class, shared by the files that implement it. See
// gradwire/rpc/tensorpipe_agent.h for what the agent does; the comments here and in the
// .cc files say how.
//
// The agent is the TensorPipe transport around three transport-free parts: the group
// directory (group.h: who is in the group, the store records, the shutdown barriers), the
// call table (call_table.h: pending calls, deadlines, the timer) and the dispatcher
// (dispatcher.h: handlers, interceptors, serving a request and building its reply). What
// stays in the agent is the I/O, one concern a file:
//   tensorpipe_agent.cc    start-up, lookups, metrics, the factory functions
//   agent_options.cc       AgentOptions checks and the address to listen on
//   agent_transports.cc    TensorPipe transports and channels: adapters and registration
//   agent_connections.cc   connections to and from peers, their loss, rejoined peers
//   agent_send.cc          requests and replies written, fault rules applied
//   agent_receive.cc       descriptors and messages read, calls completed
//   agent_budget.cc        the per-peer in-flight byte and request budget
//   agent_loans.cc         loans (direct copies) lent and copied
//   agent_shutdown.cc      graceful shutdown and close
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
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <tensorpipe/channel/channel.h>
#include <tensorpipe/tensorpipe.h>

#include "call_table.h"
#include "dispatcher.h"
#include "gradwire/c10d/store.h"
#include "gradwire/core/env.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/net.h"
#include "gradwire/core/thread_annotations.h"
#include "gradwire/core/thread_pool.h"
#include "gradwire/rpc/fault_injection.h"
#include "gradwire/rpc/stats.h"
#include "gradwire/rpc/tensorpipe_agent.h"
#include "group.h"
#include "stats_table.h"
#include "tensorpipe/loans.h"
#include "tensorpipe/negotiation.h"
#include "tensorpipe/verified_channels.h"
#include "transport/stream_transport.h"
#include "wire.h"

namespace gradwire::rpc::detail {

namespace tp = tensorpipe;

// What a message takes on the wire: its payload and the tensors that travel beside it
// (lent tensors, copied by the receiver, are not counted).
inline size_t wire_bytes(const EncodedMessage& message) {
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

// TensorPipe wants a pointer even for an empty tensor.
inline void* buffer_of(const Tensor& t) {
  static uint8_t empty_tensor_byte = 0;
  void* p = t.nbytes() == 0 ? nullptr : t.data_ptr();
  return p != nullptr ? p : &empty_tensor_byte;
}

// Thread-safety: see RpcAgent. mutex_ guards the agent's state, its incoming connections,
// the in-flight budget and the count of requests being served; the connections to peers are
// atomic slots that a sender reads without it (they change under it). The directory is
// immutable once joined_ is set; the call table and the dispatcher synchronise themselves.
class TensorPipeAgent final : public RpcAgent,
                              public ReplyWriter,
                              public std::enable_shared_from_this<TensorPipeAgent> {
 public:
  TensorPipeAgent(WorkerInfo self, int world_size, std::shared_ptr<c10d::Store> store,
                  AgentOptions options)
      : self_(std::move(self)),
        world_size_(world_size),
        store_(std::move(store)),
        options_(std::move(options)),
        group_(self_, world_size_, store_, options_.join_timeout,
               options_.elastic ? options_.max_workers : 0),
        calls_(self_.describe()),
        dispatcher_(self_, *this),
        clients_(new std::atomic<std::shared_ptr<Connection>>[static_cast<size_t>(group_.slots())]),
        lost_peers_(new std::atomic<bool>[static_cast<size_t>(group_.slots())]),
        rejoined_(new std::atomic<int>[static_cast<size_t>(group_.slots())]) {
    for (int i = 0; i < group_.slots(); ++i) {
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
  int id_limit() const override { return group_.slots(); }
  void leave() override;

  // Forced close: fails what is pending, closes TensorPipe, stops the threads. Idempotent.
  void close();

  // ReplyWriter: how the dispatcher's replies travel.
  bool write_reply(const std::shared_ptr<Link>& link, const Request& request,
                   const Response& response, bool plain, size_t* bytes) override;
  void request_done(const Link& link, size_t tensor_bytes) override;

 private:
  using Clock = std::chrono::steady_clock;
  enum class State { kStarting, kRunning, kClosing, kClosed };

  struct Connection : Link {
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
  // Its steps: the transports (sets tcp_, local_, unix_ and transports_; returns the URLs),
  // then the channels, among them mpt with its lanes' listeners.
  std::vector<std::string> register_transports(const std::string& host);
  void register_channels(const std::string& host);
  void register_mpt(const std::string& host);
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
  // Reading one message: its descriptor checked, its share of the budget taken, its tensors
  // allocated, then its data read (read_message) and the message handled (on_message).
  void on_descriptor(const std::shared_ptr<Connection>& conn, tp::Descriptor descriptor);
  // Where one message's tensors are received: fresh tensors, TensorPipe's allocation for
  // those sent beside the envelope, the devices they go to, and the copies of those lent.
  struct Arrival {
    tp::Allocation allocation;
    std::vector<Tensor> tensors;
    std::vector<Device> targets;
    std::vector<LoanCopy> lent;
  };
  // Throws what allocating a tensor throws.
  static Arrival allocate(const std::vector<IncomingTensor>& announced);
  // A message the in-flight budget refused (`limit` says why): a request is answered with a
  // BusyError; otherwise the connection closes, and a reply's call fails. `unread`: tensor
  // data of the message is still to be read.
  void refuse_over_budget(const std::shared_ptr<Connection>& conn, const ParsedEnvelope& parsed,
                          const Held& held, const std::string& limit, bool unread);
  void read_message(const std::shared_ptr<Connection>& conn,
                    std::shared_ptr<const ParsedEnvelope> parsed, std::string metadata,
                    const Held& held, Arrival arrival);
  void on_message(const std::shared_ptr<Connection>& conn,
                  std::shared_ptr<const ParsedEnvelope> parsed, std::string metadata,
                  std::vector<Tensor> tensors, const std::vector<Device>& targets,
                  std::vector<LoanCopy> lent, Held held);
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
  std::string copy_lent(const std::shared_ptr<Connection>& conn, const std::vector<LoanCopy>& lent);
  void on_release(const std::shared_ptr<Connection>& conn, const Release& release);
  size_t outstanding_loans() const { return loans_ ? loans_->outstanding() : 0; }
  void on_connection_error(const std::shared_ptr<Connection>& conn, const std::string& what);
  void write(const std::shared_ptr<Connection>& conn, EncodedMessage message,
             std::function<void(const std::string& error)> on_done);
  // A request that was not encoded (an interceptor or the encoder threw): its loans end and
  // the interceptors learn that it never left. Called in the handler of what was thrown.
  void abandon_unencoded(PendingCall& call, const Request& request, const Lending& lending);
  // What runs once request `id` to `target` is written: on a failure, its loans end and its
  // call fails.
  std::function<void(const std::string&)> request_written(uint64_t id, const WorkerInfo& target,
                                                          std::vector<Loan> taken, uint64_t serial);
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
  // Elastic groups (agent_membership.cc): the handler of membership notices, a joiner's
  // announcement to every member, and a leaver's.
  void register_membership_handler();
  Future<Value> on_membership_notice(const CallContext& context, const Request& request);
  // Sends notice `what` to every member but this worker and waits for their replies until
  // `deadline`; a member that does not answer is logged.
  void tell_members(const std::string& what, Clock::time_point deadline);
  // A joiner (AgentOptions::join_running), once it serves: tells every member it is here.
  void announce_joined();
  void wait_until_idle(Clock::time_point deadline);

  const WorkerInfo self_;
  const int world_size_;
  const std::shared_ptr<c10d::Store> store_;
  const AgentOptions options_;
  GroupDirectory group_;  // joined by start(); see joined_
  // Which incoming connections speak for which worker (opened once group_ is joined).
  mutable PeerAdmission admission_{group_, std::chrono::milliseconds(5'000)};
  CallTable calls_;
  Dispatcher dispatcher_;
  // The calls this worker makes, per (function, callee) (RpcAgent::stats).
  StatsTable call_stats_;

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
  std::unique_ptr<LoanTable> loans_;
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
  const std::shared_ptr<Negotiation> negotiation_ = std::make_shared<Negotiation>();
  const std::shared_ptr<ChannelRefusals> channel_refusals_ = std::make_shared<ChannelRefusals>();
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

}  // namespace gradwire::rpc::detail
