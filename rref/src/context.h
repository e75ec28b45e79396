// RRefContext: one agent's reference bookkeeping. The fork protocol's state is one table,
// forks_ (forks.h: every fork of a value owned here, and every fork this worker sent of a
// reference it holds, each with its state); beside it, registries of the references alive
// here (owners_, users_), the placeholders awaiting a creation, the values freed, and the
// incarnations of other workers that were lost. It is the agent's attachment, its rref
// handler, an interceptor (it turns what happens to each message that carries references —
// sent, delivered, not delivered, late — into fork events) and an agent listener (a lost
// worker's forks are released; a graceful shutdown sends this worker's last deletes).
// docs/rref.md describes the protocol and has its state tables. The members are defined in
// files by concept (context.cc names them); messages.h holds what they share of a message.
//
// Locking: mutex_ guards the table and the maps. No reference core is ever destroyed while
// it is held (a core's destructor calls back into the context): whatever a change drops is
// moved out and let go after the lock. No message is sent under it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <vector>

#include "forks.h"
#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/recent.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rpc/ids.h"
#include "gradwire/rref/rref.h"

namespace gradwire::rref {

namespace wire {
class RRefMessage;
class Create;
class Fetch;
class CallMethod;
class AddFork;
class Lost;
class ChildAccepted;
class Delete;
}  // namespace wire

class OwnerRRef;
class UserRRef;
class RRefMessageBuilder;

// Ids of references and forks are rpc/'s group-unique ids (ids.h): minter_of names the
// worker that minted one, id_text prints it as messages name it ("0:7").
using rpc::id_text;
using rpc::minter_of;
// The rpc/ names every file of the context uses.
using rpc::CallContext;
using rpc::CallRejected;
using rpc::RRefDescriptor;
using rpc::Value;
using rpc::WorkerInfo;
// Whether `value` holds a reference anywhere inside it.
bool contains_references(const rpc::Value& value);

class RRefContext : public rpc::Interceptor,
                    public rpc::AgentListener,
                    public std::enable_shared_from_this<RRefContext> {
 public:
  RRefContext(const std::shared_ptr<rpc::RpcAgent>& agent);
  ~RRefContext() override;

  // Installs a context on `agent` (its handler, interceptor, listener and attachment).
  static void install(const std::shared_ptr<rpc::RpcAgent>& agent);
  // The context of `agent`; Error when rref/ is not installed there.
  static std::shared_ptr<RRefContext> of(const rpc::RpcAgent& agent);

  const rpc::WorkerInfo& self() const { return self_; }
  // The agent, held for the caller's use; Error once it has shut down or is gone.
  std::shared_ptr<rpc::RpcAgent> agent() const;
  // The agent or null, for clean-up paths.
  std::shared_ptr<rpc::RpcAgent> agent_or_null() const;
  // A new reference or fork id (rpc::IdMinter: its minter and incarnation inside).
  uint64_t mint() { return ids_.mint(); }

  // ---- references made here
  std::shared_ptr<UserRRef> create_remote(const rpc::WorkerInfo& owner, std::string name,
                                          std::string type_name, std::vector<rpc::Value> args,
                                          rpc::CallOptions options);
  // An owner reference to what this worker holds already: `object` of registered class
  // `type_name`, or else `value`.
  std::shared_ptr<OwnerRRef> own(std::string type_name, rpc::Value value,
                                 std::shared_ptr<void> object);
  std::shared_ptr<OwnerRRef> create_local(std::string name, std::string type_name,
                                          std::vector<rpc::Value> args);
  // A new fork of an owned value, counted until it is bound to a destination. `ctx`: the
  // conversion's context (while serving a request, the fork is made for its reply).
  void add_owner_fork(const std::shared_ptr<OwnerRRef>& owner, uint64_t fork,
                      const rpc::CallContext& ctx);
  // A fork this user sends: `parent` stays alive until the owner accepts it.
  void add_child(const std::shared_ptr<UserRRef>& parent, uint64_t fork,
                 const rpc::CallContext& ctx);
  // A user reference let go (its core's destructor): the owner is told.
  void release_user(const rpc::WorkerInfo& owner, int incarnation, uint64_t rref_id, uint64_t fork,
                    bool counted);
  // `placeholder`: made by an early fork, never created.
  void owner_destroyed(uint64_t rref_id, bool placeholder);
  void register_owner(const std::shared_ptr<OwnerRRef>& owner);
  void adopt_user(const std::shared_ptr<UserRRef>& user);
  // Forks minted for `values` that will never be sent.
  void discard(const std::vector<rpc::Value>& values);
  // The error of references to incarnation `incarnation` of `worker` once it was lost (they
  // fail at once, also after a replacement rejoined); null while it lives.
  std::exception_ptr lost_error(int worker, int incarnation) const;
  // The incarnation of `worker` this worker knows now (0 until a replacement rejoins).
  int incarnation_of(int worker) const;
  // The references inside values made on this worker, received back by this worker (a call
  // an owner makes on its own object): as if sent to and received from itself.
  std::shared_ptr<void> loop_back(const std::vector<const rpc::Value*>& values);

  // Sends a protocol message to `to` (to the call handler when it runs user code: a
  // creation or a method; else to the control handler); counted in messages_in_flight until
  // its reply.
  // `keep`, when given, is filled with the references the reply carries, while the call is
  // still being finished: the caller holds it until it has converted the reply (the reply's
  // future may complete before the caller's continuation is attached, and the call's own
  // hold on them ends when it finishes).
  Future<rpc::Value> send(
      const rpc::WorkerInfo& to, const std::string& payload, std::string what,
      std::vector<rpc::Value> args = {}, rpc::CallOptions options = {},
      uint32_t handler = kRRefControlHandler,
      std::shared_ptr<std::vector<std::shared_ptr<detail::RRefCore>>> keep = nullptr);

  // Sends a fork-protocol message that settles a fork (a Delete, or a ChildAccepted) to
  // `to`, again if it times out (up to kSettleAttempts in all): a settlement lost on the way
  // would leave a value or a parent reference pinned for good. Receivers treat a second copy
  // as a no-op. Never throws: a send that fails for another reason (the peer lost, the
  // agent closing) is logged, since whatever it settled is released by that loss.
  // `through_losses`: also sent again after a lost connection (the loss notice itself).
  void send_settlement(const rpc::WorkerInfo& to, const std::string& payload, std::string what,
                       bool through_losses = false);
  // The settlement of `fork` of `rref_id`, which this worker received and will not hold:
  // a Delete to `owner` when the owner minted it (it counted the fork when it sent it), else
  // a ChildAccepted to the user that minted it (its pending child keeps the parent alive).
  void settle_refused(const rpc::RRefDescriptor& d);
  static constexpr int kSettleAttempts = 5;

  // ---- received references
  std::shared_ptr<detail::RRefCore> find_received(const rpc::RRefDescriptor& d) const;

  // ---- the handler
  Future<rpc::Value> handle(const rpc::CallContext& ctx, const rpc::Request& request);

  // ---- Interceptor
  std::shared_ptr<void> on_outgoing_request(const rpc::WorkerInfo& to,
                                            rpc::Request& request) override;
  void on_incoming_response(const rpc::WorkerInfo& from, rpc::Response& response,
                            const std::shared_ptr<void>& state) override;
  void on_call_finished(const rpc::FinishedCall& call, const std::shared_ptr<void>& state) override;
  std::shared_ptr<rpc::ServeScope> on_incoming_request(const rpc::WorkerInfo& from,
                                                       rpc::Request& request) override;
  void on_outgoing_response(const rpc::WorkerInfo& to, const rpc::Request& request,
                            rpc::Response& response) override;
  void on_request_not_sent(const rpc::Request& request) override;
  void on_late_response(const rpc::WorkerInfo& from, const rpc::Response& response,
                        const std::shared_ptr<void>& state) override;
  void on_response_not_sent(const rpc::WorkerInfo& to, const rpc::Request& request,
                            const rpc::Response& response) override;

  // ---- AgentListener
  void on_worker_lost(const rpc::WorkerInfo& worker, const std::string& why) override;
  // Its replacement is served like any worker: what was lost stays released.
  void on_worker_rejoined(const rpc::WorkerInfo& worker, int incarnation) override;
  // A worker that left gave up its references first: what it still held is released as a
  // lost worker's, without a loss notice to it (it has gone).
  void on_worker_left(const rpc::WorkerInfo& worker) override;
  void on_graceful_shutdown(Clock::time_point deadline) override;
  void on_closed() override;

  RRefMetrics metrics() const;
  RRefMetrics metrics_at_close() const;
  void wait_idle(Clock::time_point deadline, const char* what) const;
  bool wait_owned_values(int64_t count, Clock::time_point deadline) const;

 private:
  // Accepts the references inside `value`, received from `from`.
  void accept_all(const rpc::Value& value, const rpc::WorkerInfo& from,
                  std::vector<std::shared_ptr<detail::RRefCore>>& out);
  std::shared_ptr<detail::RRefCore> accept(const rpc::RRefDescriptor& d,
                                           const rpc::WorkerInfo& from);
  // A reference to a value owned here came back: the owned value (a placeholder when its
  // creation has not arrived yet); the fork is settled with whoever minted it.
  std::shared_ptr<OwnerRRef> accept_owned(const rpc::RRefDescriptor& d,
                                          const rpc::WorkerInfo& from);
  // A new user reference for a fork received here, confirmed at once when its owner made
  // it or was lost, else once the owner answers its AddFork.
  std::shared_ptr<UserRRef> accept_user(const rpc::RRefDescriptor& d);
  // Asks `owner` to count the fork of `user` (an AddFork); its answer confirms the user.
  void send_add_fork(const std::shared_ptr<UserRRef>& user, const rpc::RRefDescriptor& d,
                     const rpc::WorkerInfo& owner);
  // Binds the forks minted here inside `value` to destination `to`.
  void bind_all(const rpc::Value& value, int to, std::vector<uint64_t>& bound);
  // Forks bound to `to` by a message that was not delivered.
  void unbind(const std::vector<uint64_t>& forks, int to);
  // The one place forks change state (forks.h), under the lock; returns the verdict.
  ForkVerdict apply(uint64_t fork, const ForkEvent& event);
  void validate(const rpc::RRefDescriptor& d) const;

  std::shared_ptr<OwnerRRef> find_owner(uint64_t rref_id) const;
  // Whether value `rref_id` is held here now (a placeholder included).
  bool holds_locked(uint64_t rref_id) const GRADWIRE_REQUIRES(mutex_);
  // Whether value `rref_id`, not held now, was held here and freed (ids this worker minted
  // are never awaited).
  bool freed_locked(uint64_t rref_id) const GRADWIRE_REQUIRES(mutex_);
  // Remembers that value `rref_id` (minted by another worker) was freed here, or will never
  // be made: a later fork, creation or call naming it is refused (the last kRememberedFrees).
  void remember_freed_locked(uint64_t rref_id) GRADWIRE_REQUIRES(mutex_);
  // Whether `holder` gave up `fork` before the message counting it arrived (forgotten now).
  bool take_given_up(uint64_t fork, int holder);
  // The owned reference a Fetch or CallMethod names; one its caller created and whose
  // creation has not arrived yet is awaited (a bounded placeholder held until it does).
  std::shared_ptr<OwnerRRef> owned_or_awaited(uint64_t rref_id, const std::string& type_name,
                                              const rpc::WorkerInfo& caller);
  // An owned reference whose creation has not arrived yet (bounded in number).
  std::shared_ptr<OwnerRRef> placeholder(uint64_t rref_id, const std::string& type_name);
  // A new placeholder for value `rref_id`, not held here: CallRejected for a value freed here
  // (the refusal ends with `refusing`) or past kMaxPlaceholders.
  std::shared_ptr<OwnerRRef> new_placeholder_locked(uint64_t rref_id, const std::string& type_name,
                                                    const std::string& refusing)
      GRADWIRE_REQUIRES(mutex_);
  // The owned reference `rref_id`, made as a placeholder when a fork of it arrives before
  // its creation; counts `fork` (0: none) held by `holder`. CallRejected for a freed value.
  std::shared_ptr<OwnerRRef> owner_with_fork(uint64_t rref_id, const std::string& type_name,
                                             uint64_t fork, int holder);
  // One attempt of send_settlement; the in-flight count it took carries over to the next.
  void settlement_attempt(const rpc::WorkerInfo& to, const std::string& payload,
                          const std::string& what, int attempt, bool through_losses);
  // The answer to attempt `attempt`: sent again, or the settlement ends (end_settlement).
  void settlement_answered(const Future<rpc::Value>& done, const rpc::WorkerInfo& to,
                           const std::string& payload, const std::string& what, int attempt,
                           bool through_losses);
  // A settlement is over, answered or not: its count in messages_in_flight ends.
  void end_settlement();
  // The loss of `worker` (its current incarnation): its forks and the references to its
  // values are released, placeholders it was creating abandoned. `tell`: the loss was seen
  // here, and `worker` is told (a Lost message), so that it releases the same of this one.
  void lose(const rpc::WorkerInfo& worker, const std::string& why, bool tell);
  // Placeholders whose creation will never come (their creator, `creator`, was lost, or gave
  // its reference up before the Create arrived): failed with `error`, so calls waiting on
  // them end, and no longer awaited. `rref_id` 0: every placeholder `creator` minted.
  void abandon_placeholders(int creator, uint64_t rref_id, const std::exception_ptr& error);
  // Whether `worker`'s current incarnation is lost (under the lock).
  bool lost_locked(int worker) const GRADWIRE_REQUIRES(mutex_);
  // `holder` gives up `fork` (kDelete).
  void remove_fork(uint64_t rref_id, uint64_t fork, int holder);
  void accept_children(const std::vector<uint64_t>& forks);

  // Sends `to` (the worker that minted `fork`) the ChildAccepted that settles the fork:
  // its owner counted it, refused it, or it was given up.
  void settle_child(const rpc::WorkerInfo& to, uint64_t rref_id, uint64_t fork);

  // ---- the handler (context_handler.cc): one function per message kind
  Future<rpc::Value> dispatch(const rpc::CallContext& ctx, const rpc::Request& request,
                              const wire::RRefMessage& message, rpc::RpcAgent& agent);
  Future<rpc::Value> handle_create(const rpc::CallContext& ctx, const rpc::Request& request,
                                   const wire::Create& create);
  Future<rpc::Value> handle_fetch(const rpc::CallContext& ctx, const wire::Fetch& fetch);
  Future<rpc::Value> handle_call_method(const rpc::CallContext& ctx, const rpc::Request& request,
                                        const wire::CallMethod& call);
  Future<rpc::Value> handle_add_fork(const rpc::CallContext& ctx, rpc::RpcAgent& agent,
                                     const wire::AddFork& add);
  Future<rpc::Value> handle_lost(const rpc::CallContext& ctx, rpc::RpcAgent& agent,
                                 const wire::Lost& lost);
  Future<rpc::Value> handle_child_accepted(const wire::ChildAccepted& accepted);
  Future<rpc::Value> handle_delete(const rpc::CallContext& ctx, rpc::RpcAgent& agent,
                                   const wire::Delete& del);
  // A Delete from `caller` that arrived before the Create or AddFork counting its fork: the
  // user that sent the fork is settled, or a creator's value given up is never made.
  void deleted_before_counted(const rpc::WorkerInfo& caller, rpc::RpcAgent& agent,
                              const wire::Delete& del);

  // The group's size, known once the agent has started.
  int world_size() const;
  RRefMetrics metrics_locked() const GRADWIRE_REQUIRES(mutex_);

  const std::weak_ptr<rpc::RpcAgent> agent_;
  const rpc::WorkerInfo self_;
  mutable std::atomic<int> world_size_{0};
  rpc::IdMinter ids_;

  mutable Mutex mutex_;
  mutable std::condition_variable cv_;
  bool shutting_down_ GRADWIRE_GUARDED_BY(mutex_) = false;
  bool closed_ GRADWIRE_GUARDED_BY(mutex_) = false;
  RRefMetrics at_close_ GRADWIRE_GUARDED_BY(mutex_);  // what on_closed dropped
  // Every fork this worker tracks, owner side and user side, with its state.
  ForkTable forks_ GRADWIRE_GUARDED_BY(mutex_);
  std::map<uint64_t, std::weak_ptr<OwnerRRef>> owners_ GRADWIRE_GUARDED_BY(mutex_);
  std::map<uint64_t, std::weak_ptr<UserRRef>> users_ GRADWIRE_GUARDED_BY(mutex_);
  // Placeholders a creator's early call is waiting on, until their creation arrives.
  std::map<uint64_t, std::shared_ptr<OwnerRRef>> awaited_ GRADWIRE_GUARDED_BY(mutex_);
  // Lost incarnations, (worker id, incarnation) -> why; never forgotten.
  std::map<std::pair<int, int>, std::string> lost_ GRADWIRE_GUARDED_BY(mutex_);
  std::map<int, int> incarnations_ GRADWIRE_GUARDED_BY(mutex_);  // worker id -> the current one
  // Values this worker held and freed, whose ids another worker minted (the last
  // kRememberedFrees): a later fork or creation naming one is refused, never a placeholder.
  RecentSet<uint64_t> freed_ GRADWIRE_GUARDED_BY(mutex_);
  int64_t in_flight_ GRADWIRE_GUARDED_BY(mutex_) = 0;
  int64_t placeholders_ GRADWIRE_GUARDED_BY(mutex_) = 0;
};

// A value or object this worker owns.
class OwnerRRef : public detail::RRefCore, public std::enable_shared_from_this<OwnerRRef> {
 public:
  OwnerRRef(std::shared_ptr<RRefContext> context, uint64_t rref_id, std::string type_name);
  ~OwnerRRef() override;

  const rpc::WorkerInfo& owner() const override { return context_->self(); }
  uint64_t rref_id() const override { return id_; }
  const std::string& type_name() const override { return type_name_; }
  bool is_owner() const override { return true; }
  bool confirmed_by_owner() const override { return true; }
  Future<void> creation() const override { return ready_; }
  detail::Reply fetch(rpc::CallOptions options) override;
  detail::Reply call(std::string method, std::vector<rpc::Value> args,
                     rpc::CallOptions options) override;
  std::shared_ptr<detail::RRefCore> remote(std::string method, std::string result_type,
                                           std::vector<rpc::Value> args,
                                           rpc::CallOptions options) override;
  rpc::Value to_value(const rpc::CallContext& ctx) override;
  std::shared_ptr<void> local_object(const detail::LocalType& type,
                                     std::chrono::milliseconds timeout) override;
  rpc::RpcAgent& agent() const override;
  std::string describe() const override;

  // ---- for the context and the handler
  // Whether a creating call has started (false: a placeholder made by an early fork).
  bool begin_creation(const std::string& type_name);
  bool creation_started() const;
  // A placeholder whose creation will never come: marked as begun and failed with `error`
  // (calls waiting on it end with it). False when its creation had begun already.
  bool abandon(std::exception_ptr error);
  // Runs the registered constructor or function `name` and keeps its result.
  void create(const rpc::CallContext& ctx, const std::string& name,
              const std::vector<rpc::Value>& args);
  // Keeps what `result` completes with (a value of type type_name()).
  void adopt(Future<rpc::Value> result, std::shared_ptr<void> keep = nullptr);
  void fail(std::exception_ptr error);
  // The refusal of a held value that contains references.
  rpc::CallRejected references_refused() const;
  // Keeps `object` of class `info` as the created value.
  void hold_object(const rpc::Registry::ClassInfo& info, std::shared_ptr<void> object);
  // The value as a Value for a caller expecting `type_name`, once it exists.
  Future<rpc::Value> serialise(const rpc::CallContext& ctx, const std::string& type_name);
  // Calls `method` on the object, once it exists; with `expected_result`, refuses a method
  // whose result is another type (a remote() on a method).
  Future<rpc::Value> invoke(const rpc::CallContext& ctx, const std::string& method,
                            std::vector<rpc::Value> args, const std::string& expected_result = "");
  const std::shared_ptr<RRefContext>& context() const { return context_; }

 private:
  rpc::Value serialise_now(const rpc::CallContext& ctx, const std::string& type_name);
  Future<rpc::Value> invoke_now(const rpc::CallContext& ctx, const std::string& method,
                                const std::vector<rpc::Value>& args,
                                const std::string& expected_result);
  // A result made here, with the references inside it received back here.
  detail::Reply looped(Future<rpc::Value> raw);

  const std::shared_ptr<RRefContext> context_;
  const uint64_t id_;
  Future<void> ready_;  // the creating call has finished (its error, if it threw)

  const std::string type_name_;
  mutable Mutex mutex_;
  bool creating_ GRADWIRE_GUARDED_BY(mutex_) = false;
  // Set once, before ready_ completes; then read without the lock.
  std::exception_ptr error_;
  std::optional<rpc::Value> value_ GRADWIRE_GUARDED_BY(mutex_);  // a value type, as received
  std::shared_ptr<void> object_ GRADWIRE_GUARDED_BY(mutex_);     // a class object or a typed value
  std::optional<std::type_index> object_type_ GRADWIRE_GUARDED_BY(mutex_);
  std::string class_name_;  // set with the object, before ready_; empty for values
  bool serialised_ = false;
  rpc::Value (*to_value_)(const std::shared_ptr<void>&, const rpc::CallContext&)
      GRADWIRE_GUARDED_BY(mutex_) = nullptr;
  Mutex call_mutex_;  // serialised classes: one method at a time
};

// A reference to another worker's value: one fork of it.
class UserRRef : public detail::RRefCore, public std::enable_shared_from_this<UserRRef> {
 public:
  // `creator`: the reference remote() returned; its calls go out before the creation's
  // reply (the owner awaits the creation), as PyTorch's do.
  // `incarnation`: the owner's, as this worker knew it when the reference was made.
  UserRRef(std::shared_ptr<RRefContext> context, rpc::WorkerInfo owner, int incarnation,
           uint64_t rref_id, uint64_t fork_id, std::string type_name, Future<void> confirmed,
           bool creator = false);
  ~UserRRef() override;

  const rpc::WorkerInfo& owner() const override { return owner_; }
  int owner_incarnation() const { return incarnation_; }
  uint64_t rref_id() const override { return id_; }
  uint64_t fork_id() const { return fork_; }
  const std::string& type_name() const override { return type_name_; }
  bool is_owner() const override { return false; }
  bool confirmed_by_owner() const override { return confirmed_.completed(); }
  Future<void> creation() const override { return confirmed_; }
  detail::Reply fetch(rpc::CallOptions options) override;
  detail::Reply call(std::string method, std::vector<rpc::Value> args,
                     rpc::CallOptions options) override;
  std::shared_ptr<detail::RRefCore> remote(std::string method, std::string result_type,
                                           std::vector<rpc::Value> args,
                                           rpc::CallOptions options) override;
  rpc::Value to_value(const rpc::CallContext& ctx) override;
  std::shared_ptr<void> local_object(const detail::LocalType& type,
                                     std::chrono::milliseconds timeout) override;
  rpc::RpcAgent& agent() const override;
  std::string describe() const override;

  // The reference's own state machine, user side (docs/rref.md).
  enum class State {
    kConfirming,  // its Create or AddFork is on its way to the owner
    kConfirmed,   // the owner counts its fork
    kUncertain,   // the owner may count its fork (the Create or AddFork timed out, or the
                  // Create failed after the owner counted it)
    kReleased,    // the owner does not count it and never will, or its Delete was sent
  };
  enum class Event {
    kCounted,     // the owner counted it (its reply, or the owner made the fork itself)
    kUnsettled,   // no answer that says whether the owner counts it
    kNotCounted,  // refused, never sent, its owner's incarnation lost, or the agent closed
    kGiveUp,      // its last handle went, or a graceful shutdown gives it up
  };
  // The one place the reference changes state; true when a Delete is due (kGiveUp of a fork
  // the owner counts or may count).
  bool apply(Event event);
  State state() const;
  // The owner's answer to the Create or AddFork that counts this fork: moves the state and
  // completes creation(). `creation`: a Create, whose failure (other than its owner lost)
  // may come after the owner counted the fork.
  void owner_answered(const Future<rpc::Value>& reply, bool creation);
  const std::shared_ptr<RRefContext>& context() const { return context_; }

 private:
  // Sends what `send` sends once the owner has confirmed this reference; the reference
  // stays alive until the reply.
  // `options`: the call's; its deadline runs from now, the wait for confirmation included.
  Future<rpc::Value> after_confirmed(std::function<Future<rpc::Value>()> send,
                                     const rpc::CallOptions& options);

  const std::shared_ptr<RRefContext> context_;
  const rpc::WorkerInfo owner_;
  const int incarnation_;
  const uint64_t id_;
  const uint64_t fork_;
  const std::string type_name_;
  const Future<void> confirmed_;
  const bool creator_;
  mutable Mutex state_mutex_;
  State state_ GRADWIRE_GUARDED_BY(state_mutex_) = State::kConfirming;
};

}  // namespace gradwire::rref
