// Execution: backward() at the initiator, and the gradients each RecvBackward sends on to
// the worker of its send (Propagate), which takes them and runs what they make ready.
#include "container.h"

#include "gradwire/autograd/engine.h"
#include "gradwire/core/logging.h"
#include "gradwire/rpc/join.h"

namespace gradwire::dist_autograd::internal {
namespace {

// The bytes a gradient puts on the wire: a sparse-rows one sends its row numbers and stored
// rows only, never the dense table it stands for.
uint64_t wire_bytes(const Tensor& g) {
  if (!g.defined()) return 0;
  if (g.is_sparse()) return g.indices().nbytes() + g.values().nbytes();
  return g.nbytes();
}

}  // namespace

void Container::backward(uint64_t ctx, const std::vector<Tensor>& roots,
                         const BackwardOptions& options) {
  std::shared_ptr<ContextState> state = get(ctx);
  check_backward(roots, options);
  std::vector<autograd::GraphRoot> graph_roots = autograd::make_roots(roots);
  {
    MutexLock lock(state->mutex);
    if (!state->apply(ContextEvent::kBackward)) {
      if (state->phase == ContextPhase::kBackward) {
        throw InvalidArgument("dist_autograd::backward: context " + ctx_text(ctx) +
                              " already runs a backward pass");
      }
      // Released between the look-up above and here.
      throw InvalidArgument("dist_autograd: worker " + self_.describe() + " has no context " +
                            ctx_text(ctx) + " (unknown, or already released)");
    }
  }
  const uint64_t pass_id = mint();
  const Clock::time_point deadline = deadline_after(options.timeout);
  // The whole pass as the initiator sees it, its release of a failed pass included.
  trace::Span span("dist_autograd.backward", "dist_autograd", trace::Arg("context_id", ctx),
                   trace::Arg("pass_id", pass_id),
                   trace::Arg("roots", static_cast<uint64_t>(roots.size())));
  try {
    run_pass(state, pass_id, graph_roots, options, deadline);
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    span.arg(trace::Arg("error", 1));
    abort_failed_pass(state, pass_id, error, deadline);
    end_pass(*state, pass_id);
    std::rethrow_exception(error);
  }
  end_pass(*state, pass_id);
  span.arg(trace::Arg("error", 0));
}

void Container::check_backward(const std::vector<Tensor>& roots, const BackwardOptions& options) {
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
}

void Container::run_pass(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                         const std::vector<autograd::GraphRoot>& graph_roots,
                         const BackwardOptions& options, Clock::time_point deadline) {
  const uint64_t ctx = state->id;
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
  const int64_t discovery_ns = trace::enabled() ? trace::now_ns() : 0;
  Future<Found> found = discover(state, pass_id, edges, options.retain_graph, /*back_to=*/-1);
  Future<Watched> watched = watch_when_discovered(state, pass_id, found, options, discovery_ns);
  // The backward starts while discovery goes on: what lies below only the roots runs now
  // (gradients it sends on wait at their receivers for the Discover that names their
  // send); what lies below a send here waits until a Discover names the send, or until
  // discovery is over.
  for (const auto& r : graph_roots)
    task->add_gradient(r.edge, r.grad);
  try {
    task->run_ready();
  } catch (...) {
    // The task holds the error; the wait below reports it.
  }
  if (!watched.wait(time_left(deadline))) throw timed_out();
  if (watched.has_error()) {
    // This worker's part may have failed first (gradients it sent on were refused), and
    // a Discover that reached it afterwards was refused for that: the cause is the part's.
    Future<void> own;
    {
      MutexLock lock(state->mutex);
      if (const Pass* pass = state->part(pass_id)) own = pass->outcome;
    }
    if (own.completed() && own.has_error()) own.get();
  }
  const std::set<int> workers = watched.value().workers;
  std::vector<Future<void>> parts = watched.value().parts;
  Future<void> all = rpc::join_fail_fast(parts);
  // Discovery is over everywhere (every Discover was answered, so every one sent here was
  // taken): nothing is held any more. The thread that took the last answer ended the hold
  // before letting this one go, and finished the part if nothing was left to run; what is
  // left runs here.
  try {
    task->run_ready();
  } catch (...) {
    // The task holds the error; the wait below reports it.
  }
  {
    // The initiator waits for every worker's part (its own included) to end.
    const trace::Span wait("dist_autograd.wait", "dist_autograd", trace::Arg("context_id", ctx),
                           trace::Arg("pass_id", pass_id),
                           trace::Arg("workers", static_cast<uint64_t>(workers.size())));
    if (!all.wait(time_left(deadline))) throw timed_out();
  }
  all.value();
}

Future<Container::Watched> Container::watch_when_discovered(
    const std::shared_ptr<ContextState>& state, uint64_t pass_id, const Future<Found>& found,
    const BackwardOptions& options, int64_t discovery_ns) {
  // What discovery's end starts (the Waits, the watch for the last part) starts where it
  // ends, on the thread that takes the last answer: the initiator's thread, blocked in
  // backward(), would be woken first, and on a machine whose cores are all busy that
  // wake-up can come late, with every Wait (and an early optimizer step) after it.
  Future<Watched> watched;
  std::weak_ptr<Container> weak_self = weak_from_this();
  gradwire::detail::on_complete_inline(found, [weak_self, state, pass_id, discovery_ns,
                                               on_last_part = options.on_last_part,
                                               hook_inline = options.on_last_part_inline,
                                               watched](const Future<Found>& done) mutable {
    if (done.has_error()) {
      watched.try_set_error(done.error());
      return;
    }
    try {
      std::shared_ptr<Container> self = weak_self.lock();
      if (self == nullptr) throw Error("dist_autograd: the agent of this pass is gone");
      const std::set<int>& workers = done.value().workers;
      if (discovery_ns != 0) {
        trace::complete("dist_autograd.discovery", "dist_autograd", discovery_ns, trace::now_ns(),
                        {trace::Arg("context_id", state->id), trace::Arg("pass_id", pass_id),
                         trace::Arg("workers", static_cast<uint64_t>(workers.size()))});
      }
      Watched parts = self->watch_parts(state, pass_id, workers, on_last_part, hook_inline);
      // Discovery is over everywhere: nothing here is held any more. A part whose
      // nodes all ran meanwhile (a trainer's, once it sent the logits' gradient)
      // then ends here, and with it perhaps every part but one (the last-part
      // watch, dist_optim's early step), instead of once backward()'s thread,
      // blocked in run_pass, has woken. A part with work left runs it there; the hold
      // ends before that thread is let go, so that what it runs can finish.
      if (std::shared_ptr<autograd::GraphTask> open = self->end_discovery(state, pass_id)) {
        try {
          open->finish_if_idle();
        } catch (...) {
          // The task holds the error; backward()'s wait reports it.
        }
      }
      watched.try_set_value(std::move(parts));
    } catch (...) {
      watched.try_set_error(std::current_exception());
    }
  });
  return watched;
}

void Container::abort_failed_pass(const std::shared_ptr<ContextState>& state, uint64_t pass_id,
                                  const std::exception_ptr& error, Clock::time_point deadline) {
  // Every worker the pass reached takes back what it gave and records the failure
  // before backward reports it (so a step right after it cannot use partial gradients).
  // The wait is the pass's: bounded by what is left of its deadline (plus a small margin,
  // for the aborts of a pass that failed at its deadline) and by rpc_timeout. Aborts that
  // take longer still go on; a worker they miss keeps its part until the context ends.
  std::chrono::milliseconds abort_wait = agent_wait();
  if (deadline != Clock::time_point::max())
    abort_wait = std::min(abort_wait, time_left(deadline) + kAbortMargin);
  if (!abort(state, pass_id, error_text(error), -1).wait(abort_wait)) {
    GRADWIRE_LOG(kWarning) << "dist_autograd worker " << self_.describe() << ": the abort of pass "
                           << ctx_text(pass_id) << " in context " << ctx_text(state->id)
                           << " did not reach every worker in time";
  }
}

Container::Watched Container::watch_parts(
    const std::shared_ptr<ContextState>& state, uint64_t pass_id, const std::set<int>& workers,
    const std::function<void(uint64_t, const rpc::WorkerInfo&)>& on_last_part, bool hook_inline) {
  Watched watched;
  watched.workers = workers;
  Future<void> own;
  {
    // The pass may have ended here while discovery went on (its deadline passed): no Wait
    // goes out for it then.
    MutexLock lock(state->mutex);
    const Pass* pass = state->part(pass_id);
    if (pass == nullptr || aborted(pass->phase)) {
      throw Error("dist_autograd: pass " + ctx_text(pass_id) + " of context " +
                  ctx_text(state->id) + " ended on worker " + self_.describe() +
                  " before its discovery did");
    }
    own = pass->done;
  }
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  // Every part reports when it is done; the first failure ends the pass.
  for (int w : workers) {
    if (w != self_.id)
      watched.parts.push_back(watch_part(state, pass_id, agent->get_worker_info(w)));
  }
  watched.parts.push_back(std::move(own));
  if (on_last_part) watch_for_last_part(pass_id, workers, watched.parts, on_last_part, hook_inline);
  return watched;
}

void Container::watch_for_last_part(
    uint64_t pass_id, const std::set<int>& workers, const std::vector<Future<void>>& parts,
    const std::function<void(uint64_t, const rpc::WorkerInfo&)>& on_last_part, bool hook_inline) {
  // `parts` holds the other workers' parts in `workers`' order, then this worker's.
  struct Left {
    Mutex mutex;
    std::set<int> running GRADWIRE_GUARDED_BY(mutex);
    bool over GRADWIRE_GUARDED_BY(mutex) = false;  // a part failed, or the call was made
  };
  auto left = std::make_shared<Left>();
  std::vector<int> order;
  for (int w : workers) {
    if (w != self_.id) order.push_back(w);
  }
  order.push_back(self_.id);
  if (order.size() < 2) return;  // this worker alone: nobody else to ask
  {
    MutexLock lock(left->mutex);
    left->running.insert(order.begin(), order.end());
  }
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  std::weak_ptr<rpc::RpcAgent> weak_agent = agent;
  const int self_id = self_.id;
  for (size_t i = 0; i < parts.size() && i < order.size(); ++i) {
    gradwire::detail::on_complete_inline(
        parts[i], [left, worker = order[i], self_id, pass_id, weak_agent, on_last_part,
                   hook_inline](const Future<void>& part) {
          int last = -1;
          {
            MutexLock lock(left->mutex);
            if (left->over) return;
            if (part.has_error()) {
              left->over = true;
              return;
            }
            left->running.erase(worker);
            if (left->running.size() != 1 || *left->running.begin() == self_id) return;
            left->over = true;
            last = *left->running.begin();
          }
          // On the pool, unless the hook said it never blocks (on_last_part_inline): then
          // here, on the thread that ended the last part but one, which may be a
          // transport's, without a pool thread's wake-up before what it sends.
          auto call = [weak_agent, pass_id, last, on_last_part] {
            try {
              std::shared_ptr<rpc::RpcAgent> agent = weak_agent.lock();
              if (agent != nullptr) on_last_part(pass_id, agent->get_worker_info(last));
            } catch (const std::exception& e) {
              GRADWIRE_LOG(kWarning) << "dist_autograd: BackwardOptions::on_last_part for pass "
                                     << ctx_text(pass_id) << " threw: " << e.what();
            }
          };
          if (hook_inline) {
            call();
            return;
          }
          std::shared_ptr<rpc::RpcAgent> agent = weak_agent.lock();
          if (agent == nullptr) return;
          try {
            agent->executor()->execute(std::move(call));
          } catch (const std::exception& e) {
            GRADWIRE_LOG(kWarning) << "dist_autograd: BackwardOptions::on_last_part for pass "
                                   << ctx_text(pass_id) << " not called: " << e.what();
          }
        });
  }
}

void Container::propagate(const RecvBackward& recv, std::vector<Tensor>&& grads) {
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
  // Handing the gradients to the rpc agent (its rpc.call span follows them to the receiver).
  trace::Span span("dist_autograd.propagate", "dist_autograd", trace::Arg("context_id", state->id),
                   trace::Arg("peer", recv.from().id), trace::Arg("message_id", recv.message_id()));
  if (span.active()) {
    uint64_t bytes = 0;
    for (const Tensor& g : grads)
      bytes += wire_bytes(g);
    span.arg(trace::Arg("bytes", bytes));
  }
  wire::DistAutogradMessage message;
  wire::Propagate* p = message.mutable_propagate();
  p->set_context_id(state->id);
  p->set_pass_id(pass_id);
  p->set_message_id(recv.message_id());
  std::vector<Value> args;
  args.reserve(grads.size());
  for (Tensor& g : grads) {
    if (g.defined()) {
      args.emplace_back(std::move(g));
    } else {
      args.emplace_back();  // None: no gradient for this input
    }
  }
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

std::exception_ptr Container::undelivered(const std::exception_ptr& error, const WorkerInfo& to,
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

Future<Value> Container::on_propagate(const WorkerInfo& caller, const wire::Propagate& p,
                                      const std::vector<Value>& args) {
  // Taking the gradients (what they make ready runs afterwards, as dist_autograd.node spans).
  trace::Span span("dist_autograd.propagate_recv", "dist_autograd",
                   trace::Arg("context_id", p.context_id()), trace::Arg("caller", caller.id),
                   trace::Arg("message_id", p.message_id()));
  if (span.active()) {
    uint64_t bytes = 0;
    for (const Value& g : args)
      bytes += g.type() == rpc::ValueType::kTensor ? wire_bytes(g.as_tensor()) : 0;
    span.arg(trace::Arg("bytes", bytes));
  }
  std::shared_ptr<ContextState> state = get_for(p.context_id(), caller, "gradient");
  std::shared_ptr<SendBackward> send = send_from(*state, p.message_id(), caller, "gradient");
  if (args.size() != send->num_inputs()) {
    throw CallRejected("dist_autograd: send " + ctx_text(p.message_id()) + " takes " +
                       std::to_string(send->num_inputs()) + " gradients, got " +
                       std::to_string(args.size()));
  }
  auto refused = [&](const char* why) {
    return CallRejected("dist_autograd: worker " + self_.describe() +
                        " expects no gradients for send " + ctx_text(p.message_id()) + " in pass " +
                        ctx_text(p.pass_id()) + " of context " + ctx_text(p.context_id()) + " (" +
                        why + ")");
  };
  std::shared_ptr<autograd::GraphTask> task;
  {
    MutexLock lock(state->mutex);
    const PassPhase phase = state->pass_phase(p.pass_id());
    if (aborted(phase)) throw refused("aborted");
    const Pass* pass = state->part(p.pass_id());
    if (pass == nullptr) {
      // Reported here, or older than the newest pass of its initiator that was here.
      auto newest = state->newest_pass.find(worker_of(p.pass_id()));
      if (phase == PassPhase::kReported ||
          (newest != state->newest_pass.end() && p.pass_id() <= newest->second)) {
        throw refused("over");
      }
    } else if (pass->task == nullptr) {
      throw refused("over");
    } else if (pass->named.count(p.message_id()) != 0) {
      task = pass->task;
    } else if (phase == PassPhase::kRunning) {
      throw refused("not discovered");
    }
    if (task == nullptr) {
      Future<Value> answer = keep_early(*state, pass != nullptr, p, send, args);
      span.arg(trace::Arg("early", 1));
      return answer;
    }
  }
  for (uint32_t i = 0; i < send->num_inputs(); ++i) {
    const Value& g = args[i];
    task->add_gradient(autograd::Edge(send, i), g.is_none() ? Tensor() : g.as_tensor());
  }
  // Taken: the sender hears so now, and what the gradients made ready runs on the pool
  // (however long it takes; a failure there is this worker's part's, and its Wait's).
  run_soon(task);
  return make_ready_future(Value());
}

Future<Value> Container::keep_early(ContextState& state, bool runs_here, const wire::Propagate& p,
                                    const std::shared_ptr<SendBackward>& send,
                                    const std::vector<Value>& args) const {
  // Ahead of the Discover that names this send (discovery overlaps the backward): kept
  // until it comes, answered then. Bounded per pass this worker runs, and once for the
  // passes it has not started: gradients for passes that may never come here cannot
  // crowd out those of a pass that runs (whose discovery ends, taking or refusing them).
  size_t kept = 0;
  for (const auto& [id, waiting] : state.early) {
    const bool counts = runs_here ? id == p.pass_id() : state.part(id) == nullptr;
    if (counts) kept += waiting.size();
  }
  if (kept >= ContextState::kMaxEarly) {
    throw CallRejected("dist_autograd: worker " + self_.describe() + " already holds " +
                       std::to_string(ContextState::kMaxEarly) +
                       " gradients that came ahead of their discovery in context " +
                       ctx_text(p.context_id()) +
                       (runs_here ? " for pass " + ctx_text(p.pass_id())
                                  : std::string(" for passes it has not started")) +
                       "; refused those for send " + ctx_text(p.message_id()));
  }
  EarlyGradients early;
  early.message_id = p.message_id();
  early.send = send;
  for (uint32_t i = 0; i < send->num_inputs(); ++i) {
    early.grads.push_back(args[i].is_none() ? Tensor() : args[i].as_tensor());
    // Refused now, as they would be when taken.
    autograd::GraphTask::check_gradient(autograd::Edge(send, i), early.grads.back());
  }
  Future<Value> answer = early.answer;
  state.early[p.pass_id()].push_back(std::move(early));
  return answer;
}

std::vector<Tensor> RecvBackward::apply(std::vector<Tensor>&& grads) {
  std::shared_ptr<Container> container = container_.lock();
  if (container == nullptr) throw Error("dist_autograd: the agent of this graph is gone");
  container->propagate(*this, std::move(grads));
  return {};
}

}  // namespace gradwire::dist_autograd::internal
