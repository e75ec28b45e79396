// A trainer group on one owner (TrainerGroup in distributed_optimizer.h): the members'
// clocks, the gradients waiting to be aggregated, and the steps waiting for the staleness
// bound. Private to dist_optim.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/core/future.h"
#include "gradwire/core/mutex.h"
#include "gradwire/dist_optim/distributed_optimizer.h"

namespace gradwire::dist_optim::detail {

class TrainerGroupState {
 public:
  TrainerGroupState(TrainerGroup config, std::string owner, std::shared_ptr<Shard> shard);

  const TrainerGroup& config() const { return config_; }
  const std::shared_ptr<Shard>& shard() const { return shard_; }

  // Worker `id` (named `name`) is a member from now on; a member back after leaving (a
  // restarted trainer) starts at the slowest member's clock.
  void join(int id, const std::string& name);
  // Worker `id` steps no more: nobody waits for it, and the aggregate needs one fewer.
  void leave(int id);
  // Member `id`'s gradients (matched to the shard's parameters): see TrainerGroup.
  // Resolves to how many of them were defined, or to the update's error.
  Future<int64_t> step(rpc::RpcAgent& agent, int id, std::vector<Tensor> grads);

  // For tests and monitoring.
  int64_t updates() const;
  TrainerGroupStats stats() const;

 private:
  struct Member {
    std::string name;
    int64_t clock = 0;  // steps whose update has been applied
    bool active = true;
    bool waiting = false;                   // its step's update applied, held back by the bound
    int64_t result = 0;                     // what its step answers
    std::optional<Future<int64_t>> answer;  // its step in flight
  };
  struct Answer {
    Future<int64_t> future;
    int64_t value = 0;
    std::exception_ptr error;
  };

  int64_t needed() const GRADWIRE_REQUIRES(mutex_);
  int64_t slowest() const GRADWIRE_REQUIRES(mutex_);
  // Applies the pending aggregate (if it is due, or `force` and not empty).
  void maybe_apply(rpc::RpcAgent* agent, bool force, std::vector<Answer>& out)
      GRADWIRE_REQUIRES(mutex_);
  // Answers every member whose update is applied and whom the bound no longer holds.
  void release(std::vector<Answer>& out) GRADWIRE_REQUIRES(mutex_);
  static void deliver(std::vector<Answer>& answers);

  const TrainerGroup config_;
  const std::string owner_;
  const std::shared_ptr<Shard> shard_;
  mutable Mutex mutex_;
  std::map<int, Member> members_ GRADWIRE_GUARDED_BY(mutex_);
  int64_t left_ GRADWIRE_GUARDED_BY(mutex_) = 0;  // members gone for good (or until they rejoin)
  std::vector<Tensor> sum_ GRADWIRE_GUARDED_BY(mutex_);  // the aggregate being gathered
  std::vector<int> contributors_ GRADWIRE_GUARDED_BY(mutex_);
  std::vector<int64_t> found_ GRADWIRE_GUARDED_BY(mutex_);
  rpc::RpcAgent* agent_ GRADWIRE_GUARDED_BY(mutex_) = nullptr;  // the owner's, for a forced apply
  int64_t updates_ GRADWIRE_GUARDED_BY(mutex_) = 0;
};

// Loads a restored optimizer state into a group's shard (ShardCheckpointer::restore);
// InvalidArgument when the state does not fit the shard's parameters or kind.
using RestoreGroup = std::function<void(Shard& shard)>;

// The groups on one owner, by name (an agent attachment).
struct TrainerGroups {
  Mutex mutex;
  std::map<std::string, std::shared_ptr<TrainerGroupState>> by_name GRADWIRE_GUARDED_BY(mutex);
  // Restored states of groups not made yet: applied when a group's first member joins.
  std::map<std::string, RestoreGroup> restored GRADWIRE_GUARDED_BY(mutex);
};

// The agent's trainer groups; Error when dist_optim's extension was not installed on it.
std::shared_ptr<TrainerGroups> trainer_groups(const rpc::RpcAgent& agent);
// Group `name`'s shard on this owner; null when no member has joined it yet.
std::shared_ptr<Shard> group_shard(TrainerGroups& groups, const std::string& name);
// Group `name` on `owner`; InvalidArgument naming both when no member has joined it there.
std::shared_ptr<TrainerGroupState> find_group(const rpc::RpcAgent& owner, const std::string& name);
// Loads a restored state into group `name`'s shard now if the group exists, else when its
// first member joins (that member's join then fails with what `restore` throws).
void restore_group(TrainerGroups& groups, const std::string& name, RestoreGroup restore);

// Registers "gradwire.dist_optim.join_group" and the listener that removes lost workers.
void install_groups(const std::shared_ptr<rpc::RpcAgent>& agent);

}  // namespace gradwire::dist_optim::detail
