// Learning-rate schedules and parameter groups: every schedule's rates against PyTorch
// 1.13's, step for step, on an optimizer of two groups (fixtures/lr_schedules.txt, made by
// fixtures/make_lr_fixtures.py); an SGD training of two groups under warm-up then cosine
// against PyTorch's parameters; a schedule over a FunctionalOptimizer; the groups' own
// options, learning rates and state dicts; parse_lr_schedule's specs and the errors that
// name what was wrong.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/lr_scheduler.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "support/error_text.h"

namespace gradwire::optim {
namespace {

using test::error_text;
using ::testing::HasSubstr;

// ---- the fixture file

struct Fixture {
  std::map<std::string, std::vector<std::vector<double>>> lrs;  // schedule -> epoch -> group
  std::vector<std::vector<double>> train;                       // step -> p0 then p1
};

const Fixture& fixture() {
  static const Fixture f = [] {
    const std::string path = std::string(GRADWIRE_TEST_SOURCE_DIR) + "/fixtures/lr_schedules.txt";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot read " + path);
    Fixture out;
    std::string line, current;
    while (std::getline(in, line)) {
      std::istringstream row(line);
      std::string tag;
      row >> tag;
      if (tag == "schedule" || tag == "train") {
        row >> current;
      } else if (tag == "lr" || tag == "step") {
        size_t k = 0;
        row >> k;
        std::vector<double> values;
        double v = 0;
        while (row >> v)
          values.push_back(v);
        auto& rows = tag == "lr" ? out.lrs[current] : out.train;
        if (rows.size() != k) throw std::runtime_error(path + ": out of order: " + line);
        rows.push_back(values);
      }
    }
    return out;
  }();
  return f;
}

const std::vector<std::vector<double>>& want_lrs(const std::string& name) {
  auto it = fixture().lrs.find(name);
  if (it == fixture().lrs.end()) throw std::runtime_error("no schedule '" + name + "' in fixture");
  return it->second;
}

// PyTorch's rates are the same float64 operations in the same order: equal to the last bit
// but for cos's rounding, allowed a few ulps.
void expect_lrs(const std::vector<double>& got, const std::vector<double>& want,
                const std::string& where) {
  ASSERT_EQ(got.size(), want.size()) << where;
  for (size_t g = 0; g < want.size(); ++g)
    EXPECT_DOUBLE_EQ(got[g], want[g]) << where << ", group " << g;
}

// The fixture's optimizer: SGD with two groups, lr 0.1 and 0.025.
struct TwoGroups {
  TwoGroups()
      : a(zeros({1}, kFloat64).set_requires_grad()),
        b(zeros({1}, kFloat64).set_requires_grad()),
        opt({a}, SGDOptions{.lr = 0.1}) {
    opt.add_param_group({b}, SGDOptions{.lr = 0.025});
  }
  Tensor a, b;
  SGD opt;
};

// Makes the schedule on `opt`, then checks its rates (and the optimizer's) after
// construction and each of the fixture's steps.
void check_schedule(const std::string& name,
                    const std::function<std::unique_ptr<LrScheduler>(Optimizer&)>& make) {
  const auto& want = want_lrs(name);
  TwoGroups two;
  std::unique_ptr<LrScheduler> s = make(two.opt);
  for (size_t epoch = 0; epoch < want.size(); ++epoch) {
    if (epoch > 0) s->step();
    const std::string where = name + " at epoch " + std::to_string(epoch);
    EXPECT_EQ(s->last_epoch(), static_cast<int64_t>(epoch)) << where;
    expect_lrs(s->get_last_lr(), want[epoch], where);
    expect_lrs({two.opt.lr(0), two.opt.lr(1)}, want[epoch], where + " (the optimizer's)");
  }
  EXPECT_EQ(s->base_lrs(), (std::vector<double>{0.1, 0.025})) << name;
}

TEST(LrScheduler, StepLRMatchesPyTorch) {
  check_schedule("step", [](Optimizer& o) { return std::make_unique<StepLR>(o, 3, 0.5); });
}

TEST(LrScheduler, MultiStepLRWithARepeatedMilestoneMatchesPyTorch) {
  check_schedule("multistep", [](Optimizer& o) {
    return std::make_unique<MultiStepLR>(o, std::vector<int64_t>{9, 5, 2, 5}, 0.3);
  });
}

TEST(LrScheduler, ExponentialLRMatchesPyTorch) {
  check_schedule("exp", [](Optimizer& o) { return std::make_unique<ExponentialLR>(o, 0.9); });
}

// PyTorch's recursive form, past t_max as well (the rate climbs back periodically).
TEST(LrScheduler, CosineAnnealingLRMatchesPyTorchStepForStep) {
  check_schedule("cosine",
                 [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 5, 0.001); });
  check_schedule("cosine_long",
                 [](Optimizer& o) { return std::make_unique<CosineAnnealingLR>(o, 12); });
}

TEST(LrScheduler, LinearLRWarmUpAndDecayMatchPyTorch) {
  check_schedule("warmup",
                 [](Optimizer& o) { return std::make_unique<LinearLR>(o, 0.25, 1.0, 4); });
  check_schedule("linear_decay",
                 [](Optimizer& o) { return std::make_unique<LinearLR>(o, 1.0, 0.1, 6); });
}

TEST(LrScheduler, LambdaLRMatchesPyTorch) {
  check_schedule("lambda", [](Optimizer& o) {
    return std::make_unique<LambdaLR>(
        o, [](int64_t e) { return 1.0 / (1.0 + 0.5 * static_cast<double>(e)); });
  });
  // One function per group: each group's rate is its own base times its function's value.
  TwoGroups two;
  LambdaLR per_group(
      two.opt, {[](int64_t e) { return static_cast<double>(e + 1); }, [](int64_t) { return 2.0; }});
  per_group.step();
  EXPECT_EQ(per_group.get_last_lr(), (std::vector<double>{0.1 * 2.0, 0.025 * 2.0}));
}

TEST(LrScheduler, SequentialLRMatchesPyTorch) {
  check_schedule("warmup_cosine", [](Optimizer& o) {
    return std::make_unique<SequentialLR>(o, LinearLR(o, 0.1, 1.0, 3), CosineAnnealingLR(o, 6), 3);
  });
  check_schedule("warmup_multistep", [](Optimizer& o) {
    std::vector<std::unique_ptr<LrScheduler>> both;
    both.push_back(std::make_unique<LinearLR>(o, 0.5, 1.0, 2));
    both.push_back(std::make_unique<MultiStepLR>(o, std::vector<int64_t>{3, 6}, 0.5));
    return std::make_unique<SequentialLR>(o, std::move(both), std::vector<int64_t>{4});
  });
}

// SGD with momentum over two groups, each scheduled from its own rate (warm-up then
// cosine), against PyTorch's parameters after each step.
TEST(LrScheduler, ScheduledSgdOfTwoGroupsMatchesPyTorch) {
  const auto& want = fixture().train;
  ASSERT_EQ(want.size(), 13u);
  const std::vector<double>& start = want[0];
  Tensor p0 = tensor<double>(std::vector<double>(start.begin(), start.begin() + 6), {2, 3})
                  .set_requires_grad();
  Tensor p1 =
      tensor<double>(std::vector<double>(start.begin() + 6, start.end()), {3}).set_requires_grad();
  const Tensor w = tensor<double>({1.0, 0.5, 2.0, 0.1, 3.0, 0.75}, {2, 3});
  const Tensor v = tensor<double>({0.3, -0.2, 0.0, 1.0, -1.0, 0.5}, {2, 3});
  const Tensor u = tensor<double>({0.5, 0.25, 2.0}, {3});
  SGD opt({p0}, SGDOptions{.lr = 0.1, .momentum = 0.9});
  opt.add_param_group({p1}, SGDOptions{.lr = 0.05, .momentum = 0.9});
  SequentialLR sched(opt, LinearLR(opt, 0.2, 1.0, 3), CosineAnnealingLR(opt, 9, 0.001), 3);
  for (size_t k = 1; k < want.size(); ++k) {
    opt.zero_grad();
    Tensor loss = sum(w * p0 * p0) + sum(v * p0) + sum(u * p1 * p1);
    loss.backward();
    opt.step();
    sched.step();
    std::vector<double> got = p0.to_vector<double>();
    for (double x : p1.to_vector<double>())
      got.push_back(x);
    ASSERT_EQ(got.size(), want[k].size());
    for (size_t i = 0; i < got.size(); ++i) {
      EXPECT_NEAR(got[i], want[k][i], 1e-12 + 1e-10 * std::abs(want[k][i]))
          << "step " << k << ", value " << i;
    }
  }
}

// A FunctionalOptimizer is a target of one group: the schedule sets its rate, and its steps
// equal those of an Optimizer object under the same schedule, bit for bit.
TEST(LrScheduler, DrivesAFunctionalOptimizerAsAnObject) {
  const auto& want = want_lrs("exp");
  std::unique_ptr<FunctionalOptimizer> functional =
      make_functional_optimizer(SGDOptions{.lr = 0.1, .momentum = 0.5});
  ExponentialLR on_functional(*functional, 0.9);
  Tensor q = tensor<double>({1.0, -2.0}).set_requires_grad();
  SGD object({q}, SGDOptions{.lr = 0.1, .momentum = 0.5});
  ExponentialLR on_object(object, 0.9);
  std::vector<Tensor> params{tensor<double>({1.0, -2.0})};
  for (size_t epoch = 1; epoch < want.size(); ++epoch) {
    const Tensor grad = params[0] * 3.0 + 1.0;
    functional->step(params, {grad});
    q.set_grad(q.detach() * 3.0 + 1.0);
    object.step();
    on_functional.step();
    on_object.step();
    EXPECT_DOUBLE_EQ(functional->lr(), want[epoch][0]) << "epoch " << epoch;
    EXPECT_EQ(functional->lr(), object.lr()) << "epoch " << epoch;
    EXPECT_EQ(std::memcmp(params[0].data_ptr(), q.data_ptr(), 2 * sizeof(double)), 0)
        << "epoch " << epoch;
  }
  FunctionalLrTarget target(*functional);
  EXPECT_EQ(target.num_lr_groups(), 1u);
  EXPECT_THAT(error_text<InvalidArgument>([&] {
                target.set_group_lrs({0.1, 0.2});
              }),
              HasSubstr("2 learning rates for 1 group"));
}

TEST(LrScheduler, ArgumentsAreCheckedAndNamed) {
  TwoGroups two;
  Optimizer& o = two.opt;
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)StepLR(o, 0); }),
              HasSubstr("StepLR: step_size must be >= 1, got 0"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)StepLR(o, 3, -0.5); }),
              HasSubstr("StepLR: gamma must be a finite number >= 0, got -0.5"));
  EXPECT_THAT(error_text<InvalidArgument>(
                  [&] { (void)MultiStepLR(o, {1}, std::numeric_limits<double>::quiet_NaN()); }),
              HasSubstr("MultiStepLR: gamma"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)ExponentialLR(o, -1); }),
              HasSubstr("ExponentialLR: gamma"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)CosineAnnealingLR(o, 0); }),
              HasSubstr("CosineAnnealingLR: t_max must be >= 1, got 0"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)CosineAnnealingLR(o, 5, -1e-3); }),
              HasSubstr("CosineAnnealingLR: eta_min"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)LinearLR(o, 0.0); }),
              HasSubstr("LinearLR: start_factor must be in (0, 1], got 0"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)LinearLR(o, 0.5, 1.5); }),
              HasSubstr("LinearLR: end_factor must be in [0, 1], got 1.5"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)LinearLR(o, 0.5, 1.0, 0); }),
              HasSubstr("LinearLR: total_iters must be >= 1, got 0"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)LambdaLR(o, LambdaLR::Lambda()); }),
              HasSubstr("LambdaLR: the function is empty"));
  EXPECT_THAT(error_text<InvalidArgument>([&] {
                (void)LambdaLR(o, std::vector<LambdaLR::Lambda>{[](int64_t) { return 1.0; }});
              }),
              HasSubstr("LambdaLR: 1 functions for 2 parameter groups"));
  // SequentialLR: milestones, and every schedule on the same optimizer.
  EXPECT_THAT(error_text<InvalidArgument>([&] {
                std::vector<std::unique_ptr<LrScheduler>> s;
                s.push_back(std::make_unique<ExponentialLR>(o, 0.9));
                s.push_back(std::make_unique<StepLR>(o, 2));
                (void)SequentialLR(o, std::move(s), {});
              }),
              HasSubstr("2 schedules need 1 milestones, got 0"));
  TwoGroups other;
  EXPECT_THAT(error_text<InvalidArgument>(
                  [&] { (void)SequentialLR(o, LinearLR(o), StepLR(other.opt, 2), 5); }),
              HasSubstr("schedule 1 (StepLR) drives another optimizer"));
  EXPECT_THAT(
      error_text<InvalidArgument>([&] { (void)SequentialLR(o, LinearLR(o), StepLR(o, 2), 0); }),
      HasSubstr("milestones must be >= 1 and increasing, got 0"));
}

// A rate the optimizer rejects (here a function that turns negative at epoch 2) fails the
// step with the optimizer's error naming the group and lr, and leaves schedule and
// optimizer as they were; a target whose groups changed is refused.
TEST(LrScheduler, AFailedStepChangesNothing) {
  TwoGroups two;
  LambdaLR s(two.opt, [](int64_t e) { return e == 2 ? -1.0 : 0.5; });
  s.step();
  EXPECT_THAT(error_text<InvalidArgument>([&] { s.step(); }),
              HasSubstr("Optimizer.set_lr: group 0: SGDOptions: lr must be >= 0, got -0.1"));
  EXPECT_EQ(s.last_epoch(), 1);
  EXPECT_EQ(s.get_last_lr(), (std::vector<double>{0.05, 0.0125}));
  EXPECT_EQ(two.opt.lr(0), 0.05);
  EXPECT_EQ(two.opt.lr(1), 0.0125);
  two.opt.add_param_group({zeros({1}, kFloat64).set_requires_grad()});
  EXPECT_THAT(error_text<InvalidArgument>([&] { s.step(); }),
              HasSubstr("LambdaLR: the optimizer has 3 parameter groups, it had 2"));
  EXPECT_EQ(s.last_epoch(), 1);
}

// ---- parameter groups

// Each group steps with its own options and state: the same as two optimizers, bit for bit.
TEST(LrParamGroups, EachGroupStepsWithItsOwnOptions) {
  Tensor a = tensor<double>({1.0, -2.0, 0.5}).set_requires_grad();
  Tensor b = tensor<double>({0.25, 3.0}).set_requires_grad();
  Tensor a2 = a.detach().clone().set_requires_grad();
  Tensor b2 = b.detach().clone().set_requires_grad();
  Adam grouped({a}, AdamOptions{.lr = 0.1});
  grouped.add_param_group({b}, AdamOptions{.lr = 0.01, .beta1 = 0.8, .amsgrad = true});
  Adam first({a2}, AdamOptions{.lr = 0.1});
  Adam second({b2}, AdamOptions{.lr = 0.01, .beta1 = 0.8, .amsgrad = true});
  EXPECT_EQ(grouped.num_param_groups(), 2u);
  ASSERT_EQ(grouped.params().size(), 2u);
  EXPECT_EQ(grouped.param_groups()[1].params().size(), 1u);
  EXPECT_EQ(grouped.options(1).beta1, 0.8);
  for (int step = 0; step < 4; ++step) {
    for (Tensor* p : {&a, &b, &a2, &b2})
      p->set_grad(p->detach() * p->detach() + static_cast<double>(step));
    grouped.step();
    first.step();
    second.step();
    EXPECT_EQ(a.to_vector<double>(), a2.to_vector<double>()) << "step " << step;
    EXPECT_EQ(b.to_vector<double>(), b2.to_vector<double>()) << "step " << step;
  }
  EXPECT_EQ(grouped.state(1).params[0].step, 4);
  // set_options(options) sets every group's; set_options(g, options) one group's.
  grouped.set_options(1, AdamOptions{.lr = 0.5});
  EXPECT_EQ(grouped.lr(0), 0.1);
  EXPECT_EQ(grouped.lr(1), 0.5);
  grouped.set_options(AdamOptions{.lr = 0.2});
  EXPECT_EQ(grouped.lr(0), 0.2);
  EXPECT_EQ(grouped.lr(1), 0.2);
  EXPECT_THAT(error_text<InvalidArgument>([&] { grouped.set_options(AdamOptions{.beta1 = 2}); }),
              HasSubstr("beta1"));
  EXPECT_EQ(grouped.lr(1), 0.2);
}

TEST(LrParamGroups, SetLrChecksTheRateAndNamesTheGroup) {
  TwoGroups two;
  SGD& o = two.opt;
  o.set_lr(1, 0.5);
  EXPECT_EQ(o.lr(), 0.1);
  EXPECT_EQ(o.lr(1), 0.5);
  EXPECT_EQ(o.param_groups()[1].lr(), 0.5);
  o.set_lr(0.3);
  EXPECT_EQ(o.lr(0), 0.3);
  EXPECT_EQ(o.lr(1), 0.3);
  EXPECT_THAT(error_text<InvalidArgument>([&] { o.set_lr(-0.5); }),
              HasSubstr("Optimizer.set_lr: group 0: SGDOptions: lr must be >= 0, got -0.5"));
  EXPECT_THAT(
      error_text<InvalidArgument>([&] { o.set_lr(1, std::numeric_limits<double>::quiet_NaN()); }),
      HasSubstr("Optimizer.set_lr: group 1: SGDOptions: lr must be >= 0, got nan"));
  // All or nothing: group 1's bad rate leaves group 0 as it was.
  EXPECT_THAT(error_text<InvalidArgument>([&] {
                o.set_group_lrs({0.7, -1.0});
              }),
              HasSubstr("group 1"));
  EXPECT_EQ(o.lr(0), 0.3);
  EXPECT_EQ(o.lr(1), 0.3);
  EXPECT_THAT(error_text<InvalidArgument>([&] { o.set_group_lrs({0.7}); }),
              HasSubstr("1 learning rates for 2 parameter groups"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { o.set_lr(2, 0.1); }),
              HasSubstr("no parameter group 2 (there are 2)"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { (void)o.lr(5); }),
              HasSubstr("no parameter group 5"));
}

TEST(LrParamGroups, AddParamGroupChecksKindAndParameters) {
  Tensor a = tensor<double>({1.0}).set_requires_grad();
  Tensor b = tensor<double>({2.0}).set_requires_grad();
  SGD o({a}, SGDOptions{.lr = 0.2, .momentum = 0.9});
  EXPECT_THAT(error_text<InvalidArgument>(
                  [&] { o.add_param_group({b}, make_functional_optimizer(AdamOptions{})); }),
              HasSubstr("the new group's optimizer is a Adam, this optimizer is a SGD"));
  EXPECT_THAT(error_text<InvalidArgument>([&] {
                o.add_param_group({b, a});
              }),
              HasSubstr("parameter 1 of the new group is already in group 0"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { o.add_param_group({tensor<double>({1.0})}); }),
              HasSubstr("does not require grad"));
  EXPECT_EQ(o.num_param_groups(), 1u);
  // Without options: those the optimizer was made with, even after its own changed.
  o.set_lr(0.05);
  o.add_param_group({b});
  EXPECT_EQ(o.lr(1), 0.2);
  EXPECT_EQ(o.options(1).momentum, 0.9);
  EXPECT_EQ(o.params().size(), 2u);
  // zero_grad reaches every group.
  b.set_grad(tensor<double>({1.0}));
  o.zero_grad();
  EXPECT_FALSE(b.grad().defined());
}

// Several groups: the layout optimizer.h documents, saved and loaded through a file's bytes
// so that the next steps equal uninterrupted ones bit for bit; a one-group state dict keeps
// the FunctionalOptimizer's layout; a dict of another grouping is refused, naming why.
TEST(LrParamGroups, StateDictRoundTripsWithGroups) {
  auto make = [](std::vector<Tensor> a, std::vector<Tensor> b) {
    auto o = std::make_unique<SGD>(std::move(a), SGDOptions{.lr = 0.1, .momentum = 0.9});
    o->add_param_group(std::move(b), SGDOptions{.lr = 0.02, .momentum = 0.5});
    return o;
  };
  std::vector<Tensor> a{tensor<double>({1.0, 2.0}).set_requires_grad()};
  std::vector<Tensor> b{tensor<double>({-1.0}).set_requires_grad(),
                        tensor<double>({0.5, 0.25}).set_requires_grad()};
  auto o = make(a, b);
  auto grads = [](const std::vector<Tensor>& ps, int step) {
    for (const Tensor& p : ps)
      p.set_grad(p.detach() * 2.0 + static_cast<double>(step));
  };
  for (int step = 0; step < 2; ++step) {
    grads(o->params(), step);
    o->step();
  }
  const StateDict saved = nn::deserialize(nn::serialize(o->state_dict()));
  std::vector<std::string> keys;
  for (const auto& [k, t] : saved)
    keys.push_back(k);
  EXPECT_EQ(keys,
            (std::vector<std::string>{
                "type", "param_groups", "group.0.hyper.lr", "group.0.hyper.momentum",
                "group.0.hyper.dampening", "group.0.hyper.weight_decay", "group.0.hyper.nesterov",
                "group.1.hyper.lr", "group.1.hyper.momentum", "group.1.hyper.dampening",
                "group.1.hyper.weight_decay", "group.1.hyper.nesterov", "state.0.momentum_buffer",
                "state.1.momentum_buffer", "state.2.momentum_buffer"}));
  std::vector<Tensor> a2{a[0].detach().clone().set_requires_grad()};
  std::vector<Tensor> b2{b[0].detach().clone().set_requires_grad(),
                         b[1].detach().clone().set_requires_grad()};
  auto resumed = make(a2, b2);
  resumed->set_lr(0.7);
  resumed->load_state_dict(saved);
  EXPECT_EQ(resumed->lr(0), 0.1);
  EXPECT_EQ(resumed->lr(1), 0.02);
  for (int step = 2; step < 4; ++step) {
    grads(o->params(), step);
    grads(resumed->params(), step);
    o->step();
    resumed->step();
  }
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(o->params()[i].to_vector<double>(), resumed->params()[i].to_vector<double>())
        << "param " << i;
  }
  // One group: the FunctionalOptimizer's own layout.
  SGD single({tensor<double>({1.0}).set_requires_grad()}, SGDOptions{.lr = 0.1});
  EXPECT_EQ(single.state_dict().size(), single.functional().state_dict().size());
  EXPECT_THAT(error_text<InvalidArgument>([&] { resumed->load_state_dict(single.state_dict()); }),
              HasSubstr("the state dict is of one parameter group (it has no 'param_groups' "
                        "entry), this optimizer has 2"));
  EXPECT_THAT(error_text<InvalidArgument>([&] { single.load_state_dict(saved); }),
              HasSubstr("have sizes [1, 2], this optimizer's [1]"));
  // Problems in several places are listed together, with their group; nothing changes.
  StateDict bad = saved;
  for (auto& [k, t] : bad) {
    if (k == "group.1.hyper.lr") t = scalar_tensor(-1.0, TensorOptions(kFloat64));
    if (k == "state.0.momentum_buffer") t = zeros({3}, kFloat64);
  }
  bad.emplace_back("group.7.hyper.lr", scalar_tensor(0.1, TensorOptions(kFloat64)));
  const std::string message = error_text<InvalidArgument>([&] { resumed->load_state_dict(bad); });
  EXPECT_THAT(message, HasSubstr("unexpected key 'group.7.hyper.lr'"));
  EXPECT_THAT(message, HasSubstr("group 0: "));
  EXPECT_THAT(message, HasSubstr("'state.0.momentum_buffer' has shape"));
  EXPECT_THAT(message, HasSubstr("group 1: "));
  EXPECT_THAT(message, HasSubstr("lr must be >= 0, got -1"));
  EXPECT_EQ(resumed->lr(1), 0.02);
}

// ---- parse_lr_schedule

// Each spec gives the schedule it names: the same rates as the fixture's (two groups).
TEST(LrParse, EachSpecBuildsItsSchedule) {
  const std::pair<const char*, const char*> cases[] = {
      {"step:3:0.5", "step"},
      {"multistep:2,5,5,9:0.3", "multistep"},
      {"exp:0.9", "exp"},
      {"cosine:5:0.001", "cosine"},
      {"cosine:12", "cosine_long"},
      {"warmup:4:0.25", "warmup"},
      {"linear:1:0.1:6", "linear_decay"},
      {"warmup:3:0.1,cosine:6", "warmup_cosine"},
  };
  for (const auto& [spec, name] : cases) {
    check_schedule(name,
                   [spec = std::string(spec)](Optimizer& o) { return parse_lr_schedule(spec, o); });
  }
  TwoGroups two;
  auto s = parse_lr_schedule("warmup:2:0.5,multistep:3,6:0.5", two.opt);
  EXPECT_EQ(s->name(), "SequentialLR");
  auto* seq = dynamic_cast<SequentialLR*>(s.get());
  ASSERT_NE(seq, nullptr);
  EXPECT_EQ(seq->milestones(), std::vector<int64_t>{2});
  EXPECT_EQ(seq->schedules()[1]->name(), "MultiStepLR");
  // Over a FunctionalOptimizer as well.
  auto functional = make_functional_optimizer(AdamOptions{.lr = 0.1});
  auto on_functional = parse_lr_schedule("exp:0.5", *functional);
  on_functional->step();
  EXPECT_EQ(functional->lr(), 0.05);
}

TEST(LrParse, ErrorsNameTheBadPart) {
  TwoGroups two;
  auto error = [&](const std::string& spec) {
    return error_text<InvalidArgument>([&] { parse_lr_schedule(spec, two.opt); });
  };
  EXPECT_THAT(error(""), HasSubstr("parse_lr_schedule: '': the spec: is empty"));
  EXPECT_THAT(error("poly:5"), HasSubstr("'poly': unknown schedule (expected step, multistep"));
  EXPECT_THAT(error("step:30"),
              HasSubstr("'step:30': expected step:<step_size>:<gamma>, got 1 field"));
  EXPECT_THAT(error("step:x:0.1"), HasSubstr("step_size 'x': expected an integer"));
  EXPECT_THAT(error("exp:0.9:1"), HasSubstr("expected exp:<gamma>, got 2 fields"));
  EXPECT_THAT(error("exp:fast"), HasSubstr("gamma 'fast': expected a finite number"));
  EXPECT_THAT(error("multistep:10,,20:0.1"), HasSubstr("milestone '': expected an integer"));
  EXPECT_THAT(error("cosine:100:1e-3:2"), HasSubstr("expected cosine:<t_max>[:<eta_min>]"));
  EXPECT_THAT(error("cosine:0"),
              HasSubstr("'cosine:0': CosineAnnealingLR: t_max must be >= 1, got 0"));
  EXPECT_THAT(error("warmup:5:1.5"), HasSubstr("LinearLR: start_factor must be in (0, 1]"));
  EXPECT_THAT(error("warmup:5:0.1,cosine:abc"), HasSubstr("t_max 'abc': expected an integer"));
  EXPECT_THAT(error("warmup:5:0.1,warmup:3:0.5"), HasSubstr("a warm-up may only come first"));
  EXPECT_THAT(error("warmup:5:0.1,"), HasSubstr("'': unknown schedule"));
  // A failed parse leaves the optimizer's rates as they were.
  EXPECT_EQ(two.opt.lr(0), 0.1);
  EXPECT_EQ(two.opt.lr(1), 0.025);
}

}  // namespace
}  // namespace gradwire::optim
