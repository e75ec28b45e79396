// ServerFailover: a trainer's way through the loss of a parameter server that is restarted
// and restores its shard from a checkpoint (ShardCheckpointer, shard_checkpoint.h).
//
// When a server dies, the trainer's calls pending on it fail with a NetworkError naming it,
// and every reference it holds to the server's values (parameters, optimizer shards,
// modules) fails at once from then on, even after a replacement rejoins under the server's
// name (docs/rref.md): they belong to the lost incarnation. ServerFailover holds what must
// be made again -- the parameter references and the DistributedOptimizer over them -- and
// makes it again when a step fails that way:
//
//   dist_optim::ServerFailover failover(
//       *agent,
//       [&] { model = fetch_model(*agent); return model.params; },   // re-resolves references
//       [&](std::vector<RRef<Tensor>> params) {                      // the optimizer over them
//         return std::make_unique<dist_optim::DistributedOptimizer>(*agent, spec, params, group);
//       });
//   for (...batch...) {
//     failover.run([&] {                       // retried after a recovery
//       dist_autograd::Context ctx(*agent);
//       Tensor loss = ... model.forward(x) ...;
//       failover.optimizer().backward_and_step(ctx.id(), {loss});
//     });
//   }
//
// run(step) runs step(); when it throws a NetworkError (or a RemoteError carrying one),
// recover() waits for the owners of the parameters to answer again: each is asked which
// incarnation it is (a registered function of dist_optim) until it answers, with a growing
// pause between tries, for at most rejoin_timeout. If one of them is a new incarnation (a
// replacement that rejoined, AgentOptions::rejoin), the old optimizer is dropped, `resolve`
// is called to fetch the references anew (from the replacement, which hands them out once
// it has restored its snapshot), `make` builds the optimizer over them (a trainer-group
// member joins the replacement's group), the learning rate last set through this object is
// set again, and step() runs again. If every owner answers as the incarnation it was, the
// error was not a server's loss and is rethrown unchanged, as is any other error.
//
// What the job loses: the updates applied after the replacement's snapshot, and the step
// that failed is computed again from its batch. The time a recovery took is in recoveries().
//
// ServerFailover is an optim::LrTarget of one group (the optimizer's), so a schedule made
// on it outlives the optimizers it replaces.
//
// Thread-safety: one thread (the training loop's) uses it.
// Errors: construction: InvalidArgument for a missing function or bad options, then what
// `resolve` and `make` throw. run(): step()'s own error when it is not a server's loss or
// no owner was replaced; TimeoutError naming the owners that did not answer within
// rejoin_timeout (with the step's error); after max_recoveries recoveries within one run()
// the step's last error.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "gradwire/dist_optim/distributed_optimizer.h"
#include "gradwire/optim/lr_target.h"
#include "gradwire/rpc/agent.h"
#include "gradwire/rref/rref.h"

namespace gradwire::dist_optim {

struct FailoverOptions {
  // How long recover() waits for the parameters' owners to answer again; > 0.
  std::chrono::milliseconds rejoin_timeout{120'000};
  // The deadline of each probe call; > 0.
  std::chrono::milliseconds probe_timeout{2'000};
  // The longest pause between probes of an owner that does not answer yet; > 0.
  std::chrono::milliseconds max_probe_interval{250};
  // Recoveries one run() makes before it gives up with the step's error; >= 1.
  int max_recoveries = 3;
  void validate() const;  // InvalidArgument naming the bad field
};

// One recovery: the owners found replaced, their new incarnations, and how long it took
// from the failed step's error to the new optimizer.
struct Recovery {
  std::vector<rpc::WorkerInfo> replaced;
  std::vector<int> incarnations;
  std::chrono::duration<double> took{0};
};

class ServerFailover : public optim::LrTarget {
 public:
  using Resolve = std::function<std::vector<rref::RRef<Tensor>>()>;
  using MakeOptimizer =
      std::function<std::unique_ptr<DistributedOptimizer>(std::vector<rref::RRef<Tensor>>)>;

  // Resolves the references and makes the optimizer once, and asks each owner which
  // incarnation it is.
  ServerFailover(rpc::RpcAgent& agent, Resolve resolve, MakeOptimizer make,
                 FailoverOptions options = {});
  ~ServerFailover() override;
  ServerFailover(const ServerFailover&) = delete;
  ServerFailover& operator=(const ServerFailover&) = delete;

  // Runs step(), recovering and running it again after a server's loss (file comment).
  void run(const std::function<void()>& step);
  // After `error` (a failed step's): waits for the owners, and when one was replaced makes
  // the references and the optimizer again and returns what it did; rethrows `error` when
  // it is not a server's loss or no owner was replaced.
  Recovery recover(std::exception_ptr error);

  // The optimizer over params(); Error when the last recovery failed before making one.
  DistributedOptimizer& optimizer();
  const std::vector<rref::RRef<Tensor>>& params() const { return params_; }
  const std::vector<Recovery>& recoveries() const { return recoveries_; }

  // optim::LrTarget: the optimizer's one group; a rate set here is set again on the
  // optimizer a recovery makes (also when a server's loss failed the call that set it: a
  // schedule step that throws that way is followed by recover(), not by the step again).
  size_t num_lr_groups() const override { return 1; }
  double group_lr(size_t group) const override;
  void set_group_lrs(const std::vector<double>& lrs) override;

 private:
  // Each owner's incarnation, asked until it answers (at most until `deadline`); throws
  // TimeoutError naming those that did not answer, with `why`.
  std::vector<int> probe_owners(std::chrono::steady_clock::time_point deadline,
                                const std::string& why);
  void remember_owners();

  rpc::RpcAgent* agent_;
  Resolve resolve_;
  MakeOptimizer make_;
  FailoverOptions options_;
  std::vector<rref::RRef<Tensor>> params_;
  std::unique_ptr<DistributedOptimizer> optimizer_;
  std::vector<rpc::WorkerInfo> owners_;
  std::vector<int> incarnations_;  // each owner's, as last seen
  std::optional<double> lr_;       // the rate last set through this object
  std::vector<Recovery> recoveries_;
};

// Whether `error` is what a step sees when a worker it calls is lost: a NetworkError, or a
// RemoteError carrying one.
bool is_worker_loss(const std::exception_ptr& error);

}  // namespace gradwire::dist_optim
