#include "gradwire/rpc/agent.h"

#include <ostream>
#include <utility>

#include "gradwire/core/logging.h"

namespace gradwire::rpc {

std::string WorkerInfo::describe() const {
  return "'" + name + "' (rank " + std::to_string(id) + ")";
}

std::ostream& operator<<(std::ostream& os, const WorkerInfo& info) {
  return os << info.describe();
}

std::shared_ptr<void> Interceptor::on_outgoing_request(const WorkerInfo&, Request&) {
  return nullptr;
}
void Interceptor::on_incoming_response(const WorkerInfo&, Response&, const std::shared_ptr<void>&) {
}
void Interceptor::on_call_finished(const FinishedCall&, const std::shared_ptr<void>&) {}
std::shared_ptr<ServeScope> Interceptor::on_incoming_request(const WorkerInfo&, Request&) {
  return nullptr;
}
void Interceptor::on_outgoing_response(const WorkerInfo&, const Request&, Response&) {}
void Interceptor::on_request_not_sent(const Request&) {}
void Interceptor::on_late_response(const WorkerInfo&, const Response&,
                                   const std::shared_ptr<void>&) {}
void Interceptor::on_response_not_sent(const WorkerInfo&, const Request&, const Response&) {}
std::shared_ptr<ServeScope> Interceptor::capture_thread_state() {
  return nullptr;
}
void RpcAgent::release_unsent(const Request&) const {}

void AgentListener::on_worker_lost(const WorkerInfo&, const std::string&) {}
void AgentListener::on_worker_rejoined(const WorkerInfo&, int) {}
void AgentListener::on_worker_joined(const WorkerInfo&) {}
void AgentListener::on_worker_left(const WorkerInfo& worker) {
  on_worker_lost(worker, "it left the group");
}
void AgentListener::on_graceful_shutdown(Clock::time_point) {}
void AgentListener::on_closed() {}

void RpcAgent::add_listener(std::shared_ptr<AgentListener> listener) {
  if (listener == nullptr) throw InvalidArgument("rpc: add_listener(nullptr)");
  MutexLock lock(listeners_mutex_);
  listeners_.push_back(std::move(listener));
}

std::vector<std::shared_ptr<AgentListener>> RpcAgent::listeners() const {
  MutexLock lock(listeners_mutex_);
  return listeners_;
}

void RpcAgent::notify_worker_lost(const WorkerInfo& worker, const std::string& why) const {
  for (const auto& listener : listeners()) {
    try {
      listener->on_worker_lost(worker, why);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << worker_info().describe()
                           << ": a listener's on_worker_lost threw: " << e.what();
    }
  }
}

void RpcAgent::notify_worker_rejoined(const WorkerInfo& worker, int incarnation) const {
  for (const auto& listener : listeners()) {
    try {
      listener->on_worker_rejoined(worker, incarnation);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << worker_info().describe()
                           << ": a listener's on_worker_rejoined threw: " << e.what();
    }
  }
}

void RpcAgent::leave() {
  throw InvalidArgument("rpc agent " + worker_info().describe() +
                        " cannot leave its group: it is not elastic (AgentOptions::elastic); "
                        "use shutdown()");
}

void RpcAgent::notify_worker_joined(const WorkerInfo& worker) const {
  for (const auto& listener : listeners()) {
    try {
      listener->on_worker_joined(worker);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << worker_info().describe()
                           << ": a listener's on_worker_joined threw: " << e.what();
    }
  }
}

void RpcAgent::notify_worker_left(const WorkerInfo& worker) const {
  for (const auto& listener : listeners()) {
    try {
      listener->on_worker_left(worker);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << worker_info().describe()
                           << ": a listener's on_worker_left threw: " << e.what();
    }
  }
}

void RpcAgent::notify_graceful_shutdown(AgentListener::Clock::time_point deadline) const {
  for (const auto& listener : listeners())
    listener->on_graceful_shutdown(deadline);
}

void RpcAgent::notify_closed() const {
  for (const auto& listener : listeners()) {
    try {
      listener->on_closed();
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "rpc worker " << worker_info().describe()
                           << ": a listener's on_closed threw: " << e.what();
    }
  }
}

namespace {
struct ExtensionTable {
  Mutex mutex;
  std::vector<std::pair<std::string, AgentExtension>> installers GRADWIRE_GUARDED_BY(mutex);
};
ExtensionTable& extension_table() {
  static ExtensionTable* all = new ExtensionTable();  // never destroyed: agents may outlive main()
  return *all;
}
}  // namespace

void register_agent_extension(std::string name, AgentExtension install) {
  if (!install)
    throw InvalidArgument("rpc: register_agent_extension('" + name + "') without an installer");
  ExtensionTable& all = extension_table();
  MutexLock lock(all.mutex);
  for (const auto& [known, fn] : all.installers) {
    if (known == name) return;
  }
  all.installers.emplace_back(std::move(name), std::move(install));
}

void install_agent_extensions(const std::shared_ptr<RpcAgent>& agent) {
  std::vector<std::pair<std::string, AgentExtension>> installers;
  {
    ExtensionTable& all = extension_table();
    MutexLock lock(all.mutex);
    installers = all.installers;
  }
  for (const auto& [name, install] : installers)
    install(agent);
}

namespace detail {
void render_call_result(std::string& out, const void* call_result, size_t) {
  const auto& c = *static_cast<const CallResult*>(call_result);
  out += "result of '" + c.function + "' on worker " + c.target.describe();
}
}  // namespace detail

const char* call_outcome_name(CallOutcome outcome) {
  switch (outcome) {
    case CallOutcome::kReplied:
      return "replied";
    case CallOutcome::kTimedOut:
      return "timed out";
    case CallOutcome::kConnectionLost:
      return "connection lost";
    case CallOutcome::kNotSent:
      return "not sent";
    case CallOutcome::kShutDown:
      return "shut down";
  }
  return "unknown";
}

Registry& RpcAgent::registry() const {
  Registry* chosen = options().registry;
  return chosen != nullptr ? *chosen : rpc::registry();
}

std::chrono::milliseconds RpcAgent::effective_timeout(const CallOptions& options) const {
  return options.timeout.count() > 0 ? options.timeout : this->options().rpc_timeout;
}

Future<Value> RpcAgent::send(const Destination& to, Request request, CallOptions options) {
  Future<Value> result;
  const std::chrono::milliseconds timeout = effective_timeout(options);
  result.set_default_timeout(wait_bound(timeout));
  send_request(to, std::move(request), options,
               [result](Value value, std::exception_ptr error) mutable {
                 if (error) {
                   result.try_set_error(std::move(error));
                 } else {
                   result.try_set_value(std::move(value));
                 }
               });
  return result;
}

Future<Value> RpcAgent::call(const Destination& to, std::string function, std::vector<Value> args,
                             CallOptions options) {
  Request request;
  request.handler = kCallHandler;
  request.function = std::move(function);
  request.args = std::move(args);
  return send(to, std::move(request), options);
}

}  // namespace gradwire::rpc
