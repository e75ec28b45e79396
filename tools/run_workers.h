// gradwire-run's local workers: starting them with their environment, copying their output
// (prefixed, to the console and/or --log-dir), and watching them until they all end, one
// fails, a signal arrives, or the rendezvous asks the group to stop.
//
// Each worker runs in its own process group (signals go to the whole group, so a worker's
// own children are stopped with it) and dies with the launcher (PR_SET_PDEATHSIG, SIGKILL).
//
// Thread-safety: single-threaded; LocalGroup::run polls the workers' output pipes, their
// pidfds and the launcher's signal pipe, and calls the caller's tick between polls.
#pragma once

#include <sys/types.h>

#include <array>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "run_options.h"

namespace gradwire::run {

// Installs the SIGINT/SIGTERM handlers that write to the signal pipe, and ignores SIGPIPE.
void install_signal_handlers();
// The read end of the signal pipe (one byte per signal: its number).
int signal_fd();
// Reads a pending signal number from the pipe; 0 when none.
int take_signal();

// Thrown where the launcher waits outside LocalGroup::run (a rendezvous) and SIGINT or
// SIGTERM arrives: main exits with 128 + signal.
struct Interrupted {
  int signal = 0;
};
// Throws Interrupted when a signal is pending.
void throw_if_interrupted();

// One worker of this node: who it is in the job.
struct WorkerSlot {
  int rank = 0;  // RANK: unique across the job, never reused
  std::string role;
  int role_rank = 0;        // ROLE_RANK: unique within the role across the job
  int role_world_size = 0;  // ROLE_WORLD_SIZE: the role's workers when the group formed
  // A failure without a restart left ends the job (every worker outside role jobs).
  bool critical = true;
};

// What one generation's workers on this node are told.
struct GroupPlan {
  int64_t generation = 0;
  int node_rank = 0;
  int num_nodes = 1;
  int rank_offset = 0;  // the global rank of this node's local rank 0
  int world_size = 1;
  std::string master_addr;
  int master_port = 0;
  int restart_count = 0;  // failures of the job so far
  // This node's workers in local-rank order (LOCAL_WORLD_SIZE is their number).
  std::vector<WorkerSlot> workers;
  // An elastic role job (--role NAME:N): the workers' store is hosted by a launcher
  // (GRADWIRE_STORE_HOSTED=1), the rpc group is elastic (GRADWIRE_RPC_ELASTIC=1), and a
  // failed worker of a role that is not critical leaves the others running.
  bool elastic = false;
  // This node arrived after the group formed: its workers join the running group
  // (GRADWIRE_RPC_JOIN=1), outside the initial WORLD_SIZE.
  bool joins_running = false;
};

enum class Outcome {
  kSucceeded,    // every worker exited 0
  kFailed,       // a worker failed (status, reason); the others were stopped
  kStopped,      // tick asked the group to stop (reason)
  kInterrupted,  // SIGINT or SIGTERM reached the launcher (signal)
};

struct GroupResult {
  Outcome outcome = Outcome::kSucceeded;
  int status = 0;  // kFailed: the worker's exit status (128 + N for signal N)
  int signal = 0;  // kInterrupted
  std::string reason;
  int lost = 0;  // workers of roles that are not critical that failed and were left ended
};

class LocalGroup {
 public:
  // Starts the workers. `secret_file`: the file holding the secret this launcher made up
  // for the job, named to every worker as GRADWIRE_SECRET_FILE (in place of inherited
  // GRADWIRE_SECRET and GRADWIRE_SECRET_FILE, which are then empty); empty: the workers
  // inherit the launcher's. Throws std::runtime_error when a pipe, fork or log file fails.
  LocalGroup(const Options& options, GroupPlan plan, std::string secret_file = {});
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  // Watches the workers until they have all ended. `tick` runs about every `tick_ms` and
  // returns a reason to stop them (then SIGTERM to each worker's process group, SIGKILL
  // after --grace-ms). `on_failure` runs once, at the first failure that ends the group,
  // before the others are stopped. `worker_restarts` counts workers restarted alone
  // (--restart-workers) over the whole run.
  GroupResult run(int tick_ms, const std::function<std::optional<std::string>()>& tick,
                  const std::function<void(int rank, int status)>& on_failure,
                  int& worker_restarts);

  struct Worker;

 private:
  struct Watch;    // one run() call's decisions and deadlines
  struct PollSet;  // the descriptors one poll() watches

  // spawn()'s steps: the worker's environment, its log files (-1: none).
  std::vector<std::string> worker_env(int local_rank, int restarts, bool alone) const;
  void put_role_env(std::vector<std::string>& env) const;
  std::array<int, 2> open_logs(int rank) const;
  void spawn(int local_rank, int restarts, bool alone);
  void signal_all(int sig);

  // run()'s steps.
  PollSet poll_set() const;
  // Every worker has ended: whether to go on reading their output (bounded; lowers
  // `timeout` to the drain's end).
  bool draining(Watch& watch, int& timeout) const;
  // Stops the workers (`sig` now, SIGKILL after --grace-ms) with this outcome, unless they
  // are being stopped already.
  void stop(Watch& watch, Outcome outcome, int sig, std::string reason);
  // A worker's pidfd is ready: records its exit, and restarts it alone (into `respawn`) or
  // ends the group when it failed.
  void reap(Watch& watch, Worker& w, const std::function<void(int, int)>& on_failure,
            int& worker_restarts, std::vector<std::pair<int, int>>& respawn);
  // Who a worker is in messages: "rank R", with its role in role jobs.
  std::string describe(const Worker& w) const;
  // One of a worker's streams is ready: copies what it holds.
  void copy_output(Worker& w, int stream) const;
  std::string prefix(const Worker& w) const;

  const Options& options_;
  GroupPlan plan_;
  std::string secret_file_;
  std::vector<Worker> workers_;
};

}  // namespace gradwire::run
