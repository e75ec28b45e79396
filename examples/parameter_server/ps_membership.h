// ps_train's part in a job and its view of the trainers: which part a worker plays (from
// gradwire-run's roles, else its rank), whether the launcher started it to join a running
// elastic job, and the server's listener that says who joined, left or was lost and keeps an
// elastic job's server serving while a live trainer is there. Header-only, for ps_train.cc.
#pragma once

#include <gradwire/gradwire.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include <gradwire/core/env.h>
#include <gradwire/core/mutex.h>

namespace gradwire::examples {

// The part this worker plays: a server and its shard, or a trainer and its number (from 1).
struct Role {
  bool server = false;
  int index = 0;
};

// gradwire-run --role server:P --role trainer:N says it (ROLE_NAME, ROLE_RANK): the nodes of
// an elastic job are numbered in the order they arrive, so a rank says nothing of the role
// there. Otherwise the ranks below --servers are the servers.
inline Role role_of(int rank, int servers) {
  const char* role = std::getenv("ROLE_NAME");
  const std::string name = role == nullptr ? "" : role;
  if (name == "server" || name == "trainer") {
    const char* role_rank = std::getenv("ROLE_RANK");
    if (role_rank == nullptr)
      throw InvalidArgument("ROLE_NAME is '" + name + "' but ROLE_RANK is not set");
    const int index = static_cast<int>(parse_int("ROLE_RANK", role_rank, 0, 1 << 20));
    if (name == "server" && index >= servers) {
      throw InvalidArgument("server ROLE_RANK " + std::to_string(index) +
                            " is not below --servers " + std::to_string(servers) +
                            ": start as many servers as --servers says");
    }
    return name == "server" ? Role{true, index} : Role{false, index + 1};
  }
  return rank < servers ? Role{true, rank} : Role{false, rank - servers + 1};
}

// Whether the launcher started this worker to join a running elastic job.
inline bool launch_joins() {
  const char* join = std::getenv("GRADWIRE_RPC_JOIN");
  return join != nullptr && std::string(join) == "1";
}

// Tells what the server does when a trainer dies and when its replacement comes back. The
// agent's modules (rref/, dist_autograd/) hear of a loss before this listener, so what it
// prints is what is left once they have released the lost trainer's share.
class TrainerWatch : public rpc::AgentListener {
 public:
  explicit TrainerWatch(rpc::RpcAgent& agent) : agent_(agent) {}

  // An elastic job's server serves until no live trainer is left (those that formed the job
  // and those that joined it have left or died, and none is back), then returns; a trainer
  // that joins meanwhile keeps it serving.
  void serve_until_trainers_are_gone() {
    MutexLock lock(mutex_);
    // Woken by every change; a look each second as well, so that nothing it was not told
    // of keeps it serving.
    while (live_trainers() > 0)
      lock.wait_until(changed_, std::chrono::steady_clock::now() + std::chrono::seconds(1));
  }

  void on_worker_lost(const rpc::WorkerInfo& worker, const std::string& why) override {
    changed(worker, true);
    const rref::RRefMetrics refs = rref::metrics(agent_);
    std::printf(
        "%s: lost %s (%s); released its references and autograd contexts: %zu contexts and "
        "%lld references held for the others remain\n",
        agent_.worker_info().name.c_str(), worker.name.c_str(), why.c_str(),
        dist_autograd::num_contexts(agent_), static_cast<long long>(refs.owned_forks));
    std::fflush(stdout);
  }
  void on_worker_rejoined(const rpc::WorkerInfo& worker, int incarnation) override {
    changed(worker, false);
    std::printf("%s: %s rejoined (incarnation %d); serving it\n", agent_.worker_info().name.c_str(),
                worker.name.c_str(), incarnation);
    std::fflush(stdout);
  }
  // An elastic job (gradwire-run --role): trainers that join it late and leave it early.
  void on_worker_joined(const rpc::WorkerInfo& worker) override {
    changed(worker, false);
    std::printf("%s: %s joined the job; serving it\n", agent_.worker_info().name.c_str(),
                worker.name.c_str());
    std::fflush(stdout);
  }
  // (rref/ and dist_autograd/ release what it held on their own.)
  void on_worker_left(const rpc::WorkerInfo& worker) override {
    changed(worker, false);
    int trainers = 0;
    {
      MutexLock lock(mutex_);
      trainers = live_trainers();
    }
    std::printf("%s: %s left the job; %d trainers remain\n", agent_.worker_info().name.c_str(),
                worker.name.c_str(), trainers);
    std::fflush(stdout);
  }

 private:
  static bool is_trainer(const rpc::WorkerInfo& w) { return w.name.rfind("trainer", 0) == 0; }
  // The trainers in the group now, less those lost and not back.
  int live_trainers() const GRADWIRE_REQUIRES(mutex_) {
    int n = 0;
    for (const rpc::WorkerInfo& w : agent_.get_worker_infos())
      n += is_trainer(w) && lost_.count(w.id) == 0 ? 1 : 0;
    return n;
  }
  void changed(const rpc::WorkerInfo& worker, bool lost) {
    MutexLock lock(mutex_);
    if (lost) {
      lost_.insert(worker.id);
    } else {
      lost_.erase(worker.id);
    }
    changed_.notify_all();
  }

  rpc::RpcAgent& agent_;
  Mutex mutex_;
  std::condition_variable changed_;
  std::set<int> lost_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace gradwire::examples
