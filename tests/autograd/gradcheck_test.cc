// Finite-difference checks of every differentiable op's backward formula (gradcheck.h
// states the method and tolerances), including broadcasting, views, non-contiguous inputs
// and in-place forms on non-leaf tensors.
#include <gtest/gtest.h>

#include "gradcheck.h"
#include "gradwire/tensor/ops.h"

namespace gradwire {
namespace {

using testing::gradcheck;
using testing::uniform;
using V = std::vector<Tensor>;

Tensor positive(const Shape& s, uint64_t seed = 3) {
  return uniform(s, 0.5, 2.0, seed);
}

// ---- elementwise binary, with broadcasting and non-contiguous inputs

TEST(Gradcheck, AddSubWithAlphaAndBroadcast) {
  EXPECT_TRUE(gradcheck([](const V& x) { return add(x[0], x[1], 2.5); },
                        {uniform({2, 3}), uniform({3}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([](const V& x) { return sub(x[0], x[1], 0.5); },
                        {uniform({4, 1}), uniform({1, 3}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([](const V& x) { return x[0] + x[1] - x[0]; },
                        {uniform({2, 3}), uniform({2, 3}, -1, 1, 5)}));
}

TEST(Gradcheck, MulDivBroadcastAndNonContiguous) {
  EXPECT_TRUE(gradcheck([](const V& x) { return x[0] * x[1]; },
                        {uniform({2, 1, 3}), uniform({4, 1}, -1, 1, 2)}));
  EXPECT_TRUE(
      gradcheck([](const V& x) { return x[0].t() / x[1]; }, {uniform({3, 2}), positive({2, 3})}));
  EXPECT_TRUE(gradcheck([](const V& x) { return x[0] / x[1]; }, {uniform({}), positive({3})}));
}

TEST(Gradcheck, ScalarForms) {
  EXPECT_TRUE(gradcheck(
      [](const V& x) { return (x[0] + 2) * 3 - (1.5 - x[0]) / 4 + 2.0 / x[1] + (3 * x[1] - 1); },
      {uniform({2, 3}), positive({2, 3})}));
  EXPECT_TRUE(gradcheck([](const V& x) { return -x[0] + (2.0 + x[0]); }, {uniform({5})}));
}

TEST(Gradcheck, Pow) {
  EXPECT_TRUE(gradcheck([](const V& x) { return pow(x[0], x[1]); },
                        {positive({2, 3}), uniform({3}, -1, 2, 4)}));
  EXPECT_TRUE(gradcheck([](const V& x) { return pow(x[0], 3); }, {uniform({4})}));
  EXPECT_TRUE(gradcheck([](const V& x) { return pow(x[0], -1.5); }, {positive({4})}));
}

TEST(Gradcheck, MaximumMinimum) {
  // Distinct values (no ties, where the function is not differentiable).
  Tensor a = tensor<double>({0.1, -0.5, 0.9, 0.3, -0.2, 0.7}, {2, 3});
  Tensor b = tensor<double>({0.4, -0.8, 0.2});
  EXPECT_TRUE(gradcheck([](const V& x) { return maximum(x[0], x[1]); }, {a, b}));
  EXPECT_TRUE(gradcheck([](const V& x) { return minimum(x[0], x[1]); }, {a, b}));
}

TEST(Gradcheck, WhereAndClamp) {
  Tensor cond = tensor<bool>({true, false, true}, {3});
  EXPECT_TRUE(gradcheck([cond](const V& x) { return where(cond, x[0], x[1]); },
                        {uniform({2, 3}), uniform({2, 1}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([cond](const V& x) { return where(cond, x[0], 2.0); }, {uniform({2, 3})}));
  Tensor v = tensor<double>({-0.9, -0.3, 0.1, 0.45, 0.8});
  EXPECT_TRUE(gradcheck([](const V& x) { return clamp(x[0], -0.5, 0.5); }, {v}));
  EXPECT_TRUE(gradcheck([](const V& x) { return clamp(x[0], std::nullopt, 0.2); }, {v}));
}

// ---- unary math

TEST(Gradcheck, UnaryMath) {
  Tensor x = tensor<double>({-1.3, -0.4, 0.25, 0.7, 1.6, 2.2}, {2, 3});
  Tensor p = positive({2, 3});
  EXPECT_TRUE(gradcheck([](const V& v) { return exp(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return log(v[0]); }, {p}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sqrt(v[0]); }, {p}));
  EXPECT_TRUE(gradcheck([](const V& v) { return rsqrt(v[0]); }, {p}));
  EXPECT_TRUE(gradcheck([](const V& v) { return abs(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return neg(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return relu(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sigmoid(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return tanh(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return square(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return reciprocal(v[0]); }, {p}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sign(v[0]) * v[0]; }, {x}));
}

// ---- reductions

TEST(Gradcheck, SumMean) {
  Tensor x = uniform({2, 3, 4});
  EXPECT_TRUE(gradcheck([](const V& v) { return sum(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sum(v[0], {0, 2}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return sum(v[0], {-1}, true); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mean(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mean(v[0], {1}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mean(v[0].transpose(0, 2), {0}, true); }, {x}));
}

TEST(Gradcheck, Prod) {
  EXPECT_TRUE(gradcheck([](const V& v) { return prod(v[0], 1); }, {uniform({3, 4})}));
  EXPECT_TRUE(gradcheck([](const V& v) { return prod(v[0], 0, true); }, {uniform({3, 4})}));
  // With zeros, the out / x shortcut is undefined.
  Tensor z = tensor<double>({0.0, 2.0, 3.0, 0.0, 0.0, 1.5, 1.0, 0.5, -2.0}, {3, 3});
  EXPECT_TRUE(gradcheck([](const V& v) { return prod(v[0], 1); }, {z}));
}

TEST(Gradcheck, ExtremesAndNorm) {
  // Distinct values so that the maxima are unique.
  Tensor x =
      tensor<double>({0.3, -1.2, 2.5, 0.9, 1.7, -0.4, 0.05, 1.1, -2.2, 0.6, 1.4, -0.8}, {3, 4});
  EXPECT_TRUE(gradcheck([](const V& v) { return amax(v[0], {1}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return amin(v[0], {0}, true); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return amax(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return max(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return min(v[0]); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return max(v[0], 1).first; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return min(v[0], 0, true).first; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return norm(v[0]); }, {x}));
}

TEST(Gradcheck, TiesShareTheGradient) {
  Tensor x = tensor<double>({1.0, 3.0, 3.0}).set_requires_grad(true);
  amax(x).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0.0, 0.5, 0.5}));
}

// ---- matrix products

TEST(Gradcheck, MatrixProducts) {
  EXPECT_TRUE(gradcheck([](const V& v) { return mm(v[0], v[1]); },
                        {uniform({2, 3}), uniform({3, 4}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return mm(v[0].t(), v[1].t()); },
                        {uniform({3, 2}), uniform({4, 3}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return bmm(v[0], v[1]); },
                        {uniform({2, 2, 3}), uniform({2, 3, 2}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return dot(v[0], v[1]); },
                        {uniform({4}), uniform({4}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return outer(v[0], v[1]); },
                        {uniform({3}), uniform({2}, -1, 1, 2)}));
}

TEST(Gradcheck, MatmulAllRankCombinations) {
  Tensor v3 = uniform({3}), m23 = uniform({2, 3}, -1, 1, 2), m34 = uniform({3, 4}, -1, 1, 3);
  Tensor b234 = uniform({2, 3, 4}, -1, 1, 4), b2_23 = uniform({2, 2, 3}, -1, 1, 5);
  auto mmul = [](const V& v) { return matmul(v[0], v[1]); };
  EXPECT_TRUE(gradcheck(mmul, {v3, uniform({3}, -1, 1, 9)}));  // dot
  EXPECT_TRUE(gradcheck(mmul, {m23, v3}));                     // matrix-vector
  EXPECT_TRUE(gradcheck(mmul, {v3, m34}));                     // vector-matrix
  EXPECT_TRUE(gradcheck(mmul, {m23, m34}));                    // mm
  EXPECT_TRUE(gradcheck(mmul, {b2_23, m34}));                  // batch x broadcast matrix
  EXPECT_TRUE(gradcheck(mmul, {m23, b234}));                   // matrix x batch
  EXPECT_TRUE(gradcheck(mmul, {b2_23, b234}));                 // batched
  EXPECT_TRUE(gradcheck(mmul, {v3, b234}));                    // vector x batch
}

// matmul of two matrices takes mm's gradients: a weight used transposed (x W.t(), a linear
// layer) gets its gradient contiguous, in its own layout, with the same values.
TEST(Gradcheck, MatmulOfATransposedWeightGivesItAContiguousGradient) {
  EXPECT_TRUE(gradcheck([](const V& v) { return matmul(v[0], v[1].t()); },
                        {uniform({2, 3}), uniform({4, 3}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck([](const V& v) { return matmul(v[0].t(), v[1]); },
                        {uniform({3, 2}), uniform({3, 4}, -1, 1, 2)}));
  Tensor x = tensor<double>({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true);
  Tensor w = tensor<double>({1, 0, -1, 2, 1, 0}, {2, 3}).set_requires_grad(true);
  sum(matmul(x, w.t())).backward();
  // d sum(x W^T) / dW = 1^T x: each row of W gets the column sums of x.
  EXPECT_TRUE(w.grad().is_contiguous());
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{5, 7, 9, 5, 7, 9}));
  // d / dx = 1 W: each row of x gets the column sums of W.
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 1, -1, 3, 1, -1}));
}

TEST(Gradcheck, AddmmInPlaceOnNonLeaf) {
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor out = v[0] * 1.0;  // a non-leaf that owns its storage
        return addmm_(out, v[1], v[2], 0.5, 2.0);
      },
      {uniform({2, 4}), uniform({2, 3}, -1, 1, 2), uniform({3, 4}, -1, 1, 3)}));
}

// ---- softmax family

TEST(Gradcheck, SoftmaxFamily) {
  Tensor x = uniform({3, 4});
  EXPECT_TRUE(gradcheck([](const V& v) { return softmax(v[0], 1); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return softmax(v[0], 0); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return log_softmax(v[0], -1); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return logsumexp(v[0], 1); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return logsumexp(v[0], 0, true); }, {x}));
}

// ---- indexing

TEST(Gradcheck, IndexSelectGatherWithDuplicates) {
  Tensor idx = tensor<int64_t>({2, 0, 2});
  EXPECT_TRUE(
      gradcheck([idx](const V& v) { return index_select(v[0], 0, idx); }, {uniform({3, 2})}));
  EXPECT_TRUE(
      gradcheck([idx](const V& v) { return index_select(v[0], 1, idx); }, {uniform({2, 3})}));
  Tensor gi = tensor<int64_t>({0, 0, 2, 1, 1, 0}, {2, 3});
  EXPECT_TRUE(gradcheck([gi](const V& v) { return gather(v[0], 1, gi); }, {uniform({2, 3})}));
  EXPECT_TRUE(
      gradcheck([gi](const V& v) { return gather(v[0], 0, clamp(gi, 0, 1)); }, {uniform({2, 3})}));
}

TEST(Gradcheck, ScatterAddIndexAddMaskedFill) {
  Tensor si = tensor<int64_t>({0, 2, 2, 1}, {1, 4});
  EXPECT_TRUE(gradcheck([si](const V& v) { return scatter_add(v[0], 1, si, v[1]); },
                        {uniform({2, 3}), uniform({1, 4}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck(
      [si](const V& v) {
        Tensor a = v[0] * 1.0;
        return scatter_add_(a, 1, si, v[1]);
      },
      {uniform({2, 3}), uniform({1, 4}, -1, 1, 2)}));
  Tensor ii = tensor<int64_t>({1, 1, 0});
  EXPECT_TRUE(gradcheck([ii](const V& v) { return index_add(v[0], 0, ii, v[1]); },
                        {uniform({2, 4}), uniform({3, 4}, -1, 1, 2)}));
  Tensor mask = tensor<bool>({true, false, false, true, false, true}, {2, 3});
  EXPECT_TRUE(
      gradcheck([mask](const V& v) { return masked_fill(v[0], mask, 5.0); }, {uniform({2, 3})}));
  Tensor row = tensor<bool>({false, true, false});
  EXPECT_TRUE(
      gradcheck([row](const V& v) { return masked_fill(v[0], row, -1.0); }, {uniform({2, 3})}));
}

// ---- joining and splitting

TEST(Gradcheck, CatStack) {
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        return cat({v[0], v[1]}, 1);
      },
      {uniform({2, 3}), uniform({2, 2}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        return cat({v[0], v[1], v[0]}, 0);
      },
      {uniform({1, 3}), uniform({2, 3}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        return stack({v[0], v[1]}, 1);
      },
      {uniform({2, 3}), uniform({2, 3}, -1, 1, 2)}));
}

TEST(Gradcheck, SplitChunkAndFlattenDense) {
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        auto parts = split(v[0], 2, 1);
        return parts[0] * 2.0 + parts[1] * parts[1];  // parts[2] unused: zero gradient
      },
      {uniform({2, 5})}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        auto parts = chunk(v[0], 3, 0);
        return cat({parts[2], parts[0]}, 0);
      },
      {uniform({6, 2})}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        auto parts = split_with_sizes(v[0], {1, 3}, 0);
        return sum(parts[1], {0}) * parts[0];
      },
      {uniform({4, 2})}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        return flatten_dense_tensors({v[0], v[1]}) * 3.0;
      },
      {uniform({2, 3}), uniform({4}, -1, 1, 2)}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        auto views = unflatten_dense_tensors(v[0], {zeros({2, 2}, kFloat64), zeros({3}, kFloat64)});
        return sum(mm(views[0], views[0])) + prod(views[1], 0);
      },
      {uniform({7})}));
}

// ---- views and conversions

TEST(Gradcheck, Views) {
  Tensor x = uniform({2, 3, 4});
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].view({6, 4}) * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].transpose(0, 2).reshape({4, 6}); }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].permute({2, 0, 1}) * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].slice(2, 1, 4, 2) * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].select(1, -1) * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].narrow(0, 1, 1) * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].flatten(1) * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].unflatten(2, {2, 2}) * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0][1] * 2.0; }, {x}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        return v[0].unsqueeze(1).expand({3, 2, 4}) * 2.0;
      },
      {uniform({3, 4})}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].squeeze() * 2.0; }, {uniform({2, 1, 3})}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].squeeze(1) * 2.0; }, {uniform({2, 1, 3})}));
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].t().contiguous() * 2.0; }, {uniform({2, 3})}));
}

TEST(Gradcheck, AsStrided) {
  // Overlapping windows of a 1-d signal: elements read twice get both gradients.
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        return v[0].as_strided({3, 3}, {2, 1}, 0) * 2.0;
      },
      {uniform({7})}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        return v[0].t().as_strided({2, 2}, {1, 3}, 1) * 2.0;
      },
      {uniform({3, 2})}));
}

TEST(Gradcheck, CloneToAndCopy) {
  EXPECT_TRUE(gradcheck([](const V& v) { return v[0].clone() * v[0]; }, {uniform({3})}));
  // float64 -> float32 -> float64: the gradient is cast back; float32 rounding bounds it.
  testing::GradcheckOptions loose;
  loose.eps = 1e-3;
  loose.atol = 1e-4;
  loose.rtol = 1e-3;
  EXPECT_TRUE(gradcheck([](const V& v) { return (v[0].to(kFloat32) * 2.0f).to(kFloat64); },
                        {uniform({3})}, loose));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor dst = v[0] * 1.0;
        dst.copy_(v[1]);  // broadcast source; dst's previous value gets no gradient
        return dst * v[0];
      },
      {uniform({2, 3}), uniform({3}, -1, 1, 2)}));
}

// ---- in-place forms on non-leaf tensors (history is rebased onto the new node)

TEST(Gradcheck, InPlaceOnNonLeaf) {
  Tensor a = uniform({2, 3}), b = positive({2, 3}, 5), c = uniform({3}, -1, 1, 6);
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.add_(v[1], 2.0);
        return t;
      },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.sub_(v[1], 0.5);
        return t;
      },
      {a, c}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.mul_(v[1]);
        return t;
      },
      {a, c}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.div_(v[1]);
        return t;
      },
      {a, b}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] + 0.0;
        t.add_(1.0).sub_(0.5).mul_(3.0).div_(2.0).neg_();
        t += v[0];
        t *= v[0];
        return t;
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.pow_(3);
        return t;
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.relu_();
        return t * v[0];
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.clamp_(-0.3, 0.4);
        return t;
      },
      {tensor<double>({-0.9, -0.1, 0.2, 0.35, 0.8, 0.05}, {2, 3})}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.fill_(2.0);
        return t * v[0];
      },
      {a}));
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = v[0] * 1.0;
        t.zero_();
        return t + v[0];
      },
      {a}));
  // A tensor without history becomes a non-leaf when a gradient-requiring value is added.
  EXPECT_TRUE(gradcheck(
      [](const V& v) {
        Tensor t = zeros({2, 3}, kFloat64);
        t.add_(v[0]);
        return t * v[0];
      },
      {a}));
}

// ---- a small network: the ops nn/ builds on, checked together

TEST(Gradcheck, MlpWithCrossEntropy) {
  Tensor labels = tensor<int64_t>({2, 0, 1}, {3, 1});
  Tensor keep = tensor<bool>({true, false, true, true, true, false, true, true}, {2, 4});
  EXPECT_TRUE(gradcheck(
      [labels, keep](const V& v) {
        Tensor h = relu(matmul(v[0], v[1].t()) + v[2]);           // linear + relu
        Tensor dropped = where(keep.select(0, 0), h, 0.0) * 2.0;  // dropout-style mask
        Tensor logits = mm(dropped, v[3]);
        Tensor nll = -gather(log_softmax(logits, 1), 1, labels);  // cross entropy
        return mean(nll) + sum(tanh(h) * sigmoid(h)) * 0.1;
      },
      {uniform({3, 5}), uniform({4, 5}, -1, 1, 2), uniform({4}, -1, 1, 3),
       uniform({4, 3}, -1, 1, 4)}));
  Tensor tokens = tensor<int64_t>({1, 3, 1, 0});
  EXPECT_TRUE(gradcheck([tokens](const V& v) { return sum(index_select(v[0], 0, tokens), {1}); },
                        {uniform({4, 3})}));
}

}  // namespace
}  // namespace gradwire

namespace gradwire {
namespace {

// The checker itself must catch a wrong formula: a node whose backward is off by a factor.
class WrongSquareBackward : public autograd::Node {
 public:
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    return {grads[0] * saved_.unpack(*this) * 2.1};  // the right factor is 2
  }
  std::string name() const override { return "WrongSquareBackward"; }
  autograd::SavedVariable saved_;
};

TEST(Gradcheck, DetectsAWrongFormula) {
  auto wrong_square = [](const V& v) {
    Tensor y;
    {
      BelowAutogradGuard raw;
      y = square(v[0]);
    }
    auto node = std::make_shared<WrongSquareBackward>();
    node->saved_ = autograd::SavedVariable(v[0]);
    node->set_next_edges(autograd::collect_next_edges({v[0]}));
    autograd::set_history(y, node);
    return y;
  };
  EXPECT_FALSE(gradcheck(wrong_square, {uniform({3})}));
  EXPECT_FALSE(
      gradcheck([](const V& v) { return v[0].detach() * 2.0 + v[0] * 0.0; }, {uniform({2})}));
}

}  // namespace
}  // namespace gradwire
