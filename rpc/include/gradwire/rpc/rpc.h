// The free functions of rpc/: init_rpc, rpc_sync, rpc_async, shutdown, get_worker_info.
//
// They forward to the default agent, which init_rpc creates (a TensorPipe agent, see
// tensorpipe_agent.h) and shutdown releases. Programs that need several agents in one
// process (tests running ranks as threads) create agents with make_tensorpipe_agent and
// call their methods instead; nothing here is needed for that.
//
// init_rpc(name, rank, world_size, options) rendezvouses through options.store when set,
// else through options.init_method (env:// by default: MASTER_ADDR and MASTER_PORT).
// GRADWIRE_RPC_REJOIN=1 sets options.rejoin: the worker replaces a lost one of the running
// group under the same name and rank (gradwire-run --restart-workers sets it).
// GRADWIRE_RPC_ELASTIC=1 sets options.elastic and GRADWIRE_RPC_JOIN=1 options.join_running
// (docs/elastic.md; gradwire-run sets them for --role jobs). leave() is the default agent's
// RpcAgent::leave().
//
// Thread-safety: every function may be called from any thread; init_rpc and shutdown are
// serialised with each other.
// Errors: init_rpc throws Error when rpc is already initialised, plus what
// make_tensorpipe_agent and the rendezvous throw; every other function throws
// Error("rpc is not initialised ...") before init_rpc or after shutdown, plus what the
// agent's method throws (agent.h).
//
// Example:
//   rpc::registry().def("add", [](const Tensor& a, const Tensor& b) { return a + b; });
//   rpc::init_rpc("trainer0", rank, world_size);
//   Tensor c = rpc::rpc_sync<Tensor>("ps0", "add", a, b);
//   rpc::shutdown();
#pragma once

#include <memory>
#include <string>
#include <utility>

#include "gradwire/rpc/agent.h"

namespace gradwire::rpc {

std::shared_ptr<RpcAgent> init_rpc(std::string name, int rank, int world_size,
                                   AgentOptions options = {});
// The default agent; Error when rpc is not initialised.
std::shared_ptr<RpcAgent> default_agent();
// Shuts the default agent down (see RpcAgent::shutdown) and releases it.
void shutdown(bool graceful = true);
// The default agent leaves its elastic group (RpcAgent::leave) and is released.
void leave();

inline WorkerInfo get_worker_info() {
  return default_agent()->worker_info();
}
inline WorkerInfo get_worker_info(const Destination& worker) {
  return default_agent()->get_worker_info(worker);
}

template <typename R, typename... Args>
Future<R> rpc_async(const Destination& to, std::string function, Args&&... args) {
  return default_agent()->rpc_async<R>(to, std::move(function), std::forward<Args>(args)...);
}
template <typename R, typename... Args>
R rpc_sync(const Destination& to, std::string function, Args&&... args) {
  return default_agent()->rpc_sync<R>(to, std::move(function), std::forward<Args>(args)...);
}

}  // namespace gradwire::rpc
