// Optimizers: closed-form steps worked out by hand, option validation, functional and
// object forms, state save/load, and a small MLP trained to a stated accuracy.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/nn/nn.h"
#include "gradwire/optim/optim.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {
namespace {

using ::testing::HasSubstr;

Tensor param(std::vector<double> v) {
  return tensor<double>(v).set_requires_grad();
}
void set_grad(const Tensor& p, std::vector<double> g) {
  p.set_grad(tensor<double>(g));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/gw_optim_" + std::to_string(::getpid()) + "_" + name;
}

// ---- closed forms (tolerance 1e-15 relative: a handful of float64 operations)

TEST(SGDSteps, PlainStepIsLrTimesGrad) {
  Tensor p = param({1.0, -2.0});
  SGD sgd({p}, SGDOptions{.lr = 0.1});
  set_grad(p, {0.5, -1.0});
  sgd.step();
  EXPECT_DOUBLE_EQ(p.at({0}), 1.0 - 0.1 * 0.5);
  EXPECT_DOUBLE_EQ(p.at({1}), -2.0 + 0.1 * 1.0);
}

TEST(SGDSteps, MomentumWithDampeningTwoSteps) {
  // Constant gradient g: buf1 = g; buf2 = 0.9 g + (1 - 0.25) g = 1.65 g.
  Tensor p = param({1.0});
  SGD sgd({p}, SGDOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.25});
  set_grad(p, {2.0});
  sgd.step();
  EXPECT_DOUBLE_EQ(p.at({0}), 1.0 - 0.1 * 2.0);
  sgd.step();
  EXPECT_NEAR(p.at({0}), 1.0 - 0.1 * 2.0 - 0.1 * 1.65 * 2.0, 1e-15);
  EXPECT_NEAR(sgd.state().momentum_buffers[0].at({0}), 3.3, 1e-15);
}

TEST(SGDSteps, NesterovAndWeightDecay) {
  // d = g + wd p = 1 + 0.1 * 2 = 1.2; buf = 1.2; nesterov step uses d + 0.9 buf = 2.28.
  Tensor p = param({2.0});
  SGD sgd({p}, SGDOptions{.lr = 0.5, .momentum = 0.9, .weight_decay = 0.1, .nesterov = true});
  set_grad(p, {1.0});
  sgd.step();
  EXPECT_NEAR(p.at({0}), 2.0 - 0.5 * 2.28, 1e-15);
}

TEST(AdamSteps, FirstStepMovesByLrTimesSignOfGrad) {
  // Bias correction makes m_hat = g, v_hat = g^2, so the step is lr * g / (|g| + eps).
  Tensor p = param({1.0, 1.0, 1.0});
  Adam adam({p}, AdamOptions{.lr = 0.01, .eps = 1e-8});
  set_grad(p, {3.0, -0.5, 1e-3});
  adam.step();
  EXPECT_NEAR(p.at({0}), 1.0 - 0.01 * 3.0 / (3.0 + 1e-8), 1e-15);
  EXPECT_NEAR(p.at({1}), 1.0 + 0.01 * 0.5 / (0.5 + 1e-8), 1e-15);
  EXPECT_NEAR(p.at({2}), 1.0 - 0.01 * 1e-3 / (1e-3 + 1e-8), 1e-15);
}

TEST(AdamSteps, SecondStepByHandAndAmsgradKeepsTheMax) {
  // Gradients 1 then 0.1, beta1 = 0.9, beta2 = 0.999, eps = 0:
  //   m2 = 0.9 * 0.1 + 0.1 * 1 ... computed as the optimizer defines it.
  const double b1 = 0.9, b2 = 0.999, lr = 0.1;
  for (bool amsgrad : {false, true}) {
    Tensor p = param({0.0});
    Adam adam({p}, AdamOptions{.lr = lr, .eps = 0.0, .amsgrad = amsgrad});
    set_grad(p, {1.0});
    adam.step();
    set_grad(p, {0.1});
    adam.step();
    const double m1 = (1 - b1) * 1.0, v1 = (1 - b2) * 1.0;
    const double m2 = b1 * m1 + (1 - b1) * 0.1, v2 = b2 * v1 + (1 - b2) * 0.01;
    const double vmax = amsgrad ? std::max(v1, v2) : v2;
    const double p2 = -lr * 1.0 - (lr / (1 - b1 * b1)) * m2 / (std::sqrt(vmax / (1 - b2 * b2)));
    EXPECT_NEAR(p.at({0}), p2, 1e-14) << "amsgrad " << amsgrad;
  }
}

TEST(AdamSteps, AdamWDecaysTheWeightBeforeTheUpdate) {
  Tensor p = param({2.0});
  AdamW adamw({p}, AdamWOptions{.lr = 0.1, .eps = 0.0, .weight_decay = 0.5});
  set_grad(p, {4.0});
  adamw.step();
  // p * (1 - 0.1 * 0.5) - 0.1 * sign(g)
  EXPECT_NEAR(p.at({0}), 2.0 * 0.95 - 0.1, 1e-15);
}

TEST(AdagradSteps, TwoStepsWithLrDecay) {
  Tensor p = param({1.0});
  Adagrad ada({p}, AdagradOptions{.lr = 0.1, .lr_decay = 0.5, .eps = 0.0});
  set_grad(p, {2.0});
  ada.step();  // sum = 4, p -= 0.1 * 2 / 2
  EXPECT_NEAR(p.at({0}), 0.9, 1e-15);
  set_grad(p, {1.0});
  ada.step();  // clr = 0.1 / 1.5, sum = 5, p -= clr * 1 / sqrt(5)
  EXPECT_NEAR(p.at({0}), 0.9 - (0.1 / 1.5) / std::sqrt(5.0), 1e-15);
}

TEST(Optimizers, ParamsWithoutGradAreSkippedStateIncluded) {
  Tensor a = param({1.0}), b = param({1.0});
  Adam adam({a, b}, AdamOptions{});
  set_grad(a, {1.0});
  adam.step();
  EXPECT_EQ(b.at({0}), 1.0);
  EXPECT_EQ(adam.state().params[1].step, 0);
  EXPECT_EQ(adam.state().params[0].step, 1);
}

TEST(Optimizers, ZeroGradClearsOrZeroes) {
  Tensor p = param({1.0, 2.0});
  SGD sgd({p}, SGDOptions{});
  set_grad(p, {1.0, 1.0});
  sgd.zero_grad(/*set_to_none=*/false);
  ASSERT_TRUE(p.grad().defined());
  EXPECT_EQ(p.grad().to_vector<double>(), (std::vector<double>{0.0, 0.0}));
  sgd.zero_grad();
  EXPECT_FALSE(p.grad().defined());
}

TEST(Optimizers, Float32ParametersStepInFloat32) {
  Tensor p = tensor<float>({1.0f}).set_requires_grad();
  SGD sgd({p}, SGDOptions{.lr = 0.25f});
  p.set_grad(tensor<float>({2.0f}));
  sgd.step();
  EXPECT_EQ(p.dtype(), kFloat32);
  EXPECT_EQ(p.item<float>(), 0.5f);
}

// ---- validation

TEST(OptimOptions, BadValuesAreRejectedWithTheirNames) {
  EXPECT_THAT(error_of([] { SGDOptions{.lr = -1}.validate(); }), HasSubstr("lr must be >= 0"));
  EXPECT_THAT(error_of([] { SGDOptions{.nesterov = true}.validate(); }),
              HasSubstr("nesterov needs momentum > 0"));
  EXPECT_THAT(
      error_of([] { SGDOptions{.momentum = 0.9, .dampening = 0.1, .nesterov = true}.validate(); }),
      HasSubstr("dampening == 0"));
  EXPECT_THAT(error_of([] { SGDOptions{.weight_decay = -0.1}.validate(); }),
              HasSubstr("weight_decay must be >= 0"));
  EXPECT_THAT(error_of([] { AdamOptions{.beta1 = 1.0}.validate(); }),
              HasSubstr("beta1 must be in [0, 1)"));
  EXPECT_THAT(error_of([] { AdamWOptions{.beta2 = -0.1}.validate(); }),
              HasSubstr("beta2 must be in [0, 1)"));
  EXPECT_THAT(error_of([] { AdamOptions{.eps = -1e-8}.validate(); }),
              HasSubstr("eps must be >= 0"));
  EXPECT_THAT(error_of([] { AdamOptions{.lr = std::nan("")}.validate(); }),
              HasSubstr("lr must be >= 0"));
  EXPECT_THAT(error_of([] { AdagradOptions{.lr_decay = -1}.validate(); }),
              HasSubstr("lr_decay must be >= 0"));
  EXPECT_THAT(error_of([] { AdagradOptions{.initial_accumulator_value = -1}.validate(); }),
              HasSubstr("initial_accumulator_value"));
  Tensor p = param({1.0});
  EXPECT_THAT(error_of([&] { SGD({p}, SGDOptions{.lr = -0.5}); }), HasSubstr("lr"));
}

TEST(OptimOptions, BadParametersAndGradientsAreRejected) {
  Tensor p = param({1.0, 2.0});
  EXPECT_THAT(error_of([&] { SGD({p, p}, SGDOptions{}); }), HasSubstr("more than once"));
  EXPECT_THAT(error_of([&] { SGD({tensor<double>({1.0})}, SGDOptions{}); }),
              HasSubstr("does not require grad"));
  EXPECT_THAT(error_of([&] { SGD({p * 2.0}, SGDOptions{}); }), HasSubstr("not a leaf"));
  EXPECT_THAT(error_of([&] { SGD({Tensor()}, SGDOptions{}); }), HasSubstr("undefined"));
  std::vector<Tensor> ps{tensor<double>({1.0, 2.0})};
  SGDState state;
  EXPECT_THAT(error_of([&] { sgd_step(ps, {tensor<double>({1.0})}, state, {}); }),
              HasSubstr("gradient 0 has shape [1], its parameter [2]"));
  EXPECT_THAT(error_of([&] {
                sgd_step(ps, {tensor<float>({1.0f, 1.0f})}, state, {});
              }),
              HasSubstr("dtype"));
  EXPECT_THAT(error_of([&] { sgd_step(ps, {}, state, {}); }),
              HasSubstr("1 parameters but 0 gradients"));
  SGDState used;
  used.momentum_buffers.resize(3);
  EXPECT_THAT(error_of([&] {
                sgd_step(ps, {tensor<double>({1.0, 1.0})}, used, {});
              }),
              HasSubstr("the state holds 3 parameters"));
}

// ---- state save and load

// Runs `steps` Adam steps on a fixed quadratic, from the optimizer's current state.
void run_adam_steps(Adam& adam, const Tensor& p, int steps) {
  for (int i = 0; i < steps; ++i) {
    adam.zero_grad();
    sum(square(p - 3.0) * tensor<double>({1.0, 2.0, 0.5})).backward();
    adam.step();
  }
}

TEST(OptimState, SaveLoadResumesExactly) {
  const AdamOptions options{.lr = 0.05, .amsgrad = true};
  Tensor p_ref = param({1.0, -1.0, 0.5});
  Adam ref({p_ref}, options);
  run_adam_steps(ref, p_ref, 5);

  Tensor p = param({1.0, -1.0, 0.5});
  Adam first({p}, options);
  run_adam_steps(first, p, 3);
  const std::string path = temp_path("adam.gw");
  nn::save(first.state_dict(), path);

  Tensor p2 = p.detach().clone().set_requires_grad();
  Adam resumed({p2}, options);
  resumed.load_state_dict(nn::load(path));
  EXPECT_EQ(resumed.state().params[0].step, 3);
  run_adam_steps(resumed, p2, 2);
  EXPECT_TRUE(equal(p2, p_ref)) << p2 << " vs " << p_ref;
  std::remove(path.c_str());
}

TEST(OptimState, SgdAndAdagradStateRoundTrip) {
  Tensor p = param({1.0, 2.0});
  SGD sgd({p}, SGDOptions{.lr = 0.1, .momentum = 0.5});
  set_grad(p, {1.0, -1.0});
  sgd.step();
  StateDict sd = sgd.state_dict();
  // "type", five "hyper.*" entries, then the one momentum buffer.
  ASSERT_EQ(sd.size(), 7u);
  EXPECT_EQ(sd.back().first, "state.0.momentum_buffer");
  SGD other({param({0.0, 0.0})}, SGDOptions{.lr = 0.1, .momentum = 0.5});
  other.load_state_dict(nn::deserialize(nn::serialize(sd)));
  EXPECT_TRUE(equal(other.state().momentum_buffers[0], sgd.state().momentum_buffers[0]));

  Adagrad ada({p}, AdagradOptions{});
  set_grad(p, {1.0, 3.0});
  ada.step();
  Adagrad ada2({param({0.0, 0.0})}, AdagradOptions{});
  ada2.load_state_dict(ada.state_dict());
  EXPECT_EQ(ada2.state().params[0].step, 1);
  EXPECT_EQ(ada2.state().params[0].sum.to_vector<double>(), (std::vector<double>{1.0, 9.0}));
}

TEST(OptimState, MismatchedStateIsReportedByName) {
  Tensor p = param({1.0, 2.0});
  Adam adam({p}, AdamOptions{});
  set_grad(p, {1.0, 1.0});
  adam.step();
  StateDict sd = adam.state_dict();
  Adam wrong_shape({param({1.0, 2.0, 3.0})}, AdamOptions{});
  const std::string msg = error_of([&] { wrong_shape.load_state_dict(sd); });
  EXPECT_THAT(msg, HasSubstr("'state.0.exp_avg' has shape [2], parameter 0 has [3]"));
  EXPECT_THAT(msg, HasSubstr("'state.0.exp_avg_sq' has shape [2]"));
  sd.emplace_back("state.7.exp_avg", tensor<double>({1.0}));
  sd.erase(std::find_if(sd.begin(), sd.end(),
                        [](const auto& e) { return e.first == "state.0.exp_avg"; }));
  Adam same({param({0.0, 0.0})}, AdamOptions{});
  const std::string msg2 = error_of([&] { same.load_state_dict(sd); });
  EXPECT_THAT(msg2, HasSubstr("missing key 'state.0.exp_avg'"));
  EXPECT_THAT(msg2, HasSubstr("unexpected key 'state.7.exp_avg'"));
  EXPECT_EQ(same.state().params.size(), 0u) << "a failed load must change nothing";
}

// ---- training

// Three Gaussian blobs in 2-D (std 0.6 around centres 3 apart), seeded.
void blobs(int64_t per_class, uint64_t seed, Tensor& x, Tensor& y) {
  Generator gen(seed);
  const std::vector<std::vector<float>> centres{{0.f, 0.f}, {3.f, 0.f}, {1.5f, 2.6f}};
  std::vector<Tensor> xs;
  std::vector<int64_t> labels;
  for (int64_t c = 0; c < 3; ++c) {
    xs.push_back(randn({per_class, 2}, &gen) * 0.6f + tensor<float>(centres[size_t(c)]));
    for (int64_t i = 0; i < per_class; ++i)
      labels.push_back(c);
  }
  x = cat(xs, 0);
  y = tensor<int64_t>(labels);
}

double accuracy(nn::UnaryModule& net, const Tensor& x, const Tensor& y) {
  autograd::NoGradGuard no_grad;
  return mean(eq(argmax(net(x), 1), y).to(kFloat32)).item<double>();
}

TEST(Training, MlpLearnsThreeBlobsAndReloadsExactly) {
  // Stated target: >= 95% accuracy on a held-out set after 150 full-batch Adam steps
  // (the blobs overlap a little, so 100% is not expected).
  Tensor x, y, x_test, y_test;
  blobs(100, 1, x, y);
  blobs(100, 2, x_test, y_test);
  Generator gen(3);
  nn::MLP net(nn::MLPOptions{.sizes = {2, 32, 32, 3}, .generator = &gen});
  Adam adam(net.parameters(), AdamOptions{.lr = 0.02});
  // Its duration is a benchmark figure (optim.mlp_adam_train_s), not a test.
  for (int step = 0; step < 150; ++step) {
    adam.zero_grad();
    nn::cross_entropy(net(x), y).backward();
    adam.step();
  }
  const double acc = accuracy(net, x_test, y_test);
  EXPECT_GE(acc, 0.95) << "held-out accuracy";

  const std::string path = temp_path("mlp.gw");
  nn::save(net, path);
  Generator other(99);
  nn::MLP reloaded(nn::MLPOptions{.sizes = {2, 32, 32, 3}, .generator = &other});
  EXPECT_FALSE(equal(reloaded(x_test), net(x_test)));
  nn::load(reloaded, path);
  EXPECT_TRUE(equal(reloaded(x_test), net(x_test))) << "reloaded outputs differ";
  std::remove(path.c_str());
}

TEST(Training, SgdWithMomentumAlsoLearns) {
  Tensor x, y;
  blobs(100, 4, x, y);
  Generator gen(5);
  nn::MLP net(
      nn::MLPOptions{.sizes = {2, 32, 3}, .activation = nn::Activation::kTanh, .generator = &gen});
  SGD sgd(net.parameters(), SGDOptions{.lr = 0.1, .momentum = 0.9});
  for (int step = 0; step < 200; ++step) {
    sgd.zero_grad();
    nn::cross_entropy(net(x), y).backward();
    sgd.step();
  }
  EXPECT_GE(accuracy(net, x, y), 0.95);
}

}  // namespace
}  // namespace gradwire::optim
