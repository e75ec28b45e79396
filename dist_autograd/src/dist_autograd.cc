// The public functions: they find the agent's Container and forward to it.
#include "gradwire/dist_autograd/dist_autograd.h"

#include "container.h"
#include "gradwire/core/logging.h"
#include "gradwire/rpc/registry.h"
#include "gradwire/rpc/rpc.h"

namespace gradwire::dist_autograd {

using internal::Container;
using internal::ctx_text;
using internal::t_context;

namespace {

rpc::RpcAgent& default_agent_ref() {
  return *rpc::default_agent();
}

}  // namespace

uint64_t current_context_id() {
  return t_context;
}

Context::Context() : Context(default_agent_ref()) {}

Context::Context(rpc::RpcAgent& agent) : previous_(t_context) {
  std::shared_ptr<Container> container = Container::of(agent);
  agent_ = container->agent();
  id_ = container->create_context()->id;
  t_context = id_;
}

Context::~Context() {
  t_context = previous_;
  // The context's end: released here at once; its Releases to the workers it reached go on
  // without being waited for (sent again while unanswered, like any Release), so a step's
  // end is not a round trip. A graceful shutdown waits for the releases still going.
  const trace::Span span("dist_autograd.release", "dist_autograd", trace::Arg("context_id", id_));
  try {
    Container::of(*agent_)->release(id_, -1);
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kDebug) << "dist_autograd: releasing context " << ctx_text(id_) << ": "
                         << e.what();
  }
}

Gradients::Gradients(std::vector<std::pair<Tensor, Tensor>> items) : items_(std::move(items)) {
  index_.reserve(items_.size());
  for (size_t i = 0; i < items_.size(); ++i)
    index_.emplace(items_[i].first.impl_ptr().get(), i);
}

Tensor Gradients::at(const Tensor& leaf) const {
  auto it = index_.find(leaf.impl_ptr().get());
  if (it != index_.end()) return items_[it->second].second;
  throw InvalidArgument("dist_autograd: the context holds no gradient for this tensor (" +
                        std::to_string(items_.size()) + " leaves have one)");
}

bool Gradients::contains(const Tensor& leaf) const {
  return index_.count(leaf.impl_ptr().get()) != 0;
}

void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<Tensor>& roots,
              const BackwardOptions& options) {
  Container::of(agent)->backward(context_id, roots, options);
}
void backward(uint64_t context_id, const std::vector<Tensor>& roots,
              const BackwardOptions& options) {
  backward(default_agent_ref(), context_id, roots, options);
}
void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<Tensor>& roots,
              bool retain_graph) {
  backward(agent, context_id, roots, BackwardOptions{.retain_graph = retain_graph});
}
void backward(uint64_t context_id, const std::vector<Tensor>& roots, bool retain_graph) {
  backward(default_agent_ref(), context_id, roots, BackwardOptions{.retain_graph = retain_graph});
}
Gradients get_gradients(rpc::RpcAgent& agent, uint64_t context_id) {
  return Container::of(agent)->gradients(context_id);
}
Gradients get_gradients(uint64_t context_id) {
  return get_gradients(default_agent_ref(), context_id);
}
void release(rpc::RpcAgent& agent, uint64_t context_id) {
  const trace::Span span("dist_autograd.release", "dist_autograd",
                         trace::Arg("context_id", context_id));
  std::shared_ptr<Container> container = Container::of(agent);
  container->get(context_id);
  container->release(context_id, -1).wait(container->agent_wait());
}
Future<void> part_done(const rpc::CallContext& call, uint64_t context_id, uint64_t pass_id) {
  if (call.agent() == nullptr) {
    throw InvalidArgument("dist_autograd::part_done: the call came through no agent");
  }
  return Container::of(*call.agent())
      ->part_for(call.caller(), context_id, pass_id, "request to wait for its part")
      .second;
}
size_t num_contexts(rpc::RpcAgent& agent) {
  return Container::of(agent)->size();
}

namespace detail {
bool ensure_registered() {
  static const bool registered = [] {
    rpc::register_agent_extension("dist_autograd", &Container::install);
    return true;
  }();
  return registered;
}
namespace {
const bool kRegisteredHere = ensure_registered();
}  // namespace
}  // namespace detail

}  // namespace gradwire::dist_autograd
