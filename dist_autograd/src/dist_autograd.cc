// The dist-autograd container of one agent: its contexts, the send and recv functions
// recorded in them, and the passes that run backward through them. It is the agent's
// attachment, its handler (id 3), an interceptor (recording) and a listener (clean-up).
//
// Locking: mutex_ guards the table of contexts; each context has its own mutex for its
// functions, gradients and passes. No message is sent and no node runs under either.
#include "gradwire/dist_autograd/dist_autograd.h"

#include <deque>
#include <map>
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
// where those tensors came from.
class SendBackward : public autograd::Node {
 public:
  explicit SendBackward(const std::vector<Tensor>& sent) {
    for (const Tensor& t : sent) {
      add_input_metadata(t);
      add_next_edge(autograd::gradient_edge(t));
    }
  }
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override { return std::move(grads); }
  std::string name() const override { return "SendRpcBackward"; }
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

struct Pass {
  std::shared_ptr<autograd::GraphTask> task;
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

struct ContextState {
  explicit ContextState(uint64_t context_id) : id(context_id) {}
  const uint64_t id;
  const std::shared_ptr<ContextSink> sink = std::make_shared<ContextSink>();
  Mutex mutex;
  std::map<uint64_t, std::shared_ptr<SendBackward>> sends GRADWIRE_GUARDED_BY(mutex);
  std::set<int> touched GRADWIRE_GUARDED_BY(mutex);  // workers that know this context from here
  std::map<uint64_t, Pass> passes GRADWIRE_GUARDED_BY(mutex);
  bool running GRADWIRE_GUARDED_BY(mutex) = false;  // a backward() started here is running
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

  Future<Value> send(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                     std::string what, std::vector<Value> args = {}) {
    rpc::Request request;
    request.handler = kDistAutogradHandler;
    request.function = std::move(what);
    const std::string payload = message.SerializeAsString();
    request.payload.assign(payload.begin(), payload.end());
    request.args = std::move(args);
    return agent()->send(to, std::move(request));
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
      state->sends[message_id] = std::make_shared<SendBackward>(sent);
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
    state->sends[message_id] = std::make_shared<SendBackward>(sent);
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
      told.push_back(
          send(entry.first, message, "dist_autograd discovery in context " + ctx_text(state->id)));
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
    std::shared_ptr<ContextState> state = get(recv_context(recv));
    {
      MutexLock lock(state->mutex);
      for (const auto& [id, pass] : state->passes) {
        if (pass.task.get() == autograd::GraphTask::current()) pass_id = id;
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
    // Not waited for: the receiver's part of the pass reports through its Wait.
    send(recv.from(), message, "dist_autograd gradients in context " + ctx_text(state->id),
         std::move(args));
  }

  static uint64_t recv_context(const RecvBackward& recv);

  void backward(uint64_t ctx, const std::vector<Tensor>& roots, bool retain_graph) {
    std::shared_ptr<ContextState> state = get(ctx);
    if (roots.empty()) throw InvalidArgument("dist_autograd::backward: no roots");
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
    auto finish = [&] {
      std::shared_ptr<autograd::GraphTask> task;
      MutexLock lock(state->mutex);
      state->running = false;
      auto it = state->passes.find(pass_id);
      if (it != state->passes.end()) {
        task = std::move(it->second.task);
        state->passes.erase(it);
      }
      lock.unlock();
    };
    try {
      std::shared_ptr<autograd::GraphTask> task = make_task(state, pass_id, retain_graph);
      std::vector<autograd::Edge> edges;
      for (const auto& r : graph_roots) {
        task->expect(r.edge);
        edges.push_back(r.edge);
      }
      std::shared_ptr<rpc::RpcAgent> agent = this->agent();
      const auto timeout = agent->options().rpc_timeout;
      std::set<int> workers =
          discover(state, pass_id, edges, retain_graph).get(rpc::RpcAgent::wait_bound(timeout));
      // Every part reports when it is done; the first failure ends the pass.
      std::vector<Future<Value>> parts;
      for (int w : workers) {
        if (w == self_.id) continue;
        wire::DistAutogradMessage message;
        message.mutable_wait()->set_context_id(ctx);
        message.mutable_wait()->set_pass_id(pass_id);
        parts.push_back(send(agent->get_worker_info(w), message,
                             "dist_autograd backward in context " + ctx_text(ctx)));
      }
      Future<void> local = task->completion();
      parts.push_back(local.then(agent->executor(), [](Future<void> done) {
        done.value();
        return Value();
      }));
      Future<void> all = rpc::join_fail_fast(parts);
      for (const auto& r : graph_roots)
        task->add_gradient(r.edge, r.grad);
      try {
        task->run_ready();
      } catch (...) {
        // The task holds the error; the wait below reports it.
      }
      if (!all.wait(rpc::RpcAgent::wait_bound(timeout))) {
        throw TimeoutError("dist_autograd::backward in context " + ctx_text(ctx) +
                           " did not finish within " + std::to_string(timeout.count()) + " ms");
      }
      all.value();
    } catch (...) {
      finish();
      throw;
    }
    finish();
  }

  std::shared_ptr<autograd::GraphTask> make_task(const std::shared_ptr<ContextState>& state,
                                                 uint64_t pass_id, bool retain_graph) {
    MutexLock lock(state->mutex);
    Pass& pass = state->passes[pass_id];
    if (pass.task == nullptr) {
      autograd::ExecuteOptions options;
      options.retain_graph = retain_graph;
      options.sink = state->sink;
      pass.task = std::make_shared<autograd::GraphTask>(options);
    }
    return pass.task;
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
        std::shared_ptr<autograd::GraphTask> task = make_task(state, d.pass_id(), d.retain_graph());
        std::vector<autograd::Edge> edges;
        for (uint64_t m : d.message_ids()) {
          std::shared_ptr<SendBackward> send;
          {
            MutexLock lock(state->mutex);
            auto it = state->sends.find(m);
            if (it != state->sends.end()) send = it->second;
          }
          if (send == nullptr) {
            throw CallRejected("dist_autograd: worker " + self_.describe() + " recorded no send " +
                               ctx_text(m) + " in context " + ctx_text(d.context_id()) +
                               " (released, or its graph was freed by an earlier pass)");
          }
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
        std::shared_ptr<SendBackward> send;
        std::shared_ptr<autograd::GraphTask> task;
        {
          MutexLock lock(state->mutex);
          auto it = state->sends.find(p.message_id());
          if (it != state->sends.end()) send = it->second;
          auto pass = state->passes.find(p.pass_id());
          if (pass != state->passes.end()) task = pass->second.task;
        }
        if (send == nullptr || task == nullptr) {
          throw CallRejected("dist_autograd: worker " + self_.describe() +
                             " expects no gradients for send " + ctx_text(p.message_id()) +
                             " in context " + ctx_text(p.context_id()));
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
        task->run_ready();
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
        std::shared_ptr<autograd::GraphTask> task;
        {
          MutexLock lock(state->mutex);
          auto pass = state->passes.find(w.pass_id());
          if (pass != state->passes.end()) task = pass->second.task;
        }
        if (task == nullptr) {
          throw CallRejected("dist_autograd: worker " + self_.describe() +
                             " takes no part in pass " + ctx_text(w.pass_id()));
        }
        std::weak_ptr<ContextState> weak = state;
        const uint64_t pass_id = w.pass_id();
        return task->completion().then(agent()->executor(), [weak, pass_id](Future<void> done) {
          // This worker's part is over: its task is let go.
          if (auto s = weak.lock()) {
            std::shared_ptr<autograd::GraphTask> finished;
            MutexLock lock(s->mutex);
            auto it = s->passes.find(pass_id);
            if (it != s->passes.end()) {
              finished = std::move(it->second.task);
              s->passes.erase(it);
            }
            lock.unlock();
          }
          done.value();
          return Value();
        });
      }
      case wire::DistAutogradMessage::kRelease: {
        const uint64_t id = message.release().context_id();
        // Unknown here (never seen, or already released): nothing to do, whoever asks.
        if (find(id) == nullptr) return make_ready_future(Value());
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
    {
      MutexLock lock(state->mutex);
      touched = state->touched;
    }
    std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
    if (agent == nullptr || agent->is_shut_down()) return make_ready_future();
    std::vector<Future<Value>> told;
    for (int w : touched) {
      if (w == from || w == self_.id) continue;
      wire::DistAutogradMessage message;
      message.mutable_release()->set_context_id(ctx);
      try {
        told.push_back(send(agent->get_worker_info(w), message,
                            "dist_autograd release of context " + ctx_text(ctx)));
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

  Gradients gradients(uint64_t ctx) const { return Gradients(get(ctx)->sink->items()); }

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

uint64_t Container::recv_context(const RecvBackward& recv) {
  return recv.context_id();
}

rpc::RpcAgent& default_agent_ref() {
  return *rpc::default_agent();
}

}  // namespace

uint64_t current_context_id() {
  return t_context;
}

Context::Context() : Context(default_agent_ref()) {}

Context::Context(rpc::RpcAgent& agent) : agent_(&agent), previous_(t_context) {
  id_ = Container::of(agent)->create_context()->id;
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
              bool retain_graph) {
  Container::of(agent)->backward(context_id, roots, retain_graph);
}
void backward(uint64_t context_id, const std::vector<Tensor>& roots, bool retain_graph) {
  backward(default_agent_ref(), context_id, roots, retain_graph);
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
