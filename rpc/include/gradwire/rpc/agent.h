// RpcAgent: one worker's endpoint for remote calls — it sends requests to other workers,
// serves theirs, and knows every worker of the group by name and id.
//
// An agent is an object, not a process-wide singleton: several can live in one process
// (tests run ranks as threads). make_tensorpipe_agent() (tensorpipe_agent.h) builds the
// TensorPipe implementation; init_rpc() (rpc.h) builds one and makes it the default that the
// free functions rpc_sync / rpc_async use.
//
// Start-up order: create_tensorpipe_agent() builds an agent that has not joined its group;
// handlers, interceptors and attachments installed then are in place before any peer can
// reach it, and start() joins the group and begins serving. make_tensorpipe_agent() does
// both at once, for programs that install nothing of their own.
//
// Calls. rpc_async<R>(to, "fn", args...) sends a request to call the registered function
// "fn" on worker `to` (a name, an id or a WorkerInfo) and returns a Future<R>; rpc_sync<R>
// waits for it. A CallOptions placed before the arguments sets a per-call timeout:
//   agent->rpc_sync<Tensor>("ps0", "add", CallOptions{.timeout = 500ms}, a, b);
// Each call has a deadline (the per-call timeout, else AgentOptions::rpc_timeout); when it
// passes, the future fails with TimeoutError and a late reply is dropped. kNoTimeout
// (core/future.h) means no deadline: the call still fails when its peer or the agent goes.
// The future's get() without an argument waits as long as the call's deadline.
//
// Extension points (what rref/ and dist_autograd/ plug into):
// - register_handler(id, name, handler, execution or chooser): requests whose
//   Request::handler is `id` go to `handler` instead of the function registry, on the pool
//   or inline on the I/O thread (per request with a chooser). rpc/ owns kCallHandler (1).
// - add_interceptor(interceptor): sees every outgoing and incoming request and response and
//   may change it (set autograd ids, record tensors) or refuse it by throwing; it is told
//   how every call it saw ends, and may wrap the execution of every request served.
// - attachments: typed per-agent state the modules above hang on the agent (the RRef
//   context, the dist-autograd container), found from a CallContext.
// - add_listener(listener): told when a worker is lost, before a graceful shutdown waits
//   for outstanding work, and when the agent has closed (rref/ releases a dead worker's
//   references and sends its last protocol messages there).
// - register_agent_extension(name, install): process-wide; every agent a factory builds
//   runs each installer before start(), so a module linked into the program (rref/) is in
//   place on every agent, the default one of init_rpc included.
// send(to, request) sends a raw Request to any handler and returns its Value.
//
// Thread-safety: every method may be called from any thread, concurrently, including from
// handlers and future callbacks. Handlers and registered functions run on the agent's
// thread pool (AgentOptions::num_worker_threads), never on an I/O thread. Interceptors
// run on the thread that sends or receives and must not block.
//
// Errors, at the caller:
// - thrown at once by rpc_async / send: InvalidArgument for an unknown worker, a
//   negative timeout or a value that cannot travel; Error before start() and once the agent
//   is shut down — or, after a failure (a graceful shutdown that timed out), that first
//   error;
// - stored in the future (and thrown by rpc_sync): TimeoutError when the deadline passes;
//   NetworkError naming the worker when the connection to it is lost; InvalidArgument
//   (naming the worker, the function, the expected and received types) when the remote
//   worker refused the call before running it (unknown function, wrong arity or types);
//   RemoteError (with the remote message and worker) when the function itself threw;
//   InvalidArgument when the result does not convert to R.
// After shutdown, every pending call has failed and every new one throws.
//
// Tensors are read from their storage after rpc_async returns (zero-copy, or lent to a
// peer on the same host, which copies them out of this process): do not modify a tensor
// argument in place until its call's future completes.
//
// Example:
//   auto agent = rpc::make_tensorpipe_agent("trainer0", 0, 2, store);
//   Tensor c = agent->rpc_sync<Tensor>("ps0", "add", a, b);
//   Future<Tensor> f = agent->rpc_async<Tensor>(1, "add", a, b);
//   agent->shutdown();   // graceful: waits for every worker
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <typeindex>
#include <utility>
#include <vector>

#include "gradwire/core/executor.h"
#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/rpc/call_context.h"
#include "gradwire/rpc/envelope.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rpc/stats.h"
#include "gradwire/rpc/value.h"
#include "gradwire/rpc/value_convert.h"
#include "gradwire/rpc/worker_info.h"
#include "gradwire/tensor/device.h"

namespace gradwire::c10d {
class Store;
}  // namespace gradwire::c10d

namespace gradwire::rpc {

class FaultInjector;

inline constexpr std::chrono::milliseconds kDefaultRpcTimeout{60'000};
// The most times one rank of a group can be taken over by a new process (AgentOptions::rejoin).
inline constexpr int kMaxIncarnation = 255;

// Options of one call.
struct CallOptions {
  // The call's deadline, from now; 0 means the agent's rpc_timeout; kNoTimeout none.
  std::chrono::milliseconds timeout{0};
};

// Where CUDA tensors sent to one worker land: (device here, device there) pairs. Replies
// travel back through the inverse pairs. CPU tensors always stay on the CPU.
using DeviceMap = std::vector<std::pair<Device, Device>>;

struct AgentOptions {
  // Default deadline of a call; > 0 (kNoTimeout: none).
  std::chrono::milliseconds rpc_timeout{kDefaultRpcTimeout};
  // How long start-up and graceful shutdown wait for every worker to arrive; > 0.
  std::chrono::milliseconds join_timeout{120'000};
  // Threads that run handlers and registered functions; in [1, 1024].
  int num_worker_threads{8};
  // Rendezvous URL for init_rpc when `store` is not given (env://, tcp://, file://).
  std::string init_method{"env://"};
  // A store shared by every worker (the rendezvous result); overrides init_method.
  std::shared_ptr<c10d::Store> store;
  // Address to listen on and announce to peers. Empty: net::advertised_host (core/net.h)
  // toward the rendezvous master (the host of the store, a TCPStore seen through
  // PrefixStores, else MASTER_ADDR): GRADWIRE_RPC_HOST if set, else the IPv4 address of
  // the interface GRADWIRE_SOCKET_IFNAME names, else the local address of the interface
  // that routes to the master. So workers on other hosts or in other containers reach it
  // without configuration; a job whose master is 127.0.0.1 stays on loopback.
  std::string host;
  // Transports and channels to register, from {"tcp", "local", "shm", "uv"} and {"xth",
  // "ring", "cma", "mpt", "mpt_uv", "basic"}. Per peer, the fastest one that both ends have and
  // that can reach across the pair is used: local, unix and shm listen on abstract Unix sockets,
  // which exist per network namespace, so they serve only peers that published the same
  // host id and network namespace (RpcAgent::transport_to; containers on one host use tcp).
  // "tcp" and "local" are gradwire's own (docs/rpc.md, Transports): TCP for every peer, and
  // Unix sockets between processes of one host; both authenticate (see `secret`), bound what
  // they read, and sleep when idle. The first connection to a peer goes over "tcp" (or,
  // without it, "uv"): one of them is required. "shm" and "uv" are TensorPipe's, for
  // comparison only: they do none of that, shm busy-polls a core per worker, and a single
  // stray connection stops uv's listener.
  // Channels move tensors: xth within one process; ring through the shared-memory rings of
  // the local transport (a copy in on the sender, one out on the receiver), for pairs that
  // talk over local; cma between processes of one host (the receiver reads the sender's
  // memory with process_vm_readv); mpt over several TCP lanes of gradwire's tcp ("mpt_uv":
  // TensorPipe's uv lanes); basic through the pipe's own connection. Tensors of at least
  // direct_copy_min_bytes bypass them all between processes of one host (below).
  std::vector<std::string> transports{"local", "tcp"};
  std::vector<std::string> channels{"xth", "ring", "cma", "mpt", "basic"};
  // The job's shared secret. Every connection between workers then begins with a mutual
  // HMAC-SHA256 challenge-response over fresh nonces, and a peer that does not know the
  // secret is refused before any of its bytes are parsed. Empty: GRADWIRE_SECRET, else
  // the file named by GRADWIRE_SECRET_FILE, else none (anyone who can reach the port can
  // join: use only on a trusted network). Every worker of a job needs the same one.
  std::string secret;
  // How long a new connection may take to complete its handshake before it is closed.
  std::chrono::milliseconds handshake_timeout{10'000};
  // The "local" and "unix" transports admit only peers whose process runs as the same user
  // as this one (SO_PEERCRED, checked on both ends); true admits every user of the host (in
  // its network namespace). GRADWIRE_RPC_LOCAL_ALLOW_OTHER_UIDS=1 turns it on too.
  bool local_allow_other_uids{false};
  // How long gradwire's transports keep polling after traffic before their thread sleeps:
  // a reply that follows a request within it is picked up without a wake-up (lower
  // latency), at the cost of that much CPU after each burst; an idle worker spends none.
  // In [0, 1 s]; 0 sleeps at once.
  std::chrono::microseconds transport_spin{500};
  // While one of this worker's calls awaits its reply, the transports keep polling up to
  // this long after the last traffic instead (when longer than transport_spin): a reply
  // that comes after a few milliseconds of work on the callee (a forward, a backward part)
  // is then picked up without a wake-up, at the cost of a polling thread while the caller
  // waits. In [0, 1 s]; 0 (or not above transport_spin): transport_spin alone.
  std::chrono::microseconds transport_spin_awaiting{3000};
  // Polling yields the core between looks; a yield that kept the transport thread off its
  // core for this long or longer (more runnable threads than cores: a computation, other
  // workers' threads) ends the polling until the next traffic, and the thread sleeps: a
  // polling thread would keep one of those threads, perhaps the very computation whose
  // result it waits for, off a core, and its wake-up later puts it ahead of them. In
  // [0, 1 s]; 0: polling lasts its whole time whatever the load.
  std::chrono::microseconds transport_spin_backoff{100};
  // Lanes (TCP connections) of the mpt and mpt_uv channels; in [1, 64].
  int mpt_lanes{4};
  // Direct copies between processes of one host. A CPU tensor of at least
  // direct_copy_min_bytes sent to such a peer is lent rather than sent: the receiver copies
  // it straight out of this process's memory (process_vm_readv), spread over up to
  // direct_copy_threads threads, and then tells the sender it is done. It needs the
  // permission to read a peer's memory (same user, ptrace not restricted); each worker
  // checks that at start and otherwise everything travels through TensorPipe as usual.
  // direct_copy_threads in [0, 64]; 0 turns direct copies off. Up to 1 MiB (a 512x512
  // float32 tensor is exactly that) a pair that talks over the local transport sends a
  // tensor through its rings instead (the ring channel: two memcpys through memory that
  // stays in the cache, no control messages, no copying threads to wake), which costs less
  // than a loan at that size, so by default only tensors larger than 1 MiB are lent.
  size_t direct_copy_min_bytes{(size_t{1} << 20) + 1};
  int direct_copy_threads{4};
  // Per destination worker name.
  std::map<std::string, DeviceMap> device_maps;
  EnvelopeLimits limits;
  // The in-flight budget: what peers can make this worker hold at once. A message's cost is
  // its envelope's bytes plus its tensors' bytes, held from the moment its descriptor is
  // read until it is done with (a request: until its reply is written). Counted per
  // connection (a peer's connection, not the name it claims) and for all connections
  // together. A request past a budget, or past the queued-request bounds below, is refused
  // with a BusyError reply that names the limit (nothing of it runs; the caller may retry).
  // Its connection stays open when the message carries no separate tensor data; otherwise
  // the connection is closed after the reply (unread tensor data cannot be skipped). A
  // reply past a budget fails its call with BusyError. All > 0.
  size_t max_inflight_bytes_per_peer{size_t{8} << 30};
  size_t max_inflight_bytes{size_t{16} << 30};
  // Requests received and not yet answered (queued for the pool or running), per connection
  // and in total: the bound on the worker pool's queue.
  size_t max_queued_requests_per_peer{4096};
  size_t max_queued_requests{16384};
  // How long a forced shutdown waits for handlers still running (queued requests are
  // dropped at once); those still running then are left to finish on their own. >= 0.
  std::chrono::milliseconds close_timeout{5'000};
  // The functions peers may call; nullptr means rpc::registry().
  Registry* registry{nullptr};
  // This worker replaces one of the running group that was lost (its process died): it
  // takes over the lost worker's name and rank, joins the group as it runs (no other
  // worker waits for it or restarts), and the others accept it from then on — the way a
  // restarted trainer comes back to its parameter servers. Its rank's earlier worker must
  // be gone: the others refuse nothing, and a live one would share its name. The
  // rejoined worker lends no tensor (direct copies) to its peers; they may lend to it.
  // init_rpc turns it on when GRADWIRE_RPC_REJOIN=1 (gradwire-run --restart-workers).
  bool rejoin{false};
  // Elastic membership (docs/elastic.md). With `elastic`, the group accepts workers that were
  // not there when it formed (join_running below) and lets a worker leave it (leave()); the
  // graceful shutdown's barriers then count the members of the moment. Every worker that
  // starts the group sets it (GRADWIRE_RPC_ELASTIC=1 turns it on in init_rpc). Worker ids
  // stay below max_workers: ranks are never reused in a job, so it bounds every worker that
  // ever joins. In [1, 65536], and at least the world size.
  bool elastic{false};
  int max_workers{1024};
  // This worker joins an elastic group that is already running, under its own (unused)
  // rank and a name no worker has had: it waits for nobody, the members learn of it as it
  // announces itself (AgentListener::on_worker_joined), and it lends no tensor (direct
  // copies), as a rejoined worker. The world_size given to the factory is not used; the
  // rank must be below max_workers. init_rpc turns it on when GRADWIRE_RPC_JOIN=1.
  bool join_running{false};
  // For tests: drops, delays or cuts the messages this agent sends, on command
  // (fault_injection.h). Null: none.
  std::shared_ptr<FaultInjector> faults;
};

// Handles requests with one handler id, on the agent's thread pool (or inline, see
// register_handler). The returned future's value (or error) is the reply.
using MessageHandler =
    std::function<Future<Value>(const CallContext& context, const Request& request)>;
// Picks, per request, where a handler runs (register_handler's chooser overload). Asked on
// the I/O thread that received the request, before anything else looks at it: it must be
// cheap and never block. One that throws leaves the request to the pool.
using ExecutionChooser = std::function<Execution(const Request& request)>;

// How an outgoing call ended (Interceptor::on_call_finished).
enum class CallOutcome {
  kReplied,         // a reply arrived: a value, or an error raised on the peer
  kTimedOut,        // its deadline passed; a late reply is dropped
  kConnectionLost,  // the connection to the peer went while the call was pending
  kNotSent,         // refused by an interceptor, or encoding or writing it failed
  kShutDown,        // the agent closed before a reply came
};
// "replied", "timed out", ...
const char* call_outcome_name(CallOutcome outcome);

// How one outgoing call ended, as an interceptor is told.
struct FinishedCall {
  const WorkerInfo& to;
  uint64_t request_id;
  uint32_t handler;
  const std::string& function;  // empty for requests to other handlers
  CallOutcome outcome;
  std::exception_ptr error;  // null for a reply with a value
};

// Wraps the work an agent does for one incoming request: enter() runs on a thread before
// the handler, and before each later piece of work for the request (the reply, after an
// asynchronous handler's future completes on another thread), and exit() after it on the
// same thread, also when it throws. dist_autograd/ sets its thread-local context id here, so
// it never leaks into the next task of a pool thread. Must not throw.
class ServeScope {
 public:
  virtual ~ServeScope() = default;
  virtual void enter() {}
  virtual void exit() {}
};

// Sees every message an agent sends or receives. The default methods do nothing.
//
// Outgoing calls: on_outgoing_request may change the request and may return state for this
// call (null for none); the agent hands it back to on_incoming_response and then, exactly
// once, to on_call_finished, however the call ends — so what an interceptor recorded for a
// call never leaks. A throw from on_outgoing_request fails the send at once (interceptors
// that already ran are told kNotSent); from on_incoming_response, the call's future fails
// with it.
//
// Incoming requests: on_incoming_request may change the request and may return a ServeScope
// held until the reply is written; a throw fails the call (the caller gets a RemoteError).
// From on_outgoing_response, the reply becomes that error.
//
// Messages that never reach their peer, or reach it too late, are still shown to the
// interceptors, so that what a module recorded for the values they carry (rref/: a fork
// counted for its receiver) can be undone:
// - on_request_not_sent: a request whose arguments were made but that this interceptor did
//   not see (converting a later argument threw, send_request threw before the interceptors
//   ran, or an interceptor before it refused the request);
// - on_late_response: the reply to a call that had already ended (it timed out; the call
//   table keeps the interceptors' state of a timed-out call for this, at most 65,536 calls,
//   until its connection goes), after on_call_finished was told kTimedOut;
// - on_response_not_sent: a reply that on_outgoing_response saw but that was not written
//   (encoding it failed, and the caller gets an error reply instead; or a fault rule dropped
//   it, and the caller times out). A reply lost with its connection is not told here: the
//   agent's listeners learn that the peer was lost.
//
// Interceptors run in the order they were added, on the thread that sends or receives; they
// must not block. on_call_finished and the three hooks above must not throw (what they
// throw is logged).
class Interceptor {
 public:
  virtual ~Interceptor() = default;
  virtual std::shared_ptr<void> on_outgoing_request(const WorkerInfo& to, Request& request);
  virtual void on_incoming_response(const WorkerInfo& from, Response& response,
                                    const std::shared_ptr<void>& state);
  virtual void on_call_finished(const FinishedCall& call, const std::shared_ptr<void>& state);
  virtual std::shared_ptr<ServeScope> on_incoming_request(const WorkerInfo& from, Request& request);
  virtual void on_outgoing_response(const WorkerInfo& to, const Request& request,
                                    Response& response);
  virtual void on_request_not_sent(const Request& request);
  virtual void on_late_response(const WorkerInfo& from, const Response& response,
                                const std::shared_ptr<void>& state);
  virtual void on_response_not_sent(const WorkerInfo& to, const Request& request,
                                    const Response& response);
  // The thread-local state of this module on the calling thread, as a scope that re-enters
  // it on another thread (null: none). A module that defers a send to another thread (rref/
  // waits for a reference's confirmation) captures it when the call is made and enters it
  // around the deferred send, so the send is seen as made where the call was (dist_autograd/
  // records it in the caller's context).
  virtual std::shared_ptr<ServeScope> capture_thread_state();
};

// Every interceptor's captured thread state (Interceptor::capture_thread_state), entered
// together around deferred work: enter() in order, exit() in reverse.
class CapturedState {
 public:
  CapturedState() = default;
  explicit CapturedState(std::vector<std::shared_ptr<ServeScope>> scopes)
      : scopes_(std::move(scopes)) {}
  // Runs fn inside the captured scopes.
  template <typename F>
  decltype(auto) run(F&& fn) const {
    struct Entered {
      const std::vector<std::shared_ptr<ServeScope>>& s;
      explicit Entered(const std::vector<std::shared_ptr<ServeScope>>& scopes) : s(scopes) {
        for (const auto& x : s)
          x->enter();
      }
      ~Entered() {
        for (auto it = s.rbegin(); it != s.rend(); ++it)
          (*it)->exit();
      }
    } entered(scopes_);
    return fn();
  }
  bool empty() const { return scopes_.empty(); }

 private:
  std::vector<std::shared_ptr<ServeScope>> scopes_;
};

// Told of an agent's life beyond single messages. The default methods do nothing.
//
// on_worker_lost: a connection to or from `worker` was lost while the agent ran (the
//   worker died, or closed without a graceful shutdown). Runs on an I/O thread: must not
//   block. `why` is the transport's reason.
// on_worker_rejoined: a lost worker's replacement has connected (see the method).
// on_worker_joined / on_worker_left: an elastic group's membership changed (see the methods).
// on_graceful_shutdown: a graceful shutdown has begun and the agent still serves and
//   sends; the listener may finish its module's work (send its last messages, wait for
//   their replies) until `deadline`. Runs on the thread calling shutdown(); a throw fails
//   the shutdown with that error.
// on_closed: the agent has closed (every call failed, no handler runs any more); drop
//   per-agent state. Must not throw.
class AgentListener {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~AgentListener() = default;
  virtual void on_worker_lost(const WorkerInfo& worker, const std::string& why);
  // A worker lost earlier has been replaced by a new process under the same name and rank
  // (AgentOptions::rejoin), of incarnation `incarnation`. Runs on an I/O thread before
  // any message of the new process is served; must not block.
  virtual void on_worker_rejoined(const WorkerInfo& worker, int incarnation);
  // Elastic groups (AgentOptions::elastic): a worker that was not in the group when it
  // formed has joined it, and this agent has met it (it announced itself, connected, or was
  // looked up by name). Told once per worker, on whichever agent thread met it; must not
  // block.
  virtual void on_worker_joined(const WorkerInfo& worker);
  // Elastic groups: `worker` has left the group gracefully (RpcAgent::leave): it settled its
  // references and contexts first, and it will not come back (its name and rank stay
  // taken). Nothing waits for it from now on: calls to it fail at once. The default treats
  // it as lost (on_worker_lost with the reason "it left the group"), which releases what
  // the modules above held for it. Runs on the agent's pool; must not block for long.
  virtual void on_worker_left(const WorkerInfo& worker);
  virtual void on_graceful_shutdown(Clock::time_point deadline);
  virtual void on_closed();
};

// A snapshot of what an agent holds and has done, for monitoring and tests.
struct AgentMetrics {
  int64_t pending_calls{0};      // sent and not yet answered
  int64_t running_handlers{0};   // requests being served
  int64_t loans_outstanding{0};  // tensors lent to peers that have not released them yet
  uint64_t tensors_lent{0};      // tensors sent as loans (direct copies), ever
  uint64_t bytes_lent{0};
  uint64_t tensors_copied_in{0};  // lent tensors received by copying them from a peer, ever
  uint64_t bytes_copied_in{0};
  // Tensors sent through the "ring" channel (the local transport's shared-memory rings), ever.
  uint64_t tensors_through_rings{0};
  uint64_t bytes_through_rings{0};
  uint64_t connections_accepted{0};  // incoming connections that passed the handshake, ever
  // Of those, the ones over a transport that exists per host and network namespace
  // ("local", "unix"): peers that share this worker's host and namespace.
  uint64_t local_connections_accepted{0};
  uint64_t connections_refused{0};  // incoming connections refused before reaching the RPC
                                    // layer (bad handshake, wrong secret, garbage), ever
  uint64_t frames_refused{0};       // connections closed for a frame over the limits, ever
  // Pipes whose xth or cma channel was refused, ever: the peer's process was not verified
  // to be the one those channels would read (this one for xth), or a descriptor named
  // another process.
  uint64_t channels_refused{0};
  // Times a transport thread stopped polling early because a yield kept it off its core
  // (AgentOptions::transport_spin_backoff), ever: a sign of more runnable threads than cores.
  uint64_t transport_polls_backed_off{0};
  // The in-flight budget now (AgentOptions::max_inflight_bytes, max_queued_requests): bytes
  // of received messages not yet done with, and requests received and not yet answered.
  uint64_t inflight_bytes{0};
  uint64_t queued_requests{0};
  uint64_t requests_refused_busy{0};  // requests answered with BusyError, ever
  bool shutting_down{false};  // a shutdown has begun (a graceful one may be waiting) and the
                              // agent has not closed yet
};

class RpcAgent {
 public:
  // Called exactly once per request, with the reply's value or the call's error, on an
  // agent thread; it must not block.
  using ReplyCallback = std::function<void(Value value, std::exception_ptr error)>;

  virtual ~RpcAgent() = default;
  RpcAgent(const RpcAgent&) = delete;
  RpcAgent& operator=(const RpcAgent&) = delete;

  // Joins the group and begins serving (see the file comment). Throws what
  // make_tensorpipe_agent throws; the agent is then closed. Once only.
  virtual void start() = 0;

  virtual const WorkerInfo& worker_info() const = 0;
  // InvalidArgument naming the known workers when there is no such worker.
  virtual WorkerInfo get_worker_info(const Destination& worker) const = 0;
  // The transport that messages between this worker and `worker` travel over ("local",
  // "unix", "shm", "tcp" or "uv"): the most preferred one both registered that can reach
  // across the pair. Transports that exist per network namespace (local, unix, shm) are
  // used only when both workers published the same host id and network namespace in the
  // store (net::host_id, net::network_namespace_id); every other pair uses tcp, whatever
  // AgentOptions::transports prefers. After start(); InvalidArgument for an unknown worker
  // (as get_worker_info). An agent that does not choose per pair returns "".
  virtual std::string transport_to(const Destination& worker) const {
    get_worker_info(worker);
    return "";
  }
  virtual std::vector<WorkerInfo> get_worker_infos() const = 0;
  virtual const AgentOptions& options() const = 0;
  // The pool that runs handlers and the continuations of calls.
  virtual std::shared_ptr<Executor> executor() const = 0;
  Registry& registry() const;

  // Sends `request` (its id and timeout are set here) and calls `done` with the reply.
  // Throws at once for the errors listed in the file comment.
  virtual void send_request(const Destination& to, Request request, CallOptions options,
                            ReplyCallback done) = 0;
  Future<Value> send(const Destination& to, Request request, CallOptions options = {});
  // Tells every interceptor that `request`, whose arguments were made, will never be sent
  // (Interceptor::on_request_not_sent). send_request does this itself when it throws
  // before the interceptors saw the request; callers that give up a request before sending
  // it (an argument failed to convert) call it. Never throws.
  virtual void release_unsent(const Request& request) const;

  // Calls the registered function `function` on `to` with Values.
  Future<Value> call(const Destination& to, std::string function, std::vector<Value> args,
                     CallOptions options = {});

  template <typename R, typename... Args>
  Future<R> rpc_async(const Destination& to, std::string function, CallOptions options,
                      Args&&... args);
  template <typename R, typename... Args>
  Future<R> rpc_async(const Destination& to, std::string function, Args&&... args) {
    return rpc_async<R>(to, std::move(function), CallOptions{}, std::forward<Args>(args)...);
  }
  template <typename R, typename... Args>
  R rpc_sync(const Destination& to, std::string function, CallOptions options, Args&&... args);
  template <typename R, typename... Args>
  R rpc_sync(const Destination& to, std::string function, Args&&... args) {
    return rpc_sync<R>(to, std::move(function), CallOptions{}, std::forward<Args>(args)...);
  }

  // Throws InvalidArgument if `id` is taken (kCallHandler always is). `execution` as for
  // registered functions (registry.h): kInline runs the handler on the I/O thread that
  // received the request (on the agent's inline thread when a sending thread took it), for
  // handlers that never block.
  virtual void register_handler(uint32_t id, std::string name, MessageHandler handler,
                                Execution execution = Execution::kPool) = 0;
  // The same, with the place chosen per request: `choose` says kInline for the requests
  // that are cheap and never block (dist_autograd: a Wait), kPool for the rest.
  // A request served inline may still hand work to the pool; rpc::run_after_reply refuses
  // there (returns false), so that nothing heavy follows its reply on the I/O thread.
  virtual void register_handler(uint32_t id, std::string name, MessageHandler handler,
                                ExecutionChooser choose) = 0;
  virtual void add_interceptor(std::shared_ptr<Interceptor> interceptor) = 0;
  // The interceptors' thread state on the calling thread (see CapturedState).
  virtual CapturedState capture_thread_state() const = 0;

  // Typed per-agent state of the modules above rpc/ (one object per type). set_attachment
  // replaces any earlier one; attachment<T>() is null when none is set. Thread-safe.
  template <typename T>
  void set_attachment(std::shared_ptr<T> value) {
    MutexLock lock(attachments_mutex_);
    attachments_[std::type_index(typeid(T))] = std::move(value);
  }
  template <typename T>
  std::shared_ptr<T> attachment() const {
    MutexLock lock(attachments_mutex_);
    auto it = attachments_.find(std::type_index(typeid(T)));
    return it == attachments_.end() ? nullptr : std::static_pointer_cast<T>(it->second);
  }

  // Listeners are told in the order they were added; add them before start(). Throws
  // InvalidArgument for null. Thread-safe.
  void add_listener(std::shared_ptr<AgentListener> listener);

  // graceful: every worker agrees through the store (each waits for its own pending calls
  // and running handlers first), then the agent closes; TimeoutError naming the workers
  // that did not arrive within join_timeout (the agent is then closed anyway, and later
  // calls fail with that error).
  // forced (graceful = false): pending calls fail at once, queued requests are dropped, and
  // the agent closes, waiting at most close_timeout for handlers still running.
  // Idempotent. From a handler or function this agent is running, InvalidArgument: a
  // graceful shutdown would wait for the caller itself.
  virtual void shutdown(bool graceful = true) = 0;
  virtual bool is_shut_down() const = 0;
  // Elastic groups (AgentOptions::elastic): this worker leaves the group while the others
  // go on. Its listeners settle what it holds first (rref/ gives up its references and
  // waits for its forks to be accepted, dist_autograd/ releases the contexts it created),
  // its own calls and handlers finish, the store marks it gone (the others' shutdown
  // barriers stop counting it), every member is told (AgentListener::on_worker_left), and
  // the agent closes. Everything within join_timeout: TimeoutError otherwise (the agent is
  // then closed anyway). InvalidArgument when the group is not elastic, when called from a
  // handler of this agent, or when this process hosts the group's store (the others would
  // lose it). Returns at once when the agent is already shut down or shutting down.
  virtual void leave();

  virtual AgentMetrics metrics() const = 0;
  // Per-function statistics: calls made and served, per registered function and peer, with
  // errors, bytes and p50/p99 latency (stats.h, docs/observability.md). An agent that keeps
  // none returns empty tables.
  virtual RpcStats stats() const { return {}; }

  // How many workers had this one's name and rank before it in the running group: 0 for a
  // worker that started with the group, k for the k-th that took over a lost one
  // (AgentOptions::rejoin); at most kMaxIncarnation. Modules that mint ids (rref/,
  // dist_autograd/) keep the ids of successive incarnations apart with it. Valid after start().
  virtual int incarnation() const { return 0; }
  // Every worker id of the group is below this: the world size, or for an elastic group
  // AgentOptions::max_workers. Modules that check ids read from the wire bound them by it.
  virtual int id_limit() const { return static_cast<int>(get_worker_infos().size()); }

  // The deadline a call with these options gets.
  std::chrono::milliseconds effective_timeout(const CallOptions& options) const;
  // How long a caller waits on the future of a call with this deadline: the deadline fails
  // the call itself, and the margin only guards against a lost completion.
  static std::chrono::milliseconds wait_bound(std::chrono::milliseconds call_timeout) {
    constexpr std::chrono::milliseconds kMargin{30'000};
    return call_timeout >= kNoTimeout - kMargin ? kNoTimeout : call_timeout + kMargin;
  }

 protected:
  RpcAgent() = default;

  // For implementations: tell every listener (see AgentListener). notify_worker_lost and
  // notify_closed log what a listener throws; notify_graceful_shutdown lets it through.
  void notify_worker_lost(const WorkerInfo& worker, const std::string& why) const;
  void notify_worker_rejoined(const WorkerInfo& worker, int incarnation) const;
  void notify_worker_joined(const WorkerInfo& worker) const;
  void notify_worker_left(const WorkerInfo& worker) const;
  void notify_graceful_shutdown(AgentListener::Clock::time_point deadline) const;
  void notify_closed() const;

 private:
  std::vector<std::shared_ptr<AgentListener>> listeners() const;

  mutable Mutex listeners_mutex_;
  std::vector<std::shared_ptr<AgentListener>> listeners_ GRADWIRE_GUARDED_BY(listeners_mutex_);
  mutable Mutex attachments_mutex_;
  std::map<std::type_index, std::shared_ptr<void>> attachments_
      GRADWIRE_GUARDED_BY(attachments_mutex_);
};

// Modules above rpc/ that must be present on every agent (rref/ registers its handler,
// interceptor and listener this way) register an installer once per process, by name (a
// second registration under the same name is ignored). Agent factories
// (create_tensorpipe_agent) call install_agent_extensions on each agent they build, before
// start(), in the order the extensions were registered. An installer's throw fails the
// factory. Thread-safe.
using AgentExtension = std::function<void(const std::shared_ptr<RpcAgent>& agent)>;
void register_agent_extension(std::string name, AgentExtension install);
void install_agent_extensions(const std::shared_ptr<RpcAgent>& agent);

// ---- templates

namespace detail {
// What a call's result is named in a conversion error.
struct CallResult {
  const std::string& function;
  const WorkerInfo& target;
};
void render_call_result(std::string& out, const void* call_result, size_t);
}  // namespace detail

template <typename R, typename... Args>
Future<R> RpcAgent::rpc_async(const Destination& to, std::string function, CallOptions options,
                              Args&&... args) {
  WorkerInfo target = get_worker_info(to);
  // Arguments convert in the context of this agent (an RRef argument mints its fork here);
  // results in the context of this agent receiving from `target`.
  const CallContext context(this, worker_info(), 0, CallContext::Clock::time_point::max());
  std::vector<Value> values;
  values.reserve(sizeof...(Args));
  try {
    (values.push_back(to_value(std::forward<Args>(args), context)), ...);
  } catch (...) {
    // What the arguments converted so far recorded (an RRef's fork) is given back.
    Request unsent;
    unsent.handler = kCallHandler;
    unsent.function = function;
    unsent.args = std::move(values);
    release_unsent(unsent);
    throw;
  }
  Future<R> result;
  // get() without an argument waits as long as the call itself may take.
  result.set_default_timeout(wait_bound(effective_timeout(options)));
  Request request;
  request.handler = kCallHandler;
  request.function = function;
  request.args = std::move(values);
  send_request(target, std::move(request), options,
               [this, result, function = std::move(function), target](
                   Value value, std::exception_ptr error) mutable {
                 if (error) {
                   result.try_set_error(std::move(error));
                   return;
                 }
                 try {
                   if constexpr (std::is_void_v<R>) {
                     result.try_set_value();
                   } else {
                     // "result of 'f' on worker 'w1' (rank 1)", rendered only on a mismatch.
                     const detail::CallResult subject{function, target};
                     const CallContext received(this, target, 0,
                                                CallContext::Clock::time_point::max());
                     result.try_set_value(from_value<R>(
                         value, Where::custom(&detail::render_call_result, &subject, 0), received));
                   }
                 } catch (...) {
                   result.try_set_error(std::current_exception());
                 }
               });
  return result;
}

template <typename R, typename... Args>
R RpcAgent::rpc_sync(const Destination& to, std::string function, CallOptions options,
                     Args&&... args) {
  Future<R> pending = rpc_async<R>(to, std::move(function), options, std::forward<Args>(args)...);
  // The call's own deadline completes the future; the future's default wait (rpc_async)
  // adds a margin that only guards against a lost completion.
  if constexpr (std::is_void_v<R>) {
    pending.get();
  } else {
    return pending.get();
  }
}

}  // namespace gradwire::rpc
