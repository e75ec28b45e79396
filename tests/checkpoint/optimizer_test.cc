// add_optimizer / load_optimizer with real optimizers: the state saved, read back (and
// resharded), loaded into fresh optimizers, which then take the same next step.
#include <gtest/gtest.h>

#include "gradwire/core/error.h"
#include "gradwire/optim/adagrad.h"
#include "gradwire/optim/sgd.h"
#include "support/error_text.h"
#include "support/temp_dir.h"
#include "util.h"

namespace gradwire::checkpoint {
namespace {

using gradwire::test::error_text;
using test::bits_equal;
using test::values;

Tensor param(const Shape& shape, uint64_t seed) {
  Tensor t = values(shape, seed);
  t.set_requires_grad(true);
  return t;
}

// Gives every parameter the gradient of step `k` and steps.
void step(optim::Optimizer& opt, int k) {
  for (size_t i = 0; i < opt.params().size(); ++i)
    opt.params()[i].set_grad(values(opt.params()[i].sizes(), 1000 + 10 * k + i));
  opt.step();
}

// Saves `opt` with its parameters, reads it back, loads a fresh optimizer made by `make`
// over copies of the saved parameters, and checks one more step gives the same bits.
template <typename Make>
void round_trip(const std::string& dir, optim::Optimizer& opt, Make make) {
  const std::vector<std::string> names = {"a", "b"};
  ShardState s;
  for (size_t i = 0; i < names.size(); ++i)
    s.params.push_back({names[i], opt.params()[i].detach().clone()});
  add_optimizer(s, opt, names);
  write_shard(dir, "w0", 1, s);
  const ShardState got = read_latest(dir, "w0")->state;
  std::vector<Tensor> fresh;
  for (const Piece& p : got.params) {
    fresh.push_back(p.value.clone());
    fresh.back().set_requires_grad(true);
  }
  auto loaded = make(fresh);
  load_optimizer(*loaded, got, names);
  step(opt, 3);
  step(*loaded, 3);
  for (size_t i = 0; i < names.size(); ++i)
    EXPECT_TRUE(bits_equal(loaded->params()[i], opt.params()[i])) << names[i];
}

class CheckpointOptimizer : public ::testing::Test {
 protected:
  gradwire::test::TempDir tmp_{"gradwire-ckpt-optim"};
  std::string dir() const { return tmp_.path().string(); }
};

TEST_F(CheckpointOptimizer, AdagradRoundTripTakesTheSameNextStep) {
  const optim::AdagradOptions options{
      .lr = 0.05, .lr_decay = 0.01, .initial_accumulator_value = 0.1};
  optim::Adagrad opt({param({4, 3}, 1), param({3}, 2)}, options);
  step(opt, 0);
  step(opt, 1);
  ShardState s;
  add_optimizer(s, opt, {"a", "b"});
  EXPECT_EQ(s.optimizer_kind, "Adagrad");
  ASSERT_EQ(s.optimizer.size(), 4u);  // a/step, a/sum, b/step, b/sum
  for (const Piece& p : s.optimizer) {
    if (p.name == "a/sum") {
      EXPECT_TRUE(bits_equal(p.value, opt.state().params[0].sum));
    } else if (p.name == "a/step") {
      EXPECT_EQ(p.value.item<int64_t>(), 2);
    }
  }
  round_trip(dir(), opt, [&](std::vector<Tensor> p) {
    return std::make_unique<optim::Adagrad>(std::move(p), optim::AdagradOptions{});
  });
}

TEST_F(CheckpointOptimizer, SgdWithMomentumRoundTripTakesTheSameNextStep) {
  optim::SGD opt({param({2, 5}, 3), param({5}, 4)},
                 optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  step(opt, 0);
  step(opt, 1);
  round_trip(dir(), opt, [&](std::vector<Tensor> p) {
    return std::make_unique<optim::SGD>(std::move(p), optim::SGDOptions{.lr = 0.5});
  });
}

// A 10x4 table on two servers (rows 5/5), each with its own Adagrad, saved and loaded into
// three servers: each new server's state is exactly the saved rows, and its next step
// matches the rows the old servers' next steps compute.
TEST_F(CheckpointOptimizer, AdagradStateReshardsWithItsTable) {
  const optim::AdagradOptions options{.lr = 0.1};
  const Tensor table = values({10, 4}, 7);
  std::vector<std::unique_ptr<optim::Adagrad>> old;
  for (int r = 0; r < 2; ++r) {
    const auto [first, last] = row_range(10, r, 2);
    Tensor rows = table.slice(0, first, last).clone();
    rows.set_requires_grad(true);
    old.push_back(std::make_unique<optim::Adagrad>(std::vector<Tensor>{rows}, options));
    step(*old.back(), 0);
    ShardState s;
    s.job_shards = {"ps0", "ps1"};
    s.params.push_back({"emb", rows.detach().clone(), {10, 4}, first});
    add_optimizer(s, *old.back(), {"emb"}, {{10, 4}}, {first});
    write_shard(dir(), "ps" + std::to_string(r), 1, s);
  }
  const Checkpoint c = Checkpoint::open(dir());
  const Tensor sums = cat({old[0]->state().params[0].sum, old[1]->state().params[0].sum}, 0);
  EXPECT_TRUE(bits_equal(c.read_optimizer("emb/sum"), sums));
  for (int i = 0; i < 3; ++i) {
    const ShardState s = c.reshard(i, 3);
    const auto [first, last] = row_range(10, i, 3);
    Tensor rows = s.params[0].value.clone();
    rows.set_requires_grad(true);
    optim::Adagrad fresh({rows}, optim::AdagradOptions{});
    load_optimizer(fresh, s, {"emb"});
    EXPECT_TRUE(bits_equal(fresh.state().params[0].sum, sums.slice(0, first, last)));
    EXPECT_DOUBLE_EQ(fresh.lr(), 0.1);
  }
}

TEST_F(CheckpointOptimizer, MismatchesAreRefused) {
  optim::Adagrad opt({param({4, 3}, 1), param({3}, 2)}, optim::AdagradOptions{});
  step(opt, 0);
  ShardState s;
  EXPECT_NE(error_text<InvalidArgument>([&] {
              add_optimizer(s, opt, {"a"});
            }).find("1 names for an optimizer of 2 parameters"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              add_optimizer(s, opt, {"a", "b"}, {{4, 2}, {}});
            }).find("parameter 'a' of sizes [4, 3] cannot be rows of global sizes"),
            std::string::npos);
  add_optimizer(s, opt, {"a", "b"});
  // An optimizer whose parameter 'a' has another shape: its load_state_dict refuses, named.
  optim::Adagrad other({param({5, 3}, 1), param({3}, 2)}, optim::AdagradOptions{});
  const std::string text = error_text<InvalidArgument>([&] {
    load_optimizer(other, s, {"a", "b"});
  });
  EXPECT_NE(text.find("checkpoint::load_optimizer: "), std::string::npos) << text;
  EXPECT_NE(text.find("state.0.sum"), std::string::npos) << text;
  optim::SGD sgd({param({4, 3}, 1), param({3}, 2)}, optim::SGDOptions{});
  EXPECT_NE(error_text<InvalidArgument>([&] {
              load_optimizer(sgd, s, {"a", "b"});
            }).find("Adagrad"),
            std::string::npos);
  EXPECT_NE(error_text<InvalidArgument>([&] {
              load_optimizer(sgd, ShardState{}, {"a", "b"});
            }).find("holds no optimizer"),
            std::string::npos);
}

}  // namespace
}  // namespace gradwire::checkpoint
