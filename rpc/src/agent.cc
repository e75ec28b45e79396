#include "gradwire/rpc/agent.h"

#include <ostream>
#include <utility>

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
