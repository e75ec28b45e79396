#include "gradwire/rpc/rpc.h"

#include <mutex>

#include "gradwire/c10d/rendezvous.h"
#include "gradwire/core/env.h"
#include "gradwire/rpc/tensorpipe_agent.h"

namespace gradwire::rpc {
namespace {

// The default agent of the free functions. init_rpc and shutdown hold `lifecycle` for
// their whole run, so they are serialised; readers only take `current`'s lock.
std::mutex lifecycle;
std::mutex current_mutex;
std::shared_ptr<RpcAgent> current;

}  // namespace

std::shared_ptr<RpcAgent> init_rpc(std::string name, int rank, int world_size,
                                   AgentOptions options) {
  std::lock_guard serial(lifecycle);
  {
    std::lock_guard lock(current_mutex);
    if (current != nullptr) {
      throw Error("rpc: init_rpc('" + name + "') called while rpc is initialised as worker " +
                  current->worker_info().describe() + "; call shutdown() first");
    }
  }
  // A worker that a launcher restarted alone replaces its lost predecessor.
  if (!options.rejoin) options.rejoin = env_bool("GRADWIRE_RPC_REJOIN", false);
  // An elastic job's launcher (gradwire-run --role NAME:N) starts every worker elastic, and
  // the workers of a node that arrives later as joiners.
  if (!options.elastic) options.elastic = env_bool("GRADWIRE_RPC_ELASTIC", false);
  if (!options.join_running) options.join_running = env_bool("GRADWIRE_RPC_JOIN", false);
  std::shared_ptr<c10d::Store> store = options.store;
  if (store == nullptr) {
    // The rendezvous URL may carry rank and world size; the explicit arguments win.
    std::string url = options.init_method;
    if (url.rfind("env://", 0) == 0 || url.rfind("tcp://", 0) == 0 ||
        url.rfind("file://", 0) == 0) {
      const char sep = url.find('?') == std::string::npos ? '?' : '&';
      url += std::string(1, sep) + "rank=" + std::to_string(rank) +
             "&world_size=" + std::to_string(world_size);
      // A replacement takes its rank over in the rendezvous's claims too.
      if (options.rejoin && url.find("rejoin=") == std::string::npos) url += "&rejoin=1";
    }
    store = c10d::rendezvous(url, options.join_timeout).store;
    options.store = store;
  }
  auto agent = make_tensorpipe_agent(std::move(name), rank, world_size, store, std::move(options));
  std::lock_guard lock(current_mutex);
  current = agent;
  return agent;
}

std::shared_ptr<RpcAgent> default_agent() {
  std::lock_guard lock(current_mutex);
  if (current == nullptr) {
    throw Error("rpc is not initialised: call init_rpc first (or it was shut down)");
  }
  return current;
}

void leave() {
  std::lock_guard serial(lifecycle);
  std::shared_ptr<RpcAgent> agent;
  {
    std::lock_guard lock(current_mutex);
    agent = current;
  }
  if (agent == nullptr) throw Error("rpc: leave() called but rpc is not initialised");
  auto release = [&] {
    std::lock_guard lock(current_mutex);
    current.reset();
  };
  try {
    agent->leave();
  } catch (const InvalidArgument&) {
    throw;  // refused before anything happened: the agent still runs
  } catch (...) {
    release();
    throw;
  }
  release();
}

void shutdown(bool graceful) {
  std::lock_guard serial(lifecycle);
  std::shared_ptr<RpcAgent> agent;
  {
    std::lock_guard lock(current_mutex);
    agent = current;
  }
  if (agent == nullptr) throw Error("rpc: shutdown() called but rpc is not initialised");
  auto release = [&] {
    std::lock_guard lock(current_mutex);
    current.reset();
  };
  try {
    agent->shutdown(graceful);
  } catch (...) {
    release();
    throw;
  }
  release();
}

}  // namespace gradwire::rpc
