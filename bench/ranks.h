// Runs the ranks of a multi-process benchmark: forks one process per rank, each of which
// joins a TCPStore served by the caller (under its own key prefix) and runs `body`; rank 0's
// figures come back through the store.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/rpc/agent.h"

namespace gradwire::c10d {
class Store;
}  // namespace gradwire::c10d

namespace gradwire::bench {

using RankBody = std::function<std::vector<double>(std::shared_ptr<c10d::Store> store, int rank)>;

// How long the ranks of one run may take, all together; past it the ones still running are
// killed (a hang in a rank must not hang the whole benchmark).
inline constexpr std::chrono::seconds kRanksDeadline{600};

// Throws std::runtime_error naming `what` when a rank process fails, or naming the ranks
// killed at kRanksDeadline.
std::vector<double> run_rank_processes(uint16_t store_port, const std::string& prefix, int world,
                                       const RankBody& body, const std::string& what);

// The agent options of a rank process's agent: `reg`'s functions, on 127.0.0.1 (the ranks are
// processes of this machine), calls allowed 120 s (a benchmark's calls are its own, and a
// slow shared machine must not turn a figure into a timeout).
inline rpc::AgentOptions rank_agent_options(rpc::Registry& reg) {
  rpc::AgentOptions options;
  options.registry = &reg;
  options.host = "127.0.0.1";
  options.rpc_timeout = std::chrono::seconds(120);
  return options;
}

}  // namespace gradwire::bench
