// The lock every optimizer update on one worker takes (an agent attachment, installed with
// dist_optim's agent extension), and the count of updates applied under it. Private to
// dist_optim: the updates of every DistributedOptimizer and trainer group on the worker
// take it, and a shard's snapshot (ShardCheckpointer) takes it to see no update half-applied.
#pragma once

#include <cstdint>
#include <memory>

#include "gradwire/core/mutex.h"
#include "gradwire/rpc/agent.h"

namespace gradwire::dist_optim::detail {

// One per agent: steps of every optimizer on this worker run one at a time, so trainers
// stepping the same parameters never interleave inside one update.
struct StepLock {
  Mutex mutex;
  // The agent it belongs to, for a step that runs after its request's handler returned.
  std::weak_ptr<rpc::RpcAgent> agent;
  // Updates applied on this worker (every optimizer's), restored with a snapshot.
  int64_t updates GRADWIRE_GUARDED_BY(mutex) = 0;
};

// The registered function a worker answers with its incarnation (RpcAgent::incarnation).
inline constexpr const char* kIncarnationFunction = "gradwire.dist_optim.incarnation";

// The agent's step lock; Error when dist_optim's extension was not installed on it.
std::shared_ptr<StepLock> step_lock(const rpc::RpcAgent& agent);

}  // namespace gradwire::dist_optim::detail
