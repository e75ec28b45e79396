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

void Interceptor::on_outgoing_request(const WorkerInfo&, Request&) {}
void Interceptor::on_incoming_request(const WorkerInfo&, Request&) {}
void Interceptor::on_outgoing_response(const WorkerInfo&, const Request&, Response&) {}
void Interceptor::on_incoming_response(const WorkerInfo&, Response&) {}

Registry& RpcAgent::registry() const {
  Registry* chosen = options().registry;
  return chosen != nullptr ? *chosen : rpc::registry();
}

std::chrono::milliseconds RpcAgent::effective_timeout(const CallOptions& options) const {
  return options.timeout.count() > 0 ? options.timeout : this->options().rpc_timeout;
}

Future<Value> RpcAgent::send(const Destination& to, Request request, CallOptions options) {
  Future<Value> result;
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
