// The TensorPipe agent: an elastic group's membership (AgentOptions::elastic). A joiner
// announces itself to every member, a leaver settles, marks itself gone in the store and
// tells every member; members serve both notices (kMembershipHandler). The directory
// (group.h) holds who is a member; see docs/elastic.md.
#include "tensorpipe/tensorpipe_agent_impl.h"

#include "gradwire/core/logging.h"
#include "text.h"

namespace gradwire::rpc::detail {

namespace {
constexpr const char* kJoinedNotice = "joined";
constexpr const char* kLeftNotice = "left";
}  // namespace

void TensorPipeAgent::register_membership_handler() {
  std::weak_ptr<TensorPipeAgent> weak = weak_from_this();
  dispatcher_.register_handler(
      kMembershipHandler, "membership",
      [weak](const CallContext& context, const Request& request) -> Future<Value> {
        auto self = weak.lock();
        if (self == nullptr) throw Error("the worker has closed");
        return self->on_membership_notice(context, request);
      },
      Execution::kPool, nullptr);
}

Future<Value> TensorPipeAgent::on_membership_notice(const CallContext& context,
                                                    const Request& request) {
  const WorkerInfo& from = context.caller();
  // Refusals are CallRejected: nothing ran, and the sender sees an InvalidArgument. (Only an
  // elastic agent registers this handler; the check keeps the handler right on its own.)
  if (!group_.elastic()) {
    throw CallRejected("rpc worker " + self_.describe() + " is not in an elastic group: it " +
                       "takes no membership notice (from " + from.describe() + ")");
  }
  // Only a connection admitted as a worker of the group speaks for one (PeerAdmission).
  if (from.id < 0) {
    throw CallRejected("rpc worker " + self_.describe() +
                       ": membership notices are taken only from workers of the group, not "
                       "from " +
                       from.describe());
  }
  if (request.function == kJoinedNotice) {
    // Its connection's claim has made this worker meet it already (discover).
    return make_ready_future(Value());
  }
  if (request.function == kLeftNotice) {
    if (group_.mark_left(from.id)) {
      GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << ": " << from.describe()
                          << " left the group";
      notify_worker_left(from);
    }
    return make_ready_future(Value());
  }
  throw CallRejected("rpc worker " + self_.describe() + ": unknown membership notice '" +
                     printable(request.function) + "' from " + from.describe() +
                     " (expected 'joined' or 'left')");
}

void TensorPipeAgent::tell_members(const std::string& what, Clock::time_point deadline) {
  std::vector<std::pair<WorkerInfo, Future<Value>>> told;
  for (const WorkerInfo& member : group_.workers()) {
    if (member.id == self_.id || group_.presence(member.id) != Presence::kMember) continue;
    Request notice;
    notice.handler = kMembershipHandler;
    notice.function = what;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    try {
      told.emplace_back(member, send(member, std::move(notice),
                                     CallOptions{std::max(left, std::chrono::milliseconds(1))}));
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe() << " could not tell "
                             << member.describe() << " that it " << what << ": " << e.what();
    }
  }
  for (auto& [member, reply] : told) {
    try {
      reply.get();
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kWarning) << "rpc worker " << self_.describe() << " could not tell "
                             << member.describe() << " that it " << what << ": " << e.what();
    }
  }
}

void TensorPipeAgent::leave() {
  const std::string me = "rpc agent " + self_.describe();
  if (!group_.elastic()) RpcAgent::leave();
  if (dispatcher_.serving_on_this_thread()) {
    throw InvalidArgument(me + ": leave() was called from a request this agent is serving; it " +
                          "would wait for that request itself. Leave from outside its handlers");
  }
  if (group_.hosts_store()) {
    throw InvalidArgument(me + " hosts the group's store, which the others would lose with it: " +
                          "it cannot leave (host the store elsewhere: gradwire-run does for " +
                          "role jobs, or run gradwire-store)");
  }
  {
    MutexLock lock(mutex_);
    if (state_ != State::kRunning || shutdown_started_) return;
    shutdown_started_ = true;
  }
  const Clock::time_point deadline = Clock::now() + options_.join_timeout;
  try {
    // Settled first, while every peer still serves: rref/ gives up its references and
    // dist_autograd/ releases its contexts.
    notify_graceful_shutdown(deadline);
    wait_until_idle(deadline);
    // From here the others' barriers stop counting this worker; then each member is told.
    group_.mark_leaving();
    tell_members(kLeftNotice, deadline);
    wait_until_idle(deadline);
    departing_.store(true, std::memory_order_release);
  } catch (...) {
    {
      MutexLock lock(mutex_);
      if (failure_ == nullptr) failure_ = std::current_exception();
    }
    close();
    throw;
  }
  GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << " left the group";
  close();
}

void TensorPipeAgent::announce_joined() {
  const Clock::time_point deadline =
      Clock::now() + std::min(options_.join_timeout, options_.rpc_timeout);
  tell_members(kJoinedNotice, deadline);
  GRADWIRE_LOG(kInfo) << "rpc worker " << self_.describe() << " joined the running group ("
                      << group_.workers().size() << " members)";
}

}  // namespace gradwire::rpc::detail
