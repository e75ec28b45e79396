// The dist-autograd container of one agent: its contexts, the send and recv functions
// recorded in them, and the passes that run backward through them. It is the agent's
// attachment, its handler (id 3), an interceptor (recording) and a listener (clean-up).
//
// Its methods live where docs/dist_autograd.md explains them, one file per part of a pass:
//   contexts.cc    the table of contexts, the handler's dispatch and who may send what;
//   recording.cc   the interceptor: send and recv functions made as messages go and come;
//   discovery.cc   which sends will get gradients, counted before any flows (Discover);
//   execution.cc   backward() at the initiator, gradients sent on and taken (Propagate);
//   completion.cc  each worker's part ending, reported (Wait) or aborted (Abort);
//   release.cc     a context's end here and wherever it went (Release), lost workers.
// A context's and a pass's states are lifecycle.h's; ContextState::apply (context_state.cc)
// moves them, and the files above turn what happens into its events.
//
// Locking: mutex_ guards the table of contexts; each context has its own mutex for its
// functions, gradients and passes (context_state.h). No message is sent and no node runs
// under either.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "context_state.h"
#include "functions.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/recent.h"
#include "gradwire/core/trace.h"
#include "gradwire/dist_autograd/dist_autograd.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/ids.h"
#include "proto/dist_autograd.pb.h"

namespace gradwire::dist_autograd::internal {

using rpc::CallContext;
using rpc::CallRejected;
using rpc::Value;
using rpc::WorkerInfo;

// The context current on this thread (what current_context_id() reads).
extern thread_local uint64_t t_context;

// How much of a peer's reason for aborting a pass is kept (it is a chain of errors, each
// naming its worker).
inline constexpr size_t kMaxReasonBytes = 4096;

// How long past its deadline a failed pass waits for its aborts to be answered.
inline constexpr std::chrono::milliseconds kAbortMargin{50};

inline int worker_of(uint64_t id) {
  return rpc::minter_of(id);
}

inline std::string ctx_text(uint64_t id) {
  return rpc::id_text(id);
}

using Clock = std::chrono::steady_clock;

// How long to wait for something due by `deadline` (kNoTimeout: no deadline).
inline std::chrono::milliseconds time_left(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return kNoTimeout;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

inline Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  if (timeout >=
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + timeout;
}

inline std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Sets the current context for the work of one request.
class ContextScope : public rpc::ServeScope {
 public:
  explicit ContextScope(uint64_t id) : id_(id) {}
  void enter() override {
    saved_ = t_context;
    t_context = id_;
  }
  void exit() override { t_context = saved_; }

 private:
  uint64_t id_;
  uint64_t saved_ = 0;
};

class Container : public rpc::Interceptor,
                  public rpc::AgentListener,
                  public std::enable_shared_from_this<Container> {
 public:
  explicit Container(const std::shared_ptr<rpc::RpcAgent>& agent)
      : agent_(agent), self_(agent->worker_info()), ids_(agent) {}

  // ---- contexts (contexts.cc)
  static void install(const std::shared_ptr<rpc::RpcAgent>& agent);
  static std::shared_ptr<Container> of(const rpc::RpcAgent& agent);
  std::shared_ptr<rpc::RpcAgent> agent() const;
  std::shared_ptr<ContextState> create_context();
  std::shared_ptr<ContextState> find(uint64_t id) const;
  std::shared_ptr<ContextState> get(uint64_t id) const;
  // The context a request from a participant names, made on its first request here; a
  // context released here is never made again (a late request in it is refused).
  std::shared_ptr<ContextState> get_or_make(uint64_t id, int from);
  // Remembers that `id` was released, for a context that never reached this worker.
  void remember_released_unseen(uint64_t id);
  // Remembers that worker `by` (not its creator) released `id` before it reached this
  // worker: a request in it from `by` still on its way (it timed out there) is refused.
  // Only `by`'s own requests: a worker speaks for itself alone.
  void remember_released_by(uint64_t id, int by);
  // Remembers why context `ctx` was released here when a worker was lost, for its members
  // (`touched` and its creator); called again for the same context, it adds members.
  void remember_lost(uint64_t ctx, const std::set<int>& touched, const std::string& lost)
      GRADWIRE_REQUIRES(mutex_);
  // Remembers that `id` was released here (the newest kReleasedMemory ids).
  void remember_released(uint64_t id) GRADWIRE_REQUIRES(mutex_);
  size_t size() const;
  std::chrono::milliseconds agent_wait() const;
  // Sends one of the module's messages; `what` names it for rpc's errors and for fault
  // rules ("discover", "propagate", "wait", "abort", "release").
  Future<Value> send(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                     std::string what, std::vector<Value> args = {}, rpc::CallOptions options = {});
  // As send, but a message that cannot even be sent gives a failed future.
  Future<Value> try_send(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                         std::string what, std::vector<Value> args = {},
                         rpc::CallOptions options = {});
  // Whether worker `w` takes part in the context: its creator, or a worker it exchanged a
  // message with from here (both ends record each other, so the set is symmetric).
  static bool participant(const std::shared_ptr<ContextState>& state, int w);
  // The context a message from `caller` is about, refused unless the caller takes part.
  std::shared_ptr<ContextState> get_for(uint64_t id, const WorkerInfo& caller,
                                        const char* what) const;
  // The send `m` recorded here, refused unless `caller` is the worker it went to (the only
  // one holding its recv function).
  std::shared_ptr<SendBackward> send_from(ContextState& state, uint64_t m, const WorkerInfo& caller,
                                          const char* what) const;
  // Where a request runs: a Wait on the I/O thread that received it, the rest on the pool.
  static rpc::Execution execution_of(const rpc::Request& request);
  Future<Value> handle(const CallContext& ctx, const rpc::Request& request);
  // Contexts, messages and passes are named by group-unique ids (rpc/ids.h).
  uint64_t mint() { return ids_.mint(); }

  // ---- recording (recording.cc)
  std::shared_ptr<void> on_outgoing_request(const WorkerInfo& to, rpc::Request& request) override;
  std::shared_ptr<rpc::ServeScope> on_incoming_request(const WorkerInfo& from,
                                                       rpc::Request& request) override;
  void on_outgoing_response(const WorkerInfo& to, const rpc::Request& request,
                            rpc::Response& response) override;
  void on_incoming_response(const WorkerInfo& from, rpc::Response& response,
                            const std::shared_ptr<void>&) override;
  std::shared_ptr<rpc::ServeScope> capture_thread_state() override;
  void attach_recv(uint64_t ctx, const WorkerInfo& from, uint64_t message_id,
                   const std::vector<Tensor>& received);

  // ---- discovery (discovery.cc)
  // This worker's part in pass `pass_id`, made on first sight (the initiator's backward, or
  // the first Discover here). Its sink takes back what the pass gave if the pass fails.
  std::shared_ptr<autograd::GraphTask> start_part(const std::shared_ptr<ContextState>& state,
                                                  uint64_t pass_id, bool retain_graph);
  // What a worker's discovery found: the workers taking part (itself included), and the
  // sends of `back_to` (the worker whose Discover it answers) that it reached, which go back
  // in that answer instead of in a Discover of their own.
  struct Found {
    std::set<int> workers;
    std::vector<uint64_t> back;
  };
  // Walks the graph below `edges`, telling each recv function's sender (once per pass) that
  // its send will get a gradient: worker `back_to` (-1: none) through the result's `back`,
  // every other one with a Discover. Sends that a Discover's answer names back here are
  // taken (take_named) before the result completes.
  Future<Found> discover(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                         const std::vector<autograd::Edge>& edges, bool retain_graph, int back_to);
  // Sends of this worker that worker `from` named for pass `pass_id` (in a Discover, or
  // back in the answer to one): counts the gradients they will get, stops holding what lies
  // below only them, walks on from them (discover, with `back_to`) and takes the gradients
  // that came for them early. Throws CallRejected for a send that did not go to `from`.
  Future<Found> take_named(const std::shared_ptr<ContextState>& state, const WorkerInfo& from,
                           uint64_t pass_id, const std::vector<uint64_t>& sends, bool retain_graph,
                           int back_to);
  // A Discover: take the sends it names, and answer with the workers reached and the
  // caller's sends reached from them (docs/dist_autograd.md, Messages).
  Future<Value> on_discover(const WorkerInfo& caller, const wire::Discover& d);
  // discover()'s steps. walk_to_recvs: the recv functions below `edges` whose sender this
  // part has not told yet (now recorded as told), per sender, those of `back_to` into
  // `back` instead. take_named_back: on the pool, take_named for the sends the answers
  // `named` back, then completes `result` with `here` and what they found.
  using ToTell = std::map<int, std::pair<WorkerInfo, std::vector<uint64_t>>>;
  static ToTell walk_to_recvs(ContextState& state, uint64_t pass_id,
                              const std::vector<autograd::Edge>& edges, int back_to,
                              std::vector<uint64_t>& back);
  void take_named_back(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                       bool retain_graph, int back_to,
                       std::vector<std::pair<WorkerInfo, std::vector<uint64_t>>> named, Found here,
                       Future<Found> result);
  // Reads a Discover's answer from `from` into `found`'s workers; returns the sends of this
  // worker it names back. Throws Error, naming `from` and what was wrong, when the answer is
  // not two lists of ints.
  std::vector<uint64_t> read_answer(const WorkerInfo& from, const Value& answer,
                                    Found& found) const;
  // The nodes below the sends recorded here that pass `pass` has not named: what a Discover
  // still to come could add gradients to.
  static std::unordered_set<const autograd::Node*> unnamed_reach(const ContextState& state,
                                                                 const Pass& pass)
      GRADWIRE_REQUIRES(state.mutex);
  // Holds back, in the pass's task, what unnamed_reach gives (nothing once discovery is over).
  static void update_hold(ContextState& state, uint64_t pass_id) GRADWIRE_REQUIRES(state.mutex);
  // Takes the early gradients of pass `pass_id` whose send has been named: each is added to
  // the task and its Propagate answered; what they made ready runs on the pool.
  void take_early(const std::shared_ptr<ContextState>& state, uint64_t pass_id);
  // Discovery of pass `pass_id` is over (everywhere): nothing more is held, and early
  // gradients whose send was never named are refused. Returns the task (null when this
  // worker's part is already over); the caller runs what became ready.
  std::shared_ptr<autograd::GraphTask> end_discovery(const std::shared_ptr<ContextState>& state,
                                                     uint64_t pass_id);
  // Runs what is ready in `task`: on this thread once the request served here has been
  // answered (rpc::run_after_reply: no hand-off, and the sender is not kept waiting), else
  // (outside a request, or on the I/O thread serving a Wait) on the pool. A
  // node's error is the task's (this worker's part fails with it).
  void run_soon(const std::shared_ptr<autograd::GraphTask>& task);
  // Answers early gradients that will never be taken with `error`.
  static void refuse_early(std::vector<EarlyGradients> early, const std::exception_ptr& error);
  // Removes the early gradients of pass `pass_id` (every pass: 0) from `state`.
  static std::vector<EarlyGradients> drop_early(ContextState& state, uint64_t pass_id)
      GRADWIRE_REQUIRES(state.mutex);

  // ---- execution (execution.cc)
  void backward(uint64_t ctx, const std::vector<Tensor>& roots, const BackwardOptions& options);
  void propagate(const RecvBackward& recv, std::vector<Tensor>&& grads);
  // The error of gradients that did not reach `to`, naming it: its own error (RemoteError),
  // a refusal as a RemoteError of `to`, or the NetworkError / TimeoutError of the send.
  static std::exception_ptr undelivered(const std::exception_ptr& error, const WorkerInfo& to,
                                        uint64_t ctx, uint64_t message_id);
  // A Propagate: take the gradients of one send (refused unless discovered in a pass that
  // goes on here), answer, then run what they made ready.
  Future<Value> on_propagate(const WorkerInfo& caller, const wire::Propagate& p,
                             const std::vector<Value>& args);

  // Keeps gradients of a Propagate that came ahead of the Discover naming their send
  // (`runs_here`: the pass holds a part here), until that Discover takes them or they are
  // refused; returns the Propagate's answer. Throws CallRejected past kMaxEarly, or for a
  // gradient the send cannot take.
  Future<Value> keep_early(ContextState& state, bool runs_here, const wire::Propagate& p,
                           const std::shared_ptr<SendBackward>& send,
                           const std::vector<Value>& args) const GRADWIRE_REQUIRES(state.mutex);

  // ---- completion (completion.cc)
  // Completes when worker `to`'s part of the pass is over (failing with its error). A Wait is
  // a call like any other, bounded by rpc_timeout; while the pass goes on, one that times
  // out is asked again, so a pass may last longer than rpc_timeout (its own deadline bounds
  // it) and no call outlives the pass by more than rpc_timeout.
  Future<void> watch_part(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                          const WorkerInfo& to, Future<void> result = {});
  // A Wait whose call failed (on the pool): asked again after a timeout while the pass goes
  // on, else `result` fails with the call's error.
  static void retry_wait(const std::weak_ptr<Container>& weak_self,
                         const std::weak_ptr<ContextState>& weak_state, uint64_t pass_id,
                         const WorkerInfo& to, Future<void> result, const Future<Value>& done);
  // Discovery's end at the initiator: sends a Wait to every other worker in `workers`, and
  // watches for the last part when `on_last_part` is set. Returns every part's future (the
  // other workers' in order, then this one's). Runs where discovery ends (the thread that
  // takes its last answer), so the Waits do not wait for the initiator's thread to wake.
  // Throws Error when the pass has already ended here (failed, timed out): nothing is sent.
  struct Watched {
    std::set<int> workers;
    std::vector<Future<void>> parts;
  };
  Watched watch_parts(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                      const std::set<int>& workers,
                      const std::function<void(uint64_t, const rpc::WorkerInfo&)>& on_last_part,
                      bool hook_inline);
  // backward()'s steps. check_backward: its arguments, or InvalidArgument. run_pass: the
  // pass from its start here to the end of every part, throwing its error (a TimeoutError
  // at `deadline`). watch_when_discovered: once `found` completes, watch_parts and
  // end_discovery on the thread that completes it; the result fails with discovery.
  // abort_failed_pass: aborts the failed pass and waits for the aborts within its deadline.
  static void check_backward(const std::vector<Tensor>& roots, const BackwardOptions& options);
  void run_pass(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                const std::vector<autograd::GraphRoot>& graph_roots, const BackwardOptions& options,
                Clock::time_point deadline);
  Future<Watched> watch_when_discovered(const std::shared_ptr<ContextState>& state,
                                        uint64_t pass_id, const Future<Found>& found,
                                        const BackwardOptions& options, int64_t discovery_ns);
  void abort_failed_pass(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                         const std::exception_ptr& error, Clock::time_point deadline);
  // BackwardOptions::on_last_part: called once every part in `parts` (the other workers' of
  // `workers`, in order, then this one's) but one has ended well, when that one is another
  // worker's.
  void watch_for_last_part(
      uint64_t pass_id, const std::set<int>& workers, const std::vector<Future<void>>& parts,
      const std::function<void(uint64_t, const rpc::WorkerInfo&)>& on_last_part, bool hook_inline);
  // A Wait: answer once this worker's part of the pass is over.
  Future<Value> on_wait(const WorkerInfo& caller, const wire::Wait& w);
  // This worker's part of a pass, for its initiator `caller` (a Wait, or part_done()): the
  // future that completes when it is over. `what` names the request in errors.
  std::pair<std::shared_ptr<ContextState>, Future<void>> part_for(const WorkerInfo& caller,
                                                                  uint64_t ctx, uint64_t pass_id,
                                                                  const char* what);
  // Records how this worker's part of a pass ended: success clears an earlier failure; a
  // failure (or an abort, even after success) is remembered and takes back the pass's
  // gradients. The task, and with it the graph unless retained, is let go.
  static void part_over(ContextState& state, uint64_t pass_id, const Future<void>& part);
  // Fails this worker's part of a pass with `error`, unless it is over already.
  static void fail_part(ContextState& state, uint64_t pass_id, std::exception_ptr error);
  // Forgets the pass here once its part is over and reported; its sink stays as the
  // context's last, for an abort that may still come.
  static void forget_pass(ContextState& state, uint64_t pass_id);
  // The initiator's pass is over: the context may run another.
  static void end_pass(ContextState& state, uint64_t pass_id);
  // Aborts pass `pass_id` here (its part fails with `reason`, or, if it already succeeded,
  // what it gave is taken back) and tells the workers the context touched from here but
  // `from`, once: only a worker that took part forwards it. Completes when they have
  // answered.
  Future<void> abort(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                     const std::string& reason, int from);
  // An Abort: the pass failed elsewhere.
  Future<Value> on_abort(const WorkerInfo& caller, const wire::Abort& a);
  // The answer to a Release or an Abort, whose work ends with `done`: an empty Value once
  // `done` completes, however it ends (what was passed on is the senders' concern). Set on
  // the thread that completes `done` (at once when it already has), not through the pool:
  // a posted continuation would wake a pool worker only to move a result.
  static Future<Value> answer_when(const Future<void>& done);
  Gradients gradients(uint64_t ctx) const;

  // ---- release (release.cc)
  // Forgets the context here and tells the workers it touched from here (but `from`);
  // completes once they (and the workers they told) have forgotten it too. `lost`, when not
  // empty, says which worker was lost that the context ends for (its parts still running
  // here then fail with a NetworkError that names it).
  Future<void> release(uint64_t ctx, int from, const std::string& lost = {});
  // release()'s last step: sends the Release (naming `lost`) to the workers in `touched`
  // but `from` and this one; once they have answered (or failed), the context is released
  // everywhere from here: out of releasing_, told (lifecycle.h), and `released` completes.
  void tell_released(uint64_t ctx, int from, const std::string& lost, const std::set<int>& touched,
                     const std::weak_ptr<ContextState>& weak_state, Future<void> released);
  // Sends a Release to `to`, and again when an attempt is not answered (dropped, timed out,
  // its connection lost): at most kReleaseAttempts, each bounded by a share of rpc_timeout,
  // so a worker hears of the end unless the faults outlast all of them. `result` completes
  // with the last attempt's outcome.
  void send_release(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                    int attempts_left, Future<Value> result);
  static constexpr int kReleaseAttempts = 4;
  // A Release: forget the context here and wherever it went from here.
  Future<Value> on_release(const WorkerInfo& caller, const wire::Release& r);
  // The contexts a lost worker started are released here and on the workers they reached
  // from here: nobody is left to release them (its replacement, if one comes, starts its
  // own). Not waited for: this runs on an I/O thread.
  void on_worker_lost(const WorkerInfo& worker, const std::string& reason) override;
  void on_graceful_shutdown(Clock::time_point) override;
  void on_closed() override;

 private:
  const std::weak_ptr<rpc::RpcAgent> agent_;
  const WorkerInfo self_;
  rpc::IdMinter ids_;
  mutable Mutex mutex_;
  std::map<uint64_t, std::shared_ptr<ContextState>> contexts_ GRADWIRE_GUARDED_BY(mutex_);
  // Contexts released here, newest last: a late request must not make one again. Bounded:
  // a worker remembers the last kReleasedMemory (ids are never reused, so an older one
  // could only come from a message delayed past 65,536 later releases).
  static constexpr size_t kReleasedMemory = 1u << 16;
  RecentSet<uint64_t> released_ GRADWIRE_GUARDED_BY(mutex_){kReleasedMemory};
  // (context, worker): released by that worker before reaching here (the newest
  // kReleasedMemory).
  RecentSet<std::pair<uint64_t, int>, PairHash> released_by_ GRADWIRE_GUARDED_BY(mutex_){
      kReleasedMemory};
  // Why a context was released here when a worker was lost (the newest kLostMemory): a
  // later request in it (the initiator's Wait, say) gets that cause, as a NetworkError,
  // instead of "unknown, or already released".
  static constexpr size_t kLostMemory = 1024;
  // Only the context's members hear it (its creator and the workers it reached from here).
  struct LostWhy {
    std::string why;
    std::set<int> members;
  };
  RecentMap<uint64_t, LostWhy> lost_why_ GRADWIRE_GUARDED_BY(mutex_){kLostMemory};
  // Contexts whose release here still waits for the workers it told: completes with it.
  std::map<uint64_t, Future<void>> releasing_ GRADWIRE_GUARDED_BY(mutex_);

  friend class RecvBackward;
};

}  // namespace gradwire::dist_autograd::internal
