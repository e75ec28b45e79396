// The TensorPipe agent: descriptors and messages read from a connection, requests handed to
// the dispatcher and replies completing their calls.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include <algorithm>

#include "gradwire/core/logging.h"
#include "gradwire/core/printable.h"
#include "gradwire/tensor/factory.h"
#include "text.h"

namespace gradwire::rpc::detail {

// Replies whose lent tensors total at most this are copied on the transport's thread.
constexpr size_t kCopyOnLoopMaxBytes = size_t{1} << 20;

void TensorPipeAgent::read_next(const std::shared_ptr<Connection>& conn) {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  const SendingMark entering;  // called off the loop too (a new connection's first read)
  conn->pipe->readDescriptor([weak, conn](const tp::Error& error, tp::Descriptor descriptor) {
    auto self = weak.lock();
    if (self == nullptr) return;
    if (error) {
      self->on_connection_error(conn, error.what());
      return;
    }
    self->on_descriptor(conn, std::move(descriptor));
  });
}

namespace {

// Only host memory travels through TensorPipe here (device tensors are copied to the host
// first): a tensor said to come from elsewhere would have no channel to arrive by. Throws
// InvalidArgument.
void check_host_only(const tp::Descriptor& descriptor) {
  if (!descriptor.payloads.empty()) {
    throw InvalidArgument("malformed rpc envelope: a message with " +
                          std::to_string(descriptor.payloads.size()) + " payloads");
  }
  const tp::Device cpu{tp::kCpuDeviceType, 0};
  for (size_t i = 0; i < descriptor.tensors.size(); ++i) {
    const tp::Descriptor::Tensor& t = descriptor.tensors[i];
    if (!(t.sourceDevice == cpu) || (t.targetDevice.has_value() && !(*t.targetDevice == cpu))) {
      throw InvalidArgument("malformed rpc envelope: tensor " + std::to_string(i) +
                            " is sent from device " + printable(t.sourceDevice.type) + ":" +
                            std::to_string(t.sourceDevice.index) +
                            "; only host memory travels between workers");
    }
  }
}

// The tensors the envelope announces are those the descriptor sends (lent ones aside), of
// the same sizes, and within the limit together. Throws InvalidArgument.
void check_announced(const tp::Descriptor& descriptor, const std::vector<IncomingTensor>& announced,
                     const EnvelopeLimits& limits) {
  const size_t sent = static_cast<size_t>(
      std::count_if(announced.begin(), announced.end(),
                    [](const IncomingTensor& t) { return !t.loan.has_value(); }));
  if (sent != descriptor.tensors.size()) {
    throw InvalidArgument("malformed rpc envelope: " + std::to_string(sent) +
                          " tensors announced, " + std::to_string(descriptor.tensors.size()) +
                          " sent");
  }
  size_t total = 0;
  for (size_t i = 0, j = 0; i < announced.size(); ++i) {
    if (!announced[i].loan && announced[i].nbytes() != descriptor.tensors[j++].length) {
      throw InvalidArgument("malformed rpc envelope: tensor " + std::to_string(i) +
                            " is announced as " + std::to_string(announced[i].nbytes()) +
                            " bytes but " + std::to_string(descriptor.tensors[j - 1].length) +
                            " are sent");
    }
    total += announced[i].nbytes();
  }
  if (total > limits.max_tensor_bytes) {
    throw InvalidArgument("malformed rpc envelope: " + std::to_string(total) +
                          " tensor bytes, more than the limit of " +
                          std::to_string(limits.max_tensor_bytes));
  }
}

}  // namespace

TensorPipeAgent::Arrival TensorPipeAgent::allocate(const std::vector<IncomingTensor>& announced) {
  Arrival arrival;
  arrival.tensors.reserve(announced.size());
  for (const IncomingTensor& a : announced) {
    Tensor t = gradwire::empty(a.sizes, a.dtype);
    if (a.loan) {
      arrival.lent.push_back(
          LoanCopy{*a.loan, t.nbytes() == 0 ? nullptr : t.data_ptr(), t.nbytes()});
    } else {
      tp::Allocation::Tensor slot;
      slot.buffer = tp::CpuBuffer{buffer_of(t)};
      arrival.allocation.tensors.push_back(std::move(slot));
    }
    arrival.tensors.push_back(std::move(t));
    arrival.targets.push_back(a.device);
  }
  return arrival;
}

void TensorPipeAgent::on_descriptor(const std::shared_ptr<Connection>& conn,
                                    tp::Descriptor descriptor) {
  std::vector<IncomingTensor> announced;
  // Parsed once, here; decoded from the same parse when the tensor data has arrived.
  std::shared_ptr<const ParsedEnvelope> parsed;
  try {
    check_host_only(descriptor);
    parsed = std::make_shared<const ParsedEnvelope>(descriptor.metadata, options_.limits);
    announced = peek_tensors(*parsed, options_.limits);
    check_announced(descriptor, announced, options_.limits);
  } catch (const std::exception& e) {
    on_malformed(conn, descriptor.metadata, e.what(), /*close_after=*/true);
    return;
  }
  Held held;
  held.bytes = descriptor.metadata.size();
  for (const IncomingTensor& a : announced)
    held.bytes += a.logical_nbytes();
  held.request = parsed->is_request();
  if (std::string limit = reserve_inflight(*conn, held); !limit.empty()) {
    // Nothing is left unread when every tensor travelled inside the envelope.
    refuse_over_budget(conn, *parsed, held, limit, /*unread=*/!announced.empty());
    return;
  }
  Arrival arrival;
  try {
    // Runs on TensorPipe's loop thread: an allocation failure must become an error reply,
    // not an exception escaping into the loop.
    arrival = allocate(announced);
  } catch (const std::exception& e) {
    release_inflight(*conn, held);
    on_malformed(
        conn, descriptor.metadata,
        "cannot allocate the " + std::to_string(held.bytes) + " bytes announced: " + e.what(),
        /*close_after=*/true);
    return;
  }
  read_message(conn, std::move(parsed), std::move(descriptor.metadata), held, std::move(arrival));
}

void TensorPipeAgent::refuse_over_budget(const std::shared_ptr<Connection>& conn,
                                         const ParsedEnvelope& parsed, const Held& held,
                                         const std::string& limit, bool unread) {
  if (held.request) {
    refuse_busy(conn, parsed.id(), "worker " + self_.describe() + " is busy: " + limit, unread);
    return;
  }
  if (parsed.is_response()) {
    calls_.fail(parsed.id(),
                std::make_exception_ptr(BusyError("rpc: the reply from worker " +
                                                  conn->peer.describe() + " to worker " +
                                                  self_.describe() + " was refused: " + limit)),
                CallOutcome::kReplied, conn->serial);
  }
  close_pipe(conn->pipe);
}

void TensorPipeAgent::read_message(const std::shared_ptr<Connection>& conn,
                                   std::shared_ptr<const ParsedEnvelope> parsed,
                                   std::string metadata, const Held& held, Arrival arrival) {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  const SendingMark entering;
  conn->pipe->read(std::move(arrival.allocation),
                   [weak, conn, held, parsed = std::move(parsed), metadata = std::move(metadata),
                    tensors = std::move(arrival.tensors), targets = std::move(arrival.targets),
                    lent = std::move(arrival.lent)](const tp::Error& error) mutable {
                     auto self = weak.lock();
                     if (self == nullptr) return;
                     if (error) {
                       self->release_inflight(*conn, held);
                       self->on_connection_error(conn, error.what());
                       return;
                     }
                     self->read_next(conn);
                     self->on_message(conn, std::move(parsed), std::move(metadata),
                                      std::move(tensors), targets, std::move(lent), held);
                   });
}

void TensorPipeAgent::on_message(const std::shared_ptr<Connection>& conn,
                                 std::shared_ptr<const ParsedEnvelope> parsed, std::string metadata,
                                 std::vector<Tensor> tensors, const std::vector<Device>& targets,
                                 std::vector<LoanCopy> lent, Held held) {
  const bool to_device =
      std::any_of(targets.begin(), targets.end(), [](const Device& d) { return d.is_cuda(); });
  const bool has_loans = !lent.empty();
  size_t lent_bytes = 0;
  for (const LoanCopy& c : lent)
    lent_bytes += c.nbytes;
  // A reply whose lent tensors are small is copied right here: a copy that small, on one
  // thread, costs less than waking a pool thread for it, and the call then completes
  // without a hand-off. Larger copies, and every request, go to the pool.
  const bool copy_here = !parsed->is_request() && lent_bytes <= kCopyOnLoopMaxBytes;
  auto process = [self = shared_from_this(), conn, to_device, has_loans, parsed = std::move(parsed),
                  metadata = std::move(metadata), tensors = std::move(tensors),
                  lent = std::move(lent), held]() mutable {
    if (!lent.empty()) {
      const std::string failure = self->copy_lent(conn, lent);
      if (!failure.empty()) {
        self->release_inflight(*conn, held);
        self->on_lost_loans(conn, metadata, failure);
        return;
      }
    }
    Envelope envelope;
    try {
      envelope = decode(*parsed, tensors, self->options_.limits);
    } catch (const std::exception& e) {
      self->release_inflight(*conn, held);
      self->on_malformed(conn, metadata, e.what(), /*close_after=*/false);
      return;
    }
    if (Request* request = std::get_if<Request>(&envelope.body)) {
      {
        MutexLock lock(self->mutex_);
        if (self->state_ == State::kClosed) return;
        ++self->active_handlers_;
      }
      // The request's tensors are the handler's until its reply is written; request_done
      // returns what it holds of the budget.
      // Here on the pool when tensors were copied first: the request runs on, no second hop.
      self->dispatcher_.serve(self, conn, std::move(*request), held.bytes,
                              /*on_executor=*/to_device || has_loans);
      return;
    }
    self->release_inflight(*conn, held);
    if (Response* response = std::get_if<Response>(&envelope.body)) {
      self->complete_call(conn, std::move(*response), held.bytes);
    } else {
      self->on_release(conn, std::get<Release>(envelope.body));
    }
  };
  // Requests always run on the pool. Replies complete their call here, on the I/O thread,
  // unless tensors must first be copied to a device or out of the sender's memory.
  if (!to_device && (!has_loans || copy_here)) {
    process();
  } else {
    try {
      pool_->execute(std::move(process));
    } catch (const Error&) {
      // The pool is shut down: the agent is closing and the message is moot.
    }
  }
}

void TensorPipeAgent::on_malformed(const std::shared_ptr<Connection>& conn,
                                   const std::string& metadata, const std::string& why,
                                   bool close_after) {
  GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe() << ": malformed message from "
                         << conn->peer.describe() << ": " << why;
  std::optional<EnvelopeHeader> header = peek_header(metadata, options_.limits);
  if (header && header->is_request) {
    Response reply;
    reply.id = header->id;
    reply.result = ErrorReply{ErrorKind::kInvalidArgument, why, self_.name, /*rejected=*/true};
    // Unread tensor data of a bad descriptor cannot be skipped: after the reply, the
    // connection goes.
    std::shared_ptr<tp::Pipe> pipe = conn->pipe;
    write(conn, encode(Envelope{std::move(reply)}), [pipe, close_after](const std::string&) {
      if (close_after) close_pipe(pipe);
    });
    return;
  }
  if (header) {
    calls_.fail(header->id,
                std::make_exception_ptr(InvalidArgument("rpc: worker " + conn->peer.describe() +
                                                        " sent a malformed reply: " + why)),
                CallOutcome::kReplied, conn->serial);
  }
  if (close_after) close_pipe(conn->pipe);
}

void TensorPipeAgent::on_lost_loans(const std::shared_ptr<Connection>& conn,
                                    const std::string& metadata, const std::string& why) {
  const std::string text = "worker " + self_.describe() +
                           " could not copy the tensors lent by worker " + conn->peer.describe() +
                           ": " + why;
  GRADWIRE_LOG(kWarning) << "rpc: " << text;
  std::optional<EnvelopeHeader> header = peek_header(metadata, options_.limits);
  if (!header) return;
  if (header->is_request) {
    Response reply;
    reply.id = header->id;
    reply.result = ErrorReply{ErrorKind::kNetwork, text, self_.name, /*rejected=*/true};
    write(conn, encode(Envelope{std::move(reply)}), nullptr);
    return;
  }
  calls_.fail(header->id, std::make_exception_ptr(NetworkError("rpc: the reply " + text)),
              CallOutcome::kReplied, conn->serial);
}

void TensorPipeAgent::complete_call(const std::shared_ptr<Connection>& conn, Response response,
                                    size_t bytes) {
  std::optional<PendingCall> call = calls_.take(response.id, conn->serial);
  if (!call) {
    // A call that timed out: what the reply carries is still shown to the interceptors
    // that saw its request.
    if (std::optional<LateCall> late = calls_.take_late(response.id, conn->serial)) {
      for (size_t i = 0; i < late->states.size() && i < late->interceptors->size(); ++i) {
        try {
          (*late->interceptors)[i]->on_late_response(late->to, response, late->states[i]);
        } catch (const std::exception& e) {
          GRADWIRE_LOG(kError) << "rpc worker " << self_.describe()
                               << ": an interceptor's on_late_response threw: " << e.what();
        }
      }
    }
    GRADWIRE_LOG(kDebug) << "rpc worker " << self_.describe() << ": dropped the reply "
                         << response.id << " from " << conn->peer.describe()
                         << " (its call timed out or was never made)";
    return;
  }
  call->bytes_in = bytes;
  try {
    for (size_t i = 0; i < call->states.size(); ++i)
      (*call->interceptors)[i]->on_incoming_response(call->to, response, call->states[i]);
  } catch (...) {
    calls_.finish(*call, Value(), std::current_exception(), CallOutcome::kReplied);
    return;
  }
  if (Value* value = std::get_if<Value>(&response.result)) {
    calls_.finish(*call, std::move(*value), nullptr, CallOutcome::kReplied);
  } else {
    calls_.finish(*call, Value(),
                  Dispatcher::reply_error(std::get<ErrorReply>(response.result), call->to,
                                          call->handler, call->function),
                  CallOutcome::kReplied);
  }
}

}  // namespace gradwire::rpc::detail
