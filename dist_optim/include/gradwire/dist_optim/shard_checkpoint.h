// ShardCheckpointer: a parameter server's shard (its parameters, the shared optimizer of a
// trainer group, the count of updates applied) saved in the background every few seconds,
// and restored by a server that was restarted after a failure.
//
//   // On the server, once its model exists and before trainers are handed references:
//   dist_optim::ShardCheckpointer ckpt(*agent, module->named_parameters(),
//       {.dir = "/ckpt", .every = std::chrono::seconds(30), .keep_last = 3, .group = "job"});
//   ckpt.restore();   // the newest complete snapshot, if any (a restarted server)
//   ckpt.start();     // one snapshot every 30 s, on a thread of its own
//   ... serve ...
//   ckpt.stop();
//
// A snapshot is consistent: the parameters, the group's optimizer state and the update
// count are copied under the lock every optimizer update on the worker takes (dist_optim's
// step lock), so no update is half-applied in it and every snapshot holds the state after
// a whole number of updates. That copy is the only pause training sees: the files are
// written afterwards, on the checkpointer's thread, by checkpoint::write_shard
// (dir/<shard>/<seq>/, the manifest last, the oldest pruned past keep_last).
//
// A write that fails (an unwritable directory, a full disk) is logged as an error and
// counted (stats()); the next interval tries again and training never stops for it.
//
// restore() loads the newest complete snapshot (checkpoint::read_latest): the parameters
// are copied into the tensors given, in place, and the update count is set; the group's
// optimizer state is loaded into the group's optimizer when its first member joins (at
// once if the group exists already). Everything is checked before anything changes: a
// parameter missing from the snapshot, one the snapshot has and this shard does not, or a
// shape or dtype that differs is an InvalidArgument naming the parameter and the snapshot's
// path, and nothing is loaded. With no snapshot, restore() returns nullopt and the shard
// starts fresh. New snapshots follow the restored one's sequence number.
//
// What is lost on a failure: the updates applied after the last snapshot (at most `every`
// of training). Trainers see the loss as a NetworkError on their pending calls and come
// back through ServerFailover (failover.h).
//
// With private optimizers (no trainer group) only the parameters are saved: each trainer's
// optimizer on the server starts fresh after a restore.
//
// Thread-safety: restore, start, snapshot_now and stop are called from one thread (the
// server's main thread); stats() from any. Snapshots never run two at a time.
// Errors: options are validated at construction (InvalidArgument naming the field); the
// constructor also refuses an agent without dist_optim's extension (Error). snapshot_now()
// throws what the write throws. stop(): TimeoutError when a write in progress outlasts
// stop_timeout (the thread is then left to finish that write on its own).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gradwire/checkpoint/checkpoint.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/tensor/state_dict.h"

namespace gradwire::dist_optim {

// One snapshot written (or restored).
struct SnapshotInfo {
  int64_t seq = 0;      // its sequence number (dir/<shard>/<seq>)
  int64_t updates = 0;  // the optimizer updates applied on the worker when it was taken
  std::string path;     // where it lies
  // How long updates were held for the copy (zero for a restored one).
  std::chrono::duration<double> pause{0};
};

struct ShardCheckpointOptions {
  // Where snapshots go: dir/<shard>/<seq>/. Required.
  std::string dir{};
  // This shard's name in the checkpoint; empty: the worker's name.
  std::string shard{};
  // Every shard of the job (recorded in each snapshot); empty: this one alone.
  std::vector<std::string> job_shards{};
  // Time between snapshots; > 0.
  std::chrono::duration<double> every{60.0};
  // Snapshots kept; >= 1.
  int keep_last = 3;
  // The trainer group whose shared optimizer is saved with the parameters; empty: none.
  std::string group{};
  // How long stop() waits for a write in progress; > 0.
  std::chrono::milliseconds stop_timeout{30'000};
  // Called on the checkpointer's thread after each background snapshot is written; what it
  // throws is logged.
  std::function<void(const SnapshotInfo&)> on_written{};
  void validate() const;  // InvalidArgument naming the bad field
};

struct CheckpointerStats {
  int64_t written = 0;  // snapshots written (background and snapshot_now)
  int64_t failed = 0;   // background snapshots that failed
  std::optional<SnapshotInfo> last;
  std::string last_error;  // the last failure's message; empty when none
};

class ShardCheckpointer {
 public:
  // `params`: the shard's parameters by name (a module's named_parameters(): the tensors
  // themselves, which restore() writes into). The worker `agent` runs dist_optim's agent
  // extension (every agent a factory builds does once dist_optim is linked).
  ShardCheckpointer(rpc::RpcAgent& agent, StateDict params, ShardCheckpointOptions options);
  // stop(), its errors logged.
  ~ShardCheckpointer();
  ShardCheckpointer(const ShardCheckpointer&) = delete;
  ShardCheckpointer& operator=(const ShardCheckpointer&) = delete;

  // Loads the newest complete snapshot (see the file comment); nullopt when there is none.
  // Before start().
  std::optional<SnapshotInfo> restore();
  // Starts the background snapshots, the first one `every` from now. Once.
  void start();
  // Takes a snapshot and writes it now, on the calling thread.
  SnapshotInfo snapshot_now();
  // The consistent copy a snapshot writes (taken now; nothing is written).
  checkpoint::ShardState capture() const;
  // Stops the background snapshots, waiting at most stop_timeout for a write in progress.
  // Idempotent.
  void stop();

  CheckpointerStats stats() const;
  const std::string& shard() const;

  struct Inner;  // shared with the checkpointer's thread

 private:
  std::shared_ptr<Inner> inner_;
  std::thread thread_;
};

}  // namespace gradwire::dist_optim
