// The TensorPipe agent: requests and replies written to a connection, as the fault rules
// (AgentOptions::faults) decide.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include "gradwire/core/logging.h"
#include "gradwire/core/trace.h"
#include "text.h"

namespace gradwire::rpc::detail {

void TensorPipeAgent::release_unsent(const Request& request) const {
  for (const auto& interceptor : *dispatcher_.interceptors()) {
    try {
      interceptor->on_request_not_sent(request);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << self_.describe()
                           << ": an interceptor's on_request_not_sent threw: " << e.what();
    }
  }
}

void TensorPipeAgent::send_request(const Destination& to, Request request, CallOptions options,
                                   ReplyCallback done) {
  WorkerInfo target;
  std::shared_ptr<Connection> conn;
  try {
    target = get_worker_info(to);
    if (options.timeout.count() < 0) {
      throw InvalidArgument("rpc: " + describe_call(request.handler, request.function) +
                            " to worker " + target.describe() + " was given a negative timeout (" +
                            ms_text(options.timeout) + ")");
    }
    conn = connection_to(target, request);
  } catch (...) {
    // No interceptor saw the request: they learn here that it never left.
    release_unsent(request);
    throw;
  }
  const std::chrono::milliseconds timeout = effective_timeout(options);
  const uint64_t id = calls_.next_id();
  request.id = id;
  std::shared_ptr<const Dispatcher::Interceptors> interceptors = dispatcher_.interceptors();
  // The wire says "no timeout" with 0.
  request.timeout = timeout == kNoTimeout ? std::chrono::milliseconds(0) : timeout;
  PendingCall call{std::move(done),  target,  request.handler,
                   request.function, timeout, conn->serial,
                   interceptors,     {},      id};
  call.states.reserve(interceptors->size());
  call.started_ns = trace::now_ns();
  if (request.handler == kCallHandler)
    call.stats = &call_stats_.entry(request.function, target.id, target.name);
  // Loans are tied to the connection they travel on: losing it ends them.
  Lending lending{target.id, conn->serial, {}};
  EncodedMessage message;
  FaultDecision fault;
  try {
    for (const auto& interceptor : *interceptors)
      call.states.push_back(interceptor->on_outgoing_request(target, request));
    request.id = id;  // the agent's, whatever an interceptor did
    fault = decide_fault(target, /*is_reply=*/false, request.handler, request.function);
    message = encode(Envelope{std::move(request)}, device_mapper(group_.route_to(target.id)),
                     kDefaultInlineTensorBytes, lender_for(lending));
    call.bytes_out = wire_bytes(message);
  } catch (...) {
    abandon_unencoded(call, request, lending);
    throw;
  }
  // A close that began meanwhile refuses the call here, as it would have before encoding;
  // one that begins after add() fails it through its callback.
  std::optional<PendingCall> refused;
  if (!calls_.add(call)) {
    refused = std::move(call);
  } else if (!running_.load(std::memory_order_acquire)) {
    refused = calls_.take(id);
  }
  if (refused) {
    return_loans(lending.taken, conn->serial);
    refused->done = nullptr;
    calls_.finish(*refused, Value(), nullptr, CallOutcome::kShutDown);
    MutexLock lock(mutex_);
    refuse_locked("send " + refused->what() + " to worker " + target.describe());
  }
  // A message that never left cannot be copied from: its loans end (the connection may
  // have been lost before they were made, so its own clean-up missed them).
  return_unsent_loans(fault, lending);
  // A dropped request stays pending until its deadline, as one lost on the way would.
  apply_fault(fault, conn, std::move(message),
              request_written(id, target, std::move(lending.taken), conn->serial));
}

void TensorPipeAgent::abandon_unencoded(PendingCall& call, const Request& request,
                                        const Lending& lending) {
  return_loans(lending.taken, lending.connection);
  // The interceptors that saw the request learn that it never left; the caller gets the
  // error thrown, not through its callback. The one that refused it, and those after it,
  // are told as for a request that never reached them.
  const std::shared_ptr<const Dispatcher::Interceptors> interceptors = call.interceptors;
  call.done = nullptr;
  const size_t saw = call.states.size();
  calls_.finish(call, Value(), std::current_exception(), CallOutcome::kNotSent);
  for (size_t i = saw; i < interceptors->size(); ++i) {
    try {
      (*interceptors)[i]->on_request_not_sent(request);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << self_.describe()
                           << ": an interceptor's on_request_not_sent threw: " << e.what();
    }
  }
}

std::function<void(const std::string&)> TensorPipeAgent::request_written(uint64_t id,
                                                                         const WorkerInfo& target,
                                                                         std::vector<Loan> taken,
                                                                         uint64_t serial) {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  return [weak, id, target, taken = std::move(taken), serial](const std::string& error) {
    if (error.empty()) return;
    auto self = weak.lock();
    if (self == nullptr) return;
    self->return_loans(taken, serial);
    std::optional<PendingCall> lost = self->calls_.take(id, serial);
    if (!lost) return;
    self->calls_.finish(
        *lost, Value(),
        std::make_exception_ptr(NetworkError("rpc: " + lost->what() + " to worker " +
                                             target.describe() + " could not be sent: " + error)),
        CallOutcome::kNotSent);
  };
}

FaultDecision TensorPipeAgent::decide_fault(const WorkerInfo& to, bool is_reply, uint32_t handler,
                                            const std::string& function) const {
  if (!options_.faults) return {};
  return options_.faults->decide(OutgoingMessage{self_, to, is_reply, handler, function});
}

void TensorPipeAgent::return_unsent_loans(const FaultDecision& decision, Lending& lending) {
  if (decision.verdict != FaultDecision::Verdict::kDrop &&
      decision.verdict != FaultDecision::Verdict::kCut)
    return;
  return_loans(lending.taken, lending.connection);
  lending.taken.clear();
}

void TensorPipeAgent::apply_fault(const FaultDecision& decision,
                                  const std::shared_ptr<Connection>& conn, EncodedMessage message,
                                  std::function<void(const std::string&)> on_done) {
  switch (decision.verdict) {
    case FaultDecision::Verdict::kSend:
      write(conn, std::move(message), std::move(on_done));
      return;
    case FaultDecision::Verdict::kDrop:
      return;
    case FaultDecision::Verdict::kCut:
      // Both ends then see the connection lost; the reason this side gives names the rule.
      conn->cut.store(true, std::memory_order_release);
      close_pipe(conn->pipe);
      return;
    case FaultDecision::Verdict::kDelay: {
      std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
      auto held = std::make_shared<EncodedMessage>(std::move(message));
      options_.faults->run_later(decision.delay, [weak, conn, held, on_done = std::move(on_done)] {
        // An agent that has gone meanwhile sends nothing; its calls have failed already.
        if (auto self = weak.lock()) self->write(conn, std::move(*held), on_done);
      });
      return;
    }
  }
}

void TensorPipeAgent::write(const std::shared_ptr<Connection>& conn, EncodedMessage message,
                            std::function<void(const std::string&)> on_done) {
  auto keep = std::make_shared<std::vector<Tensor>>(std::move(message.tensors));
  tp::Message out;
  out.metadata = std::move(message.payload);
  out.tensors.reserve(keep->size());
  for (const Tensor& t : *keep) {
    tp::Message::Tensor tensor;
    tensor.buffer = tp::CpuBuffer{buffer_of(t)};
    tensor.length = t.nbytes();
    // The receiver always takes TensorPipe's part of a message into host memory (a device
    // map is applied after). Saying so up front lets TensorPipe send the tensor's bytes with
    // its descriptor; without a target it first waits for the receiver to name one (a
    // descriptor reply: a round trip more for every message that carries a tensor).
    tensor.targetDevice = tp::Device{tp::kCpuDeviceType, 0};
    out.tensors.push_back(std::move(tensor));
  }
  // This thread may run TensorPipe's loop meanwhile, and so take other messages: no
  // request among them runs here (SendingMark).
  const SendingMark sending;
  conn->pipe->write(std::move(out), [keep, on_done = std::move(on_done)](const tp::Error& error) {
    if (on_done) on_done(error ? error.what() : std::string());
  });
}

bool TensorPipeAgent::write_reply(const std::shared_ptr<Link>& link, const Request& request,
                                  const Response& response, bool plain, size_t* bytes) {
  std::shared_ptr<Connection> conn = std::static_pointer_cast<Connection>(link);
  const FaultDecision fault =
      decide_fault(conn->peer, /*is_reply=*/true, request.handler, request.function);
  const bool written = fault.verdict != FaultDecision::Verdict::kDrop;
  if (plain) {
    EncodedMessage message = encode(Envelope{response});
    if (bytes != nullptr) *bytes = wire_bytes(message);
    apply_fault(fault, conn, std::move(message), nullptr);
    return written;
  }
  // A caller outside the group gets no route; with CUDA devices here it still needs one,
  // to be told that its tensors have nowhere to go.
  const DeviceRoute* route = group_.route_back(conn->peer.id);
  std::optional<DeviceRoute> stray;
  if (route == nullptr && group_.maps_devices()) {
    route = &stray.emplace(conn->peer, DeviceMap{}, DeviceRoute::Direction::kReply);
  }
  Lending lending{conn->peer.id, conn->serial, {}};
  EncodedMessage message;
  try {
    message = encode(Envelope{response}, device_mapper(route), kDefaultInlineTensorBytes,
                     lender_for(lending));
    if (bytes != nullptr) *bytes = wire_bytes(message);
  } catch (...) {
    return_loans(lending.taken, conn->serial);
    throw;
  }
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  return_unsent_loans(fault, lending);
  apply_fault(
      fault, conn, std::move(message),
      [weak, taken = std::move(lending.taken), serial = conn->serial](const std::string& error) {
        if (error.empty() || taken.empty()) return;
        if (auto self = weak.lock()) self->return_loans(taken, serial);
      });
  return written;
}

}  // namespace gradwire::rpc::detail
