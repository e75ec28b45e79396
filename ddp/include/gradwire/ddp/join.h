// Join: training with uneven inputs, where ranks run out of data at different steps.
//
// Every synchronised step is a set of collectives all ranks must take part in; a rank
// that has finished its data would leave the others hanging in their next all-reduce. Under
// a Join, each step of a rank that has data starts with a small all-reduce announcing it;
// a rank that has run out calls join(), which answers those announcements and *shadows*
// each step's collectives (the bucket all-reduces on zeros, buffer broadcasts, the bucket
// rebuild) until every rank has joined. As in PyTorch, the averages of those steps divide
// by the initial world size (the ranks that ran out count as contributing zeros); with
// divide_by_initial_world_size = false they divide by the number of ranks that still had
// data, so each step's gradient is exactly the mean over the ranks that took part. Buffers
// are broadcast from the highest rank that still has data. When all have joined, the
// parameters and buffers of the rank that trained longest (ties: the highest rank) are
// broadcast to every rank, so every replica ends equal.
//
// no_sync works under a Join: each announcement also says whether the ranks with data
// synchronise this step, and the joined ranks shadow the gradient collectives only of the
// steps that do (the ranks with data must agree on no_sync, as they must without a Join).
//
// throw_on_early_termination (PyTorch's): at the step where some rank has run out while
// others still have data, every rank throws gradwire::Error instead of shadowing — the
// ranks with data from that step's announcement (the forward), the ranks that ran out from
// join() — naming the ranks that ran out. Ranks that all run out at the same step end
// normally.
//
// Usage: construct the Join before the loop on every rank, run the loop over this rank's
// data, then call join(). Every rank must use a Join over the same joinables, with the
// same options.
//
// Thread-safety: one training loop thread, as for DistributedDataParallel.
// Errors: collectives' TimeoutError/NetworkError; InvalidArgument for an empty list or a
// joinable already under another Join; gradwire::Error for an early termination (above). The
// destructor detaches the joinables (it does not shadow: a rank that leaves the loop by an
// exception will make its peers time out).
//
// Example:
//   ddp::Join join({&model});
//   for (const auto& batch : my_batches) { step(model, batch); }
//   join.join();                          // returns when every rank has run out of data
#pragma once

#include <cstdint>
#include <vector>

#include "gradwire/c10d/process_group.h"

namespace gradwire::ddp {

class Join;

// What Join needs of an object with per-step collectives.
class Joinable {
 public:
  virtual ~Joinable() = default;
  virtual c10d::ProcessGroup& join_process_group() = 0;
  // Called by Join: attach to (non-null) or detach from (null) a Join.
  virtual void set_join(Join* join) = 0;
  // One step of collectives on behalf of a rank without data. `participants` ranks have
  // data; `root` is the highest of them; `sync`: they synchronise gradients this step (not
  // under no_sync).
  virtual void join_shadow_step(int participants, int root, bool sync) = 0;
  // After every rank has joined: make every rank's state equal to rank `root`'s.
  virtual void join_finish(int root) = 0;
};

struct JoinOptions {
  // Each step's average divides by the initial world size (PyTorch's default); false: by
  // the number of ranks that still have data.
  bool divide_by_initial_world_size{true};
  // Throw on every rank at the first step where some rank has run out (see above).
  bool throw_on_early_termination{false};
};

// What a step's announcement tells a rank with data.
struct JoinStep {
  int participants{0};  // ranks with data
  int root{-1};         // the highest of them
};

class Join {
 public:
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // Called by a joinable at the start of each step of a rank with data; `sync`: this step
  // synchronises gradients. Throws gradwire::Error under throw_on_early_termination once
  // some rank has run out.
  JoinStep announce(bool sync);
  const JoinOptions& options() const { return options_; }
  // This rank is out of data: shadow the others' steps until all have joined, then
  // synchronise the final state. Returns the number of steps shadowed.
  int64_t join();

 private:
  struct Exchange {
    JoinStep step;
    bool sync{false};
    std::vector<int> out;  // ranks without data
  };
  // The all-reduce of a one-hot presence vector and a sync count: who has data this step,
  // and whether they synchronise.
  Exchange exchange(bool has_data, bool sync);

  JoinOptions options_;
  std::vector<Joinable*> joinables_;
  c10d::ProcessGroup* group_;
  int64_t steps_{0};
  bool joined_{false};
};

}  // namespace gradwire::ddp
