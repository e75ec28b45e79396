// dist_autograd: backward passes across remote calls.
//
// Inside a dist_autograd::Context, every rpc_sync / rpc_async / remote / RRef proxy call
// whose arguments (or result) hold tensors that require grad is recorded: a send function on
// the sender and a recv function on the receiver, for the request and for the reply. The
// context id and the message id travel in the rpc envelope. backward(ctx_id, roots) then
// carries gradients back along those calls: each worker runs its part of the graph on its
// own, and the gradients of its leaves accumulate in the context on that worker
// (get_gradients), never in .grad, so concurrent contexts stay apart.
//
//   {
//     dist_autograd::Context ctx(*agent);                // RAII: released on every worker
//     Tensor y = agent->rpc_sync<Tensor>("ps0", "forward", x);
//     Tensor loss = sum(mul(y, y));
//     dist_autograd::backward(*agent, ctx.id(), {loss});
//     auto grads = dist_autograd::get_gradients(*agent, ctx.id());   // this worker's leaves
//   }
//
// Correct beyond PyTorch's FAST mode. Before any gradient flows, the pass discovers which
// recorded sends will receive a gradient: the initiator walks its graph from the roots, and
// every recv function it reaches asks the worker of its send to walk on from there,
// recursively. Each worker thus knows exactly how many gradients each of its sends will
// receive before the first arrives, and runs its part as one graph task (autograd's
// GraphTask): a node reached by several remote paths runs once, with the sum, and only then
// frees its saved tensors; a call whose result never reaches the loss is never waited for.
// docs/dist_autograd.md describes the messages.
//
// Context ids are unique in the group: the worker id in the high 16 bits. The current
// context is a thread-local (the one rpc/'s ServeScope sets around every request served
// within a context), so nested calls made by a function serving a request join it.
//
// Thread-safety: every function may be called from any thread; contexts on different
// threads are independent; one context may run one backward pass at a time.
//
// Errors: an unknown or released context id, backward without roots or with a root that
// does not require grad, a second pass while one runs: InvalidArgument. The first failure
// of any worker's part ends the pass at once, on every worker, with that error:
//   - a node failing on another worker, or a worker refusing gradients sent to it:
//     RemoteError naming that worker;
//   - a worker lost mid-pass, or gradients that could not reach it: NetworkError naming it
//     (a RemoteError naming the worker that could not reach it, when that was not this one);
//   - the pass outliving its deadline (BackwardOptions::timeout): TimeoutError.
// After a failed pass, every worker it reached has taken back what the pass gave its
// leaves, and get_gradients (and so DistributedOptimizer::step) throws Error naming the
// failure on each of them until a later pass in the context succeeds there.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gradwire/core/future.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::dist_autograd {

// The handler id dist_autograd/ owns on every agent (rpc/ owns 1, rref/ 2).
inline constexpr uint32_t kDistAutogradHandler = 3;

// The context current on this thread (0: none).
uint64_t current_context_id();

// A dist-autograd context on `agent`, current on this thread while it lives (the previous
// one is restored at its end). Its end releases it here at once and sends its release to
// every worker it touched without waiting for their answers (sent again while unanswered),
// so the end of a training step costs no round trip; those workers drop it shortly after. A
// graceful shutdown of the agent waits for the releases still going. Use release() to wait.
class Context {
 public:
  // On the default agent (init_rpc).
  Context();
  explicit Context(rpc::RpcAgent& agent);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  uint64_t id() const { return id_; }

 private:
  // Held, so that rpc::shutdown() (which lets the default agent go) cannot free the agent
  // this context still has to release itself on.
  std::shared_ptr<rpc::RpcAgent> agent_;
  uint64_t id_;
  uint64_t previous_;
};

// This worker's leaves and their gradients in one context (a snapshot, taken by
// get_gradients). Leaves are told apart by identity (Tensor::is_same); at() and contains()
// look a leaf up by hash, in constant time.
//
// DDP inside a context (ddp/reducer.h): for the parameters of a DistributedDataParallel
// whose forward fed a backward pass in this context, the context holds the gradients
// averaged across the DDP group, on every rank, whatever the DDP's options — parameters a
// rank did not use included (zeros averaged in), except those no rank used, which keep
// what they had. The Reducer reads the context's gradient through the pass's GradientSink
// and writes the average back before the pass completes (autograd/gradient_sink.h).
class Gradients {
 public:
  Gradients() = default;
  explicit Gradients(std::vector<std::pair<Tensor, Tensor>> items);
  // The gradient of `leaf`; InvalidArgument when the context holds none for it.
  Tensor at(const Tensor& leaf) const;
  bool contains(const Tensor& leaf) const;
  size_t size() const { return items_.size(); }
  // (leaf, gradient), in the order the leaves first received one.
  const std::vector<std::pair<Tensor, Tensor>>& items() const { return items_; }

 private:
  std::vector<std::pair<Tensor, Tensor>> items_;
  std::unordered_map<const void*, size_t> index_;  // leaf's TensorImpl -> position in items_
};

// How long a pass may take by default: generous, since a pass's size has no bound the
// library could know; set BackwardOptions::timeout for a tighter one.
inline constexpr std::chrono::milliseconds kDefaultBackwardTimeout{30 * 60 * 1000};

struct BackwardOptions {
  // Keep the recorded graph for another pass (its gradients then accumulate).
  bool retain_graph = false;
  // The pass's deadline, from the call: discovery, every worker's part and their reports
  // all within it, whatever the agent's rpc_timeout; > 0 (kNoTimeout: none).
  std::chrono::milliseconds timeout{kDefaultBackwardTimeout};
  // Called at most once during the pass, when every worker's part but one has ended well and
  // the one left is another worker: with the pass's id and that worker. The pass then
  // succeeds exactly when that worker's part does, so a request sent to it from here may
  // wait there, with part_done(), for its part to end and act on the pass's gradients at
  // once (dist_optim's backward_and_step() sends its step this way, saving a round trip).
  // Runs on the agent's pool, possibly after backward() has returned; it should not block
  // for long. What it throws is logged and otherwise ignored.
  std::function<void(uint64_t pass_id, const rpc::WorkerInfo& last)> on_last_part = nullptr;
  // The hook never blocks and does little (it sends, say, one rpc_async): then it runs on the
  // thread that saw the last part but one end, which may be a transport's or the one that
  // ran that part's last node, instead of the pool: no pool thread has to wake up first
  // (on a machine whose cores are all busy, that wake-up can come hundreds of microseconds
  // late). A hook that blocks there stalls that thread's other work.
  bool on_last_part_inline = false;
};

// Runs a backward pass from `roots` (one-element tensors get gradient 1) in context
// `context_id`, which must be current here or known to this worker; returns when every
// worker's part is done, or throws the first failure (see Errors above).
void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<Tensor>& roots,
              const BackwardOptions& options);
void backward(uint64_t context_id, const std::vector<Tensor>& roots,
              const BackwardOptions& options);
void backward(rpc::RpcAgent& agent, uint64_t context_id, const std::vector<Tensor>& roots,
              bool retain_graph = false);
void backward(uint64_t context_id, const std::vector<Tensor>& roots, bool retain_graph = false);

// This worker's leaves and their gradients in the context. Error naming the failure when
// the context's last pass failed here (and no pass has succeeded here since).
Gradients get_gradients(rpc::RpcAgent& agent, uint64_t context_id);
Gradients get_gradients(uint64_t context_id);

// Releases the context here and on every worker it touched, and returns once they have all
// released it (bounded by the agent's rpc_timeout). A Context's end does the same without
// waiting.
void release(rpc::RpcAgent& agent, uint64_t context_id);

// For a request that BackwardOptions::on_last_part sent: completes when this worker's part in
// pass `pass_id` of context `context_id` is over, with the part's error if it failed (or was
// aborted, or the context released). Only the pass's initiator may ask (`call.caller()`):
// anyone else gets CallRejected, as does a pass this worker takes no part in (it has no
// part to end) or a context it does not hold. No timeout of its own: the part ends by the
// pass's deadline, an abort or the context's release.
Future<void> part_done(const rpc::CallContext& call, uint64_t context_id, uint64_t pass_id);

// How many contexts this worker holds (for monitoring and tests).
size_t num_contexts(rpc::RpcAgent& agent);

namespace detail {
bool ensure_registered();
inline const bool kRegistered = ensure_registered();
}  // namespace detail

}  // namespace gradwire::dist_autograd
