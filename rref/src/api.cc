// The free functions rref.h declares: what RRef<T>, remote() and the metrics call on an
// agent's context (RRefContext::of).
#include <cxxabi.h>

#include <cstdlib>
#include <utility>

#include "context.h"
#include "gradwire/core/printable.h"
#include "messages.h"

namespace gradwire::rref {

bool contains_references(const Value& value) {
  return has_descriptor(value);
}

namespace detail {

std::string demangle(const char* name) {
  int status = 0;
  char* text = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || text == nullptr) return name;
  std::string out(text);
  std::free(text);
  return out;
}

void throw_empty() {
  throw Error("rref: this RRef is empty (default-constructed or moved from)");
}

void throw_unnamed_type(const std::string& cpp_name) {
  throw InvalidArgument("rref: RRef<" + cpp_name +
                        ">: the type is neither a class registered with def_class on this "
                        "worker's registry nor a value type with a ValueConverter");
}

CallContext sending_context(rpc::RpcAgent& agent) {
  return CallContext(&agent, agent.worker_info(), 0, CallContext::Clock::time_point::max());
}

std::chrono::milliseconds wait_bound(rpc::RpcAgent& agent, const rpc::CallOptions& options) {
  return agent.effective_timeout(options);
}

void throw_timeout(const std::string& what, std::chrono::milliseconds waited) {
  throw TimeoutError("rref: " + what + " timed out after " + std::to_string(waited.count()) +
                     " ms");
}

std::shared_ptr<RRefCore> create(rpc::RpcAgent& agent, const rpc::Destination& to, std::string name,
                                 std::string type_name, std::vector<Value> args,
                                 rpc::CallOptions options) {
  std::shared_ptr<RRefContext> context = RRefContext::of(agent);
  const WorkerInfo owner = agent.get_worker_info(to);
  if (owner.id == context->self().id) {
    return context->create_local(std::move(name), std::move(type_name), std::move(args));
  }
  return context->create_remote(owner, std::move(name), std::move(type_name), std::move(args),
                                options);
}

std::shared_ptr<RRefCore> own_value(rpc::RpcAgent& agent, std::string type_name, Value value) {
  return RRefContext::of(agent)->own(std::move(type_name), std::move(value), nullptr);
}

std::shared_ptr<RRefCore> own_object(rpc::RpcAgent& agent, std::string class_name,
                                     std::shared_ptr<void> object) {
  return RRefContext::of(agent)->own(std::move(class_name), Value(), std::move(object));
}

std::shared_ptr<RRefCore> receive(const Value& value, const rpc::Where& where,
                                  const CallContext& ctx, const std::string& expected_type) {
  if (value.type() != rpc::ValueType::kRRef) {
    throw InvalidArgument(where.str() + ": expected RRef<" + expected_type + ">, received " +
                          value.describe());
  }
  const RRefDescriptor& d = value.as_rref();
  if (ctx.agent() == nullptr) {
    throw InvalidArgument(where.str() +
                          ": an RRef converts only inside a call made or served by an agent "
                          "(it must find that agent's references)");
  }
  std::shared_ptr<RRefContext> context = RRefContext::of(*ctx.agent());
  if (d.type_name != expected_type) {
    // A descriptor that arrived was checked (validate); one made here is quoted escaped too.
    throw InvalidArgument(where.str() + ": expected RRef<" + expected_type + ">, received RRef<" +
                          printable(d.type_name, kMaxTypeNameBytes) + "> (RRef " +
                          id_text(d.rref_id) + " owned by worker " + std::to_string(d.owner) + ")");
  }
  std::shared_ptr<RRefCore> core = context->find_received(d);
  if (core == nullptr) {
    throw InvalidArgument(where.str() + ": RRef " + id_text(d.rref_id) + " (fork " +
                          id_text(d.fork_id) + ") was not received by worker " +
                          context->self().describe() +
                          " (a Value holding an RRef converts only where it arrived)");
  }
  return core;
}

}  // namespace detail

RRefMetrics metrics(rpc::RpcAgent& agent) {
  return RRefContext::of(agent)->metrics();
}

RRefMetrics metrics_at_close(rpc::RpcAgent& agent) {
  return RRefContext::of(agent)->metrics_at_close();
}

void wait_idle(rpc::RpcAgent& agent, std::chrono::milliseconds timeout) {
  RRefContext::of(agent)->wait_idle(deadline_after(timeout), "wait_idle");
}

bool wait_owned_values(rpc::RpcAgent& agent, int64_t count, std::chrono::milliseconds timeout) {
  return RRefContext::of(agent)->wait_owned_values(count, deadline_after(timeout));
}

}  // namespace gradwire::rref
