// LrTarget: whatever a learning-rate schedule (lr_scheduler.h) drives -- some number of
// parameter groups, each with a learning rate that can be read and set.
//
// optim::Optimizer is one (each of its parameter groups), and so is
// dist_optim::DistributedOptimizer (one group, its rate on every owner);
// FunctionalLrTarget (lr_scheduler.h) makes a FunctionalOptimizer one. A schedule reads the
// current rates with group_lr() and sets the next ones with one set_group_lrs() call, so a
// target whose rates live elsewhere (a distributed optimizer's owners) can send them all
// in one round.
//
// Errors: set_group_lrs() throws InvalidArgument for a list whose length is not
// num_lr_groups() or a rate its optimizer rejects (negative, NaN), naming the group, and
// then changes no group; group_lr() throws InvalidArgument for a group out of range.
// Implementations may throw their own errors from set_group_lrs() (a distributed
// optimizer's owner that is gone).
//
// Thread-safety: as the implementing object's (an optim::Optimizer: one thread at a time).
//
// Example:
//   void halve(optim::LrTarget& t) {
//     std::vector<double> lrs;
//     for (size_t g = 0; g < t.num_lr_groups(); ++g) lrs.push_back(t.group_lr(g) / 2);
//     t.set_group_lrs(lrs);
//   }
#pragma once

#include <cstddef>
#include <vector>

namespace gradwire::optim {

class LrTarget {
 public:
  virtual ~LrTarget() = default;

  // The number of groups, each with its own learning rate.
  virtual size_t num_lr_groups() const = 0;
  // Group `group`'s learning rate.
  virtual double group_lr(size_t group) const = 0;
  // Every group's learning rate at once: lrs[g] for group g. All or nothing for a rate the
  // optimizer rejects.
  virtual void set_group_lrs(const std::vector<double>& lrs) = 0;

 protected:
  LrTarget() = default;
  LrTarget(const LrTarget&) = default;
  LrTarget& operator=(const LrTarget&) = default;
};

}  // namespace gradwire::optim
