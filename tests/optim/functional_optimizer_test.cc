// FunctionalOptimizer: each of the four kinds behind the one interface, stepped exactly as
// its object; state dicts that carry kind and hyperparameters, so that save -> load ->
// step equals uninterrupted steps bit for bit; typed errors naming what was wrong; and the
// fused CPU updates against the tensor-op formulation (bit for bit) and the hand-worked
// values of a float32 Adam step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/nn/serialize.h"
#include "gradwire/optim/optim.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

// One case per kind, with options that reach the kind's less common branches.
struct Kind {
  std::string name;
  std::function<std::unique_ptr<FunctionalOptimizer>()> make;
  std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)> make_object;
};

std::vector<Kind> kinds() {
  const SGDOptions sgd{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
  const AdamOptions adam{.lr = 0.01, .weight_decay = 0.1, .amsgrad = true};
  const AdamWOptions adamw{.lr = 0.02, .beta1 = 0.8, .weight_decay = 0.05};
  const AdagradOptions adagrad{
      .lr = 0.1, .lr_decay = 0.01, .weight_decay = 0.02, .initial_accumulator_value = 0.1};
  return {
      {"SGD", [=] { return make_functional_optimizer(sgd); },
       [=](std::vector<Tensor> ps) { return std::make_unique<SGD>(std::move(ps), sgd); }},
      {"Adam", [=] { return make_functional_optimizer(adam); },
       [=](std::vector<Tensor> ps) { return std::make_unique<Adam>(std::move(ps), adam); }},
      {"AdamW", [=] { return make_functional_optimizer(adamw); },
       [=](std::vector<Tensor> ps) { return std::make_unique<AdamW>(std::move(ps), adamw); }},
      {"Adagrad", [=] { return make_functional_optimizer(adagrad); },
       [=](std::vector<Tensor> ps) { return std::make_unique<Adagrad>(std::move(ps), adagrad); }},
  };
}

// Deterministic parameters and per-step gradients (seeded), of the given dtype.
std::vector<Tensor> initial_params(DType dtype) {
  Generator gen(11);
  return {randn({3, 4}, &gen).to(dtype), randn({5}, &gen).to(dtype)};
}
std::vector<Tensor> grads_for(int step, DType dtype) {
  Generator gen(100 + static_cast<uint64_t>(step));
  std::vector<Tensor> g{randn({3, 4}, &gen).to(dtype), randn({5}, &gen).to(dtype)};
  if (step == 2) g[1] = Tensor();  // a step without a gradient for the second parameter
  return g;
}

std::vector<Tensor> clones(const std::vector<Tensor>& ts) {
  std::vector<Tensor> out;
  for (const Tensor& t : ts)
    out.push_back(t.detach().clone());
  return out;
}

// Bitwise equality of values (equal() would call -0 == +0 and NaN != NaN).
void expect_same_bits(const Tensor& a, const Tensor& b, const std::string& where) {
  ASSERT_EQ(a.dtype(), b.dtype()) << where;
  ASSERT_EQ(a.sizes(), b.sizes()) << where;
  const Tensor ca = a.detach().contiguous(), cb = b.detach().contiguous();
  EXPECT_EQ(std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()), 0)
      << where << ": " << a << " vs " << b;
}

TEST(FunctionalOptimizer, EachKindStepsExactlyAsItsObject) {
  for (const Kind& kind : kinds()) {
    for (DType dtype : {kFloat32, kFloat64}) {
      const std::string where = kind.name + " " + std::string(dtype_name(dtype));
      std::unique_ptr<FunctionalOptimizer> functional = kind.make();
      EXPECT_EQ(functional->type_name(), kind.name);
      std::vector<Tensor> fparams = initial_params(dtype);
      std::vector<Tensor> oparams;
      for (Tensor p : initial_params(dtype))
        oparams.push_back(p.set_requires_grad());
      std::unique_ptr<Optimizer> object = kind.make_object(oparams);
      EXPECT_EQ(object->type_name(), kind.name);
      for (int step = 0; step < 4; ++step) {
        const std::vector<Tensor> g = grads_for(step, dtype);
        functional->step(fparams, g);
        object->zero_grad();
        for (size_t i = 0; i < g.size(); ++i) {
          if (g[i].defined()) oparams[i].set_grad(g[i].clone());
        }
        object->step();
        for (size_t i = 0; i < fparams.size(); ++i) {
          expect_same_bits(fparams[i], oparams[i],
                           where + " step " + std::to_string(step) + " param " + std::to_string(i));
        }
      }
      // The parameters moved (a step that changed nothing would also compare equal).
      EXPECT_FALSE(equal(fparams[0], initial_params(dtype)[0])) << where;
    }
  }
}

TEST(FunctionalOptimizer, AnyKindDrivesTheGenericObject) {
  // Optimizer over a FunctionalOptimizer is what SGD/Adam/... are; built directly it
  // gives the same steps as the typed object.
  Tensor a = tensor<double>({1.0, -2.0}).set_requires_grad();
  Tensor b = tensor<double>({1.0, -2.0}).set_requires_grad();
  Optimizer generic({a}, make_functional_optimizer(AdagradOptions{.lr = 0.5}));
  Adagrad typed({b}, AdagradOptions{.lr = 0.5});
  for (int k = 0; k < 3; ++k) {
    a.set_grad(tensor<double>({0.5, 3.0}));
    b.set_grad(tensor<double>({0.5, 3.0}));
    generic.step();
    typed.step();
  }
  expect_same_bits(a, b, "generic vs Adagrad");
  EXPECT_EQ(generic.type_name(), "Adagrad");
  // Adagrad's first step moves each coordinate by lr * g / |g| = lr (eps aside).
  EXPECT_NE(a.at({0}), 1.0);
}

TEST(FunctionalOptimizer, StateDictHoldsKindHyperparametersAndState) {
  FunctionalSGD sgd(SGDOptions{.lr = 0.25, .momentum = 0.5, .dampening = 0.125});
  std::vector<Tensor> params{tensor<double>({1.0, 2.0})};
  sgd.step(params, {tensor<double>({4.0, -8.0})});
  const StateDict sd = sgd.state_dict();
  std::vector<std::string> keys;
  for (const auto& [key, t] : sd)
    keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"type", "hyper.lr", "hyper.momentum", "hyper.dampening",
                                            "hyper.weight_decay", "hyper.nesterov",
                                            "state.0.momentum_buffer"}));
  EXPECT_EQ(sd[0].second.dtype(), kUInt8);
  EXPECT_EQ(sd[0].second.to_vector<uint8_t>(), (std::vector<uint8_t>{'S', 'G', 'D'}));
  EXPECT_EQ(sd[1].second.dim(), 0);
  EXPECT_EQ(sd[1].second.dtype(), kFloat64);
  EXPECT_EQ(sd[1].second.item<double>(), 0.25);
  EXPECT_EQ(sd[3].second.item<double>(), 0.125);
  EXPECT_EQ(sd[5].second.dtype(), kBool);
  EXPECT_FALSE(sd[5].second.item<bool>());
  // The first momentum step stores the gradient itself.
  EXPECT_EQ(sd[6].second.to_vector<double>(), (std::vector<double>{4.0, -8.0}));
  EXPECT_EQ(params[0].to_vector<double>(),
            (std::vector<double>{1.0 - 0.25 * 4.0, 2.0 + 0.25 * 8.0}));
}

TEST(FunctionalOptimizer, SaveLoadThenStepEqualsUninterruptedStepsBitForBit) {
  for (const Kind& kind : kinds()) {
    for (DType dtype : {kFloat32, kFloat64}) {
      const std::string where = kind.name + " " + std::string(dtype_name(dtype));
      std::vector<Tensor> ref = initial_params(dtype);
      auto uninterrupted = kind.make();
      for (int step = 0; step < 5; ++step)
        uninterrupted->step(ref, grads_for(step, dtype));

      std::vector<Tensor> params = initial_params(dtype);
      auto first = kind.make();
      for (int step = 0; step < 3; ++step)
        first->step(params, grads_for(step, dtype));
      // Through the state file's bytes, then rebuilt from the state dict alone (kind and
      // hyperparameters included), on copies of the parameters.
      const StateDict saved = nn::deserialize(nn::serialize(first->state_dict()));
      std::vector<Tensor> resumed_params = clones(params);
      auto resumed = make_functional_optimizer(saved, resumed_params);
      EXPECT_EQ(resumed->type_name(), kind.name);
      EXPECT_EQ(resumed->lr(), first->lr());
      for (int step = 3; step < 5; ++step)
        resumed->step(resumed_params, grads_for(step, dtype));
      for (size_t i = 0; i < ref.size(); ++i)
        expect_same_bits(resumed_params[i], ref[i], where + " param " + std::to_string(i));
    }
  }
}

TEST(FunctionalOptimizer, LoadReplacesHyperparametersAndLrIsValidated) {
  Tensor p = tensor<double>({1.0}).set_requires_grad();
  Adam saved_from({p}, AdamOptions{.lr = 0.125, .beta2 = 0.99, .amsgrad = true});
  Adam target({tensor<double>({0.0}).set_requires_grad()}, AdamOptions{.lr = 0.5});
  target.load_state_dict(saved_from.state_dict());
  EXPECT_EQ(target.options().lr, 0.125);
  EXPECT_EQ(target.options().beta2, 0.99);
  EXPECT_TRUE(target.options().amsgrad);
  target.functional().set_lr(0.25);
  EXPECT_EQ(target.options().lr, 0.25);
  EXPECT_THAT(error_of([&] { target.functional().set_lr(-1.0); }), HasSubstr("lr must be >= 0"));
  EXPECT_EQ(target.options().lr, 0.25);
}

// Replaces (or appends) one entry of a state dict.
StateDict with(StateDict sd, const std::string& key, const Tensor& value) {
  for (auto& [k, t] : sd) {
    if (k == key) {
      t = value;
      return sd;
    }
  }
  sd.emplace_back(key, value);
  return sd;
}
StateDict without(StateDict sd, const std::string& key) {
  sd.erase(std::remove_if(sd.begin(), sd.end(), [&](const auto& e) { return e.first == key; }),
           sd.end());
  return sd;
}

TEST(FunctionalOptimizer, LoadErrorsAreTypedAndNameWhatWasWrong) {
  std::vector<Tensor> params{tensor<double>({1.0, 2.0})};
  FunctionalAdam adam(AdamOptions{.lr = 0.01});
  adam.step(params, {tensor<double>({1.0, 1.0})});
  const StateDict good = adam.state_dict();

  FunctionalAdam target(AdamOptions{.lr = 0.5});
  EXPECT_THAT(error_of([&] { target.load_state_dict(without(good, "type"), params); }),
              HasSubstr("missing key 'type'"));
  EXPECT_THAT(error_of([&] { target.load_state_dict(without(good, "hyper.beta1"), params); }),
              HasSubstr("missing key 'hyper.beta1'"));
  EXPECT_THAT(error_of([&] {
                target.load_state_dict(with(good, "hyper.lr", scalar_tensor(0.1f)), params);
              }),
              HasSubstr("'hyper.lr' must be a one-element float64 tensor, got float32 []"));
  EXPECT_THAT(error_of([&] {
                target.load_state_dict(
                    with(good, "hyper.amsgrad", scalar_tensor(1.0, TensorOptions(kFloat64))),
                    params);
              }),
              HasSubstr("'hyper.amsgrad' must be a one-element bool tensor"));
  EXPECT_THAT(error_of([&] {
                target.load_state_dict(
                    with(good, "hyper.beta1", scalar_tensor(1.5, TensorOptions(kFloat64))), params);
              }),
              HasSubstr("Adam.load_state_dict: bad hyperparameter: AdamOptions: beta1 must be in "
                        "[0, 1), got 1.5"));
  EXPECT_THAT(error_of([&] {
                target.load_state_dict(
                    with(good, "hyper.momentum", scalar_tensor(0.9, TensorOptions(kFloat64))),
                    params);
              }),
              HasSubstr("unexpected key 'hyper.momentum'"));
  // Another kind's state dict: AdamW's has the same fields, so only the type tells.
  FunctionalAdamW adamw;
  EXPECT_THAT(error_of([&] { adamw.load_state_dict(good, params); }),
              HasSubstr("the state dict is of type 'Adam', this optimizer is 'AdamW'"));
  // Every problem in one message.
  const std::string several = error_of([&] {
    target.load_state_dict(without(without(good, "hyper.eps"), "state.0.exp_avg"), params);
  });
  EXPECT_THAT(several, HasSubstr("2 problems"));
  EXPECT_THAT(several, HasSubstr("missing key 'hyper.eps'"));
  EXPECT_THAT(several, HasSubstr("missing key 'state.0.exp_avg'"));
  // A failed load changes nothing.
  EXPECT_EQ(target.options().lr, 0.5);
  EXPECT_TRUE(target.state().params.empty());

  EXPECT_THAT(error_of([&] { make_functional_optimizer(without(good, "type"), params); }),
              HasSubstr("no 'type' entry"));
  EXPECT_THAT(
      error_of([&] {
        make_functional_optimizer(with(good, "type", tensor<uint8_t>({'R', 'M', 'S'})), params);
      }),
      HasSubstr("unknown optimizer type 'RMS'"));
  EXPECT_THAT(error_of([&] {
                make_functional_optimizer(good, {tensor<double>({1.0, 2.0, 3.0})});
              }),
              HasSubstr("'state.0.exp_avg' has shape [2], parameter 0 has [3]"));
  // The per-kind state objects read only "state.*" and accept a whole optimizer's dict.
  AdamState state;
  state.load_state_dict(good, params);
  EXPECT_EQ(state.params[0].step, 1);
}

// ---- fused updates

// The same values as `t`, in a transposed (non-contiguous) layout: the tensor-op path.
Tensor strided_copy(const Tensor& t) {
  Tensor base = t.detach().t().contiguous();  // [4, 3] holding t's transpose
  Tensor view = base.t();                     // [3, 4], strides {1, 3}
  EXPECT_FALSE(view.is_contiguous());
  return view;
}

TEST(FusedUpdates, MatchTheTensorOpFormulationBitForBit) {
  for (const Kind& kind : kinds()) {
    for (DType dtype : {kFloat32, kFloat64}) {
      const std::string where = kind.name + " " + std::string(dtype_name(dtype));
      Generator gen(5);
      const Tensor start = randn({3, 4}, &gen).to(dtype);
      std::vector<Tensor> fused{start.clone()};
      std::vector<Tensor> unfused{strided_copy(start)};
      auto a = kind.make();
      auto b = kind.make();
      for (int step = 0; step < 6; ++step) {
        const Tensor g = randn({3, 4}, &gen).to(dtype);
        a->step(fused, {g});
        b->step(unfused, {strided_copy(g)});
        expect_same_bits(fused[0], unfused[0], where + " step " + std::to_string(step));
      }
      // The state agrees too (state_dict tensors compared by position).
      const StateDict sa = a->state_dict(), sb = b->state_dict();
      ASSERT_EQ(sa.size(), sb.size()) << where;
      for (size_t i = 0; i < sa.size(); ++i)
        expect_same_bits(sa[i].second, sb[i].second, where + " " + sa[i].first);
    }
  }
}

TEST(FusedUpdates, Float32AdamStepByHand) {
  // One Adam step in float32 worked out with float arithmetic in the formula's order:
  // with m0 = v0 = 0 and t = 1, m = (1 - b1) g, v = (1 - b2) g^2,
  // p -= (lr / (1 - b1)) * m / (sqrt(v) / sqrt(1 - b2) + eps).
  const float lr = 0.001f, eps = 1e-8f;
  const std::vector<float> p0{0.5f, -1.25f, 3.0f, 0.0f}, g{0.1f, -2.0f, 1e-3f, 7.5f};
  std::vector<Tensor> params{tensor<float>(p0)};
  FunctionalAdam adam(AdamOptions{.lr = 0.001});
  adam.step(params, {tensor<float>(g)});
  const std::vector<float> got = params[0].to_vector<float>();
  for (size_t i = 0; i < p0.size(); ++i) {
    const float m = float(1.0 - 0.9) * g[i];
    const float v = float(1.0 - 0.999) * (g[i] * g[i]);
    const float denom = std::sqrt(v) / float(std::sqrt(1.0 - 0.999)) + eps;
    const float expected = p0[i] + float(-(0.001 / (1.0 - 0.9))) * (m / denom);
    EXPECT_EQ(got[i], expected) << "element " << i;
    // And close to the real-number update: lr * sign(g) (bias correction cancels).
    EXPECT_NEAR(got[i], p0[i] - lr * (g[i] > 0 ? 1.0f : -1.0f), 2e-6f) << "element " << i;
  }
}

TEST(FusedUpdates, BumpTheParameterVersionSoAutogradSeesTheWrite) {
  // A graph that saved the parameter must refuse to run backward after an in-place
  // update, whichever path made it.
  for (const Kind& kind : kinds()) {
    Tensor p = tensor<float>({1.0f, 2.0f}).set_requires_grad();
    std::unique_ptr<Optimizer> opt = kind.make_object({p});
    Tensor loss = sum(p * p);  // saves p
    p.set_grad(tensor<float>({1.0f, 1.0f}));
    const uint64_t before = p.version();
    opt->step();
    EXPECT_GT(p.version(), before) << kind.name;
    try {
      loss.backward();
      ADD_FAILURE() << kind.name << ": backward over a parameter modified in place ran";
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()), HasSubstr("version")) << kind.name;
    }
  }
}

}  // namespace
}  // namespace gradwire::optim
