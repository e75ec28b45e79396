#include "dispatcher.h"

#include <optional>

#include "gradwire/core/error.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "gradwire/core/trace.h"
#include "text.h"

namespace gradwire::rpc::detail {
namespace {

// How much of a peer's error reply its caller is shown: the whole text of any error a worker
// raises itself, and every worker name (at most 128 bytes in the envelope by default).
constexpr size_t kShownRemoteMessageBytes = 4096;
constexpr size_t kShownRemoteWorkerBytes = 256;

std::exception_ptr error_of_kind(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return std::make_exception_ptr(InvalidArgument(message));
    case ErrorKind::kTimeout:
      return std::make_exception_ptr(TimeoutError(message));
    case ErrorKind::kNetwork:
      return std::make_exception_ptr(NetworkError(message));
    case ErrorKind::kStore:
      return std::make_exception_ptr(StoreError(message));
    case ErrorKind::kBusy:
      return std::make_exception_ptr(BusyError(message));
    default:
      return std::make_exception_ptr(Error(message));
  }
}

// The dispatcher whose request (handler or reply) runs on this thread.
thread_local const Dispatcher* t_serving = nullptr;
// What run_after_reply queued for the request served on this thread (null: none served).
thread_local std::vector<std::function<void()>>* t_after_reply = nullptr;
// How many SendingMarks are alive on this thread.
thread_local int t_sending = 0;

// Collects run_after_reply's work for one request and runs it as the request's serving ends
// (after its reply, or after the handler returned an unfinished result).
class AfterReply {
 public:
  AfterReply() : previous_(t_after_reply) { t_after_reply = &work_; }
  ~AfterReply() {
    t_after_reply = previous_;
    for (size_t i = 0; i < work_.size(); ++i) {
      try {
        work_[i]();
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kError) << "rpc: work to run after a reply threw: " << e.what();
      } catch (...) {
        GRADWIRE_LOG(kError) << "rpc: work to run after a reply threw";
      }
    }
  }
  AfterReply(const AfterReply&) = delete;
  AfterReply& operator=(const AfterReply&) = delete;

 private:
  std::vector<std::function<void()>>* previous_;
  std::vector<std::function<void()>> work_;
};

// Hides the enclosing request's run_after_reply list while a request served inline runs.
class NoAfterReply {
 public:
  NoAfterReply() : previous_(t_after_reply) { t_after_reply = nullptr; }
  ~NoAfterReply() { t_after_reply = previous_; }
  NoAfterReply(const NoAfterReply&) = delete;
  NoAfterReply& operator=(const NoAfterReply&) = delete;

 private:
  std::vector<std::function<void()>>* previous_;
};

class ServingMark {
 public:
  explicit ServingMark(const Dispatcher* dispatcher) : previous_(t_serving) {
    t_serving = dispatcher;
  }
  ~ServingMark() { t_serving = previous_; }
  ServingMark(const ServingMark&) = delete;
  ServingMark& operator=(const ServingMark&) = delete;

 private:
  const Dispatcher* previous_;
};

// Enters every scope for a stretch of work on this thread, and exits them in reverse.
class ScopesEntered {
 public:
  explicit ScopesEntered(const std::vector<std::shared_ptr<ServeScope>>& scopes) : scopes_(scopes) {
    for (const auto& s : scopes_)
      s->enter();
  }
  ~ScopesEntered() {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      (*it)->exit();
  }
  ScopesEntered(const ScopesEntered&) = delete;
  ScopesEntered& operator=(const ScopesEntered&) = delete;

 private:
  const std::vector<std::shared_ptr<ServeScope>>& scopes_;
};

}  // namespace

Dispatcher::Dispatcher(WorkerInfo self, ReplyWriter& writer)
    : self_(std::move(self)),
      writer_(writer),
      interceptors_(std::make_shared<const Interceptors>()) {
  // rpc/ owns the call handler: registered functions, by name. serve() calls the function it
  // looked up itself; the entry reserves the id and names it.
  auto handlers = std::make_shared<Handlers>();
  handlers->emplace(kCallHandler,
                    HandlerEntry{"call",
                                 [this](const CallContext& context, const Request& request) {
                                   return context.agent()->registry().invoke(
                                       context, request.function, request.args, executor_);
                                 },
                                 Execution::kPool, nullptr});
  handlers_.store(std::move(handlers), std::memory_order_release);
}

void Dispatcher::register_handler(uint32_t id, std::string name, MessageHandler handler,
                                  Execution execution, ExecutionChooser choose) {
  if (!handler)
    throw InvalidArgument("rpc: register_handler(" + std::to_string(id) + ", '" + name +
                          "') was given an empty handler");
  MutexLock lock(changes_mutex_);
  std::shared_ptr<const Handlers> now = handlers_.load(std::memory_order_acquire);
  auto it = now->find(id);
  if (it != now->end()) {
    throw InvalidArgument("rpc: handler id " + std::to_string(id) + " ('" + name +
                          "') is already taken by '" + it->second.name + "'");
  }
  auto next = std::make_shared<Handlers>(*now);
  next->emplace(id,
                HandlerEntry{std::move(name), std::move(handler), execution, std::move(choose)});
  handlers_.store(std::move(next), std::memory_order_release);
}

Execution Dispatcher::execution_of(const HandlerEntry& entry, const Request& request) {
  if (!entry.choose) return entry.execution;
  try {
    return entry.choose(request);
  } catch (...) {
    return Execution::kPool;  // the handler itself says what is wrong with the request
  }
}

void Dispatcher::add_interceptor(std::shared_ptr<Interceptor> interceptor) {
  if (interceptor == nullptr) throw InvalidArgument("rpc: add_interceptor(nullptr)");
  MutexLock lock(changes_mutex_);
  auto next = std::make_shared<Interceptors>(*interceptors_.load(std::memory_order_acquire));
  next->push_back(std::move(interceptor));
  interceptors_.store(std::move(next), std::memory_order_release);
}

void Dispatcher::start(std::shared_ptr<Executor> executor) {
  executor_ = std::move(executor);
}

SendingMark::SendingMark() {
  ++t_sending;
}
SendingMark::~SendingMark() {
  --t_sending;
}
bool sending_on_this_thread() {
  return t_sending > 0;
}

ThreadPool& Dispatcher::inline_thread() {
  std::call_once(inline_once_, [this] {
    inline_thread_ =
        std::make_unique<ThreadPool>(ThreadPoolOptions{.num_threads = 1, .name = "gw-inline"});
  });
  return *inline_thread_;
}

bool Dispatcher::serving_on_this_thread() const {
  return t_serving == this;
}

void Dispatcher::serve(std::shared_ptr<RpcAgent> agent, std::shared_ptr<Link> from, Request request,
                       size_t tensor_bytes, bool on_executor) {
  std::shared_ptr<const Handlers> handlers = handlers_.load(std::memory_order_acquire);
  auto it = handlers->find(request.handler);
  const HandlerEntry* entry = it == handlers->end() ? nullptr : &it->second;
  // A call is looked up once: the entry says where it runs and is what runs.
  std::shared_ptr<const RegisteredFunction> function;
  if (request.handler == kCallHandler) function = agent->registry().find(request.function);
  Timing timing;
  if (function != nullptr)
    timing.stats = &served_stats_.entry(request.function, from->peer.id, from->peer.name);
  if (timing.stats != nullptr || trace::enabled()) timing.arrived_ns = trace::now_ns();
  const bool inline_execution =
      function != nullptr ? function->execution() == Execution::kInline
                          : entry != nullptr && execution_of(*entry, request) == Execution::kInline;
  // A thread inside a send (SendingMark) that took this request from TensorPipe's loop runs
  // nothing of it: an inline request goes to the inline thread, the others to the pool.
  const bool sending = sending_on_this_thread();
  const bool runs_inline = inline_execution && !sending;
  // Functions and handlers that asked for it run right here, on the thread that received
  // the request (an I/O thread, or the executor when tensors had to be copied first); so
  // does everything else when that thread is already the executor's.
  if (runs_inline || on_executor) {
    // Work queued to follow the reply (run_after_reply) is refused on an I/O thread: it is
    // posted to the pool instead.
    run(agent, from, request, handlers, entry, function, tensor_bytes, timing,
        /*after_reply_here=*/on_executor);
    return;
  }
  try {
    if (inline_execution) {
      // Served as on an I/O thread: what it asks to run after its reply goes to the pool.
      inline_thread().execute([this, agent, from, request = std::move(request), handlers, entry,
                               function, tensor_bytes, timing]() mutable {
        run(agent, from, request, handlers, entry, function, tensor_bytes, timing,
            /*after_reply_here=*/false);
      });
      return;
    }
    executor_->execute([this, agent, from, request = std::move(request), handlers, entry, function,
                        tensor_bytes, timing]() mutable {
      run(agent, from, request, handlers, entry, function, tensor_bytes, timing,
          /*after_reply_here=*/true);
    });
  } catch (const Error&) {
    writer_.request_done(*from, tensor_bytes);
  }
}

void Dispatcher::run(const std::shared_ptr<RpcAgent>& agent, const std::shared_ptr<Link>& from,
                     Request& request, const std::shared_ptr<const Handlers>& handlers,
                     const HandlerEntry* entry,
                     const std::shared_ptr<const RegisteredFunction>& function, size_t tensor_bytes,
                     Timing timing, bool after_reply_here) {
  // Destroyed last: what the handler asked to run after its reply runs once it is written,
  // outside the request's scopes. Not on an I/O thread, where run_after_reply refuses.
  std::optional<AfterReply> after_reply;
  if (after_reply_here) after_reply.emplace();
  // Served inline: no enclosing request collects its work. (serve() hands inline requests
  // that reach a thread inside a call into TensorPipe to the inline thread; this holds for
  // any other transport a dispatcher serves.)
  std::optional<NoAfterReply> no_after_reply;
  if (!after_reply_here) no_after_reply.emplace();
  ServingMark serving(this);
  if (timing.arrived_ns != 0) timing.started_ns = trace::now_ns();
  std::shared_ptr<const Interceptors> interceptors = this->interceptors();
  ServeScopes scopes;
  Future<Value> result;
  bool failed = false;
  try {
    for (const auto& interceptor : *interceptors) {
      if (auto scope = interceptor->on_incoming_request(from->peer, request))
        scopes.push_back(std::move(scope));
    }
  } catch (...) {
    result = make_failed_future<Value>(std::current_exception());
    failed = true;
  }
  {
    ScopesEntered entered(scopes);
    if (!failed) result = invoke(agent, *from, request, entry, function);
    if (result.completed()) {
      respond(from, request, result, tensor_bytes, *interceptors, timing);
      return;
    }
  }
  // The reply is written inside the same scopes by the thread that completes the result
  // when that is one of the pool's workers outside any request's handler (the last node of
  // a backward part answering a Wait, a continuation ending): it is done with its task, and
  // posting the reply would wake another worker only to write it. Else (a transport thread,
  // a handler completing another request's result, a thread of the application) it is
  // posted to the pool.
  auto reply = std::make_shared<std::function<void(const Future<Value>&)>>(
      [this, agent, from, tensor_bytes, scopes = std::move(scopes),
       interceptors = std::move(interceptors), request = std::move(request),
       timing](const Future<Value>& done) {
        ServingMark serving(this);
        ScopesEntered entered(scopes);
        respond(from, request, done, tensor_bytes, *interceptors, timing);
      });
  reply_when_done(result, std::move(reply));
}

Future<Value> Dispatcher::invoke(const std::shared_ptr<RpcAgent>& agent, const Link& from,
                                 const Request& request, const HandlerEntry* entry,
                                 const std::shared_ptr<const RegisteredFunction>& function) {
  try {
    // What is registered is not listed to the caller: a peer learns only that the
    // name it sent is unknown (the worker's own log and registry() have the list).
    if (entry == nullptr) {
      throw CallRejected("worker " + self_.describe() + " has no handler with id " +
                         std::to_string(request.handler));
    }
    const CallContext context(agent.get(), from.peer, request.id,
                              request.timeout.count() > 0
                                  ? deadline_after(request.timeout)
                                  : std::chrono::steady_clock::time_point::max());
    if (request.handler == kCallHandler) {
      return function != nullptr
                 ? function->invoke(context, request.args, executor_)
                 : make_failed_future<Value>(std::make_exception_ptr(CallRejected(
                       "no function '" + printable(request.function) + "' is registered")));
    }
    return entry->handler(context, request);
  } catch (...) {
    return make_failed_future<Value>(std::current_exception());
  }
}

void Dispatcher::reply_when_done(const Future<Value>& result,
                                 std::shared_ptr<std::function<void(const Future<Value>&)>> reply) {
  gradwire::detail::on_complete_inline(result, [this, reply](const Future<Value>& done) {
    auto write = [reply, done] {
      try {
        (*reply)(done);
      } catch (const std::exception& e) {
        GRADWIRE_LOG(kError) << "rpc: writing a reply failed: " << e.what();
      }
    };
    if (t_serving == nullptr && executor_->on_own_thread()) {
      write();
      return;
    }
    try {
      executor_->execute(std::move(write));
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc: the pool refused to write a reply: " << e.what();
    }
  });
}

void Dispatcher::respond(const std::shared_ptr<Link>& from, const Request& request,
                         const Future<Value>& result, size_t tensor_bytes,
                         const Interceptors& interceptors, const Timing& timing) {
  Response response;
  response.id = request.id;
  response.autograd_context_id = request.autograd_context_id;
  response.autograd_message_id = request.autograd_message_id;
  if (result.has_error()) {
    response.result = error_reply(result.error());
  } else {
    response.result = result.value();
  }
  size_t saw = 0;  // the interceptors that saw the reply
  size_t bytes_out = 0;
  int64_t end_ns = 0;
  try {
    for (const auto& interceptor : interceptors) {
      ++saw;
      interceptor->on_outgoing_response(from->peer, request, response);
    }
    // Serving ends as the reply is handed over, before it can reach the caller.
    end_ns = timing.arrived_ns != 0 ? trace::now_ns() : 0;
    const bool written = writer_.write_reply(from, request, response, /*plain=*/false, &bytes_out);
    if (end_ns != 0)
      served(from, request, tensor_bytes, bytes_out, result.has_error(), timing, end_ns);
    if (!written) {
      // A fault rule dropped it: never written, as if its write had failed, and no error
      // reply goes in its place (the caller times out).
      for (size_t i = 0; i < saw; ++i) {
        try {
          interceptors[i]->on_response_not_sent(from->peer, request, response);
        } catch (...) {
          // Must not throw (agent.h).
        }
      }
    }
  } catch (...) {
    // They learn that it was not written: an error reply goes instead.
    for (size_t i = 0; i < saw; ++i) {
      try {
        interceptors[i]->on_response_not_sent(from->peer, request, response);
      } catch (...) {
        // Must not throw (agent.h); the error reply still goes.
      }
    }
    ErrorReply reply = error_reply(std::current_exception());
    reply.message = "the reply to " + describe_call(request.handler, request.function) +
                    " could not be sent: " + reply.message;
    response.result = std::move(reply);
    bytes_out = 0;
    if (timing.arrived_ns != 0) end_ns = trace::now_ns();
    writer_.write_reply(from, request, response, /*plain=*/true, &bytes_out);
    if (timing.arrived_ns != 0)
      served(from, request, tensor_bytes, bytes_out, true, timing, end_ns);
  }
  writer_.request_done(*from, tensor_bytes);
}

void Dispatcher::served(const std::shared_ptr<Link>& from, const Request& request, size_t bytes_in,
                        size_t bytes_out, bool error, const Timing& timing, int64_t end_ns) {
  if (trace::enabled()) {
    // A function registered here is traced by its name; what else a request names (a name
    // nothing here has, another handler's description of its request) is the peer's, and is
    // traced escaped.
    const bool registered = timing.stats != nullptr;
    const std::string escaped =
        registered ? std::string() : printable(request.function, trace::kTextBytes);
    const trace::Text function{
        "function", registered ? std::string_view(request.function) : std::string_view(escaped)};
    trace::complete("rpc.queue", "rpc", timing.arrived_ns, timing.started_ns,
                    {trace::Arg("peer", from->peer.id), trace::Arg("request_id", request.id)},
                    &function);
    trace::complete("rpc.serve", "rpc", timing.started_ns, end_ns,
                    {trace::Arg("peer", from->peer.id), trace::Arg("request_id", request.id),
                     trace::Arg("bytes_in", static_cast<uint64_t>(bytes_in)),
                     trace::Arg("bytes_out", static_cast<uint64_t>(bytes_out)),
                     trace::Arg("error", error ? 1 : 0)},
                    &function);
  }
  // Counted last: whoever sees the count sees the spans too.
  if (timing.stats != nullptr) {
    timing.stats->record(end_ns - timing.started_ns, error, bytes_out, bytes_in);
  }
}

ErrorReply Dispatcher::error_reply(std::exception_ptr error) const {
  try {
    std::rethrow_exception(std::move(error));
  } catch (const RemoteError& e) {
    // Raised further down a chain of calls (A -> B -> C): the reply names where it came
    // from and what it was there, not this worker.
    ErrorKind kind = ErrorKind::kError;
    for (ErrorKind k : {ErrorKind::kInvalidArgument, ErrorKind::kTimeout, ErrorKind::kNetwork,
                        ErrorKind::kStore}) {
      if (error_kind_name(k) == e.remote_type()) kind = k;
    }
    return ErrorReply{kind, e.remote_message(), e.worker(), false};
  } catch (const CallRejected& e) {
    return ErrorReply{ErrorKind::kInvalidArgument, e.what(), self_.name, /*rejected=*/true};
  } catch (const Error& e) {
    return ErrorReply{e.kind(), e.what(), self_.name, false};
  } catch (const std::exception& e) {
    return ErrorReply{ErrorKind::kError, e.what(), self_.name, false};
  } catch (...) {
    return ErrorReply{ErrorKind::kError, "an exception that is not a std::exception", self_.name,
                      false};
  }
}

std::exception_ptr Dispatcher::reply_error(const ErrorReply& reply, const WorkerInfo& to,
                                           uint32_t handler, const std::string& function) {
  // The text and the worker name are the peer's: shown escaped, and cut. Relayed escaping
  // keeps backslashes, so that the names a peer's message quotes escaped already, and an error
  // passed on along a chain of calls, are escaped once.
  const std::string message = printable_relayed(reply.message, kShownRemoteMessageBytes);
  if (reply.rejected) {
    return error_of_kind(reply.kind, "rpc: worker " + to.describe() + " refused " +
                                         describe_call(handler, function) + ": " + message);
  }
  return std::make_exception_ptr(RemoteError(
      reply.worker.empty() ? to.name : printable_relayed(reply.worker, kShownRemoteWorkerBytes),
      std::string(error_kind_name(reply.kind)), message));
}

}  // namespace gradwire::rpc::detail

namespace gradwire::rpc {

bool run_after_reply(std::function<void()> fn) {
  if (detail::t_after_reply == nullptr || !fn) return false;
  detail::t_after_reply->push_back(std::move(fn));
  return true;
}

}  // namespace gradwire::rpc
