// Recording: the interceptor that makes send and recv functions as messages within a
// context go and come, and the thread-local current context.
#include "container.h"

#include "gradwire/core/printable.h"

#include "gradwire/rpc/value_walk.h"

namespace gradwire::dist_autograd::internal {

thread_local uint64_t t_context = 0;

// The tensors that require grad inside a message's values, in order.
std::vector<Tensor> grad_tensors(const std::vector<const Value*>& values) {
  std::vector<Tensor> out;
  for (const Value* v : values) {
    rpc::for_each_leaf(*v, [&](const Value& leaf) {
      if (leaf.type() != rpc::ValueType::kTensor) return;
      const Tensor& t = leaf.as_tensor();
      if (t.defined() && t.requires_grad()) out.push_back(t);
    });
  }
  return out;
}

std::shared_ptr<void> Container::on_outgoing_request(const WorkerInfo& to, rpc::Request& request) {
  const uint64_t ctx = t_context;
  if (ctx == 0 || request.handler == kDistAutogradHandler) return nullptr;
  std::shared_ptr<ContextState> state = find(ctx);
  if (state == nullptr) return nullptr;
  request.autograd_context_id = ctx;
  request.autograd_message_id = 0;
  std::vector<const Value*> values;
  for (const Value& v : request.args)
    values.push_back(&v);
  std::vector<Tensor> sent = grad_tensors(values);
  MutexLock lock(state->mutex);
  state->touched.insert(to.id);
  if (!sent.empty()) {
    const uint64_t message_id = mint();
    state->sends[message_id] = std::make_shared<SendBackward>(sent, to.id);
    request.autograd_message_id = message_id;
  }
  return nullptr;
}

std::shared_ptr<rpc::ServeScope> Container::on_incoming_request(const WorkerInfo& from,
                                                                rpc::Request& request) {
  const uint64_t ctx = request.autograd_context_id;
  if (ctx == 0 || request.handler == kDistAutogradHandler) return nullptr;
  if (from.id < 0) throw CallRejected("dist_autograd: a context from outside the group");
  std::shared_ptr<ContextState> state = get_or_make(ctx, from.id);
  {
    MutexLock lock(state->mutex);
    state->touched.insert(from.id);
  }
  if (request.autograd_message_id != 0) {
    std::vector<const Value*> values;
    for (const Value& v : request.args)
      values.push_back(&v);
    attach_recv(ctx, from, request.autograd_message_id, grad_tensors(values));
  }
  return std::make_shared<ContextScope>(ctx);
}

void Container::on_outgoing_response(const WorkerInfo& to, const rpc::Request& request,
                                     rpc::Response& response) {
  response.autograd_message_id = 0;
  const uint64_t ctx = request.autograd_context_id;
  if (ctx == 0 || request.handler == kDistAutogradHandler) return;
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr) return;
  std::vector<Tensor> sent = grad_tensors({value});
  if (sent.empty()) return;
  std::shared_ptr<ContextState> state = find(ctx);
  if (state == nullptr) {
    // Released while the call ran (its creator was lost, say): sent as it is, the result
    // would reach the caller cut off from the pass, whose backward would then succeed
    // without the gradients that should have flowed back through this call.
    throw Error("dist_autograd: context " + ctx_text(ctx) + " was released on worker " +
                self_.describe() + " while " + printable(request.function, 200) +
                " ran; its result cannot join the backward pass");
  }
  const uint64_t message_id = mint();
  MutexLock lock(state->mutex);
  state->sends[message_id] = std::make_shared<SendBackward>(sent, to.id);
  state->touched.insert(to.id);
  response.autograd_context_id = ctx;
  response.autograd_message_id = message_id;
}

void Container::on_incoming_response(const WorkerInfo& from, rpc::Response& response,
                                     const std::shared_ptr<void>&) {
  if (response.autograd_context_id == 0 || response.autograd_message_id == 0) return;
  const Value* value = std::get_if<Value>(&response.result);
  if (value == nullptr) return;
  if (find(response.autograd_context_id) == nullptr) return;
  attach_recv(response.autograd_context_id, from, response.autograd_message_id,
              grad_tensors({value}));
}

std::shared_ptr<rpc::ServeScope> Container::capture_thread_state() {
  if (t_context == 0) return nullptr;
  return std::make_shared<ContextScope>(t_context);
}

void Container::attach_recv(uint64_t ctx, const WorkerInfo& from, uint64_t message_id,
                            const std::vector<Tensor>& received) {
  if (received.empty()) return;
  auto recv = std::make_shared<RecvBackward>(weak_from_this(), ctx, from, message_id);
  for (const Tensor& t : received)
    autograd::set_history(t, recv);
}

}  // namespace gradwire::dist_autograd::internal
