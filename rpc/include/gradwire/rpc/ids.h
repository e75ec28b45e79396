// Group-unique ids that modules above rpc/ mint for their own objects (rref/'s references
// and forks, dist_autograd/'s contexts, messages and passes), and how messages name them.
//
// An id is 64 bits: the minting worker's id in the top 16, its incarnation in the next 8
// (AgentOptions::rejoin: a replacement that rejoins under the same rank never reuses an id
// its predecessor's peers may still hold), then a 40-bit counter. Zero is never minted, so
// modules may use it for "none".
//
// Thread-safety: IdMinter::mint may be called from any thread.
//
// Example:
//   rpc::IdMinter ids(agent);              // in a module's per-agent state
//   uint64_t id = ids.mint();
//   int minter = rpc::minter_of(id);       // == agent->worker_info().id
//   std::string text = rpc::id_text(id);   // "2:17"
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "gradwire/rpc/agent.h"

namespace gradwire::rpc {

inline constexpr int kIdMinterShift = 48;
inline constexpr int kIdIncarnationShift = 40;

// The worker that minted `id`.
inline int minter_of(uint64_t id) {
  return static_cast<int>(id >> kIdMinterShift);
}

// "minter:rest", as modules name ids in messages and errors.
inline std::string id_text(uint64_t id) {
  return std::to_string(minter_of(id)) + ":" +
         std::to_string(id & ((uint64_t{1} << kIdMinterShift) - 1));
}

// Mints ids for one agent. The incarnation is read at each mint, as the agent knows it
// once it has joined its group; an agent already gone mints under incarnation 0.
class IdMinter {
 public:
  explicit IdMinter(const std::shared_ptr<RpcAgent>& agent)
      : agent_(agent), worker_(static_cast<uint64_t>(agent->worker_info().id)) {}

  uint64_t mint() {
    uint64_t incarnation = 0;
    if (auto a = agent_.lock()) incarnation = static_cast<uint64_t>(a->incarnation()) & 0xff;
    return (worker_ << kIdMinterShift) | (incarnation << kIdIncarnationShift) |
           next_.fetch_add(1, std::memory_order_relaxed);
  }

 private:
  const std::weak_ptr<RpcAgent> agent_;
  const uint64_t worker_;
  std::atomic<uint64_t> next_{1};
};

}  // namespace gradwire::rpc
