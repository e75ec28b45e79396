// Gradient checks (finite differences in float64, nn_gradcheck.h) for every layer,
// activation and loss of nn/.
#include <gtest/gtest.h>

#include "gradwire/nn/nn.h"
#include "nn_gradcheck.h"

namespace gradwire::nn {
namespace {

using testing::check_gradients;
using testing::uniform64;

Tensor leaf(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  return uniform64(shape, lo, hi, seed).set_requires_grad();
}

TEST(NnGradients, Linear2dAnd3dInputs) {
  Generator gen(1);
  Linear fc(LinearOptions{4, 3, true, kFloat64, &gen});
  Tensor x = leaf({5, 4}, 2);
  EXPECT_TRUE(check_gradients([&] { return fc(x); }, {x, fc.weight(), fc.bias()}));
  Tensor x3 = leaf({2, 3, 4}, 3);
  EXPECT_TRUE(check_gradients([&] { return fc(x3); }, {x3, fc.weight(), fc.bias()}));
  Linear nobias(LinearOptions{4, 2, false, kFloat64, &gen});
  EXPECT_FALSE(nobias.bias().defined());
  EXPECT_TRUE(check_gradients([&] { return nobias(x); }, {x, nobias.weight()}));
}

TEST(NnGradients, EmbeddingWithRepeatedIndices) {
  Generator gen(1);
  Embedding emb(EmbeddingOptions{6, 3, kFloat64, &gen});
  Tensor idx = tensor<int64_t>({1, 4, 1, 0, 5, 1}, {2, 3});
  EXPECT_TRUE(check_gradients([&] { return emb(idx); }, {emb.weight()}));
}

TEST(NnGradients, EmbeddingBagSumAndMean) {
  for (auto mode : {EmbeddingBagMode::kSum, EmbeddingBagMode::kMean}) {
    Generator gen(2);
    EmbeddingBag bag(EmbeddingBagOptions{7, 3, mode, kFloat64, &gen});
    // Bags {2, 2, 5}, {} (empty), {0}, {6, 2}.
    Tensor input = tensor<int64_t>({2, 2, 5, 0, 6, 2});
    Tensor offsets = tensor<int64_t>({0, 3, 3, 4});
    EXPECT_TRUE(check_gradients([&] { return bag.forward(input, offsets); }, {bag.weight()}))
        << (mode == EmbeddingBagMode::kSum ? "sum" : "mean");
    Tensor fixed = tensor<int64_t>({1, 3, 3, 0, 6, 4}, {3, 2});
    EXPECT_TRUE(check_gradients([&] { return bag(fixed); }, {bag.weight()}));
  }
}

TEST(NnGradients, Activations) {
  // ReLU's inputs stay at least 0.1 away from its kink.
  Tensor x = uniform64({3, 4}, 0.1, 1.0, 4) *
             tensor<double>({1, -1, 1, -1, -1, 1, 1, -1, 1, 1, -1, -1}, {3, 4});
  x.set_requires_grad();
  ReLU relu_m;
  Sigmoid sigmoid_m;
  Tanh tanh_m;
  EXPECT_TRUE(check_gradients([&] { return relu_m(x); }, {x}));
  Tensor y = leaf({3, 4}, 5, -4.0, 4.0);
  EXPECT_TRUE(check_gradients([&] { return sigmoid_m(y); }, {y}));
  EXPECT_TRUE(check_gradients([&] { return tanh_m(y); }, {y}));
}

TEST(NnGradients, DropoutUsesItsMaskInBackward) {
  Generator gen(1);
  Dropout drop(DropoutOptions{0.4, &gen});
  Tensor x = leaf({4, 5}, 6);
  // The same seed before each call gives the same mask for every evaluation.
  EXPECT_TRUE(check_gradients(
      [&] {
        gen.set_seed(11);
        return drop(x);
      },
      {x}));
}

TEST(NnGradients, Losses) {
  Tensor a = leaf({3, 4}, 7), b = leaf({3, 4}, 8);
  for (auto r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    EXPECT_TRUE(check_gradients([&] { return mse_loss(a, b, r); }, {a, b}));
  }
  Tensor logits = leaf({4, 5}, 9, -3.0, 3.0);
  Tensor target = tensor<int64_t>({1, 0, 4, 1});
  for (auto r : {Reduction::kMean, Reduction::kSum, Reduction::kNone}) {
    EXPECT_TRUE(check_gradients([&] { return cross_entropy(logits, target, r); }, {logits}));
    EXPECT_TRUE(
        check_gradients([&] { return nll_loss(log_softmax(logits, 1), target, r); }, {logits}));
  }
  Tensor probs = softmax(uniform64({4, 5}, -1, 1, 10), 1);
  EXPECT_TRUE(check_gradients([&] { return cross_entropy(logits, probs); }, {logits}));
  Tensor one = leaf({5}, 11);
  EXPECT_TRUE(
      check_gradients([&] { return cross_entropy(one, scalar_tensor(int64_t{3})); }, {one}));
}

TEST(NnGradients, MlpEndToEnd) {
  Generator gen(3);
  MLP net(MLPOptions{.sizes = {3, 5, 4, 2},
                     .activation = Activation::kTanh,
                     .dtype = kFloat64,
                     .generator = &gen});
  Tensor x = leaf({6, 3}, 12);
  Tensor target = tensor<int64_t>({0, 1, 1, 0, 1, 0});
  std::vector<Tensor> wrt = net.parameters();
  wrt.push_back(x);
  EXPECT_TRUE(check_gradients([&] { return cross_entropy(net(x), target); }, wrt));
}

}  // namespace
}  // namespace gradwire::nn
