// Discovery: every worker in a pass learns which of its sends will get gradients (Discover,
// or named back in the answer to one), counting them in its part's graph task.
#include "container.h"

#include <limits>

namespace gradwire::dist_autograd::internal {

std::shared_ptr<autograd::GraphTask> Container::start_part(
    const std::shared_ptr<ContextState>& state, uint64_t pass_id, bool retain_graph) {
  MutexLock lock(state->mutex);
  const PassPhase was = state->pass_phase(pass_id);
  if (!state->apply(pass_id, PassEvent::kStart)) {
    if (aborted(was)) {
      throw CallRejected("dist_autograd: worker " + self_.describe() + " already aborted pass " +
                         ctx_text(pass_id) + " in context " + ctx_text(state->id));
    }
    throw CallRejected("dist_autograd: worker " + self_.describe() + "'s part in pass " +
                       ctx_text(pass_id) + " is already over");
  }
  Pass& pass = state->passes.at(pass_id);
  if (was != PassPhase::kNone) return pass.task;  // a later Discover joins the running part
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

Future<Container::Found> Container::discover(const std::shared_ptr<ContextState>& state,
                                             uint64_t pass_id,
                                             const std::vector<autograd::Edge>& edges,
                                             bool retain_graph, int back_to) {
  Found here;
  here.workers.insert(self_.id);
  std::vector<WorkerInfo> asked;
  std::vector<Future<Value>> told;
  for (auto& [id, entry] : walk_to_recvs(*state, pass_id, edges, back_to, here.back)) {
    wire::DistAutogradMessage message;
    wire::Discover* d = message.mutable_discover();
    d->set_context_id(state->id);
    d->set_pass_id(pass_id);
    d->set_retain_graph(retain_graph);
    for (uint64_t m : entry.second)
      d->add_message_ids(m);
    asked.push_back(entry.first);
    told.push_back(try_send(entry.first, message, "discover"));
  }
  Future<Found> result;
  std::weak_ptr<Container> weak_self = weak_from_this();
  gradwire::detail::on_complete_inline(
      collect_all(std::move(told)), [weak_self, state, pass_id, retain_graph, back_to, asked, here,
                                     result](const Future<std::vector<Value>>& done) mutable {
        if (done.has_error()) {
          result.try_set_error(done.error());
          return;
        }
        std::shared_ptr<Container> self = weak_self.lock();
        std::vector<std::pair<WorkerInfo, std::vector<uint64_t>>> named;
        try {
          if (self == nullptr) throw Error("dist_autograd: the agent of this pass is gone");
          for (size_t i = 0; i < done.value().size() && i < asked.size(); ++i) {
            std::vector<uint64_t> back = self->read_answer(asked[i], done.value()[i], here);
            if (!back.empty()) named.emplace_back(asked[i], std::move(back));
          }
        } catch (...) {
          result.try_set_error(std::current_exception());
          return;
        }
        if (named.empty()) {
          result.try_set_value(std::move(here));
          return;
        }
        self->take_named_back(state, pass_id, retain_graph, back_to, std::move(named),
                              std::move(here), result);
      });
  return result;
}

Container::ToTell Container::walk_to_recvs(ContextState& state, uint64_t pass_id,
                                           const std::vector<autograd::Edge>& edges, int back_to,
                                           std::vector<uint64_t>& back) {
  ToTell to_tell;
  std::vector<autograd::Node*> stack;
  std::set<autograd::Node*> seen;
  for (const auto& e : edges) {
    if (e.is_valid()) stack.push_back(e.function.get());
  }
  MutexLock lock(state.mutex);
  // The recv functions whose sender this part told; a pass that holds no part here any
  // more (reported while this walk was on its way) records none.
  std::set<const autograd::Node*> unrecorded;
  Pass* pass = state.part(pass_id);
  std::set<const autograd::Node*>& notified = pass != nullptr ? pass->notified : unrecorded;
  while (!stack.empty()) {
    autograd::Node* node = stack.back();
    stack.pop_back();
    if (!seen.insert(node).second) continue;
    if (auto* recv = dynamic_cast<RecvBackward*>(node)) {
      if (notified.insert(recv).second) {
        if (recv->from().id == back_to) {
          // The worker whose Discover this answers: told in the answer, one round trip
          // less than a Discover of its own (and nothing sent while this worker computes).
          back.push_back(recv->message_id());
        } else {
          auto& entry = to_tell[recv->from().id];
          entry.first = recv->from();
          entry.second.push_back(recv->message_id());
        }
      }
      continue;
    }
    for (const auto& next : node->next_edges()) {
      if (next.is_valid()) stack.push_back(next.function.get());
    }
  }
  return to_tell;
}

void Container::take_named_back(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                                bool retain_graph, int back_to,
                                std::vector<std::pair<WorkerInfo, std::vector<uint64_t>>> named,
                                Found here, Future<Found> result) {
  // Taken on the pool (walking on from them is no work for the transport thread that has
  // the answer), and this discovery completes once what that told has answered too.
  auto take = [self = shared_from_this(), state, pass_id, retain_graph, back_to, named, here,
               result]() mutable {
    std::vector<Future<Found>> more;
    try {
      for (const auto& [from, sends] : named)
        more.push_back(self->take_named(state, from, pass_id, sends, retain_graph, back_to));
    } catch (...) {
      result.try_set_error(std::current_exception());
      return;
    }
    gradwire::detail::on_complete_inline(
        collect_all(std::move(more)),
        [here, result](const Future<std::vector<Found>>& taken) mutable {
          if (taken.has_error()) {
            result.try_set_error(taken.error());
            return;
          }
          for (const Found& f : taken.value()) {
            here.workers.insert(f.workers.begin(), f.workers.end());
            here.back.insert(here.back.end(), f.back.begin(), f.back.end());
          }
          result.try_set_value(std::move(here));
        });
  };
  try {
    agent()->executor()->execute(std::move(take));
  } catch (...) {
    result.try_set_error(std::current_exception());
  }
}

std::vector<uint64_t> Container::read_answer(const WorkerInfo& from, const Value& answer,
                                             Found& found) const {
  auto malformed = [&](const char* why) {
    return Error("dist_autograd: worker " + self_.describe() +
                 " got a malformed answer to its Discover from worker " + from.describe() + ": " +
                 why);
  };
  if (answer.type() != rpc::ValueType::kList || answer.as_list().size() != 2 ||
      answer.as_list()[0].type() != rpc::ValueType::kList ||
      answer.as_list()[1].type() != rpc::ValueType::kList) {
    throw malformed("expected a list of two lists (workers, sends named back)");
  }
  for (const Value& w : answer.as_list()[0].as_list()) {
    if (w.type() != rpc::ValueType::kInt || w.as_int() < 0 ||
        w.as_int() > std::numeric_limits<int>::max()) {
      throw malformed("a worker id that is not an int in [0, 2^31)");
    }
    found.workers.insert(static_cast<int>(w.as_int()));
  }
  std::vector<uint64_t> back;
  for (const Value& m : answer.as_list()[1].as_list()) {
    if (m.type() != rpc::ValueType::kInt) throw malformed("a send id that is not an int");
    back.push_back(static_cast<uint64_t>(m.as_int()));
  }
  return back;
}

Future<Container::Found> Container::take_named(const std::shared_ptr<ContextState>& state,
                                               const WorkerInfo& from, uint64_t pass_id,
                                               const std::vector<uint64_t>& ids, bool retain_graph,
                                               int back_to) {
  std::vector<std::shared_ptr<SendBackward>> sends;
  for (uint64_t m : ids)
    sends.push_back(send_from(*state, m, from, "discovery"));
  {
    // Each send gets its gradients once per pass: a send named again would wait for
    // gradients that never come. Refused before the pass is made here.
    MutexLock lock(state->mutex);
    const Pass* pass = state->part(pass_id);
    std::set<uint64_t> seen;
    for (uint64_t m : ids) {
      if (!seen.insert(m).second || (pass != nullptr && pass->named.count(m) != 0)) {
        throw CallRejected("dist_autograd: worker " + self_.describe() + " refused send " +
                           ctx_text(m) + " named again by worker " + from.describe() + " in pass " +
                           ctx_text(pass_id) + " of context " + ctx_text(state->id));
      }
    }
  }
  std::shared_ptr<autograd::GraphTask> task = start_part(state, pass_id, retain_graph);
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
    if (Pass* pass = state->part(pass_id)) {
      pass->named.insert(ids.begin(), ids.end());
      update_hold(*state, pass_id);
    }
  }
  Future<Found> found = discover(state, pass_id, edges, retain_graph, back_to);
  take_early(state, pass_id);
  return found;
}

Future<Value> Container::on_discover(const WorkerInfo& caller, const wire::Discover& d) {
  // Taking part and telling the workers further on (their answers come later).
  const trace::Span span("dist_autograd.discover_recv", "dist_autograd",
                         trace::Arg("context_id", d.context_id()), trace::Arg("caller", caller.id),
                         trace::Arg("sends", static_cast<int64_t>(d.message_ids_size())));
  std::shared_ptr<ContextState> state = get_for(d.context_id(), caller, "discovery");
  const std::vector<uint64_t> ids(d.message_ids().begin(), d.message_ids().end());
  Future<Found> found = take_named(state, caller, d.pass_id(), ids, d.retain_graph(), caller.id);
  // The answer is made on the thread that completes the discovery (lists of ints: no hop
  // through the pool for it): the workers reached, and the caller's sends reached.
  Future<Value> answer;
  gradwire::detail::on_complete_inline(found, [answer](const Future<Found>& done) mutable {
    if (done.has_error()) {
      answer.try_set_error(done.error());
      return;
    }
    try {
      const Found& f = done.value();
      // Sized first and assigned in place: moving a Value into a growing vector here makes
      // GCC 12 warn (wrongly) that the variant's inactive members may be used
      // uninitialised.
      Value::List workers(f.workers.size());
      size_t i = 0;
      for (int w : f.workers)
        workers[i++] = Value(int64_t{w});
      Value::List back(f.back.size());
      for (size_t j = 0; j < f.back.size(); ++j)
        back[j] = Value(static_cast<int64_t>(f.back[j]));
      Value::List both(2);
      both[0] = Value::list(std::move(workers));
      both[1] = Value::list(std::move(back));
      answer.try_set_value(Value::list(std::move(both)));
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
  Pass* pass = state.part(pass_id);
  if (pass == nullptr || pass->phase != PassPhase::kDiscovering || pass->task == nullptr) return;
  // Under the context's lock (taken before the task's, never after): two Discovers
  // updating at once cannot leave the older, larger set in place.
  pass->task->hold(unnamed_reach(state, *pass));
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
    const Pass* pass = state->part(pass_id);
    auto early = state->early.find(pass_id);
    if (pass == nullptr || pass->task == nullptr || early == state->early.end()) return;
    task = pass->task;
    std::vector<EarlyGradients>& waiting = early->second;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if (pass->named.count(it->message_id) == 0) {
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
    if (!state->apply(pass_id, PassEvent::kDiscoveryOver)) return nullptr;
    task = state->passes.at(pass_id).task;
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
