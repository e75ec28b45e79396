// Join: training with uneven inputs, where ranks run out of data at different steps.
//
// Every synchronised step is a set of collectives all ranks must take part in; a rank
// that has finished its data would leave the others hanging in their next all-reduce. Under
// a Join, each step of a rank that has data starts with a small all-reduce announcing it;
// a rank that has run out calls join(), which answers those announcements and *shadows*
// each step's collectives (the bucket all-reduces on zeros, buffer broadcasts, the bucket
// rebuild) until every rank has joined. The averages of those steps divide by the number
// of ranks that still had data, so each step's gradient is exactly the mean over the ranks
// that took part (PyTorch divides by the initial world size by default; gradwire does
// what its issue asks and reports the step's participants). Buffers are broadcast from the
// highest rank that still has data. When all have joined, the parameters and buffers of
// the rank that trained longest (ties: the highest rank) are broadcast to every rank, so
// every replica ends equal.
//
// Usage: construct the Join before the loop on every rank, run the loop over this rank's
// data, then call join(). Every rank must use a Join over the same joinables; no_sync
// must not be used under a Join (the shadowing ranks could not know which steps are
// synchronised: forward throws InvalidArgument).
//
// Thread-safety: one training loop thread, as for DistributedDataParallel.
// Errors: collectives' TimeoutError/NetworkError; InvalidArgument for an empty list or a
// joinable already under another Join. The destructor detaches the joinables (it does not
// shadow: a rank that leaves the loop by an exception will make its peers time out).
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
  // data; `root` is the highest of them.
  virtual void join_shadow_step(int participants, int root) = 0;
  // After every rank has joined: make every rank's state equal to rank `root`'s.
  virtual void join_finish(int root) = 0;
};

class Join {
 public:
  explicit Join(std::vector<Joinable*> joinables);
  ~Join();
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // Called by a joinable at the start of each step of a rank with data: returns the number
  // of ranks with data and sets `root` to the highest of them.
  int announce(int& root);
  // This rank is out of data: shadow the others' steps until all have joined, then
  // synchronise the final state. Returns the number of steps shadowed.
  int64_t join();

 private:
  // The all-reduce of a one-hot presence vector: who has data this step.
  int exchange(bool has_data, int& root);

  std::vector<Joinable*> joinables_;
  c10d::ProcessGroup* group_;
  int64_t steps_{0};
  bool joined_{false};
};

}  // namespace gradwire::ddp
