// RRefContext (context.h): the protocol messages it sends, and the settlements it sends
// again until they are answered (a Delete, a ChildAccepted, a loss notice).
#include <utility>

#include "context.h"
#include "gradwire/core/error_kind_of.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/trace.h"
#include "messages.h"
#include "proto/rref.pb.h"

namespace gradwire::rref {

Future<Value> RRefContext::send(
    const WorkerInfo& to, const std::string& payload, std::string what, std::vector<Value> args,
    rpc::CallOptions options, uint32_t handler,
    std::shared_ptr<std::vector<std::shared_ptr<detail::RRefCore>>> keep) {
  std::shared_ptr<rpc::RpcAgent> agent = this->agent();
  rpc::Request request;
  request.handler = handler;
  request.function = std::move(what);
  request.payload.assign(payload.begin(), payload.end());
  request.args = std::move(args);
  {
    MutexLock lock(mutex_);
    ++in_flight_;
  }
  Future<Value> result;
  result.set_default_timeout(rpc::RpcAgent::wait_bound(agent->effective_timeout(options)));
  std::weak_ptr<RRefContext> weak = weak_from_this();
  // Tracing: the message from its send to its reply (rref.send).
  TracedOp traced{nullptr, 0};
  int64_t start_ns = 0;
  if (trace::enabled()) {
    wire::RRefMessage message;
    if (message.ParseFromString(payload)) {
      traced = traced_op(message);
      start_ns = trace::now_ns();
    }
  }
  auto done = [weak, traced, start_ns, peer = to.id](RRefContext& self, bool failed) {
    if (start_ns != 0) record_message("rref.send", start_ns, traced, peer, failed ? "error" : "ok");
    MutexLock lock(self.mutex_);
    --self.in_flight_;
    self.cv_.notify_all();
  };
  try {
    agent->send_request(to, std::move(request), options,
                        [weak, done, result, keep](Value value, std::exception_ptr error) mutable {
                          if (error) {
                            result.try_set_error(std::move(error));
                          } else {
                            auto self = weak.lock();
                            if (keep != nullptr && self != nullptr && has_descriptor(value)) {
                              for_each_descriptor(value, [&](const RRefDescriptor& d) {
                                if (auto core = self->find_received(d)) keep->push_back(core);
                              });
                            }
                            result.try_set_value(std::move(value));
                          }
                          const bool failed = error != nullptr;
                          if (auto self = weak.lock()) done(*self, failed);
                        });
  } catch (...) {
    done(*this, true);
    throw;
  }
  return result;
}

std::shared_ptr<UserRRef> RRefContext::create_remote(const WorkerInfo& owner, std::string name,
                                                     std::string type_name, std::vector<Value> args,
                                                     rpc::CallOptions options) {
  const int incarnation = incarnation_of(owner.id);
  if (std::exception_ptr lost = lost_error(owner.id, incarnation)) std::rethrow_exception(lost);
  const uint64_t rref_id = mint();
  const uint64_t fork = mint();
  wire::RRefMessage message;
  wire::Create* create = message.mutable_create();
  create->set_rref_id(rref_id);
  create->set_fork_id(fork);
  create->set_type_name(type_name);
  create->set_name(name);
  Future<void> confirmed;
  auto user = std::make_shared<UserRRef>(shared_from_this(), owner, incarnation, rref_id, fork,
                                         type_name, confirmed,
                                         /*creator=*/true);
  {
    MutexLock lock(mutex_);
    users_[fork] = user;
  }
  Future<Value> reply;
  try {
    reply = send(owner, message.SerializeAsString(),
                 "remote " + name + " -> RRef " + id_text(rref_id) + " (" + type_name + ")", args,
                 options, kRRefHandler);
  } catch (...) {
    discard(args);
    throw;
  }
  // The reference stays alive until the owner has replied: a delete is sent only for a fork
  // the owner has counted.
  gradwire::detail::on_complete_inline(
      reply, [user](const Future<Value>& done) { user->owner_answered(done, /*creation=*/true); });
  return user;
}

void RRefContext::release_user(const WorkerInfo& owner, int incarnation, uint64_t rref_id,
                               uint64_t fork, bool counted) {
  {
    MutexLock lock(mutex_);
    auto it = users_.find(fork);
    if (it != users_.end() && it->second.expired()) users_.erase(it);
    cv_.notify_all();
    if (!counted || closed_ || lost_.count({owner.id, incarnation}) != 0) return;
  }
  wire::RRefMessage message;
  message.mutable_delete_fork()->set_rref_id(rref_id);
  message.mutable_delete_fork()->set_fork_id(fork);
  send_settlement(owner, message.SerializeAsString(),
                  "delete of fork " + id_text(fork) + " of RRef " + id_text(rref_id));
}

void RRefContext::send_settlement(const WorkerInfo& to, const std::string& payload,
                                  std::string what, bool through_losses) {
  {
    MutexLock lock(mutex_);
    ++in_flight_;  // across every attempt: wait_idle and a graceful shutdown wait for the last
  }
  settlement_attempt(to, payload, what, 1, through_losses);
}

void RRefContext::settlement_attempt(const WorkerInfo& to, const std::string& payload,
                                     const std::string& what, int attempt, bool through_losses) {
  Future<Value> reply;
  std::shared_ptr<rpc::RpcAgent> agent;
  try {
    agent = this->agent();
    reply = send(to, payload, what);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kDebug) << "rref worker " << self_.describe() << ": the " << what
                         << " was not sent to " << to.describe() << ": " << e.what();
    end_settlement();
    return;
  }
  std::weak_ptr<RRefContext> weak = weak_from_this();
  reply.add_callback(agent->executor(), [weak, to, payload, what, attempt,
                                         through_losses](const Future<Value>& done) {
    if (auto self = weak.lock())
      self->settlement_answered(done, to, payload, what, attempt, through_losses);
  });
}

void RRefContext::settlement_answered(const Future<Value>& done, const WorkerInfo& to,
                                      const std::string& payload, const std::string& what,
                                      int attempt, bool through_losses) {
  if (done.has_error()) {
    // Sent again after a timeout (lost on the way, or its answer was: the receiver takes a
    // second copy as a no-op), and after a lost connection when `through_losses`. Anything
    // else is final: refused (nothing left to settle there) or the peer is gone.
    const ErrorKind kind = error_kind_of(done.error());
    bool again = (kind == ErrorKind::kTimeout || (through_losses && kind == ErrorKind::kNetwork)) &&
                 attempt < kSettleAttempts;
    if (again) {
      MutexLock lock(mutex_);
      again = !closed_;
    }
    if (again) {
      settlement_attempt(to, payload, what, attempt + 1, through_losses);
      return;
    }
    try {
      std::rethrow_exception(done.error());
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kDebug) << "rref worker " << self_.describe() << ": the " << what << " to "
                           << to.describe() << " failed after " << attempt
                           << " attempt(s): " << e.what();
    }
  }
  end_settlement();
}

void RRefContext::end_settlement() {
  MutexLock lock(mutex_);
  --in_flight_;
  cv_.notify_all();
}

void RRefContext::settle_child(const WorkerInfo& to, uint64_t rref_id, uint64_t fork) {
  wire::RRefMessage message;
  message.mutable_child_accepted()->add_fork_ids(fork);
  send_settlement(to, message.SerializeAsString(),
                  "accept of fork " + id_text(fork) + " of RRef " + id_text(rref_id));
}

void RRefContext::settle_refused(const RRefDescriptor& d) {
  const int minter = minter_of(d.fork_id);
  if (minter == self_.id) return;
  wire::RRefMessage message;
  std::string what;
  if (minter == d.owner) {
    message.mutable_delete_fork()->set_rref_id(d.rref_id);
    message.mutable_delete_fork()->set_fork_id(d.fork_id);
    what = "delete of refused fork ";
  } else {
    message.mutable_child_accepted()->add_fork_ids(d.fork_id);
    what = "settlement of refused fork ";
  }
  std::shared_ptr<rpc::RpcAgent> agent = agent_or_null();
  if (agent == nullptr) return;
  WorkerInfo to;
  try {
    to = agent->get_worker_info(minter);
  } catch (const std::exception&) {
    return;  // validate() checked the id; a group that changed size has nothing to settle
  }
  send_settlement(to, message.SerializeAsString(),
                  what + id_text(d.fork_id) + " of RRef " + id_text(d.rref_id));
}

}  // namespace gradwire::rref
