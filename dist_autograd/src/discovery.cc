// Discovery: before any gradient flows, every worker in a pass learns which of its sends
// will get gradients (Discover), counting them in its part's graph task.
#include "container.h"

namespace gradwire::dist_autograd::internal {

std::shared_ptr<autograd::GraphTask> Container::start_part(
    const std::shared_ptr<ContextState>& state, uint64_t pass_id, bool retain_graph) {
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
  options.trace_context = state->id;
  pass.task = std::make_shared<autograd::GraphTask>(options);
  uint64_t& newest = state->newest_pass[worker_of(pass_id)];
  newest = std::max(newest, pass_id);
  // Until a Discover names them, every send here may still get gradients in this pass.
  update_hold(*state, pass_id);
  std::shared_ptr<autograd::GraphTask> task = pass.task;
  Future<void> outcome = pass.outcome;
  Future<void> done = pass.done;
  lock.unlock();
  // The part's end is recorded on the thread that ends it (the last node's, an abort's or
  // a release's; none holds a lock of this context), not after a hop through the pool: on
  // a participant the Wait's answer goes out from there, on the initiator backward() wakes.
  std::weak_ptr<ContextState> weak = state;
  gradwire::detail::on_complete_inline(outcome,
                                       [weak, pass_id, done](const Future<void>& part) mutable {
                                         if (auto s = weak.lock()) part_over(*s, pass_id, part);
                                         if (part.has_error()) {
                                           done.try_set_error(part.error());
                                         } else {
                                           done.try_set_value();
                                         }
                                       });
  gradwire::detail::forward_completion(task->completion(), outcome);
  return task;
}

Future<std::set<int>> Container::discover(const std::shared_ptr<ContextState>& state,
                                          uint64_t pass_id,
                                          const std::vector<autograd::Edge>& edges,
                                          bool retain_graph) {
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

Future<Value> Container::on_discover(const WorkerInfo& caller, const wire::Discover& d) {
  // Taking part and telling the workers further on (their answers come later).
  const trace::Span span("dist_autograd.discover_recv", "dist_autograd",
                         trace::Arg("context_id", d.context_id()), trace::Arg("caller", caller.id),
                         trace::Arg("sends", static_cast<int64_t>(d.message_ids_size())));
  std::shared_ptr<ContextState> state = get_for(d.context_id(), caller, "discovery");
  std::vector<std::shared_ptr<SendBackward>> sends;
  for (uint64_t m : d.message_ids())
    sends.push_back(send_from(*state, m, caller, "discovery"));
  std::shared_ptr<autograd::GraphTask> task = start_part(state, d.pass_id(), d.retain_graph());
  std::vector<autograd::Edge> edges;
  for (const auto& send : sends) {
    for (uint32_t i = 0; i < send->num_inputs(); ++i) {
      task->expect(autograd::Edge(send, i));
    }
    edges.push_back(autograd::Edge(send, 0));
  }
  {
    // Counted: what lies below only these sends may run as soon as its gradients are in.
    MutexLock lock(state->mutex);
    auto pass = state->passes.find(d.pass_id());
    if (pass != state->passes.end()) {
      pass->second.named.insert(d.message_ids().begin(), d.message_ids().end());
      update_hold(*state, d.pass_id());
    }
  }
  Future<std::set<int>> found = discover(state, d.pass_id(), edges, d.retain_graph());
  take_early(state, d.pass_id());
  // The answer is made on the thread that completes the discovery (a list of ints: no
  // hop through the pool for it).
  Future<Value> answer;
  gradwire::detail::on_complete_inline(found, [answer](const Future<std::set<int>>& done) mutable {
    if (done.has_error()) {
      answer.try_set_error(done.error());
      return;
    }
    try {
      const std::set<int>& workers = done.value();
      // Sized first and assigned in place: moving a Value into a growing vector here made
      // GCC 12 warn (wrongly) that the variant's inactive members may be used
      // uninitialised.
      Value::List ids(workers.size());
      size_t i = 0;
      for (int w : workers)
        ids[i++] = Value(int64_t{w});
      answer.try_set_value(Value::list(std::move(ids)));
    } catch (...) {
      answer.try_set_error(std::current_exception());
    }
  });
  return answer;
}

std::unordered_set<const autograd::Node*> Container::unnamed_reach(const ContextState& state,
                                                                   const Pass& pass) {
  std::unordered_set<const autograd::Node*> seen;
  std::vector<const autograd::Node*> stack;
  for (const auto& [m, send] : state.sends) {
    if (pass.named.count(m) == 0) stack.push_back(send.get());
  }
  while (!stack.empty()) {
    const autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    for (const auto& next : node->next_edges()) {
      if (next.is_valid() && seen.count(next.function.get()) == 0)
        stack.push_back(next.function.get());
    }
  }
  return seen;
}

void Container::update_hold(ContextState& state, uint64_t pass_id) {
  auto it = state.passes.find(pass_id);
  if (it == state.passes.end() || it->second.task == nullptr || it->second.discovered) return;
  // Under the context's lock (taken before the task's, never after): two Discovers
  // updating at once cannot leave the older, larger set in place.
  it->second.task->hold(unnamed_reach(state, it->second));
}

std::vector<EarlyGradients> Container::drop_early(ContextState& state, uint64_t pass_id) {
  std::vector<EarlyGradients> dropped;
  for (auto it = state.early.begin(); it != state.early.end();) {
    if (pass_id != 0 && it->first != pass_id) {
      ++it;
      continue;
    }
    for (EarlyGradients& e : it->second)
      dropped.push_back(std::move(e));
    it = state.early.erase(it);
  }
  return dropped;
}

void Container::refuse_early(std::vector<EarlyGradients> early, const std::exception_ptr& error) {
  for (EarlyGradients& e : early)
    e.answer.try_set_error(error);
}

void Container::run_soon(const std::shared_ptr<autograd::GraphTask>& task) {
  auto run = [task] {
    try {
      task->run_ready();
    } catch (...) {
      // The task holds the error: this worker's part fails with it.
    }
  };
  if (!rpc::run_after_reply(run)) agent()->executor()->execute(run);
}

void Container::take_early(const std::shared_ptr<ContextState>& state, uint64_t pass_id) {
  std::vector<EarlyGradients> taken;
  std::shared_ptr<autograd::GraphTask> task;
  {
    MutexLock lock(state->mutex);
    auto pass = state->passes.find(pass_id);
    auto early = state->early.find(pass_id);
    if (pass == state->passes.end() || pass->second.task == nullptr ||
        early == state->early.end()) {
      return;
    }
    task = pass->second.task;
    std::vector<EarlyGradients>& waiting = early->second;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (pass->second.named.count(it->message_id) == 0) {
        ++it;
        continue;
      }
      taken.push_back(std::move(*it));
      it = waiting.erase(it);
    }
    if (waiting.empty()) state->early.erase(early);
  }
  if (taken.empty()) return;
  for (EarlyGradients& e : taken) {
    try {
      for (uint32_t i = 0; i < e.grads.size(); ++i)
        task->add_gradient(autograd::Edge(e.send, i), std::move(e.grads[i]));
      e.answer.try_set_value(Value());
    } catch (...) {
      e.answer.try_set_error(std::current_exception());
    }
  }
  run_soon(task);
}

std::shared_ptr<autograd::GraphTask> Container::end_discovery(
    const std::shared_ptr<ContextState>& state, uint64_t pass_id) {
  std::shared_ptr<autograd::GraphTask> task;
  std::vector<EarlyGradients> unnamed;
  {
    MutexLock lock(state->mutex);
    auto pass = state->passes.find(pass_id);
    if (pass == state->passes.end() || pass->second.discovered) return nullptr;
    pass->second.discovered = true;
    task = pass->second.task;
    unnamed = drop_early(*state, pass_id);
  }
  if (!unnamed.empty()) {
    std::string ids;
    for (const EarlyGradients& e : unnamed)
      ids += (ids.empty() ? "" : ", ") + ctx_text(e.message_id);
    refuse_early(std::move(unnamed),
                 std::make_exception_ptr(CallRejected(
                     "dist_autograd: worker " + self_.describe() +
                     " expects no gradients for send " + ids + " in pass " + ctx_text(pass_id) +
                     " of context " + ctx_text(state->id) + " (no Discover named it)")));
  }
  if (task != nullptr) task->release_hold();
  return task;
}

}  // namespace gradwire::dist_autograd::internal
