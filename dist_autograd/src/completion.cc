// Completion: each worker's part of a pass ends, is reported to the initiator (Wait) or
// aborted everywhere the pass reached (Abort), and the context remembers how it ended.
#include "container.h"

#include "gradwire/core/error_kind_of.h"
#include "gradwire/core/printable.h"
#include "gradwire/rpc/join.h"

namespace gradwire::dist_autograd::internal {

Future<void> Container::watch_part(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                                   const WorkerInfo& to, Future<void> result) {
  wire::DistAutogradMessage message;
  message.mutable_wait()->set_context_id(state->id);
  message.mutable_wait()->set_pass_id(pass_id);
  Future<Value> reply = try_send(to, message, "wait");
  std::weak_ptr<Container> weak_self = weak_from_this();
  std::weak_ptr<ContextState> weak_state = state;
  std::shared_ptr<Executor> executor = agent()->executor();
  // A part that ended well is recorded on the thread that has its answer (the initiator's
  // wait ends without a hop through the pool); a failure is looked at on the pool.
  gradwire::detail::on_complete_inline(reply, [executor, weak_self, weak_state, pass_id, to,
                                               result](const Future<Value>& answered) mutable {
    if (!answered.has_error()) {
      result.try_set_value();
      return;
    }
    try {
      executor->execute([weak_self, weak_state, pass_id, to, result, answered]() mutable {
        retry_wait(weak_self, weak_state, pass_id, to, result, answered);
      });
    } catch (...) {
      result.try_set_error(answered.error());
    }
  });
  return result;
}

void Container::retry_wait(const std::weak_ptr<Container>& weak_self,
                           const std::weak_ptr<ContextState>& weak_state, uint64_t pass_id,
                           const WorkerInfo& to, Future<void> result, const Future<Value>& done) {
  std::shared_ptr<Container> self = weak_self.lock();
  std::shared_ptr<ContextState> s = weak_state.lock();
  bool ask_again = false;
  if (error_kind_of(done.error()) == ErrorKind::kTimeout && self != nullptr && s != nullptr) {
    // Asked again while the pass goes on here: its part holds, and it was not aborted.
    MutexLock lock(s->mutex);
    const PassPhase phase = s->pass_phase(pass_id);
    ask_again = holds_part(phase) && !aborted(phase);
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
}

std::pair<std::shared_ptr<ContextState>, Future<void>> Container::part_for(const WorkerInfo& caller,
                                                                           uint64_t ctx,
                                                                           uint64_t pass_id,
                                                                           const char* what) {
  // Only the pass's initiator (who minted its id) waits for it.
  if (worker_of(pass_id) != caller.id) {
    throw CallRejected("dist_autograd: worker " + self_.describe() + " refused a " + what +
                       " for pass " + ctx_text(pass_id) + " from worker " + caller.describe() +
                       ", which did not start it");
  }
  std::shared_ptr<ContextState> state = get_for(ctx, caller, what);
  {
    MutexLock lock(state->mutex);
    // Its part holds here; or it is the last reported pass, asked again after its answer
    // was lost or late, or asked after the Wait's answer.
    const PassPhase phase = state->pass_phase(pass_id);
    if (holds_part(phase) || phase == PassPhase::kReported ||
        phase == PassPhase::kAbortedReported) {
      return {state, state->passes.at(pass_id).done};
    }
  }
  throw CallRejected("dist_autograd: worker " + self_.describe() + " takes no part in pass " +
                     ctx_text(pass_id));
}

Future<Value> Container::on_wait(const WorkerInfo& caller, const wire::Wait& w) {
  auto [state, done] = part_for(caller, w.context_id(), w.pass_id(), "wait");
  // The initiator asks only once discovery is over everywhere: nothing here is held any
  // more, and what that made ready runs on the pool.
  if (std::shared_ptr<autograd::GraphTask> task = end_discovery(state, w.pass_id())) {
    run_soon(task);
  }
  // Answered on the thread that ends this worker's part (no hop through the pool).
  std::weak_ptr<ContextState> weak = state;
  const uint64_t pass_id = w.pass_id();
  Future<Value> answer;
  gradwire::detail::on_complete_inline(done,
                                       [weak, pass_id, answer](const Future<void>& part) mutable {
                                         // This worker's part is over and reported.
                                         if (auto s = weak.lock()) forget_pass(*s, pass_id);
                                         if (part.has_error()) {
                                           answer.try_set_error(part.error());
                                         } else {
                                           answer.try_set_value(Value());
                                         }
                                       });
  return answer;
}

void Container::part_over(ContextState& state, uint64_t pass_id, const Future<void>& part) {
  std::shared_ptr<autograd::GraphTask> task;
  std::shared_ptr<PassSink> sink;
  bool failed = part.has_error();
  {
    MutexLock lock(state.mutex);
    const PassPhase was = state.pass_phase(pass_id);
    // A part reported before its outcome was set (its task let go) has nothing to finish.
    if (state.apply(pass_id, PassEvent::kPartEnds)) {
      Pass& pass = state.passes.at(pass_id);
      task = std::move(pass.task);
      sink = pass.sink;
    }
    if (aborted(was)) failed = true;
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

void Container::fail_part(ContextState& state, uint64_t pass_id, std::exception_ptr error) {
  Future<void> outcome;
  {
    MutexLock lock(state.mutex);
    const Pass* pass = state.part(pass_id);
    if (pass == nullptr) return;
    outcome = pass->outcome;
  }
  outcome.try_set_error(std::move(error));
}

void Container::forget_pass(ContextState& state, uint64_t pass_id) {
  std::shared_ptr<autograd::GraphTask> task;
  MutexLock lock(state.mutex);
  Pass* pass = state.part(pass_id);
  if (pass == nullptr) return;
  task = std::move(pass->task);
  state.apply(pass_id, PassEvent::kReport);
  std::vector<EarlyGradients> early = drop_early(state, pass_id);
  lock.unlock();
  refuse_early(std::move(early),
               std::make_exception_ptr(CallRejected(
                   "dist_autograd: gradients for pass " + ctx_text(pass_id) + " of context " +
                   ctx_text(state.id) + " came after this worker's part of it was over")));
}

void Container::end_pass(ContextState& state, uint64_t pass_id) {
  forget_pass(state, pass_id);
  MutexLock lock(state.mutex);
  state.apply(ContextEvent::kBackwardEnds);
}

Future<void> Container::abort(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                              const std::string& reason, int from) {
  Future<void> outcome;
  std::shared_ptr<PassSink> sink;
  std::set<int> touched;
  std::vector<EarlyGradients> early;
  {
    MutexLock lock(state->mutex);
    const PassPhase was = state->pass_phase(pass_id);
    if (!state->apply(pass_id, PassEvent::kAbort)) return make_ready_future();  // aborted
    const Pass& pass = state->passes.at(pass_id);
    if (holds_part(was)) {
      outcome = pass.outcome;
      sink = pass.sink;
    } else if (was == PassPhase::kReported) {
      sink = pass.sink;
    } else {
      // Never took part: nothing to take back or forward, but gradients that came early
      // for it are refused.
      early = drop_early(*state, pass_id);
      lock.unlock();
      refuse_early(std::move(early), std::make_exception_ptr(CallRejected(reason)));
      return make_ready_future();
    }
    state->failure.emplace(pass_id, reason);
    touched = state->touched;
    early = drop_early(*state, pass_id);
  }
  refuse_early(std::move(early), std::make_exception_ptr(CallRejected(reason)));
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

Future<Value> Container::on_abort(const WorkerInfo& caller, const wire::Abort& a) {
  // Unknown here (never seen, or already released): nothing to take back.
  if (find(a.context_id()) == nullptr) return make_ready_future(Value());
  std::shared_ptr<ContextState> state = get_for(a.context_id(), caller, "pass abort");
  const std::string reason = "dist_autograd: pass " + ctx_text(a.pass_id()) +
                             " was aborted by worker " + caller.describe() + ": " +
                             printable(a.reason(), kMaxReasonBytes);
  // Answered once the abort has been passed on, whatever came of that.
  return answer_when(abort(state, a.pass_id(), reason, caller.id));
}

Future<Value> Container::answer_when(const Future<void>& done) {
  if (done.completed()) return make_ready_future(Value());
  Future<Value> answer;
  gradwire::detail::on_complete_inline(
      done, [answer](const Future<void>&) mutable { answer.try_set_value(Value()); });
  return answer;
}

Gradients Container::gradients(uint64_t ctx) const {
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

}  // namespace gradwire::dist_autograd::internal
