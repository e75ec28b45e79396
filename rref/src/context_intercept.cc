// RRefContext (context.h) as the agent's interceptor: forks minted here are bound to the
// message that carries them, released when it is not delivered, and the references a
// message carries in are accepted (held until it has been served or converted).
#include <utility>

#include "context.h"
#include "gradwire/core/error_kind_of.h"
#include "gradwire/core/logging.h"
#include "messages.h"

namespace gradwire::rref {

namespace {

// The references a message carried, alive until it has been served or converted.
struct Held : rpc::ServeScope {
  std::vector<std::shared_ptr<detail::RRefCore>> cores;
};

struct CallState {
  std::vector<uint64_t> bound;  // forks minted here that this request carries
  std::vector<std::shared_ptr<detail::RRefCore>> received;  // in its reply
};

}  // namespace

void RRefContext::bind_all(const Value& value, int to, std::vector<uint64_t>& bound) {
  std::vector<uint64_t> uncounted;  // owner forks for a worker lost here
  for_each_descriptor(value, [&](const RRefDescriptor& d) {
    if (minter_of(d.fork_id) != self_.id) return;
    if (apply(d.fork_id, ForkEvent{.kind = ForkEventKind::kBind, .peer = to}) !=
        ForkVerdict::kApplied)
      return;
    bound.push_back(d.fork_id);
    if (to != self_.id) {
      MutexLock lock(mutex_);
      if (lost_locked(to)) uncounted.push_back(d.fork_id);
    }
  });
  // A fork kept for a lost worker would never be released (its loss was applied once, its
  // Deletes are ignored, and its death later would not be told again): the message goes,
  // but the owner does not count the fork, and a user does not keep it pending.
  unbind(uncounted, to);
}

void RRefContext::unbind(const std::vector<uint64_t>& forks, int to) {
  for (uint64_t fork : forks)
    apply(fork, ForkEvent{.kind = ForkEventKind::kNotDelivered, .peer = to});
}

void RRefContext::discard(const std::vector<Value>& values) {
  // Only forks bound to no receiver: one bound may be accepted there, and the message that
  // carries it settles it.
  for (const Value& v : values) {
    for_each_descriptor(v, [&](const RRefDescriptor& d) {
      if (minter_of(d.fork_id) == self_.id)
        apply(d.fork_id, ForkEvent{.kind = ForkEventKind::kDiscarded});
    });
  }
}

std::shared_ptr<void> RRefContext::loop_back(const std::vector<const Value*>& values) {
  auto held = std::make_shared<Held>();
  std::vector<uint64_t> bound;
  for (const Value* v : values) {
    if (!has_descriptor(*v)) continue;
    bind_all(*v, self_.id, bound);
    accept_all(*v, self_, held->cores);
  }
  return held;
}

// ---- interceptor

std::shared_ptr<void> RRefContext::on_outgoing_request(const WorkerInfo& to,
                                                       rpc::Request& request) {
  auto state = std::make_shared<CallState>();
  for (const Value& v : request.args) {
    if (v.type() == rpc::ValueType::kRRef || v.type() == rpc::ValueType::kList ||
        v.type() == rpc::ValueType::kMap)
      bind_all(v, to.id, state->bound);
  }
  return state;
}

void RRefContext::on_incoming_response(const WorkerInfo& from, rpc::Response& response,
                                       const std::shared_ptr<void>& state) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr || state == nullptr || !has_descriptor(*value)) return;
  accept_all(*value, from, static_cast<CallState*>(state.get())->received);
}

void RRefContext::on_call_finished(const rpc::FinishedCall& call,
                                   const std::shared_ptr<void>& state) {
  if (state == nullptr) return;
  // Served: its receiver accepted what it carried. Anything else (never sent, refused
  // unread as busy, timed out, its connection or the agent gone) releases the forks it
  // carried; a receiver that got it anyway finds them refused or freed.
  if (call.outcome == rpc::CallOutcome::kReplied && error_kind_of(call.error) != ErrorKind::kBusy)
    return;
  unbind(static_cast<CallState*>(state.get())->bound, call.to.id);
}

void RRefContext::on_request_not_sent(const rpc::Request& request) {
  discard(request.args);
}

void RRefContext::on_late_response(const WorkerInfo& from, const rpc::Response& response,
                                   const std::shared_ptr<void>&) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr || !has_descriptor(*value)) return;
  // Accepted as if the call had waited for it, then let go at once: each fork is counted
  // and deleted (or refused) as usual.
  std::vector<std::shared_ptr<detail::RRefCore>> dropped;
  try {
    accept_all(*value, from, dropped);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kDebug) << "rref worker " << self_.describe() << ": a late reply from "
                         << from.describe() << " carried a reference refused here: " << e.what();
  }
}

void RRefContext::on_response_not_sent(const WorkerInfo& to, const rpc::Request&,
                                       const rpc::Response& response) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr || !has_descriptor(*value)) return;
  std::vector<uint64_t> forks;
  for_each_descriptor(*value, [&](const RRefDescriptor& d) {
    if (minter_of(d.fork_id) == self_.id) forks.push_back(d.fork_id);
  });
  unbind(forks, to.id);
}

std::shared_ptr<rpc::ServeScope> RRefContext::on_incoming_request(const WorkerInfo& from,
                                                                  rpc::Request& request) {
  std::shared_ptr<Held> held;
  for (const Value& v : request.args) {
    if (!has_descriptor(v)) continue;
    if (held == nullptr) held = std::make_shared<Held>();
    accept_all(v, from, held->cores);
  }
  return held;
}

void RRefContext::on_outgoing_response(const WorkerInfo& to, const rpc::Request& request,
                                       rpc::Response& response) {
  const Value* value = std::get_if<Value>(&response.result);
  if (value != nullptr && has_descriptor(*value)) {
    std::vector<uint64_t> bound;
    bind_all(*value, to.id, bound);
  }
  // Forks converted for this reply that it does not carry: its result failed to convert
  // part-way (a later element threw), or the function made them and failed.
  std::vector<uint64_t> unused;
  {
    MutexLock lock(mutex_);
    unused = forks_.take_minted_for_reply(to.id, request.id);
  }
  for (uint64_t fork : unused)
    apply(fork, ForkEvent{.kind = ForkEventKind::kDiscarded});
}

}  // namespace gradwire::rref
