// Learning-rate schedules (torch.optim.lr_scheduler, PyTorch 1.13): StepLR, MultiStepLR,
// ExponentialLR, CosineAnnealingLR, LinearLR (warm-up), LambdaLR (a function of the epoch)
// and SequentialLR (one schedule after another, e.g. warm-up then cosine), over anything
// with learning rates (an LrTarget, lr_target.h): an optim::Optimizer (every parameter
// group, each from its own initial rate), a FunctionalOptimizer, or a
// dist_optim::DistributedOptimizer (every owner, one round of messages per step).
//
// Same numbers as PyTorch: a schedule is made at epoch 0 (last_epoch() == 0, the rates of
// epoch 0 already set: LinearLR sets base * start_factor at once), and each step() moves
// to the next epoch and sets every group's rate by PyTorch's own (chainable, recursive)
// formula from the rate the group has now -- so CosineAnnealingLR gives PyTorch's step()
// values, which differ from the closed form in the last bits, and a rate changed from
// outside between steps carries on as in PyTorch. base_lrs() are the rates the target had
// when the schedule was made (PyTorch's initial_lr); in a SequentialLR every schedule's are
// those the first one found. The closed forms are used where PyTorch uses them (a
// SequentialLR entering its next schedule). The tests compare every schedule with PyTorch
// 1.13's values (tests/optim/fixtures/make_lr_fixtures.py).
//
// A schedule refers to its target; the target must outlive it (a FunctionalOptimizer is
// wrapped in a FunctionalLrTarget the schedule owns, the optimizer itself is not).
// Stepping the schedule once per epoch (or per iteration, for a warm-up counted in steps)
// after the optimizer's step is the usual order, as in PyTorch.
//
// parse_lr_schedule() builds a schedule from a command-line spec ("step:30:0.1",
// "warmup:5:0.1,cosine:100", ...; its comment lists them).
//
// Errors: a constructor throws InvalidArgument for a bad argument, naming it and its value
// (a step_size or T_max below 1, a negative or NaN gamma or eta_min, a start_factor
// outside (0, 1], an end_factor outside [0, 1], total_iters below 1, an empty function,
// as many functions as groups, a SequentialLR whose schedules drive another target or
// whose milestones are not increasing or not one fewer than its schedules). step() throws
// what the target's set_group_lrs() throws (a rate the optimizer rejects; an owner of a
// distributed optimizer that is gone), and then leaves the schedule as it was (the same
// epoch), so it may be stepped again; it also throws InvalidArgument when the target's
// number of groups changed since the schedule was made.
//
// Thread-safety: one thread at a time, as the target it drives (a step sets the target's
// rates). Distinct schedules over distinct targets are independent.
//
// Example:
//   optim::SGD opt(net.parameters(), optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
//   optim::SequentialLR sched(opt, optim::LinearLR(opt, 0.1, 1.0, 5),  // 5 epochs of warm-up
//                             optim::CosineAnnealingLR(opt, 95), 5);   // then cosine to 0
//   for (int epoch = 0; epoch < 100; ++epoch) {
//     train_one_epoch(opt);
//     sched.step();
//   }
//   // The same from a spec, for any LrTarget:
//   std::unique_ptr<optim::LrScheduler> s = optim::parse_lr_schedule("warmup:5:0.1,cosine:95",
//   opt);
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/lr_target.h"

namespace gradwire::optim {

// A FunctionalOptimizer as an LrTarget of one group (it does not own the optimizer).
class FunctionalLrTarget final : public LrTarget {
 public:
  explicit FunctionalLrTarget(FunctionalOptimizer& optimizer) : optimizer_(&optimizer) {}
  size_t num_lr_groups() const override { return 1; }
  double group_lr(size_t group) const override;
  void set_group_lrs(const std::vector<double>& lrs) override;
  FunctionalOptimizer& optimizer() const { return *optimizer_; }

 private:
  FunctionalOptimizer* optimizer_;
};

// What a schedule is given: an LrTarget (an optim::Optimizer, a DistributedOptimizer, ...)
// or a FunctionalOptimizer, both by reference (they must outlive the schedule).
class LrTargetRef {
 public:
  LrTargetRef(LrTarget& target);                // NOLINT(google-explicit-constructor)
  LrTargetRef(FunctionalOptimizer& optimizer);  // NOLINT(google-explicit-constructor)

  LrTarget& operator*() const { return *target_; }
  LrTarget* operator->() const { return target_.get(); }
  // Whether both refer to the same optimizer.
  bool same_as(const LrTargetRef& other) const { return identity_ == other.identity_; }

 private:
  std::shared_ptr<LrTarget> target_;  // not owning for an LrTarget, owning its adapter
  const void* identity_;              // the object referred to
};

// The base of every schedule (PyTorch's _LRScheduler).
class LrScheduler {
 public:
  virtual ~LrScheduler();
  LrScheduler(const LrScheduler&) = delete;
  LrScheduler& operator=(const LrScheduler&) = delete;
  LrScheduler(LrScheduler&&) = default;

  // Moves to the next epoch and sets every group's learning rate for it.
  virtual void step();
  // The rates the last step (or the construction) set, one per group.
  const std::vector<double>& get_last_lr() const { return last_lr_; }
  // The epoch the rates are for: 0 after construction, +1 per step().
  int64_t last_epoch() const { return last_epoch_; }
  // Each group's rate when the schedule was made (PyTorch's initial_lr).
  const std::vector<double>& base_lrs() const { return base_lrs_; }
  // "StepLR", "CosineAnnealingLR", ...
  const std::string& name() const { return name_; }
  LrTarget& target() const { return *target_; }

 protected:
  LrScheduler(LrTargetRef target, std::string name);
  // PyTorch's first step (epoch 0), called at the end of each schedule's constructor.
  void initial_step();
  // The rates for last_epoch() (already moved on), from the target's current rates
  // (current_lrs()) or base_lrs(): PyTorch's get_lr().
  virtual std::vector<double> get_lr() const = 0;
  // PyTorch's _get_closed_form_lr(), for the schedules that have one.
  virtual std::optional<std::vector<double>> closed_form_lr() const { return std::nullopt; }
  std::vector<double> current_lrs() const;
  // PyTorch's _step_count: 1 during the initial step.
  int64_t step_count() const { return step_count_; }

 private:
  friend class SequentialLR;
  // One step to `epoch`: the rates from the closed form when asked and there is one (as
  // PyTorch's step(epoch)), else get_lr(); set on the target; nothing changes if that throws.
  void step_to(int64_t epoch, bool closed_form);

  LrTargetRef target_;
  std::string name_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  int64_t last_epoch_ = -1;
  int64_t step_count_ = 0;
  uint64_t made_;  // the order schedules were made in (SequentialLR's first made)
};

// lr * gamma every step_size epochs.
class StepLR final : public LrScheduler {
 public:
  StepLR(LrTargetRef target, int64_t step_size, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// lr * gamma at each milestone (an epoch listed twice multiplies by gamma twice).
class MultiStepLR final : public LrScheduler {
 public:
  MultiStepLR(LrTargetRef target, std::vector<int64_t> milestones, double gamma = 0.1);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  std::vector<int64_t> milestones_;  // sorted
  double gamma_;
};

// lr * gamma every epoch.
class ExponentialLR final : public LrScheduler {
 public:
  ExponentialLR(LrTargetRef target, double gamma);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double gamma_;
};

// From the base rate down to eta_min along half a cosine over t_max epochs (then back up,
// periodically, as PyTorch's does past t_max).
class CosineAnnealingLR final : public LrScheduler {
 public:
  CosineAnnealingLR(LrTargetRef target, int64_t t_max, double eta_min = 0.0);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

// The rate times a factor going linearly from start_factor (epoch 0) to end_factor (epoch
// total_iters), then end_factor: a warm-up (start_factor < end_factor = 1) or a decay.
class LinearLR final : public LrScheduler {
 public:
  LinearLR(LrTargetRef target, double start_factor = 1.0 / 3, double end_factor = 1.0,
           int64_t total_iters = 5);

 protected:
  std::vector<double> get_lr() const override;
  std::optional<std::vector<double>> closed_form_lr() const override;

 private:
  double start_factor_;
  double end_factor_;
  int64_t total_iters_;
};

// base_lr * lambda(epoch): one function for every group, or one per group.
class LambdaLR final : public LrScheduler {
 public:
  using Lambda = std::function<double(int64_t epoch)>;
  LambdaLR(LrTargetRef target, Lambda lambda);
  LambdaLR(LrTargetRef target, std::vector<Lambda> per_group);

 protected:
  std::vector<double> get_lr() const override;

 private:
  std::vector<Lambda> lambdas_;
};

// Schedules one after another: schedules[0] until milestones[0], schedules[1] from there
// (restarted at its epoch 0) until milestones[1], ... Every schedule must drive the same
// target and have been made just before, one after the other (PyTorch's SequentialLR: the
// rates go back to the base rates of the schedule made first, which become every
// schedule's, and the others' initial steps are undone). A SequentialLR is not itself one
// of the schedules.
class SequentialLR final : public LrScheduler {
 public:
  SequentialLR(LrTargetRef target, std::vector<std::unique_ptr<LrScheduler>> schedules,
               std::vector<int64_t> milestones);
  // Two schedules, the second from epoch `milestone` (a warm-up then another schedule).
  template <typename First, typename Second>
  SequentialLR(LrTargetRef target, First&& first, Second&& second, int64_t milestone)
      : SequentialLR(std::move(target),
                     two(std::make_unique<std::decay_t<First>>(std::forward<First>(first)),
                         std::make_unique<std::decay_t<Second>>(std::forward<Second>(second))),
                     {milestone}) {}

  void step() override;
  const std::vector<std::unique_ptr<LrScheduler>>& schedules() const { return schedules_; }
  const std::vector<int64_t>& milestones() const { return milestones_; }

 protected:
  std::vector<double> get_lr() const override;

 private:
  static std::vector<std::unique_ptr<LrScheduler>> two(std::unique_ptr<LrScheduler> a,
                                                       std::unique_ptr<LrScheduler> b);

  std::vector<std::unique_ptr<LrScheduler>> schedules_;
  std::vector<int64_t> milestones_;
};

// A schedule from a spec, over `target`:
//   "step:<step_size>:<gamma>"              StepLR            step:30:0.1
//   "multistep:<m1>,<m2>,...:<gamma>"       MultiStepLR       multistep:10,20:0.1
//   "exp:<gamma>"                           ExponentialLR     exp:0.95
//   "cosine:<t_max>[:<eta_min>]"            CosineAnnealingLR cosine:100 / cosine:100:1e-4
//   "linear:<start>:<end>:<total_iters>"    LinearLR          linear:1:0.1:50
//   "warmup:<iters>:<start_factor>"         LinearLR from start_factor to 1 over iters
//   "warmup:<iters>:<start_factor>,<spec>"  SequentialLR: the warm-up, then <spec> (any of
//                                           the others) from epoch <iters>
// Errors: InvalidArgument naming the part that is wrong and what was expected (an unknown
// kind, a missing or extra field, a number that does not parse), or what the schedule's
// constructor rejects.
std::unique_ptr<LrScheduler> parse_lr_schedule(const std::string& spec, LrTargetRef target);

}  // namespace gradwire::optim
