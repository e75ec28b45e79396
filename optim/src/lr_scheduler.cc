#include "gradwire/optim/lr_scheduler.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <numbers>
#include <sstream>
#include <utility>

#include "gradwire/core/check.h"

namespace gradwire::optim {

namespace {

// The order schedules are made in: SequentialLR takes the base rates of the one made first
// (the order its arguments were evaluated in is not the order they were made in).
std::atomic<uint64_t> schedules_made{0};

void check_gamma(const char* who, const char* name, double value) {
  GRADWIRE_CHECK_ARG(std::isfinite(value) && value >= 0.0)
      << who << ": " << name << " must be a finite number >= 0, got " << value;
}

}  // namespace

// ---- targets

double FunctionalLrTarget::group_lr(size_t group) const {
  GRADWIRE_CHECK_ARG(group == 0) << "FunctionalLrTarget: no group " << group
                                 << " (a FunctionalOptimizer has one)";
  return optimizer_->lr();
}

void FunctionalLrTarget::set_group_lrs(const std::vector<double>& lrs) {
  GRADWIRE_CHECK_ARG(lrs.size() == 1)
      << "FunctionalLrTarget: " << lrs.size() << " learning rates for 1 group";
  optimizer_->set_lr(lrs[0]);
}

LrTargetRef::LrTargetRef(LrTarget& target)
    : target_(std::shared_ptr<LrTarget>(), &target), identity_(&target) {}

LrTargetRef::LrTargetRef(FunctionalOptimizer& optimizer)
    : target_(std::make_shared<FunctionalLrTarget>(optimizer)), identity_(&optimizer) {}

// ---- LrScheduler

LrScheduler::LrScheduler(LrTargetRef target, std::string name)
    : target_(std::move(target)), name_(std::move(name)), made_(schedules_made.fetch_add(1)) {
  const size_t groups = target_->num_lr_groups();
  for (size_t g = 0; g < groups; ++g)
    base_lrs_.push_back(target_->group_lr(g));
  last_lr_ = base_lrs_;
}

LrScheduler::~LrScheduler() = default;

std::vector<double> LrScheduler::current_lrs() const {
  const size_t groups = target_->num_lr_groups();
  GRADWIRE_CHECK_ARG(groups == base_lrs_.size())
      << name_ << ": the optimizer has " << groups << " parameter groups, it had "
      << base_lrs_.size() << " when the schedule was made";
  std::vector<double> lrs;
  for (size_t g = 0; g < groups; ++g)
    lrs.push_back(target_->group_lr(g));
  return lrs;
}

void LrScheduler::initial_step() {
  step_count_ = 0;
  step();
}

void LrScheduler::step() {
  step_to(last_epoch_ + 1, /*closed_form=*/false);
}

void LrScheduler::step_to(int64_t epoch, bool closed_form) {
  const int64_t epoch_before = last_epoch_, count_before = step_count_;
  ++step_count_;
  last_epoch_ = epoch;
  try {
    std::optional<std::vector<double>> lrs;
    if (closed_form) lrs = closed_form_lr();
    if (!lrs) lrs = get_lr();
    GRADWIRE_CHECK_ARG(lrs->size() == base_lrs_.size())
        << name_ << ": the optimizer has " << target_->num_lr_groups()
        << " parameter groups, it had " << base_lrs_.size() << " when the schedule was made";
    target_->set_group_lrs(*lrs);
    last_lr_ = std::move(*lrs);
  } catch (...) {
    last_epoch_ = epoch_before;
    step_count_ = count_before;
    throw;
  }
}

// ---- StepLR

StepLR::StepLR(LrTargetRef target, int64_t step_size, double gamma)
    : LrScheduler(std::move(target), "StepLR"), step_size_(step_size), gamma_(gamma) {
  GRADWIRE_CHECK_ARG(step_size >= 1) << "StepLR: step_size must be >= 1, got " << step_size;
  check_gamma("StepLR", "gamma", gamma);
  initial_step();
}

std::vector<double> StepLR::get_lr() const {
  std::vector<double> lrs = current_lrs();
  if (last_epoch() == 0 || last_epoch() % step_size_ != 0) return lrs;
  for (double& lr : lrs)
    lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> StepLR::closed_form_lr() const {
  std::vector<double> lrs;
  const int64_t e = last_epoch();
  // Python's floor division (the epoch is never negative here, but keep its meaning).
  const int64_t n = e >= 0 ? e / step_size_ : -((-e + step_size_ - 1) / step_size_);
  for (double base : base_lrs())
    lrs.push_back(base * std::pow(gamma_, static_cast<double>(n)));
  return lrs;
}

// ---- MultiStepLR

MultiStepLR::MultiStepLR(LrTargetRef target, std::vector<int64_t> milestones, double gamma)
    : LrScheduler(std::move(target), "MultiStepLR"),
      milestones_(std::move(milestones)),
      gamma_(gamma) {
  check_gamma("MultiStepLR", "gamma", gamma);
  std::sort(milestones_.begin(), milestones_.end());
  initial_step();
}

std::vector<double> MultiStepLR::get_lr() const {
  std::vector<double> lrs = current_lrs();
  const auto [lo, hi] = std::equal_range(milestones_.begin(), milestones_.end(), last_epoch());
  const auto times = hi - lo;  // PyTorch's Counter: a milestone listed twice counts twice
  if (times == 0) return lrs;
  for (double& lr : lrs)
    lr = lr * std::pow(gamma_, static_cast<double>(times));
  return lrs;
}

std::optional<std::vector<double>> MultiStepLR::closed_form_lr() const {
  const auto passed =
      std::upper_bound(milestones_.begin(), milestones_.end(), last_epoch()) - milestones_.begin();
  std::vector<double> lrs;
  for (double base : base_lrs())
    lrs.push_back(base * std::pow(gamma_, static_cast<double>(passed)));
  return lrs;
}

// ---- ExponentialLR

ExponentialLR::ExponentialLR(LrTargetRef target, double gamma)
    : LrScheduler(std::move(target), "ExponentialLR"), gamma_(gamma) {
  check_gamma("ExponentialLR", "gamma", gamma);
  initial_step();
}

std::vector<double> ExponentialLR::get_lr() const {
  std::vector<double> lrs = current_lrs();
  if (last_epoch() == 0) return lrs;
  for (double& lr : lrs)
    lr = lr * gamma_;
  return lrs;
}

std::optional<std::vector<double>> ExponentialLR::closed_form_lr() const {
  std::vector<double> lrs;
  for (double base : base_lrs())
    lrs.push_back(base * std::pow(gamma_, static_cast<double>(last_epoch())));
  return lrs;
}

// ---- CosineAnnealingLR

CosineAnnealingLR::CosineAnnealingLR(LrTargetRef target, int64_t t_max, double eta_min)
    : LrScheduler(std::move(target), "CosineAnnealingLR"), t_max_(t_max), eta_min_(eta_min) {
  GRADWIRE_CHECK_ARG(t_max >= 1) << "CosineAnnealingLR: t_max must be >= 1, got " << t_max;
  check_gamma("CosineAnnealingLR", "eta_min", eta_min);
  initial_step();
}

// Each expression is PyTorch's, operation for operation (the order of a product and a
// division changes the last bits).
std::vector<double> CosineAnnealingLR::get_lr() const {
  constexpr double kPi = std::numbers::pi;
  std::vector<double> lrs = current_lrs();
  const int64_t e = last_epoch();
  const auto t = static_cast<double>(t_max_);
  if (e == 0) return lrs;
  if (step_count() == 1 && e > 0) {
    for (size_t g = 0; g < lrs.size(); ++g) {
      lrs[g] = eta_min_ +
               (base_lrs()[g] - eta_min_) * (1 + std::cos(static_cast<double>(e) * kPi / t)) / 2;
    }
    return lrs;
  }
  if ((e - 1 - t_max_) % (2 * t_max_) == 0) {
    for (size_t g = 0; g < lrs.size(); ++g)
      lrs[g] = lrs[g] + (base_lrs()[g] - eta_min_) * (1 - std::cos(kPi / t)) / 2;
    return lrs;
  }
  for (double& lr : lrs) {
    lr = (1 + std::cos(kPi * static_cast<double>(e) / t)) /
             (1 + std::cos(kPi * static_cast<double>(e - 1) / t)) * (lr - eta_min_) +
         eta_min_;
  }
  return lrs;
}

std::optional<std::vector<double>> CosineAnnealingLR::closed_form_lr() const {
  constexpr double kPi = std::numbers::pi;
  std::vector<double> lrs;
  for (double base : base_lrs()) {
    lrs.push_back(eta_min_ + (base - eta_min_) *
                                 (1 + std::cos(kPi * static_cast<double>(last_epoch()) /
                                               static_cast<double>(t_max_))) /
                                 2);
  }
  return lrs;
}

// ---- LinearLR

LinearLR::LinearLR(LrTargetRef target, double start_factor, double end_factor, int64_t total_iters)
    : LrScheduler(std::move(target), "LinearLR"),
      start_factor_(start_factor),
      end_factor_(end_factor),
      total_iters_(total_iters) {
  GRADWIRE_CHECK_ARG(start_factor > 0.0 && start_factor <= 1.0)
      << "LinearLR: start_factor must be in (0, 1], got " << start_factor;
  GRADWIRE_CHECK_ARG(end_factor >= 0.0 && end_factor <= 1.0)
      << "LinearLR: end_factor must be in [0, 1], got " << end_factor;
  GRADWIRE_CHECK_ARG(total_iters >= 1) << "LinearLR: total_iters must be >= 1, got " << total_iters;
  initial_step();
}

std::vector<double> LinearLR::get_lr() const {
  std::vector<double> lrs = current_lrs();
  const int64_t e = last_epoch();
  if (e == 0) {
    for (double& lr : lrs)
      lr = lr * start_factor_;
    return lrs;
  }
  if (e > total_iters_) return lrs;
  const double factor = 1. + (end_factor_ - start_factor_) /
                                 (static_cast<double>(total_iters_) * start_factor_ +
                                  static_cast<double>(e - 1) * (end_factor_ - start_factor_));
  for (double& lr : lrs)
    lr = lr * factor;
  return lrs;
}

std::optional<std::vector<double>> LinearLR::closed_form_lr() const {
  std::vector<double> lrs;
  const auto done = static_cast<double>(std::min(total_iters_, last_epoch()));
  for (double base : base_lrs()) {
    lrs.push_back(base * (start_factor_ + (end_factor_ - start_factor_) * done /
                                              static_cast<double>(total_iters_)));
  }
  return lrs;
}

// ---- LambdaLR

LambdaLR::LambdaLR(LrTargetRef target, Lambda lambda) : LrScheduler(std::move(target), "LambdaLR") {
  GRADWIRE_CHECK_ARG(static_cast<bool>(lambda)) << "LambdaLR: the function is empty";
  lambdas_.assign(base_lrs().size(), lambda);
  initial_step();
}

LambdaLR::LambdaLR(LrTargetRef target, std::vector<Lambda> per_group)
    : LrScheduler(std::move(target), "LambdaLR"), lambdas_(std::move(per_group)) {
  GRADWIRE_CHECK_ARG(lambdas_.size() == base_lrs().size())
      << "LambdaLR: " << lambdas_.size() << " functions for " << base_lrs().size()
      << " parameter groups (one per group, or one for all)";
  for (size_t g = 0; g < lambdas_.size(); ++g)
    GRADWIRE_CHECK_ARG(static_cast<bool>(lambdas_[g])) << "LambdaLR: function " << g << " is empty";
  initial_step();
}

std::vector<double> LambdaLR::get_lr() const {
  current_lrs();  // checks the number of groups
  std::vector<double> lrs;
  for (size_t g = 0; g < lambdas_.size(); ++g)
    lrs.push_back(base_lrs()[g] * lambdas_[g](last_epoch()));
  return lrs;
}

// ---- SequentialLR

std::vector<std::unique_ptr<LrScheduler>> SequentialLR::two(std::unique_ptr<LrScheduler> a,
                                                            std::unique_ptr<LrScheduler> b) {
  std::vector<std::unique_ptr<LrScheduler>> both;
  both.push_back(std::move(a));
  both.push_back(std::move(b));
  return both;
}

SequentialLR::SequentialLR(LrTargetRef target, std::vector<std::unique_ptr<LrScheduler>> schedules,
                           std::vector<int64_t> milestones)
    : LrScheduler(std::move(target), "SequentialLR"),
      schedules_(std::move(schedules)),
      milestones_(std::move(milestones)) {
  GRADWIRE_CHECK_ARG(!schedules_.empty()) << "SequentialLR: no schedules";
  GRADWIRE_CHECK_ARG(milestones_.size() + 1 == schedules_.size())
      << "SequentialLR: " << schedules_.size() << " schedules need " << schedules_.size() - 1
      << " milestones, got " << milestones_.size();
  for (size_t i = 0; i < schedules_.size(); ++i) {
    GRADWIRE_CHECK_ARG(schedules_[i] != nullptr) << "SequentialLR: schedule " << i << " is null";
    GRADWIRE_CHECK_ARG(dynamic_cast<const SequentialLR*>(schedules_[i].get()) == nullptr)
        << "SequentialLR: schedule " << i << " is itself a SequentialLR";
    GRADWIRE_CHECK_ARG(schedules_[i]->target_.same_as(target_))
        << "SequentialLR: schedule " << i << " (" << schedules_[i]->name()
        << ") drives another optimizer";
  }
  for (size_t i = 0; i < milestones_.size(); ++i) {
    GRADWIRE_CHECK_ARG(milestones_[i] >= 1 && (i == 0 || milestones_[i] > milestones_[i - 1]))
        << "SequentialLR: milestones must be >= 1 and increasing, got " << milestones_[i]
        << " at position " << i;
  }
  // PyTorch's initial_lr: the rates before the first schedule was made.
  const LrScheduler* first_made = schedules_.front().get();
  for (const auto& s : schedules_) {
    if (s->made_ < first_made->made_) first_made = s.get();
  }
  const std::vector<double> initial = first_made->base_lrs_;
  GRADWIRE_CHECK_ARG(initial.size() == target_->num_lr_groups())
      << "SequentialLR: the optimizer has " << target_->num_lr_groups()
      << " parameter groups, it had " << initial.size() << " when the schedules were made";
  target_->set_group_lrs(initial);
  for (auto& s : schedules_) {
    s->base_lrs_ = initial;
    s->last_epoch_ -= 1;  // undoes its initial step
  }
  schedules_.front()->initial_step();
  base_lrs_ = initial;
  last_epoch_ = 0;
  last_lr_ = schedules_.front()->get_last_lr();
}

void SequentialLR::step() {
  const int64_t epoch = last_epoch_ + 1;
  const size_t idx = static_cast<size_t>(
      std::upper_bound(milestones_.begin(), milestones_.end(), epoch) - milestones_.begin());
  LrScheduler& current = *schedules_[idx];
  if (idx > 0 && milestones_[idx - 1] == epoch) {
    current.step_to(0, /*closed_form=*/true);  // restarted: PyTorch's step(0)
  } else {
    current.step();
  }
  last_epoch_ = epoch;
  ++step_count_;
  last_lr_ = current.get_last_lr();
}

std::vector<double> SequentialLR::get_lr() const {
  return current_lrs();
}

// ---- parse_lr_schedule

namespace {

[[noreturn]] void bad_spec(const std::string& spec, const std::string& part,
                           const std::string& why) {
  GRADWIRE_THROW(InvalidArgument) << "parse_lr_schedule: '" << spec << "': " << part << ": " << why;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + 1;
  }
}

double parse_number(const std::string& spec, const std::string& what, const std::string& text) {
  char* end = nullptr;
  const double v = text.empty() ? 0.0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
    bad_spec(spec, what + " '" + text + "'", "expected a finite number");
  return v;
}

int64_t parse_integer(const std::string& spec, const std::string& what, const std::string& text) {
  char* end = nullptr;
  const long long v = text.empty() ? 0 : std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || end != text.c_str() + text.size())
    bad_spec(spec, what + " '" + text + "'", "expected an integer");
  return v;
}

// One schedule (no warm-up prefix), "kind:field:...".
std::unique_ptr<LrScheduler> parse_one(const std::string& spec, const std::string& text,
                                       const LrTargetRef& target) {
  const std::vector<std::string> f = split(text, ':');
  const std::string& kind = f[0];
  auto expect_fields = [&](size_t min, size_t max, const char* form) {
    if (f.size() - 1 < min || f.size() - 1 > max) {
      bad_spec(spec, "'" + text + "'",
               "expected " + std::string(form) + ", got " + std::to_string(f.size() - 1) +
                   " field" + (f.size() == 2 ? "" : "s"));
    }
  };
  if (kind == "step") {
    expect_fields(2, 2, "step:<step_size>:<gamma>");
    return std::make_unique<StepLR>(target, parse_integer(spec, "step_size", f[1]),
                                    parse_number(spec, "gamma", f[2]));
  }
  if (kind == "multistep") {
    expect_fields(2, 2, "multistep:<m1>,<m2>,...:<gamma>");
    std::vector<int64_t> milestones;
    for (const std::string& m : split(f[1], ','))
      milestones.push_back(parse_integer(spec, "milestone", m));
    return std::make_unique<MultiStepLR>(target, std::move(milestones),
                                         parse_number(spec, "gamma", f[2]));
  }
  if (kind == "exp") {
    expect_fields(1, 1, "exp:<gamma>");
    return std::make_unique<ExponentialLR>(target, parse_number(spec, "gamma", f[1]));
  }
  if (kind == "cosine") {
    expect_fields(1, 2, "cosine:<t_max>[:<eta_min>]");
    return std::make_unique<CosineAnnealingLR>(
        target, parse_integer(spec, "t_max", f[1]),
        f.size() > 2 ? parse_number(spec, "eta_min", f[2]) : 0.0);
  }
  if (kind == "linear") {
    expect_fields(3, 3, "linear:<start_factor>:<end_factor>:<total_iters>");
    return std::make_unique<LinearLR>(target, parse_number(spec, "start_factor", f[1]),
                                      parse_number(spec, "end_factor", f[2]),
                                      parse_integer(spec, "total_iters", f[3]));
  }
  if (kind == "warmup") {
    expect_fields(2, 2, "warmup:<iters>:<start_factor>");
    return std::make_unique<LinearLR>(target, parse_number(spec, "start_factor", f[2]), 1.0,
                                      parse_integer(spec, "iters", f[1]));
  }
  bad_spec(spec, "'" + kind + "'",
           "unknown schedule (expected step, multistep, exp, cosine, linear or warmup)");
}

}  // namespace

std::unique_ptr<LrScheduler> parse_lr_schedule(const std::string& spec, LrTargetRef target) {
  if (spec.empty()) bad_spec(spec, "the spec", "is empty");
  auto made = [&](const std::string& text) {
    try {
      return parse_one(spec, text, target);
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      if (what.rfind("parse_lr_schedule", 0) == 0) throw;
      bad_spec(spec, "'" + text + "'", what);  // the schedule's own check
    }
  };
  // A warm-up's fields hold no comma, so its first comma ends it (multistep's milestones
  // hold commas).
  if (spec.rfind("warmup:", 0) == 0) {
    const size_t comma = spec.find(',');
    if (comma != std::string::npos) {
      const std::string warmup = spec.substr(0, comma), rest = spec.substr(comma + 1);
      if (rest.rfind("warmup:", 0) == 0)
        bad_spec(spec, "'" + rest + "'", "a warm-up may only come first");
      std::unique_ptr<LrScheduler> first = made(warmup);
      const int64_t iters = parse_integer(spec, "iters", split(warmup, ':')[1]);
      std::unique_ptr<LrScheduler> second;
      try {
        second = made(rest);
      } catch (...) {
        target->set_group_lrs(first->base_lrs());  // the warm-up's initial step undone
        throw;
      }
      std::vector<std::unique_ptr<LrScheduler>> both;
      both.push_back(std::move(first));
      both.push_back(std::move(second));
      return std::make_unique<SequentialLR>(target, std::move(both), std::vector<int64_t>{iters});
    }
  }
  return made(spec);
}

}  // namespace gradwire::optim
