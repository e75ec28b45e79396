// ShardCheckpointer (shard_checkpoint.h): a consistent copy of a server's shard taken under
// dist_optim's step lock, written by checkpoint::write_shard on a thread of its own, and
// restored from checkpoint::read_latest.
#include "gradwire/dist_optim/shard_checkpoint.h"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include "gradwire/autograd/grad_mode.h"
#include "gradwire/core/check.h"
#include "gradwire/core/logging.h"
#include "gradwire/core/mutex.h"
#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/tensor/factory.h"
#include "step_lock.h"
#include "trainer_group.h"

namespace gradwire::dist_optim {

using Clock = std::chrono::steady_clock;

void ShardCheckpointOptions::validate() const {
  GRADWIRE_CHECK_ARG(!dir.empty()) << "dist_optim: ShardCheckpointOptions.dir is empty";
  GRADWIRE_CHECK_ARG(every.count() > 0)
      << "dist_optim: ShardCheckpointOptions.every must be > 0 seconds, got " << every.count();
  GRADWIRE_CHECK_ARG(keep_last >= 1)
      << "dist_optim: ShardCheckpointOptions.keep_last must be >= 1, got " << keep_last;
  GRADWIRE_CHECK_ARG(stop_timeout.count() > 0)
      << "dist_optim: ShardCheckpointOptions.stop_timeout must be > 0, got " << stop_timeout.count()
      << " ms";
}

namespace {

constexpr const char* kUpdatesCounter = "updates";
constexpr const char* kHyperPrefix = "hyper.";
constexpr const char* kStatePrefix = "state.";

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// The kind a FunctionalOptimizer's state dict names ("type": its name's bytes).
std::string kind_of(const StateDict& state) {
  for (const auto& [key, t] : state) {
    if (key != "type") continue;
    const std::vector<uint8_t> bytes = t.to_vector<uint8_t>();
    return std::string(bytes.begin(), bytes.end());
  }
  throw Error("dist_optim: an optimizer state without a 'type' entry");
}

// The name `params` gives the tensor `p` (the same tensor, not equal values); empty if none.
std::string name_of(const StateDict& params, const Tensor& p) {
  for (const auto& [name, t] : params) {
    if (t.is_same(p)) return name;
  }
  return "";
}

// The group optimizer's state as checkpoint pieces: "<param name>/<field>" for each
// "state.<i>.<field>" (checkpoint::add_optimizer's naming), the kind, and the
// hyperparameters as they are ("hyper.lr", ...).
void add_optimizer_pieces(checkpoint::ShardState& out, const StateDict& optimizer,
                          const std::vector<Tensor>& shard_params, const StateDict& named,
                          const std::string& group) {
  std::vector<std::string> names;
  for (const Tensor& p : shard_params) {
    names.push_back(name_of(named, p));
    if (names.back().empty()) {
      throw InvalidArgument("dist_optim: trainer group '" + group + "' steps parameter " +
                            std::to_string(names.size() - 1) +
                            ", which is not among the checkpointer's parameters");
    }
  }
  out.optimizer_kind = kind_of(optimizer);
  for (const auto& [key, t] : optimizer) {
    if (starts_with(key, kHyperPrefix)) {
      out.optimizer_hyper.emplace_back(key, t);
    } else if (starts_with(key, kStatePrefix)) {
      const size_t dot = key.find('.', 6);
      GRADWIRE_CHECK(dot != std::string::npos) << "dist_optim: optimizer state key '" << key << "'";
      const size_t index = std::stoul(key.substr(6, dot - 6));
      GRADWIRE_CHECK(index < names.size()) << "dist_optim: optimizer state key '" << key << "'";
      checkpoint::Piece piece;
      piece.name = names[index] + "/" + key.substr(dot + 1);
      piece.value = t;
      out.optimizer.push_back(std::move(piece));
    }
  }
}

// The FunctionalOptimizer state dict for `shard`'s parameters from a snapshot's pieces.
StateDict optimizer_state_for(const detail::Shard& shard, const StateDict& current,
                              const checkpoint::ShardState& saved, const StateDict& named,
                              const std::string& source) {
  StateDict state;
  for (const auto& [key, t] : current) {
    if (key == "type") state.emplace_back(key, t);
  }
  for (const auto& [key, t] : saved.optimizer_hyper)
    state.emplace_back(key, t);
  std::map<std::string, std::vector<std::pair<std::string, Tensor>>> by_param;
  for (const checkpoint::Piece& piece : saved.optimizer) {
    const size_t slash = piece.name.rfind('/');
    if (slash == std::string::npos) {
      throw InvalidArgument("dist_optim: optimizer entry '" + piece.name + "' in " + source +
                            " is not '<parameter>/<state>'");
    }
    by_param[piece.name.substr(0, slash)].emplace_back(piece.name.substr(slash + 1), piece.value);
  }
  const std::vector<Tensor>& params = shard.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string name = name_of(named, params[i]);
    auto it = by_param.find(name);
    if (name.empty() || it == by_param.end()) continue;  // no state yet (never stepped)
    for (const auto& [field, t] : it->second)
      state.emplace_back(kStatePrefix + std::to_string(i) + "." + field, t);
    by_param.erase(it);
  }
  if (!by_param.empty()) {
    throw InvalidArgument("dist_optim: " + source + " holds optimizer state for parameter '" +
                          by_param.begin()->first + "', which the trainer group does not step");
  }
  return state;
}

// Whether `params` has a parameter named `name`.
bool name_of_key(const StateDict& params, const std::string& name) {
  return std::any_of(params.begin(), params.end(),
                     [&](const auto& entry) { return entry.first == name; });
}

// The highest sequence number under dir/<shard> (complete or not); 0 when none.
int64_t newest_seq_on_disk(const std::string& dir, const std::string& shard) {
  std::error_code ec;
  int64_t newest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir + "/" + shard, ec)) {
    const std::string name = entry.path().filename().string();
    int64_t seq = 0;
    const auto [end, err] = std::from_chars(name.data(), name.data() + name.size(), seq);
    if (err == std::errc() && end == name.data() + name.size()) newest = std::max(newest, seq);
  }
  return newest;
}

// The snapshot's value of each of `params`, in their order, after checking that the two
// hold the same parameters whole, with the same shapes and dtypes, and that every optimizer
// entry names one of them (InvalidArgument naming the parameter and the snapshot).
std::vector<Tensor> matched_params(const StateDict& params, const checkpoint::Snapshot& snap) {
  std::map<std::string, const checkpoint::Piece*> saved;
  for (const checkpoint::Piece& piece : snap.state.params)
    saved[piece.name] = &piece;
  std::vector<Tensor> values;
  for (const auto& [name, p] : params) {
    auto it = saved.find(name);
    if (it == saved.end()) {
      throw InvalidArgument("dist_optim: snapshot " + snap.path + " has no parameter '" + name +
                            "'; nothing was restored");
    }
    const checkpoint::Piece& piece = *it->second;
    if (piece.row_offset != 0 ||
        (!piece.global_sizes.empty() && piece.global_sizes != piece.value.sizes())) {
      throw InvalidArgument("dist_optim: snapshot " + snap.path + " holds only rows of '" + name +
                            "' (load a resharded checkpoint through checkpoint::Checkpoint)");
    }
    if (piece.value.sizes() != p.sizes() || piece.value.dtype() != p.dtype()) {
      std::ostringstream os;
      os << "dist_optim: parameter '" << name << "' in snapshot " << snap.path << " is "
         << dtype_name(piece.value.dtype()) << shape_to_string(piece.value.sizes())
         << "; this shard's is " << dtype_name(p.dtype()) << shape_to_string(p.sizes())
         << "; nothing was restored";
      throw InvalidArgument(os.str());
    }
    values.push_back(piece.value);
    saved.erase(it);
  }
  if (!saved.empty()) {
    throw InvalidArgument("dist_optim: snapshot " + snap.path + " holds parameter '" +
                          saved.begin()->first +
                          "', which this shard does not have; nothing was restored");
  }
  for (const checkpoint::Piece& piece : snap.state.optimizer) {
    const std::string param = piece.name.substr(0, piece.name.rfind('/'));
    if (name_of_key(params, param)) continue;
    throw InvalidArgument("dist_optim: snapshot " + snap.path + " holds optimizer state '" +
                          piece.name + "' of no parameter of this shard; nothing was restored");
  }
  return values;
}

// Loads a snapshot's optimizer state into a trainer group's shard (detail::restore_group).
detail::RestoreGroup optimizer_restorer(checkpoint::ShardState saved, StateDict named,
                                        std::string source, std::string group) {
  return [saved = std::move(saved), named = std::move(named), source = std::move(source),
          group = std::move(group)](detail::Shard& shard) {
    const StateDict current = shard.state_dict();
    const std::string kind = kind_of(current);
    if (kind != saved.optimizer_kind) {
      throw InvalidArgument("dist_optim: snapshot " + source + " holds a " + saved.optimizer_kind +
                            " optimizer state; trainer group '" + group + "' here runs " + kind);
    }
    const StateDict state = optimizer_state_for(shard, current, saved, named, source);
    try {
      shard.load_state_dict(state);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("dist_optim: the optimizer state in snapshot " + source +
                            " does not fit trainer group '" + group + "': " + e.what());
    }
  };
}

}  // namespace

struct ShardCheckpointer::Inner {
  ShardCheckpointOptions options;
  StateDict params;
  std::shared_ptr<detail::StepLock> step_lock;
  std::shared_ptr<detail::TrainerGroups> groups;

  Mutex write_mutex;                                      // one snapshot at a time
  int64_t next_seq GRADWIRE_GUARDED_BY(write_mutex) = 0;  // 0: not known yet

  mutable Mutex mutex;
  std::condition_variable cv;
  bool stopping GRADWIRE_GUARDED_BY(mutex) = false;
  bool finished GRADWIRE_GUARDED_BY(mutex) = false;
  CheckpointerStats stats GRADWIRE_GUARDED_BY(mutex);

  checkpoint::ShardState capture(std::chrono::duration<double>* pause) const;
  SnapshotInfo write();
  void run();
};

checkpoint::ShardState ShardCheckpointer::Inner::capture(
    std::chrono::duration<double>* pause) const {
  checkpoint::ShardState state;
  state.job_shards =
      options.job_shards.empty() ? std::vector<std::string>{options.shard} : options.job_shards;
  StateDict optimizer;
  std::shared_ptr<detail::Shard> shard;
  const auto start = Clock::now();
  {
    // No update runs on this worker while the lock is held: the copy is of whole updates.
    MutexLock paused(step_lock->mutex);
    autograd::NoGradGuard no_grad;
    for (const auto& [name, p] : params) {
      checkpoint::Piece piece;
      piece.name = name;
      piece.value = p.detach().clone();
      state.params.push_back(std::move(piece));
    }
    if (!options.group.empty()) shard = detail::group_shard(*groups, options.group);
    if (shard != nullptr) optimizer = shard->state_dict();  // copies, under the shard's lock
    state.counters[kUpdatesCounter] = step_lock->updates;
  }
  if (pause != nullptr) *pause = Clock::now() - start;
  if (shard != nullptr)
    add_optimizer_pieces(state, optimizer, shard->params(), params, options.group);
  return state;
}

SnapshotInfo ShardCheckpointer::Inner::write() {
  MutexLock one_at_a_time(write_mutex);
  if (next_seq == 0) next_seq = newest_seq_on_disk(options.dir, options.shard) + 1;
  SnapshotInfo info;
  checkpoint::ShardState state = capture(&info.pause);
  info.seq = next_seq;
  info.updates = state.counters[kUpdatesCounter];
  info.path = checkpoint::write_shard(options.dir, options.shard, info.seq, state,
                                      checkpoint::WriteOptions{.keep_last = options.keep_last});
  ++next_seq;
  MutexLock lock(mutex);
  ++stats.written;
  stats.last = info;
  return info;
}

void ShardCheckpointer::Inner::run() {
  const auto every = std::chrono::duration_cast<Clock::duration>(options.every);
  auto next = Clock::now() + every;
  for (;;) {
    {
      MutexLock lock(mutex);
      while (!stopping && Clock::now() < next)
        lock.wait_until(cv, next);
      if (stopping) break;
    }
    try {
      const SnapshotInfo info = write();
      if (options.on_written) options.on_written(info);
    } catch (const std::exception& e) {
      GRADWIRE_LOG(kError) << "dist_optim: snapshot of shard '" << options.shard << "' into "
                           << options.dir << " failed (trying again in " << options.every.count()
                           << " s; training goes on): " << e.what();
      MutexLock lock(mutex);
      ++stats.failed;
      stats.last_error = e.what();
    }
    // A write that outlasted the interval is followed by the next one at once, not a burst.
    next = std::max(next + every, Clock::now());
  }
  MutexLock lock(mutex);
  finished = true;
  cv.notify_all();
}

ShardCheckpointer::ShardCheckpointer(rpc::RpcAgent& agent, StateDict params,
                                     ShardCheckpointOptions options)
    : inner_(std::make_shared<Inner>()) {
  options.validate();
  if (options.shard.empty()) options.shard = agent.worker_info().name;
  std::set<std::string> names;
  for (const auto& [name, t] : params) {
    GRADWIRE_CHECK_ARG(t.defined())
        << "dist_optim: ShardCheckpointer: parameter '" << name << "' is an undefined tensor";
    GRADWIRE_CHECK_ARG(names.insert(name).second)
        << "dist_optim: ShardCheckpointer: parameter name '" << name << "' given twice";
  }
  inner_->options = std::move(options);
  inner_->params = std::move(params);
  inner_->step_lock = detail::step_lock(agent);
  inner_->groups = detail::trainer_groups(agent);
}

ShardCheckpointer::~ShardCheckpointer() {
  try {
    stop();
  } catch (const std::exception& e) {
    GRADWIRE_LOG(kWarning) << "dist_optim: stopping the checkpointer of shard '"
                           << inner_->options.shard << "': " << e.what();
  }
}

const std::string& ShardCheckpointer::shard() const {
  return inner_->options.shard;
}

checkpoint::ShardState ShardCheckpointer::capture() const {
  return inner_->capture(nullptr);
}

SnapshotInfo ShardCheckpointer::snapshot_now() {
  return inner_->write();
}

std::optional<SnapshotInfo> ShardCheckpointer::restore() {
  Inner& in = *inner_;
  std::optional<checkpoint::Snapshot> snap =
      checkpoint::read_latest(in.options.dir, in.options.shard);
  if (!snap) {
    GRADWIRE_LOG(kInfo) << "dist_optim: no snapshot of shard '" << in.options.shard << "' in "
                        << in.options.dir << ": starting fresh";
    return std::nullopt;
  }
  const std::vector<Tensor> values = matched_params(in.params, *snap);
  SnapshotInfo info;
  info.seq = snap->seq;
  info.path = snap->path;
  if (auto it = snap->state.counters.find(kUpdatesCounter); it != snap->state.counters.end())
    info.updates = it->second;
  {
    MutexLock paused(in.step_lock->mutex);
    autograd::NoGradGuard no_grad;
    for (size_t i = 0; i < values.size(); ++i)
      in.params[i].second.copy_(values[i]);
    in.step_lock->updates = info.updates;
  }
  if (!snap->state.optimizer_kind.empty()) {
    if (in.options.group.empty()) {
      GRADWIRE_LOG(kWarning) << "dist_optim: snapshot " << snap->path
                             << " holds a trainer group's optimizer state, but the checkpointer "
                                "names no group: the optimizers here start fresh";
    } else {
      detail::restore_group(
          *in.groups, in.options.group,
          optimizer_restorer(std::move(snap->state), in.params, snap->path, in.options.group));
    }
  }
  MutexLock lock(in.write_mutex);
  in.next_seq = std::max(info.seq, newest_seq_on_disk(in.options.dir, in.options.shard)) + 1;
  return info;
}

void ShardCheckpointer::start() {
  if (thread_.joinable()) throw InvalidArgument("dist_optim: ShardCheckpointer started twice");
  {
    MutexLock lock(inner_->mutex);
    if (inner_->stopping) throw InvalidArgument("dist_optim: ShardCheckpointer started after stop");
  }
  thread_ = std::thread([inner = inner_] { inner->run(); });
}

void ShardCheckpointer::stop() {
  const auto deadline = Clock::now() + inner_->options.stop_timeout;
  bool done = true;
  {
    MutexLock lock(inner_->mutex);
    inner_->stopping = true;
    inner_->cv.notify_all();
    if (thread_.joinable()) {
      while (!inner_->finished && Clock::now() < deadline)
        lock.wait_until(inner_->cv, deadline);
      done = inner_->finished;
    }
  }
  if (!thread_.joinable()) return;
  if (done) {
    thread_.join();
    return;
  }
  // The thread holds everything it uses; it ends once its write does.
  thread_.detach();
  throw TimeoutError(
      "dist_optim: the checkpointer of shard '" + inner_->options.shard + "' did not stop within " +
      std::to_string(inner_->options.stop_timeout.count()) + " ms: a snapshot into " +
      inner_->options.dir + " is still being written (left to finish on its own)");
}

CheckpointerStats ShardCheckpointer::stats() const {
  MutexLock lock(inner_->mutex);
  return inner_->stats;
}

}  // namespace gradwire::dist_optim
