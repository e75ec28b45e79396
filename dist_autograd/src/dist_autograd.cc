// The dist-autograd container of one agent: its contexts, the send and recv functions
// recorded in them, and the passes that run backward through them. It is the agent's
// attachment, its handler (id 3), an interceptor (recording) and a listener (clean-up).
//
// Locking: mutex_ guards the table of contexts; each context has its own mutex for its
// functions, gradients and passes. No message is sent and no node runs under either.
#include "gradwire/dist_autograd/dist_autograd.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/gradient_sink.h"
#include "gradwire/autograd/graph_task.h"
#include "gradwire/autograd/node.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/core/printable.h"
#include "gradwire/rpc/ids.h"
#include "gradwire/rpc/join.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rpc/rpc.h"
#include "gradwire/rpc/value_walk.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "proto/dist_autograd.pb.h"

namespace gradwire::dist_autograd {

using rpc::CallContext;
using rpc::CallRejected;
using rpc::Value;
using rpc::WorkerInfo;

namespace {

thread_local uint64_t t_context = 0;

// How much of a peer's reason for aborting a pass is kept (it is a chain of errors, each
// naming its worker).
constexpr size_t kMaxReasonBytes = 4096;

int worker_of(uint64_t id) {
  return rpc::minter_of(id);
}

std::string ctx_text(uint64_t id) {
  return rpc::id_text(id);
}

// The tensors that require grad inside a message's values, in order.
std::vector<Tensor> grad_tensors(const std::vector<const Value*>& values) {
  std::vector<Tensor> out;
  for (const Value* v : values) {
    rpc::for_each_leaf(*v, [&](const Value& leaf) {
      if (leaf.type() != rpc::ValueType::kTensor) return;
      const Tensor& t = leaf.as_tensor();
      if (t.defined() && t.requires_grad()) out.push_back(t);
    });
  }
  return out;
}

// On the sender: the gradients that come back for the tensors a message sent, passed on to
// where those tensors came from. Only `peer`, the worker the message went to, holds the
// recv function that discovers this send and propagates into it.
class SendBackward : public autograd::Node {
 public:
  SendBackward(const std::vector<Tensor>& sent, int peer) : peer_(peer) {
    for (const Tensor& t : sent) {
      add_input_metadata(t);
      add_next_edge(autograd::gradient_edge(t));
    }
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return std::move(grads); }
  std::string name() const override { return "SendRpcBackward"; }
  int peer() const { return peer_; }

 private:
  const int peer_;
};

class Container;

// On the receiver: the grad_fn of the tensors a message brought; their gradients go back to
// the sender's SendBackward.
class RecvBackward : public autograd::Node {
 public:
  RecvBackward(std::weak_ptr<Container> container, uint64_t context_id, WorkerInfo from,
               uint64_t message_id)
      : container_(std::move(container)),
        context_id_(context_id),
        from_(std::move(from)),
        message_id_(message_id) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override;
  std::string name() const override { return "RecvRpcBackward"; }
  const WorkerInfo& from() const { return from_; }
  uint64_t message_id() const { return message_id_; }
  uint64_t context_id() const { return context_id_; }

 private:
  std::weak_ptr<Container> container_;
  const uint64_t context_id_;
  const WorkerInfo from_;
  const uint64_t message_id_;
};

using Clock = std::chrono::steady_clock;

// How long to wait for something due by `deadline` (kNoTimeout: no deadline).
std::chrono::milliseconds time_left(Clock::time_point deadline) {
  if (deadline == Clock::time_point::max()) return kNoTimeout;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

Clock::time_point deadline_after(std::chrono::milliseconds timeout) {
  const auto now = Clock::now();
  if (timeout >=
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + timeout;
}

std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

class ContextSink;

// What one pass gives a context's leaves on this worker, so that a failed pass can take
// it back: the pass's task delivers into this sink, which forwards to the context's and
// remembers, for each leaf it touches first, what the context held for it before. Once the
// pass is over (finish) nothing more goes through; a failed pass also puts back what the
// leaves held before it (DDP's averages included: they went through here too).
//
// Thread-safety: as GradientSink; finish() may race with the pass's last deliveries, which
// are then dropped (the pass has failed, or has already delivered everything).
class PassSink : public autograd::GradientSink {
 public:
  explicit PassSink(std::shared_ptr<ContextSink> target) : target_(std::move(target)) {}
  void accumulate(const Tensor& leaf, const Tensor& grad) override;
  Tensor gradient(const Tensor& leaf) const override;
  void set_gradient(const Tensor& leaf, const Tensor& grad) override;
  // Ends the pass's deliveries; `take_back` restores what the leaves held before the pass
  // (once, even if called again).
  void finish(bool take_back);

 private:
  void remember(const Tensor& leaf) GRADWIRE_REQUIRES(mutex_);

  const std::shared_ptr<ContextSink> target_;
  mutable Mutex mutex_;
  bool open_ GRADWIRE_GUARDED_BY(mutex_) = true;
  bool taken_back_ GRADWIRE_GUARDED_BY(mutex_) = false;
  // leaf's TensorImpl -> (leaf, what the context held for it before the pass)
  std::unordered_map<const void*, std::pair<Tensor, Tensor>> before_ GRADWIRE_GUARDED_BY(mutex_);
};

// One pass as this worker takes part in it.
struct Pass {
  std::shared_ptr<autograd::GraphTask> task;  // dropped once this worker's part is over
  std::shared_ptr<PassSink> sink;
  // This worker's part: completes with the task, or fails first (gradients it sent were
  // not delivered, the pass was aborted, the context released).
  Future<void> outcome;
  // The outcome, once the context has recorded it (what Wait answers and backward awaits).
  Future<void> done;
  std::set<const autograd::Node*> notified;  // recv functions whose sender was told
};

// The gradients of this worker's leaves in one context: in first-arrival order, indexed by
// the leaf's identity (its TensorImpl, kept alive by the entry), so that accumulating a
// gradient and looking one up cost O(1) whatever the number of leaves.
//
// It holds what it is given: a pass's gradient is the pass's own (later sums are out of
// place), and a Reducer's set_gradient hands over a copy of its averaged bucket slot
// (gradient_sink.h), so no entry aliases a bucket that a later pass of any context reuses.
class ContextSink : public autograd::GradientSink {
 public:
  void accumulate(const Tensor& leaf, const Tensor& grad) override {
    MutexLock lock(mutex_);
    auto [it, fresh] = index_.try_emplace(leaf.impl_ptr().get(), items_.size());
    if (fresh) {
      items_.emplace_back(leaf, grad);
      return;
    }
    Tensor& held = items_[it->second].second;
    held = held.defined() ? add(held, grad) : grad;
  }
  Tensor gradient(const Tensor& leaf) const override {
    MutexLock lock(mutex_);
    auto it = index_.find(leaf.impl_ptr().get());
    return it == index_.end() ? Tensor() : items_[it->second].second;
  }
  void set_gradient(const Tensor& leaf, const Tensor& grad) override {
    MutexLock lock(mutex_);
    auto [it, fresh] = index_.try_emplace(leaf.impl_ptr().get(), items_.size());
    if (fresh) {
      if (grad.defined()) {
        items_.emplace_back(leaf, grad);
      } else {
        index_.erase(it);
      }
      return;
    }
    if (grad.defined()) {
      items_[it->second].second = grad;
      return;
    }
    // Holding nothing: the last entry takes the removed one's place.
    const size_t slot = it->second;
    index_.erase(it);
    if (slot + 1 != items_.size()) {
      items_[slot] = std::move(items_.back());
      index_[items_[slot].first.impl_ptr().get()] = slot;
    }
    items_.pop_back();
  }
  std::vector<std::pair<Tensor, Tensor>> items() const {
    MutexLock lock(mutex_);
    return items_;
  }

 private:
  mutable Mutex mutex_;
  std::vector<std::pair<Tensor, Tensor>> items_ GRADWIRE_GUARDED_BY(mutex_);
  std::unordered_map<const void*, size_t> index_ GRADWIRE_GUARDED_BY(mutex_);
};

void PassSink::accumulate(const Tensor& leaf, const Tensor& grad) {
  MutexLock lock(mutex_);
  if (!open_) return;
  remember(leaf);
  target_->accumulate(leaf, grad);
}

Tensor PassSink::gradient(const Tensor& leaf) const {
  return target_->gradient(leaf);
}

void PassSink::set_gradient(const Tensor& leaf, const Tensor& grad) {
  MutexLock lock(mutex_);
  if (!open_) return;
  remember(leaf);
  target_->set_gradient(leaf, grad);
}

void PassSink::remember(const Tensor& leaf) {
  auto [it, fresh] = before_.try_emplace(leaf.impl_ptr().get());
  if (fresh) it->second = {leaf, target_->gradient(leaf)};
}

void PassSink::finish(bool take_back) {
  MutexLock lock(mutex_);
  open_ = false;
  if (!take_back || taken_back_) return;
  taken_back_ = true;
  for (const auto& [key, entry] : before_)
    target_->set_gradient(entry.first, entry.second);
}

struct ContextState {
  explicit ContextState(uint64_t context_id) : id(context_id) {}
  const uint64_t id;
  const std::shared_ptr<ContextSink> sink = std::make_shared<ContextSink>();
  Mutex mutex;
  std::map<uint64_t, std::shared_ptr<SendBackward>> sends GRADWIRE_GUARDED_BY(mutex);
  std::set<int> touched GRADWIRE_GUARDED_BY(mutex);  // workers that know this context from here
  std::map<uint64_t, Pass> passes GRADWIRE_GUARDED_BY(mutex);
  bool running GRADWIRE_GUARDED_BY(mutex) = false;  // a backward() started here is running
  // The last pass whose part here is over, and its sink: an abort that comes after this
  // worker's part succeeded still takes back what the pass gave.
  uint64_t last_pass GRADWIRE_GUARDED_BY(mutex) = 0;
  std::shared_ptr<PassSink> last_sink GRADWIRE_GUARDED_BY(mutex);
  Future<void> last_done GRADWIRE_GUARDED_BY(mutex);  // for a Wait asked again
  // Passes aborted here: their later messages are refused.
  std::set<uint64_t> aborted GRADWIRE_GUARDED_BY(mutex);
  // Why the last pass failed here, until one succeeds here (get_gradients throws it).
  std::optional<std::pair<uint64_t, std::string>> failure GRADWIRE_GUARDED_BY(mutex);
};

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

  static void install(const std::shared_ptr<rpc::RpcAgent>& agent) {
    auto container = std::make_shared<Container>(agent);
    std::weak_ptr<Container> weak = container;
    agent->register_handler(
        kDistAutogradHandler, "dist_autograd",
        [weak](const CallContext& ctx, const rpc::Request& request) {
          std::shared_ptr<Container> self = weak.lock();
          if (self == nullptr) return make_failed_future<Value>(Error("dist_autograd: gone"));
          return self->handle(ctx, request);
        },
        rpc::Execution::kPool);
    agent->add_interceptor(container);
    agent->add_listener(container);
    agent->set_attachment(container);
  }

  static std::shared_ptr<Container> of(const rpc::RpcAgent& agent) {
    auto c = agent.attachment<Container>();
    if (c == nullptr) {
      throw Error(
          "dist_autograd: worker " + agent.worker_info().describe() +
          " has no dist_autograd container (the program must link gradwire::dist_autograd)");
    }
    return c;
  }

  std::shared_ptr<rpc::RpcAgent> agent() const {
    auto a = agent_.lock();
    if (a == nullptr || a->is_shut_down()) {
      throw Error("dist_autograd: the agent of worker " + self_.describe() + " has shut down");
    }
    return a;
  }

  // Contexts, messages and passes are named by group-unique ids (rpc/ids.h).
  uint64_t mint() { return ids_.mint(); }

  std::shared_ptr<ContextState> create_context() {
    const uint64_t id = mint();
    auto state = std::make_shared<ContextState>(id);
    MutexLock lock(mutex_);
    contexts_[id] = state;
    return state;
  }

  std::shared_ptr<ContextState> find(uint64_t id) const {
    MutexLock lock(mutex_);
    auto it = contexts_.find(id);
    return it == contexts_.end() ? nullptr : it->second;
  }
  std::shared_ptr<ContextState> get(uint64_t id) const {
    auto c = find(id);
    if (c == nullptr) {
      throw InvalidArgument("dist_autograd: worker " + self_.describe() + " has no context " +
                            ctx_text(id) + " (unknown, or already released)");
    }
    return c;
  }
  // The context a request from a participant names, made on its first request here; a
  // context released here is never made again (a late request in it is refused).
  std::shared_ptr<ContextState> get_or_make(uint64_t id) {
    MutexLock lock(mutex_);
    auto it = contexts_.find(id);
    if (it != contexts_.end()) return it->second;
    if (released_.count(id) != 0) {
      throw CallRejected("dist_autograd: worker " + self_.describe() +
                         " already released context " + ctx_text(id));
    }
    auto state = std::make_shared<ContextState>(id);
    contexts_.emplace(id, state);
    return state;
  }

  // Remembers that `id` was released, for a context that never reached this worker.
  void remember_released_unseen(uint64_t id) {
    MutexLock lock(mutex_);
    if (contexts_.count(id) == 0) remember_released(id);
  }

  // Remembers that `id` was released here (the newest kReleasedMemory ids).
  void remember_released(uint64_t id) GRADWIRE_REQUIRES(mutex_) {
    if (!released_.insert(id).second) return;
    released_order_.push_back(id);
    if (released_order_.size() > kReleasedMemory) {
      released_.erase(released_order_.front());
      released_order_.pop_front();
    }
  }
  size_t size() const {
    MutexLock lock(mutex_);
    return contexts_.size();
  }

  // Sends one of the module's messages; `what` names it for rpc's errors and for fault
  // rules ("discover", "propagate", "wait", "abort", "release").
  Future<Value> send(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                     std::string what, std::vector<Value> args = {},
                     rpc::CallOptions options = {}) {
    rpc::Request request;
    request.handler = kDistAutogradHandler;
    request.function = std::move(what);
    const std::string payload = message.SerializeAsString();
    request.payload.assign(payload.begin(), payload.end());
    request.args = std::move(args);
    return agent()->send(to, std::move(request), options);
  }

  // As send, but a message that cannot even be sent gives a failed future.
  Future<Value> try_send(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                         std::string what, std::vector<Value> args = {},
                         rpc::CallOptions options = {}) {
    try {
      return send(to, message, std::move(what), std::move(args), options);
    } catch (...) {
      return make_failed_future<Value>(std::current_exception());
    }
  }

  // ---- recording

  std::shared_ptr<void> on_outgoing_request(const WorkerInfo& to, rpc::Request& request) override {
    const uint64_t ctx = t_context;
    if (ctx == 0 || request.handler == kDistAutogradHandler) return nullptr;
    std::shared_ptr<ContextState> state = find(ctx);
    if (state == nullptr) return nullptr;
    request.autograd_context_id = ctx;
    request.autograd_message_id = 0;
    std::vector<const Value*> values;
    for (const Value& v : request.args)
      values.push_back(&v);
    std::vector<Tensor> sent = grad_tensors(values);
    MutexLock lock(state->mutex);
    state->touched.insert(to.id);
    if (!sent.empty()) {
      const uint64_t message_id = mint();
      state->sends[message_id] = std::make_shared<SendBackward>(sent, to.id);
      request.autograd_message_id = message_id;
    }
    return nullptr;
  }

  std::shared_ptr<rpc::ServeScope> on_incoming_request(const WorkerInfo& from,
                                                       rpc::Request& request) override {
    const uint64_t ctx = request.autograd_context_id;
    if (ctx == 0 || request.handler == kDistAutogradHandler) return nullptr;
    if (from.id < 0) throw CallRejected("dist_autograd: a context from outside the group");
    std::shared_ptr<ContextState> state = get_or_make(ctx);
    {
      MutexLock lock(state->mutex);
      state->touched.insert(from.id);
    }
    if (request.autograd_message_id != 0) {
      std::vector<const Value*> values;
      for (const Value& v : request.args)
        values.push_back(&v);
      attach_recv(ctx, from, request.autograd_message_id, grad_tensors(values));
    }
    return std::make_shared<ContextScope>(ctx);
  }

  void on_outgoing_response(const WorkerInfo& to, const rpc::Request& request,
                            rpc::Response& response) override {
    response.autograd_message_id = 0;
    const uint64_t ctx = request.autograd_context_id;
    if (ctx == 0 || request.handler == kDistAutogradHandler) return;
    const Value* value = std::get_if<Value>(&response.result);
    if (value == nullptr) return;
    std::vector<Tensor> sent = grad_tensors({value});
    if (sent.empty()) return;
    std::shared_ptr<ContextState> state = find(ctx);
    if (state == nullptr) return;
    const uint64_t message_id = mint();
    MutexLock lock(state->mutex);
    state->sends[message_id] = std::make_shared<SendBackward>(sent, to.id);
    state->touched.insert(to.id);
    response.autograd_context_id = ctx;
    response.autograd_message_id = message_id;
  }

  void on_incoming_response(const WorkerInfo& from, rpc::Response& response,
                            const std::shared_ptr<void>&) override {
    if (response.autograd_context_id == 0 || response.autograd_message_id == 0) return;
    const Value* value = std::get_if<Value>(&response.result);
    if (value == nullptr) return;
    if (find(response.autograd_context_id) == nullptr) return;
    attach_recv(response.autograd_context_id, from, response.autograd_message_id,
                grad_tensors({value}));
  }

  std::shared_ptr<rpc::ServeScope> capture_thread_state() override {
    if (t_context == 0) return nullptr;
    return std::make_shared<ContextScope>(t_context);
  }

  void attach_recv(uint64_t ctx, const WorkerInfo& from, uint64_t message_id,
                   const std::vector<Tensor>& received) {
    if (received.empty()) return;
    auto recv = std::make_shared<RecvBackward>(weak_from_this(), ctx, from, message_id);
    for (const Tensor& t : received)
      autograd::set_history(t, recv);
  }

  // ---- backward

  // This worker's part in pass `pass_id`, made on first sight (the initiator's backward, or
  // the first Discover here). Its sink takes back what the pass gave if the pass fails.
  std::shared_ptr<autograd::GraphTask> start_part(const std::shared_ptr<ContextState>& state,
                                                  uint64_t pass_id, bool retain_graph) {
    MutexLock lock(state->mutex);
    if (state->aborted.count(pass_id) != 0) {
      throw CallRejected("dist_autograd: worker " + self_.describe() + " already aborted pass " +
                         ctx_text(pass_id) + " in context " + ctx_text(state->id));
    }
    auto found = state->passes.find(pass_id);
    if ((found != state->passes.end() && found->second.task == nullptr) ||
        state->last_pass == pass_id) {
      throw CallRejected("dist_autograd: worker " + self_.describe() + "'s part in pass " +
                         ctx_text(pass_id) + " is already over");
    }
    if (found != state->passes.end()) return found->second.task;
    Pass& pass = state->passes[pass_id];
    autograd::ExecuteOptions options;
    options.retain_graph = retain_graph;
    pass.sink = std::make_shared<PassSink>(state->sink);
    options.sink = pass.sink;
    pass.task = std::make_shared<autograd::GraphTask>(options);
    gradwire::detail::forward_completion(pass.task->completion(), pass.outcome);
    std::weak_ptr<ContextState> weak = state;
    pass.done = pass.outcome.then(agent()->executor(), [weak, pass_id](Future<void> part) {
      if (auto s = weak.lock()) part_over(*s, pass_id, part);
      part.value();
    });
    return pass.task;
  }

  // Records how this worker's part of a pass ended: success clears an earlier failure; a
  // failure (or an abort, even after success) is remembered and takes back the pass's
  // gradients. The task, and with it the graph unless retained, is let go.
  static void part_over(ContextState& state, uint64_t pass_id, const Future<void>& part) {
    std::shared_ptr<autograd::GraphTask> task;
    std::shared_ptr<PassSink> sink;
    bool failed = part.has_error();
    {
      MutexLock lock(state.mutex);
      auto it = state.passes.find(pass_id);
      if (it != state.passes.end()) {
        task = std::move(it->second.task);
        sink = it->second.sink;
      }
      if (state.aborted.count(pass_id) != 0) failed = true;
      if (failed) {
        if (!state.failure || state.failure->first != pass_id) {
          state.failure.emplace(pass_id, part.has_error() ? error_text(part.error())
                                                          : std::string("the pass was aborted"));
        }
      } else {
        state.failure.reset();
      }
    }
    if (sink != nullptr) sink->finish(failed);
  }

  // Fails this worker's part of a pass with `error`, unless it is over already.
  static void fail_part(ContextState& state, uint64_t pass_id, std::exception_ptr error) {
    Future<void> outcome;
    {
      MutexLock lock(state.mutex);
      auto it = state.passes.find(pass_id);
      if (it == state.passes.end()) return;
      outcome = it->second.outcome;
    }
    outcome.try_set_error(std::move(error));
  }

  // Forgets the pass here once its part is over and reported; its sink stays as the
  // context's last, for an abort that may still come.
  static void forget_pass(ContextState& state, uint64_t pass_id) {
    std::shared_ptr<autograd::GraphTask> task;
    MutexLock lock(state.mutex);
    auto it = state.passes.find(pass_id);
    if (it == state.passes.end()) return;
    task = std::move(it->second.task);
    state.last_pass = pass_id;
    state.last_sink = std::move(it->second.sink);
    state.last_done = it->second.done;
    state.passes.erase(it);
    lock.unlock();
  }

  // Walks the graph below `edges`, telling each recv function's sender (once per pass) that
  // its send will get a gradient. Completes with the workers taking part.
  Future<std::set<int>> discover(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                                 const std::vector<autograd::Edge>& edges, bool retain_graph) {
    std::map<int, std::pair<WorkerInfo, std::vector<uint64_t>>> to_tell;
    {
      std::vector<autograd::Node*> stack;
      std::set<autograd::Node*> seen;
      for (const auto& e : edges) {
        if (e.is_valid()) stack.push_back(e.function.get());
      }
      MutexLock lock(state->mutex);
      Pass& pass = state->passes[pass_id];
      while (!stack.empty()) {
        autograd::Node* node = stack.back();
        stack.pop_back();
        if (!seen.insert(node).second) continue;
        if (auto* recv = dynamic_cast<RecvBackward*>(node)) {
          if (pass.notified.insert(recv).second) {
            auto& entry = to_tell[recv->from().id];
            entry.first = recv->from();
            entry.second.push_back(recv->message_id());
          }
          continue;
        }
        for (const auto& next : node->next_edges()) {
          if (next.is_valid()) stack.push_back(next.function.get());
        }
      }
    }
    std::vector<Future<Value>> told;
    for (auto& [id, entry] : to_tell) {
      wire::DistAutogradMessage message;
      wire::Discover* d = message.mutable_discover();
      d->set_context_id(state->id);
      d->set_pass_id(pass_id);
      d->set_retain_graph(retain_graph);
      for (uint64_t m : entry.second)
        d->add_message_ids(m);
      told.push_back(try_send(entry.first, message, "discover"));
    }
    Future<std::set<int>> result;
    auto all = collect_all(told);
    gradwire::detail::on_complete_inline(
        all, [result, self_id = self_.id](const Future<std::vector<Value>>& done) mutable {
          if (done.has_error()) {
            result.try_set_error(done.error());
            return;
          }
          std::set<int> workers{self_id};
          for (const Value& v : done.value())
            for (const Value& w : v.as_list())
              workers.insert(static_cast<int>(w.as_int()));
          result.try_set_value(std::move(workers));
        });
    return result;
  }

  void propagate(const RecvBackward& recv, std::vector<Tensor>&& grads) {
    uint64_t pass_id = 0;
    std::shared_ptr<ContextState> state = get(recv.context_id());
    {
      MutexLock lock(state->mutex);
      for (const auto& [id, pass] : state->passes) {
        if (pass.task != nullptr && pass.task.get() == autograd::GraphTask::current()) pass_id = id;
      }
    }
    if (pass_id == 0) {
      throw Error(
          "dist_autograd: a recv function ran outside a distributed backward pass (use "
          "dist_autograd::backward, not autograd::backward, on a graph with remote calls)");
    }
    wire::DistAutogradMessage message;
    wire::Propagate* p = message.mutable_propagate();
    p->set_context_id(state->id);
    p->set_pass_id(pass_id);
    p->set_message_id(recv.message_id());
    std::vector<Value> args;
    for (Tensor& g : grads)
      args.push_back(g.defined() ? Value(std::move(g)) : Value());
    // The receiver answers once it has taken the gradients (it runs what they make ready
    // afterwards). Not waited for here, but checked: gradients the receiver refused or never
    // got end this worker's part, and so the pass, with the receiver's error.
    Future<Value> sent = try_send(recv.from(), message, "propagate", std::move(args));
    std::weak_ptr<ContextState> weak = state;
    gradwire::detail::on_complete_inline(
        sent, [weak, pass_id, to = recv.from(), m = recv.message_id()](const Future<Value>& done) {
          if (!done.has_error()) return;
          if (auto s = weak.lock()) fail_part(*s, pass_id, undelivered(done.error(), to, s->id, m));
        });
  }

  // The error of gradients that did not reach `to`, naming it: its own error (RemoteError),
  // a refusal as a RemoteError of `to`, or the NetworkError / TimeoutError of the send.
  static std::exception_ptr undelivered(const std::exception_ptr& error, const WorkerInfo& to,
                                        uint64_t ctx, uint64_t message_id) {
    const std::string what = "dist_autograd: the gradients for send " + ctx_text(message_id) +
                             " in context " + ctx_text(ctx) + " did not reach worker " +
                             to.describe() + ": ";
    try {
      std::rethrow_exception(error);
    } catch (const RemoteError& e) {
      return std::make_exception_ptr(
          RemoteError(e.worker(), e.remote_type(), what + e.remote_message()));
    } catch (const NetworkError& e) {
      return std::make_exception_ptr(NetworkError(what + e.what()));
    } catch (const TimeoutError& e) {
      return std::make_exception_ptr(TimeoutError(what + e.what()));
    } catch (const Error& e) {
      return std::make_exception_ptr(
          RemoteError(to.name, std::string(error_kind_name(e.kind())), what + e.what()));
    } catch (const std::exception& e) {
      return std::make_exception_ptr(Error(what + e.what()));
    }
  }

  void backward(uint64_t ctx, const std::vector<Tensor>& roots, const BackwardOptions& options) {
    std::shared_ptr<ContextState> state = get(ctx);
    if (roots.empty()) throw InvalidArgument("dist_autograd::backward: no roots");
    if (options.timeout <= std::chrono::milliseconds(0)) {
      throw InvalidArgument("dist_autograd::backward: BackwardOptions::timeout must be > 0, got " +
                            std::to_string(options.timeout.count()) + " ms");
    }
    for (size_t i = 0; i < roots.size(); ++i) {
      if (!roots[i].defined() || !roots[i].requires_grad()) {
        throw InvalidArgument("dist_autograd::backward: root " + std::to_string(i) +
                              " does not require grad");
      }
    }
    std::vector<autograd::GraphRoot> graph_roots = autograd::make_roots(roots);
    {
      MutexLock lock(state->mutex);
      if (state->running) {
        throw InvalidArgument("dist_autograd::backward: context " + ctx_text(ctx) +
                              " already runs a backward pass");
      }
      state->running = true;
    }
    const uint64_t pass_id = mint();
    const Clock::time_point deadline = deadline_after(options.timeout);
    try {
      std::shared_ptr<rpc::RpcAgent> agent = this->agent();
      std::shared_ptr<autograd::GraphTask> task = start_part(state, pass_id, options.retain_graph);
      std::vector<autograd::Edge> edges;
      for (const auto& r : graph_roots) {
        task->expect(r.edge);
        edges.push_back(r.edge);
      }
      auto timed_out = [&] {
        return TimeoutError("dist_autograd::backward in context " + ctx_text(ctx) +
                            " did not finish within " + std::to_string(options.timeout.count()) +
                            " ms (BackwardOptions::timeout)");
      };
      Future<std::set<int>> found = discover(state, pass_id, edges, options.retain_graph);
      if (!found.wait(time_left(deadline))) throw timed_out();
      const std::set<int> workers = found.value();
      // Every part reports when it is done; the first failure ends the pass.
      std::vector<Future<void>> parts;
      for (int w : workers) {
        if (w != self_.id) parts.push_back(watch_part(state, pass_id, agent->get_worker_info(w)));
      }
      {
        MutexLock lock(state->mutex);
        parts.push_back(state->passes[pass_id].done);
      }
      Future<void> all = rpc::join_fail_fast(parts);
      for (const auto& r : graph_roots)
        task->add_gradient(r.edge, r.grad);
      try {
        task->run_ready();
      } catch (...) {
        // The task holds the error; the wait below reports it.
      }
      if (!all.wait(time_left(deadline))) throw timed_out();
      all.value();
    } catch (...) {
      const std::exception_ptr error = std::current_exception();
      // Every worker the pass reached takes back what it gave and records the failure
      // before backward reports it (so a step right after it cannot use partial gradients).
      if (!abort(state, pass_id, error_text(error), -1).wait(agent_wait())) {
        GRADWIRE_LOG(kWarning) << "dist_autograd worker " << self_.describe()
                               << ": the abort of pass " << ctx_text(pass_id) << " in context "
                               << ctx_text(ctx) << " did not reach every worker in time";
      }
      end_pass(*state, pass_id);
      std::rethrow_exception(error);
    }
    end_pass(*state, pass_id);
  }

  // Completes when worker `to`'s part of the pass is over (failing with its error). A Wait is
  // a call like any other, bounded by rpc_timeout; while the pass goes on, one that times
  // out is asked again, so a pass may last longer than rpc_timeout (its own deadline bounds
  // it) and no call outlives the pass by more than rpc_timeout.
  Future<void> watch_part(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                          const WorkerInfo& to, Future<void> result = {}) {
    wire::DistAutogradMessage message;
    message.mutable_wait()->set_context_id(state->id);
    message.mutable_wait()->set_pass_id(pass_id);
    Future<Value> reply = try_send(to, message, "wait");
    std::weak_ptr<Container> weak_self = weak_from_this();
    std::weak_ptr<ContextState> weak_state = state;
    reply.add_callback(agent()->executor(), [weak_self, weak_state, pass_id, to,
                                             result](Future<Value> done) mutable {
      if (!done.has_error()) {
        result.try_set_value();
        return;
      }
      std::shared_ptr<Container> self = weak_self.lock();
      std::shared_ptr<ContextState> s = weak_state.lock();
      bool ask_again = false;
      try {
        std::rethrow_exception(done.error());
      } catch (const TimeoutError&) {
        if (self != nullptr && s != nullptr) {
          MutexLock lock(s->mutex);
          ask_again = s->passes.count(pass_id) != 0 && s->aborted.count(pass_id) == 0;
        }
      } catch (...) {
      }
      if (!ask_again) {
        result.try_set_error(done.error());
        return;
      }
      try {
        self->watch_part(s, pass_id, to, result);
      } catch (...) {
        result.try_set_error(std::current_exception());
      }
    });
    return result;
  }

  // The initiator's pass is over: the context may run another.
  static void end_pass(ContextState& state, uint64_t pass_id) {
    forget_pass(state, pass_id);
    MutexLock lock(state.mutex);
    state.running = false;
  }

  // Aborts pass `pass_id` here (its part fails with `reason`, or, if it already succeeded,
  // what it gave is taken back) and tells the workers the context touched from here but
  // `from`, once: only a worker that took part forwards it. Completes when they have
  // answered.
  Future<void> abort(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                     const std::string& reason, int from) {
    Future<void> outcome;
    std::shared_ptr<PassSink> sink;
    std::set<int> touched;
    {
      MutexLock lock(state->mutex);
      if (!state->aborted.insert(pass_id).second) return make_ready_future();
      auto it = state->passes.find(pass_id);
      if (it != state->passes.end()) {
        outcome = it->second.outcome;
        sink = it->second.sink;
      } else if (state->last_pass == pass_id) {
        sink = state->last_sink;
      } else {
        return make_ready_future();  // never took part: nothing to take back or forward
      }
      state->failure.emplace(pass_id, reason);
      touched = state->touched;
    }
    outcome.try_set_error(std::make_exception_ptr(Error(reason)));
    if (sink != nullptr) sink->finish(/*take_back=*/true);
    std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
    if (agent == nullptr || agent->is_shut_down()) return make_ready_future();
    std::vector<Future<Value>> told;
    for (int w : touched) {
      if (w == from || w == self_.id) continue;
      wire::DistAutogradMessage message;
      wire::Abort* a = message.mutable_abort();
      a->set_context_id(state->id);
      a->set_pass_id(pass_id);
      a->set_reason(reason);
      told.push_back(try_send(agent->get_worker_info(w), message, "abort"));
    }
    return rpc::join_settled(told);
  }

  // ---- the handler

  // Whether worker `w` takes part in the context: its creator, or a worker it exchanged a
  // message with from here (both ends record each other, so the set is symmetric).
  static bool participant(const std::shared_ptr<ContextState>& state, int w) {
    if (w == worker_of(state->id)) return true;
    MutexLock lock(state->mutex);
    return state->touched.count(w) != 0;
  }

  // The context a message from `caller` is about, refused unless the caller takes part.
  std::shared_ptr<ContextState> get_for(uint64_t id, const WorkerInfo& caller,
                                        const char* what) const {
    std::shared_ptr<ContextState> state = get(id);
    if (!participant(state, caller.id)) {
      throw CallRejected("dist_autograd: worker " + self_.describe() + " refused a " + what +
                         " for context " + ctx_text(id) + " from worker " + caller.describe() +
                         ", which takes no part in it");
    }
    return state;
  }

  // The send `m` recorded here, refused unless `caller` is the worker it went to (the only
  // one holding its recv function).
  std::shared_ptr<SendBackward> send_from(ContextState& state, uint64_t m, const WorkerInfo& caller,
                                          const char* what) const {
    std::shared_ptr<SendBackward> send;
    {
      MutexLock lock(state.mutex);
      auto it = state.sends.find(m);
      if (it != state.sends.end()) send = it->second;
    }
    if (send == nullptr) {
      throw CallRejected("dist_autograd: worker " + self_.describe() + " recorded no send " +
                         ctx_text(m) + " in context " + ctx_text(state.id) +
                         " (released, or its graph was freed by an earlier pass)");
    }
    if (send->peer() != caller.id) {
      throw CallRejected("dist_autograd: worker " + self_.describe() + " refused a " + what +
                         " for send " + ctx_text(m) + " in context " + ctx_text(state.id) +
                         " from worker " + caller.describe() + ", which the send did not go to");
    }
    return send;
  }

  Future<Value> handle(const CallContext& ctx, const rpc::Request& request) {
    // Only members of the group speak for a context; each message is then checked against
    // the workers that take part in the context (or pass) it names.
    const WorkerInfo& caller = ctx.caller();
    if (caller.id < 0) {
      throw CallRejected("dist_autograd: worker " + self_.describe() + " refused a message from '" +
                         printable(caller.name) + "', which is not a member of the group");
    }
    wire::DistAutogradMessage message;
    if (request.payload.empty() ||
        !message.ParseFromArray(request.payload.data(), static_cast<int>(request.payload.size()))) {
      throw CallRejected("malformed dist_autograd message: the payload does not parse");
    }
    switch (message.op_case()) {
      case wire::DistAutogradMessage::kDiscover: {
        const wire::Discover& d = message.discover();
        std::shared_ptr<ContextState> state = get_for(d.context_id(), caller, "discovery");
        std::vector<std::shared_ptr<SendBackward>> sends;
        for (uint64_t m : d.message_ids())
          sends.push_back(send_from(*state, m, caller, "discovery"));
        std::shared_ptr<autograd::GraphTask> task =
            start_part(state, d.pass_id(), d.retain_graph());
        std::vector<autograd::Edge> edges;
        for (const auto& send : sends) {
          for (uint32_t i = 0; i < send->num_inputs(); ++i) {
            task->expect(autograd::Edge(send, i));
          }
          edges.push_back(autograd::Edge(send, 0));
        }
        Future<std::set<int>> found = discover(state, d.pass_id(), edges, d.retain_graph());
        return found.then(agent()->executor(), [](Future<std::set<int>> done) {
          Value::List ids;
          for (int w : done.value())
            ids.push_back(Value(int64_t{w}));
          return Value::list(std::move(ids));
        });
      }
      case wire::DistAutogradMessage::kPropagate: {
        const wire::Propagate& p = message.propagate();
        std::shared_ptr<ContextState> state = get_for(p.context_id(), caller, "gradient");
        std::shared_ptr<SendBackward> send = send_from(*state, p.message_id(), caller, "gradient");
        std::shared_ptr<autograd::GraphTask> task;
        {
          MutexLock lock(state->mutex);
          auto pass = state->passes.find(p.pass_id());
          if (pass != state->passes.end() && state->aborted.count(p.pass_id()) == 0)
            task = pass->second.task;
        }
        if (task == nullptr) {
          throw CallRejected("dist_autograd: worker " + self_.describe() +
                             " expects no gradients for send " + ctx_text(p.message_id()) +
                             " in pass " + ctx_text(p.pass_id()) + " of context " +
                             ctx_text(p.context_id()) + " (not discovered, over, or aborted)");
        }
        if (request.args.size() != send->num_inputs()) {
          throw CallRejected("dist_autograd: send " + ctx_text(p.message_id()) + " takes " +
                             std::to_string(send->num_inputs()) + " gradients, got " +
                             std::to_string(request.args.size()));
        }
        for (uint32_t i = 0; i < send->num_inputs(); ++i) {
          const Value& g = request.args[i];
          task->add_gradient(autograd::Edge(send, i), g.is_none() ? Tensor() : g.as_tensor());
        }
        // Taken: the sender hears so now, and what the gradients made ready runs on the pool
        // (however long it takes; a failure there is this worker's part's, and its Wait's).
        agent()->executor()->execute([task] {
          try {
            task->run_ready();
          } catch (...) {
            // The task holds the error: this worker's part fails with it.
          }
        });
        return make_ready_future(Value());
      }
      case wire::DistAutogradMessage::kWait: {
        const wire::Wait& w = message.wait();
        // Only the pass's initiator (who minted its id) waits for it.
        if (worker_of(w.pass_id()) != caller.id) {
          throw CallRejected("dist_autograd: worker " + self_.describe() +
                             " refused a wait for pass " + ctx_text(w.pass_id()) + " from worker " +
                             caller.describe() + ", which did not start it");
        }
        std::shared_ptr<ContextState> state = get_for(w.context_id(), caller, "wait");
        std::optional<Future<void>> done;
        {
          MutexLock lock(state->mutex);
          auto pass = state->passes.find(w.pass_id());
          if (pass != state->passes.end() && pass->second.sink != nullptr) {
            done = pass->second.done;
          } else if (state->last_pass == w.pass_id()) {
            done = state->last_done;  // asked again after its answer was lost or late
          }
        }
        if (!done) {
          throw CallRejected("dist_autograd: worker " + self_.describe() +
                             " takes no part in pass " + ctx_text(w.pass_id()));
        }
        std::weak_ptr<ContextState> weak = state;
        const uint64_t pass_id = w.pass_id();
        return done->then(agent()->executor(), [weak, pass_id](Future<void> part) {
          // This worker's part is over and reported.
          if (auto s = weak.lock()) forget_pass(*s, pass_id);
          part.value();
          return Value();
        });
      }
      case wire::DistAutogradMessage::kAbort: {
        const wire::Abort& a = message.abort();
        // Unknown here (never seen, or already released): nothing to take back.
        if (find(a.context_id()) == nullptr) return make_ready_future(Value());
        std::shared_ptr<ContextState> state = get_for(a.context_id(), caller, "pass abort");
        const std::string reason = "dist_autograd: pass " + ctx_text(a.pass_id()) +
                                   " was aborted by worker " + caller.describe() + ": " +
                                   printable(a.reason(), kMaxReasonBytes);
        return abort(state, a.pass_id(), reason, caller.id)
            .then(agent()->executor(), [](Future<void>) { return Value(); });
      }
      case wire::DistAutogradMessage::kRelease: {
        const uint64_t id = message.release().context_id();
        if (find(id) == nullptr) {
          // Unknown here: never seen, or already released; nothing to do, whoever asks. Its
          // creator's release is remembered, though: a request in it still on its way (one
          // that timed out, say) must not make it here after its end.
          if (worker_of(id) == caller.id) remember_released_unseen(id);
          return make_ready_future(Value());
        }
        get_for(id, caller, "release");
        return release(id, caller.id).then(agent()->executor(), [](Future<void>) {
          return Value();
        });
      }
      case wire::DistAutogradMessage::OP_NOT_SET:
        break;
    }
    throw CallRejected("malformed dist_autograd message: no operation");
  }

  // Forgets the context here and tells the workers it touched from here (but `from`);
  // completes once they (and the workers they told) have forgotten it too.
  Future<void> release(uint64_t ctx, int from) {
    std::shared_ptr<ContextState> state;
    {
      MutexLock lock(mutex_);
      auto it = contexts_.find(ctx);
      if (it == contexts_.end()) return make_ready_future();
      state = std::move(it->second);
      contexts_.erase(it);
      remember_released(ctx);
    }
    std::set<int> touched;
    std::vector<Future<void>> parts;
    {
      MutexLock lock(state->mutex);
      touched = state->touched;
      for (const auto& [id, pass] : state->passes)
        parts.push_back(pass.outcome);
    }
    // Parts still running end here, so that their Waits are answered.
    for (Future<void>& part : parts) {
      part.try_set_error(std::make_exception_ptr(Error("dist_autograd: context " + ctx_text(ctx) +
                                                       " was released on worker " +
                                                       self_.describe() + " during the pass")));
    }
    std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
    if (agent == nullptr || agent->is_shut_down()) return make_ready_future();
    std::vector<Future<Value>> told;
    for (int w : touched) {
      if (w == from || w == self_.id) continue;
      wire::DistAutogradMessage message;
      message.mutable_release()->set_context_id(ctx);
      try {
        told.push_back(send(agent->get_worker_info(w), message, "release"));
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kDebug) << "dist_autograd worker " << self_.describe()
                             << ": the release of context " << ctx_text(ctx)
                             << " was not sent: " << e.what();
      }
    }
    // A worker that is gone, or never had it, does not hold it: failures only end the wait.
    return rpc::join_settled(told);
  }

  std::chrono::milliseconds agent_wait() const {
    auto a = agent_.lock();
    return a == nullptr ? std::chrono::milliseconds(0) : a->options().rpc_timeout;
  }

  Gradients gradients(uint64_t ctx) const {
    std::shared_ptr<ContextState> state = get(ctx);
    {
      MutexLock lock(state->mutex);
      if (state->failure) {
        throw Error("dist_autograd: context " + ctx_text(ctx) + " on worker " + self_.describe() +
                    " holds no gradients: its last backward pass (" +
                    ctx_text(state->failure->first) +
                    ") failed, and none has succeeded here since: " + state->failure->second);
      }
    }
    return Gradients(state->sink->items());
  }

  // ---- listener

  // The contexts a lost worker started are released here and on the workers they reached
  // from here: nobody is left to release them (its replacement, if one comes, starts its
  // own). Not waited for: this runs on an I/O thread.
  void on_worker_lost(const WorkerInfo& worker, const std::string&) override {
    std::vector<uint64_t> theirs;
    {
      MutexLock lock(mutex_);
      for (const auto& [id, state] : contexts_) {
        if (worker_of(id) == worker.id) theirs.push_back(id);
      }
    }
    for (uint64_t id : theirs)
      release(id, worker.id);
    if (!theirs.empty()) {
      GRADWIRE_LOG(kInfo) << "dist_autograd worker " << self_.describe() << ": released "
                          << theirs.size() << " contexts of lost worker " << worker.describe();
    }
  }

  void on_graceful_shutdown(Clock::time_point) override {
    std::vector<uint64_t> mine;
    {
      MutexLock lock(mutex_);
      for (const auto& [id, state] : contexts_) {
        if (worker_of(id) == self_.id) mine.push_back(id);
      }
    }
    for (uint64_t id : mine)
      release(id, -1).wait(agent_wait());
  }

  void on_closed() override {
    std::map<uint64_t, std::shared_ptr<ContextState>> dropped;
    MutexLock lock(mutex_);
    dropped.swap(contexts_);
    lock.unlock();
  }

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
  std::unordered_set<uint64_t> released_ GRADWIRE_GUARDED_BY(mutex_);
  std::deque<uint64_t> released_order_ GRADWIRE_GUARDED_BY(mutex_);

  friend class RecvBackward;
};

std::vector<Tensor> RecvBackward::apply(std::vector<Tensor>&& grads) {
  std::shared_ptr<Container> container = container_.lock();
  if (container == nullptr) throw Error("dist_autograd: the agent of this graph is gone");
  container->propagate(*this, std::move(grads));
  return {};
}

rpc::RpcAgent& default_agent_ref() {
  return *rpc::default_agent();
}

}  // namespace

uint64_t current_context_id() {
  return t_context;
}

Context::Context() : Context(default_agent_ref()) {}

Context::Context(rpc::RpcAgent& agent) : previous_(t_context) {
  std::shared_ptr<Container> container = Container::of(agent);
  agent_ = container->agent();
  id_ = container->create_context()->id;
  t_context = id_;
}

Context::~Context() {
  t_context = previous_;
  try {
    std::shared_ptr<Container> container = Container::of(*agent_);
    if (!container->release(id_, -1).wait(container->agent_wait())) {
      GRADWIRE_LOG(kWarning) << "dist_autograd: releasing context " << ctx_text(id_)
                             << " on the workers it touched did not finish in time";
    }
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kDebug) << "dist_autograd: releasing context " << ctx_text(id_) << ": "
                         << e.what();
  }
}

Gradients::Gradients(std::vector<std::pair<Tensor, Tensor>> items) : items_(std::move(items)) {
  index_.reserve(items_.size());
  for (size_t i = 0; i < items_.size(); ++i)
    index_.emplace(items_[i].first.impl_ptr().get(), i);
}

Tensor Gradients::at(const Tensor& leaf) const {
  auto it = index_.find(leaf.impl_ptr().get());
  if (it != index_.end()) return items_[it->second].second;
  throw InvalidArgument("dist_autograd: the context holds no gradient for this tensor (" +
                        std::to_string(items_.size()) + " leaves have one)");
}

bool Gradients::contains(const Tensor& leaf) const {
  return index_.count(leaf.impl_ptr().get()) != 0;
}

void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<Tensor>& roots,
              const BackwardOptions& options) {
  Container::of(agent)->backward(context_id, roots, options);
}
void backward(uint64_t context_id, const std::vector<Tensor>& roots,
              const BackwardOptions& options) {
  backward(default_agent_ref(), context_id, roots, options);
}
void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<Tensor>& roots,
              bool retain_graph) {
  backward(agent, context_id, roots, BackwardOptions{.retain_graph = retain_graph});
}
void backward(uint64_t context_id, const std::vector<Tensor>& roots, bool retain_graph) {
  backward(default_agent_ref(), context_id, roots, BackwardOptions{.retain_graph = retain_graph});
}
Gradients get_gradients(rpc::RpcAgent& agent, uint64_t context_id) {
  return Container::of(agent)->gradients(context_id);
}
Gradients get_gradients(uint64_t context_id) {
  return get_gradients(default_agent_ref(), context_id);
}
void release(rpc::RpcAgent& agent, uint64_t context_id) {
  std::shared_ptr<Container> container = Container::of(agent);
  container->get(context_id);
  container->release(context_id, -1).wait(container->agent_wait());
}
size_t num_contexts(rpc::RpcAgent& agent) {
  return Container::of(agent)->size();
}

namespace detail {
bool ensure_registered() {
  static const bool registered = [] {
    rpc::register_agent_extension("dist_autograd", &Container::install);
    return true;
  }();
  return registered;
}
namespace {
const bool kRegisteredHere = ensure_registered();
}  // namespace
}  // namespace detail

}  // namespace gradwire::dist_autograd
