// Release: a context ends here and wherever it went from here; the contexts of a lost worker
// end where they reached.
#include "container.h"

#include "gradwire/core/error_kind_of.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "gradwire/rpc/join.h"

namespace gradwire::dist_autograd::internal {

Future<void> Container::release(uint64_t ctx, int from, const std::string& lost) {
  // Released for a lost worker: the cause is recorded as the context leaves the table, so
  // that a request in it arriving from then on (the initiator's Wait) hears the cause, not
  // "unknown". Its members so far are read first (a context's mutex is not taken under the
  // table's); one added since is added below.
  std::shared_ptr<ContextState> state = lost.empty() ? nullptr : find(ctx);
  std::set<int> members;
  if (state != nullptr) {
    MutexLock lock(state->mutex);
    members = state->touched;
  }
  Future<void> released;
  {
    MutexLock lock(mutex_);
    auto it = contexts_.find(ctx);
    if (it == contexts_.end()) {
      // Being released here already: a Release sent again (its first attempt's answer was
      // late) is answered when that release is, so an answer still means "gone everywhere
      // from here".
      auto going = releasing_.find(ctx);
      return going == releasing_.end() ? make_ready_future() : going->second;
    }
    state = std::move(it->second);
    contexts_.erase(it);
    remember_released(ctx);
    if (!lost.empty()) remember_lost(ctx, members, lost);
    releasing_.emplace(ctx, released);
  }
  std::set<int> touched;
  std::vector<Future<void>> parts;
  std::vector<EarlyGradients> early;
  {
    MutexLock lock(state->mutex);
    state->apply(ContextEvent::kRelease);
    touched = state->touched;
    for (const auto& [id, pass] : state->passes) {
      if (holds_part(pass.phase)) parts.push_back(pass.outcome);
    }
    early = drop_early(*state, 0);
  }
  if (!lost.empty() && touched != members) {
    MutexLock lock(mutex_);
    remember_lost(ctx, touched, lost);
  }
  // Parts still running end here, so that their Waits are answered.
  const std::string what = "dist_autograd: context " + ctx_text(ctx) + " was released on worker " +
                           self_.describe() + " during the pass";
  for (Future<void>& part : parts) {
    // Released because a worker was lost: the pass failed for the lost connection.
    part.try_set_error(lost.empty() ? std::make_exception_ptr(Error(what))
                                    : std::make_exception_ptr(NetworkError(what + ": " + lost)));
  }
  refuse_early(std::move(early), lost.empty()
                                     ? std::make_exception_ptr(CallRejected(what))
                                     : std::make_exception_ptr(NetworkError(what + ": " + lost)));
  tell_released(ctx, from, lost, touched, state, released);
  return released;
}

void Container::tell_released(uint64_t ctx, int from, const std::string& lost,
                              const std::set<int>& touched,
                              const std::weak_ptr<ContextState>& weak_state,
                              Future<void> released) {
  std::weak_ptr<Container> weak_self = weak_from_this();
  auto settle = [weak_self, weak_state, ctx, released](const Future<void>&) mutable {
    if (auto self = weak_self.lock()) {
      MutexLock lock(self->mutex_);
      self->releasing_.erase(ctx);
    }
    if (auto s = weak_state.lock()) {
      MutexLock lock(s->mutex);
      s->apply(ContextEvent::kTold);
    }
    released.try_set_value();
  };
  std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
  if (agent == nullptr || agent->is_shut_down()) {
    settle(make_ready_future());
    return;
  }
  std::vector<Future<Value>> told;
  for (int w : touched) {
    if (w == from || w == self_.id) continue;
    wire::DistAutogradMessage message;
    message.mutable_release()->set_context_id(ctx);
    message.mutable_release()->set_lost(lost);
    try {
      Future<Value> done;
      send_release(agent->get_worker_info(w), message, kReleaseAttempts, done);
      told.push_back(std::move(done));
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kDebug) << "dist_autograd worker " << self_.describe()
                           << ": the release of context " << ctx_text(ctx)
                           << " was not sent: " << e.what();
    }
  }
  // A worker that is gone, or never had it, does not hold it: failures only end the wait.
  gradwire::detail::on_complete_inline(rpc::join_settled(told), std::move(settle));
}

void Container::send_release(const WorkerInfo& to, const wire::DistAutogradMessage& message,
                             int attempts_left, Future<Value> result) {
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  const std::chrono::milliseconds budget = agent->options().rpc_timeout;
  const std::chrono::milliseconds attempt =
      budget == kNoTimeout ? kNoTimeout
                           : std::max(budget / kReleaseAttempts, std::chrono::milliseconds(1));
  Future<Value> reply = try_send(to, message, "release", {}, rpc::CallOptions{.timeout = attempt});
  std::weak_ptr<Container> weak_self = weak_from_this();
  reply.add_callback(agent->executor(), [weak_self, to, message, attempts_left,
                                         result](Future<Value> done) mutable {
    if (!done.has_error()) {
      result.try_set_value(Value());
      return;
    }
    // Not answered: the request or its reply was lost on the way (a timeout, a connection
    // closed under it). A refusal is the receiver's answer, and a worker that is gone holds
    // nothing; in both cases sending again would change nothing.
    const ErrorKind kind = error_kind_of(done.error());
    const bool again = kind == ErrorKind::kTimeout || kind == ErrorKind::kNetwork;
    std::shared_ptr<Container> self = weak_self.lock();
    if (!again || attempts_left <= 1 || self == nullptr) {
      if (again) {
        GRADWIRE_LOG(kDebug) << "dist_autograd: the release of context "
                             << ctx_text(message.release().context_id()) << " did not reach worker "
                             << to.describe() << " in " << kReleaseAttempts
                             << " attempts: " << error_text(done.error());
      }
      result.try_set_error(done.error());
      return;
    }
    try {
      self->send_release(to, message, attempts_left - 1, result);
    } catch (...) {
      result.try_set_error(std::current_exception());  // the agent has shut down
    }
  });
}

Future<Value> Container::on_release(const WorkerInfo& caller, const wire::Release& r) {
  const uint64_t id = r.context_id();
  if (find(id) == nullptr) {
    // Unknown here: never seen, or already released; nothing to do, whoever asks. Its
    // creator's release is remembered, though: a request in it still on its way (one
    // that timed out, say) must not make it here after its end.
    // Released by another participant before it came here: that participant's request in
    // it (one that timed out on the way) must not make it either.
    if (worker_of(id) == caller.id) {
      remember_released_unseen(id);
    } else {
      remember_released_by(id, caller.id);
    }
    return make_ready_future(Value());
  }
  get_for(id, caller, "release");
  trace::instant("dist_autograd.release_recv", "dist_autograd",
                 {trace::Arg("context_id", id), trace::Arg("caller", caller.id)});
  std::string lost;
  if (!r.lost().empty()) lost = printable(r.lost(), kMaxReasonBytes);
  return answer_when(release(id, caller.id, lost));
}

void Container::remember_lost(uint64_t ctx, const std::set<int>& touched, const std::string& lost) {
  if (LostWhy* known = lost_why_.find(ctx)) {
    known->members.insert(touched.begin(), touched.end());
    return;
  }
  LostWhy entry{"dist_autograd: context " + ctx_text(ctx) + " was released on worker " +
                    self_.describe() + ": " + lost,
                touched};
  entry.members.insert(worker_of(ctx));
  lost_why_.put(ctx, std::move(entry));
}

void Container::on_worker_lost(const WorkerInfo& worker, const std::string& reason) {
  std::vector<uint64_t> theirs;
  std::vector<std::shared_ptr<ContextState>> others;
  {
    MutexLock lock(mutex_);
    for (const auto& [id, state] : contexts_) {
      if (worker_of(id) == worker.id) {
        theirs.push_back(id);
      } else if (worker_of(id) != self_.id) {
        others.push_back(state);
      }
    }
  }
  // Reached here only through the lost worker (a call it nested in its creator's pass):
  // nobody alive knows that this worker holds it, and only the lost worker's Release would
  // have come. (This worker's own contexts are released by it, their creator, as usual.)
  for (const std::shared_ptr<ContextState>& state : others) {
    MutexLock state_lock(state->mutex);
    if (state->touched.size() == 1 && state->touched.count(worker.id) != 0)
      theirs.push_back(state->id);
  }
  const std::string lost = "worker " + self_.describe() + " lost worker " + worker.describe() +
                           (reason.empty() ? std::string() : " (" + reason + ")");
  for (uint64_t id : theirs)
    release(id, worker.id, lost);
  if (!theirs.empty()) {
    GRADWIRE_LOG(kInfo) << "dist_autograd worker " << self_.describe() << ": released "
                        << theirs.size() << " contexts of lost worker " << worker.describe();
  }
}

void Container::on_graceful_shutdown(Clock::time_point) {
  std::vector<uint64_t> mine;
  {
    MutexLock lock(mutex_);
    for (const auto& [id, state] : contexts_) {
      if (worker_of(id) == self_.id) mine.push_back(id);
    }
  }
  for (uint64_t id : mine)
    release(id, -1).wait(agent_wait());
  // Releases still going (a Context's end does not wait for them): the workers they go to
  // must hear of them before this one stops answering and sending again.
  std::vector<Future<void>> going;
  {
    MutexLock lock(mutex_);
    for (const auto& [id, released] : releasing_)
      going.push_back(released);
  }
  for (Future<void>& released : going)
    released.wait(agent_wait());
}

void Container::on_closed() {
  std::map<uint64_t, std::shared_ptr<ContextState>> dropped;
  MutexLock lock(mutex_);
  dropped.swap(contexts_);
  lock.unlock();
}

}  // namespace gradwire::dist_autograd::internal
