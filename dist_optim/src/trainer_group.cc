// Trainer groups (TrainerGroup): the owner side. One TrainerGroupState per (owner, group
// name) holds the shared optimizer's shard, the members' clocks and the aggregate being
// gathered; a member's step is a Future answered once its update is applied and the
// staleness bound lets it go on. Answers are delivered outside the group's lock.
#include "trainer_group.h"

#include <algorithm>
#include <limits>
#include <sstream>
#include <utility>

#include "gradwire/core/check.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/trace.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::dist_optim {

void TrainerGroup::validate() const {
  GRADWIRE_CHECK_ARG(!name.empty()) << "dist_optim: a TrainerGroup needs a name";
  GRADWIRE_CHECK_ARG(trainers >= 1)
      << "dist_optim: TrainerGroup '" << name << "': trainers must be >= 1, got " << trainers;
  GRADWIRE_CHECK_ARG(max_staleness >= -1)
      << "dist_optim: TrainerGroup '" << name
      << "': max_staleness must be >= 0 (or -1: unbounded), got " << max_staleness;
  GRADWIRE_CHECK_ARG(aggregate >= 0 && aggregate <= trainers)
      << "dist_optim: TrainerGroup '" << name
      << "': aggregate must be in [1, trainers = " << trainers
      << "] (or 0: every member of the moment), got " << aggregate;
}

namespace detail {

TrainerGroupState::TrainerGroupState(TrainerGroup config, std::string owner,
                                     std::shared_ptr<Shard> shard)
    : config_(std::move(config)), owner_(std::move(owner)), shard_(std::move(shard)) {}

int64_t TrainerGroupState::needed() const {
  // The members expected or joined (trainers that join a running job add to them), less
  // those gone.
  const int64_t members =
      std::max<int64_t>(config_.trainers, static_cast<int64_t>(members_.size()));
  const int64_t present = std::max<int64_t>(1, members - left_);
  return config_.aggregate == 0 ? present : std::min<int64_t>(config_.aggregate, present);
}

int64_t TrainerGroupState::slowest() const {
  // Members expected but not yet joined count as the slowest (clock 0).
  if (static_cast<int64_t>(members_.size()) < config_.trainers) return 0;
  int64_t low = std::numeric_limits<int64_t>::max();
  for (const auto& [id, m] : members_) {
    if (m.active) low = std::min(low, m.clock);
  }
  return low == std::numeric_limits<int64_t>::max() ? 0 : low;
}

void TrainerGroupState::join(int id, const std::string& name) {
  {
    MutexLock lock(mutex_);
    auto it = members_.find(id);
    if (it == members_.end()) {
      Member m;
      m.name = name;
      // A trainer joining a running job starts level with the slowest member, so that the
      // staleness bound does not hold everyone back until it has caught up from step 0.
      int64_t low = std::numeric_limits<int64_t>::max();
      for (const auto& [other, o] : members_)
        if (o.active) low = std::min(low, o.clock);
      if (static_cast<int64_t>(members_.size()) >= config_.trainers &&
          low != std::numeric_limits<int64_t>::max())
        m.clock = low;
      members_.emplace(id, std::move(m));
      return;
    }
    Member& m = it->second;
    if (!m.active) {
      --left_;
      m.active = true;
      m.waiting = false;
      m.answer.reset();
      // Back after a loss: it starts level with the slowest of the others.
      int64_t low = std::numeric_limits<int64_t>::max();
      for (const auto& [other, o] : members_)
        if (other != id && o.active) low = std::min(low, o.clock);
      m.clock = low == std::numeric_limits<int64_t>::max() ? m.clock : low;
    }
    m.name = name;
  }
}

void TrainerGroupState::leave(int id) {
  std::vector<Answer> out;
  {
    MutexLock lock(mutex_);
    auto it = members_.find(id);
    if (it == members_.end() || !it->second.active) return;
    Member& m = it->second;
    m.active = false;
    ++left_;
    if (m.answer && !m.waiting &&
        std::find(contributors_.begin(), contributors_.end(), id) == contributors_.end()) {
      m.answer.reset();
    }
    // One member fewer: an aggregate that now has enough is applied.
    maybe_apply(agent_, false, out);
    release(out);
  }
  deliver(out);
}

Future<int64_t> TrainerGroupState::step(rpc::RpcAgent& agent, int id, std::vector<Tensor> grads) {
  Future<int64_t> answer;
  std::vector<Answer> out;
  {
    MutexLock lock(mutex_);
    auto it = members_.find(id);
    if (it == members_.end() || !it->second.active) {
      std::ostringstream os;
      os << "dist_optim: worker " << id << " is not a member of trainer group '" << config_.name
         << "' on " << owner_ << (it == members_.end() ? "" : " (it left)");
      throw InvalidArgument(os.str());
    }
    Member& m = it->second;
    if (m.answer) {
      throw InvalidArgument("dist_optim: " + m.name + " stepped trainer group '" + config_.name +
                            "' on " + owner_ + " again before its last step was answered");
    }
    agent_ = &agent;
    int64_t found = 0;
    if (sum_.empty()) sum_.resize(grads.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!grads[i].defined()) continue;
      ++found;
      // add() makes a new tensor (sparse rows stay sparse): the context's own gradient is
      // never written into.
      sum_[i] = sum_[i].defined() ? add(sum_[i], grads[i]) : grads[i];
    }
    contributors_.push_back(id);
    found_.push_back(found);
    m.answer = answer;
    maybe_apply(&agent, false, out);
    release(out);
  }
  deliver(out);
  return answer;
}

void TrainerGroupState::maybe_apply(rpc::RpcAgent* agent, bool force, std::vector<Answer>& out) {
  const int64_t count = static_cast<int64_t>(contributors_.size());
  // Due once enough members still in the group have contributed: the gradient of one that
  // left (or was lost) after stepping stays in the aggregate but does not stand for a live
  // member's, or the round would close without a member whose step then waits alone.
  int64_t live = 0;
  for (int id : contributors_) {
    auto it = members_.find(id);
    if (it != members_.end() && it->second.active) ++live;
  }
  if (count == 0 || (!force && live < needed()) || agent == nullptr) return;
  std::vector<Tensor> grads = std::move(sum_);
  sum_.clear();
  std::vector<int> who = std::move(contributors_);
  contributors_.clear();
  std::vector<int64_t> found = std::move(found_);
  found_.clear();
  if (count > 1) {
    for (Tensor& g : grads)
      if (g.defined()) g = mul(g, 1.0 / static_cast<double>(count));
  }
  double factor = 1.0;
  if (config_.lr_scaling == LrScaling::kLinear) factor = static_cast<double>(count);
  if (config_.lr_scaling == LrScaling::kInverseTrainers) factor = 1.0 / config_.trainers;
  std::exception_ptr error;
  try {
    trace::Span span("dist_optim.group_update", "dist_optim", trace::Arg("gradients", count),
                     trace::Arg("update", updates_ + 1));
    shard_->apply(*agent, std::move(grads), factor);
    ++updates_;
  } catch (...) {
    error = std::current_exception();
  }
  for (size_t k = 0; k < who.size(); ++k) {
    Member& m = members_.at(who[k]);
    if (!m.answer) continue;  // it left
    if (error != nullptr) {
      out.push_back(Answer{*m.answer, 0, error});
      m.answer.reset();
      continue;
    }
    m.clock += 1;
    m.waiting = true;
    m.result = found[k];
  }
}

void TrainerGroupState::release(std::vector<Answer>& out) {
  const int64_t low = slowest();
  for (auto& [id, m] : members_) {
    if (!m.waiting || !m.answer) continue;
    // A member gone is never held back; otherwise at most max_staleness ahead.
    if (m.active && config_.max_staleness >= 0 && m.clock - config_.max_staleness > low) continue;
    out.push_back(Answer{*m.answer, m.result, nullptr});
    m.answer.reset();
    m.waiting = false;
  }
}

void TrainerGroupState::deliver(std::vector<Answer>& answers) {
  for (Answer& a : answers) {
    if (a.error != nullptr) {
      a.future.set_error(a.error);
    } else {
      a.future.set_value(a.value);
    }
  }
}

int64_t TrainerGroupState::updates() const {
  MutexLock lock(mutex_);
  return updates_;
}

TrainerGroupStats TrainerGroupState::stats() const {
  MutexLock lock(mutex_);
  TrainerGroupStats out;
  out.members = static_cast<int64_t>(members_.size());
  for (const auto& [id, m] : members_)
    out.active += m.active ? 1 : 0;
  out.pending = static_cast<int64_t>(contributors_.size());
  out.updates = updates_;
  return out;
}

namespace {

constexpr const char* kJoinGroup = "gradwire.dist_optim.join_group";

// What must agree between the members of a group on one owner; empty when all does.
std::string difference(const TrainerGroup& a, const TrainerGroup& b) {
  std::ostringstream os;
  if (a.trainers != b.trainers) os << "trainers " << a.trainers << " vs " << b.trainers << "; ";
  if (a.max_staleness != b.max_staleness)
    os << "max_staleness " << a.max_staleness << " vs " << b.max_staleness << "; ";
  if (a.aggregate != b.aggregate)
    os << "aggregate " << a.aggregate << " vs " << b.aggregate << "; ";
  if (a.lr_scaling != b.lr_scaling) os << "lr_scaling differs; ";
  return os.str();
}

std::string spec_difference(const StateDict& a, const StateDict& b) {
  // The type and hyperparameters (a spec has nothing else).
  if (a.size() != b.size()) return "the optimizer specs have different entries";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first) return "the optimizer specs have different entries";
    if (!equal(a[i].second, b[i].second)) return "the optimizers differ in '" + a[i].first + "'";
  }
  return "";
}

// Removes lost workers from every group on this owner, so that nobody waits for them. The
// listener runs on an I/O thread, which must not block; leaving may apply an update (the
// aggregate the lost worker was awaited for), so it runs on the agent's pool.
class GroupWatch : public rpc::AgentListener {
 public:
  GroupWatch(std::weak_ptr<TrainerGroups> groups, std::weak_ptr<rpc::RpcAgent> agent)
      : groups_(std::move(groups)), agent_(std::move(agent)) {}
  void on_worker_lost(const rpc::WorkerInfo& worker, const std::string&) override {
    std::shared_ptr<TrainerGroups> groups = groups_.lock();
    std::shared_ptr<rpc::RpcAgent> agent = agent_.lock();
    if (groups == nullptr || agent == nullptr) return;
    std::vector<std::shared_ptr<TrainerGroupState>> all;
    {
      MutexLock lock(groups->mutex);
      for (const auto& [name, g] : groups->by_name)
        all.push_back(g);
    }
    if (all.empty()) return;
    const int id = worker.id;
    try {
      agent->executor()->execute([all = std::move(all), id] {
        for (const auto& g : all)
          g->leave(id);
      });
    } catch (const std::exception& e) {
      // The pool is shut down: so is every step that could wait for the lost worker.
      GRADWIRE_LOG(kDebug) << "dist_optim: not removing lost worker " << id
                           << " from trainer groups: " << e.what();
    }
  }

 private:
  std::weak_ptr<TrainerGroups> groups_;
  std::weak_ptr<rpc::RpcAgent> agent_;
};

rref::RRef<Shard> join_group(const rpc::CallContext& ctx, const std::string& name,
                             const StateDict& spec, const std::vector<rref::RRef<Tensor>>& params,
                             int64_t trainers, int64_t max_staleness, int64_t aggregate,
                             int64_t lr_scaling) {
  rpc::RpcAgent& agent = *ctx.agent();
  // The counts arrive as int64: out of int's range is refused before they are narrowed.
  for (const auto& [field, value] : {std::pair<const char*, int64_t>{"trainers", trainers},
                                     {"max_staleness", max_staleness},
                                     {"aggregate", aggregate}}) {
    if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max()) {
      throw InvalidArgument("dist_optim: TrainerGroup '" + name + "': " + field + " " +
                            std::to_string(value) + " is out of range");
    }
  }
  TrainerGroup config{.name = name,
                      .trainers = static_cast<int>(trainers),
                      .max_staleness = static_cast<int>(max_staleness),
                      .aggregate = static_cast<int>(aggregate),
                      .lr_scaling = static_cast<LrScaling>(lr_scaling)};
  if (lr_scaling < 0 || lr_scaling > static_cast<int64_t>(LrScaling::kInverseTrainers)) {
    throw InvalidArgument("dist_optim: TrainerGroup '" + name + "': unknown lr_scaling " +
                          std::to_string(lr_scaling));
  }
  config.validate();
  std::shared_ptr<TrainerGroups> groups = trainer_groups(agent);
  const std::string owner = agent.worker_info().describe();
  std::shared_ptr<TrainerGroupState> group;
  {
    MutexLock lock(groups->mutex);
    auto it = groups->by_name.find(name);
    if (it == groups->by_name.end()) {
      auto shard = std::make_shared<Shard>(spec, params);
      // A state restored from a checkpoint before the group existed (ShardCheckpointer).
      if (auto restored = groups->restored.find(name); restored != groups->restored.end()) {
        restored->second(*shard);
        groups->restored.erase(restored);
      }
      group = std::make_shared<TrainerGroupState>(config, owner, shard);
      shard->set_group(group);
      groups->by_name.emplace(name, group);
    } else {
      group = it->second;
      const std::string why = difference(group->config(), config) +
                              spec_difference(group->shard()->state_dict_spec(), spec);
      bool same_params = params.size() == group->shard()->params().size();
      for (size_t i = 0; same_params && i < params.size(); ++i) {
        same_params =
            params[i].is_owner() && params[i].local_value()->is_same(group->shard()->params()[i]);
      }
      if (!why.empty() || !same_params) {
        throw InvalidArgument("dist_optim: " + ctx.caller().name + " cannot join trainer group '" +
                              name + "' on " + owner + ": " +
                              (why.empty() ? "its parameters are not the group's" : why));
      }
    }
  }
  group->join(ctx.caller().id, ctx.caller().name);
  return rref::make_local(agent, group->shard());
}

}  // namespace

std::shared_ptr<TrainerGroups> trainer_groups(const rpc::RpcAgent& agent) {
  std::shared_ptr<TrainerGroups> groups = agent.attachment<TrainerGroups>();
  if (groups == nullptr) {
    throw Error("dist_optim: worker " + agent.worker_info().describe() +
                " has no trainer groups (dist_optim's agent extension was not installed on it)");
  }
  return groups;
}

std::shared_ptr<Shard> group_shard(TrainerGroups& groups, const std::string& name) {
  MutexLock lock(groups.mutex);
  auto it = groups.by_name.find(name);
  return it == groups.by_name.end() ? nullptr : it->second->shard();
}

std::shared_ptr<TrainerGroupState> find_group(const rpc::RpcAgent& owner, const std::string& name) {
  std::shared_ptr<TrainerGroups> groups = trainer_groups(owner);
  MutexLock lock(groups->mutex);
  auto it = groups->by_name.find(name);
  if (it == groups->by_name.end()) {
    throw InvalidArgument("dist_optim: worker " + owner.worker_info().describe() +
                          " holds no trainer group '" + name + "' (no member has joined it there)");
  }
  return it->second;
}

void restore_group(TrainerGroups& groups, const std::string& name, RestoreGroup restore) {
  std::shared_ptr<Shard> shard;
  {
    MutexLock lock(groups.mutex);
    auto it = groups.by_name.find(name);
    if (it == groups.by_name.end()) {
      groups.restored[name] = std::move(restore);
      return;
    }
    shard = it->second->shard();
  }
  restore(*shard);
}

void install_groups(const std::shared_ptr<rpc::RpcAgent>& agent) {
  auto groups = std::make_shared<TrainerGroups>();
  agent->set_attachment(groups);
  agent->add_listener(std::make_shared<GroupWatch>(groups, agent));
  rpc::Registry& registry = agent->registry();
  if (registry.has_function(kJoinGroup)) return;
  try {
    registry.def(kJoinGroup, &join_group);
  } catch (const InvalidArgument&) {
    // Another agent sharing this registry registered it first.
  }
}

}  // namespace detail

TrainerGroupStats trainer_group_stats(const rpc::RpcAgent& owner, const std::string& name) {
  return detail::find_group(owner, name)->stats();
}

}  // namespace gradwire::dist_optim
