// nn/: Module bookkeeping, layer values, default initialisations, Dropout statistics,
// loss values (including stability for huge logits), state dicts and the state file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "gradwire/autograd/autograd.h"
#include "gradwire/core/error.h"
#include "gradwire/nn/nn.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/zero_grad.h"

namespace gradwire::nn {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no InvalidArgument thrown)";
}

std::vector<std::string> keys(const StateDict& sd) {
  std::vector<std::string> out;
  for (const auto& e : sd)
    out.push_back(e.first);
  return out;
}

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "/gw_nn_" + std::to_string(::getpid()) + "_" + name;
}

// A module with a parameter, a buffer and two submodules, one nested.
class Net : public UnaryModule {
 public:
  Net() : UnaryModule("Net") {
    scale_ = register_parameter("scale", ones({3}));
    count_ = register_buffer("count", zeros({1}, TensorOptions(kInt64)));
    fc_ = register_module("fc", std::make_shared<Linear>(3, 2));
    head_ = register_module("head",
                            std::make_shared<Sequential>(std::vector<std::shared_ptr<UnaryModule>>{
                                std::make_shared<Linear>(2, 2), std::make_shared<Dropout>(0.5)}));
  }
  Tensor forward(const Tensor& x) override { return (*head_)(fc_->forward(x * scale_)); }

 private:
  Tensor scale_, count_;
  std::shared_ptr<Linear> fc_;
  std::shared_ptr<Sequential> head_;
};

TEST(Module, NamesOrderAndModes) {
  Net net;
  EXPECT_THAT(keys(net.named_parameters()),
              ElementsAre("scale", "fc.weight", "fc.bias", "head.0.weight", "head.0.bias"));
  EXPECT_THAT(keys(net.named_buffers()), ElementsAre("count"));
  EXPECT_THAT(keys(net.state_dict()), ElementsAre("scale", "count", "fc.weight", "fc.bias",
                                                  "head.0.weight", "head.0.bias"));
  EXPECT_EQ(net.parameters(/*recurse=*/false).size(), 1u);
  std::vector<std::string> modules;
  for (const auto& [name, m] : net.named_modules())
    modules.push_back(name + ":" + m->type_name());
  EXPECT_THAT(modules,
              ElementsAre("fc:Linear", "head:Sequential", "head.0:Linear", "head.1:Dropout"));
  for (const Tensor& p : net.parameters())
    EXPECT_TRUE(p.requires_grad());
  EXPECT_TRUE(net.is_training());
  net.eval();
  for (const auto& [name, m] : net.named_modules())
    EXPECT_FALSE(m->is_training()) << name;
  net.train();
  EXPECT_TRUE(net.named_modules()[3].second->is_training());
}

TEST(Module, BadRegistrationsAreRejected) {
  Module m("M");
  m.register_parameter("w", zeros({2}));
  EXPECT_THAT(error_of([&] { m.register_buffer("w", zeros({2})); }),
              HasSubstr("'w' is already registered"));
  EXPECT_THAT(error_of([&] { m.register_parameter("a.b", zeros({2})); }),
              HasSubstr("must not contain '.'"));
  EXPECT_THAT(error_of([&] { m.register_parameter("", zeros({2})); }), HasSubstr("empty"));
  EXPECT_THAT(error_of([&] { m.register_parameter("i", zeros({2}, TensorOptions(kInt64))); }),
              HasSubstr("only floating tensors can require grad"));
  EXPECT_THAT(error_of([&] { m.register_module("c", std::shared_ptr<Linear>()); }),
              HasSubstr("null"));
}

TEST(Module, SharedParametersAreListedOnce) {
  auto fc = std::make_shared<Linear>(2, 2);
  Sequential seq({fc, fc});
  EXPECT_EQ(seq.parameters().size(), 2u);
  EXPECT_EQ(seq.state_dict().size(), 4u);  // both names, as PyTorch's state_dict
}

TEST(Module, ZeroGrad) {
  Linear fc(2, 1);
  sum(fc(ones({3, 2}))).backward();
  ASSERT_TRUE(fc.weight().grad().defined());
  fc.zero_grad(/*set_to_none=*/false);
  EXPECT_EQ(sum(abs(fc.weight().grad())).item<double>(), 0.0);
  fc.zero_grad();
  EXPECT_FALSE(fc.weight().grad().defined());
}

TEST(Module, ZeroGradIsTheSharedFreeFunction) {
  // gradwire::zero_grad (tensor/zero_grad.h) is what Module and Optimizer call: an
  // undefined tensor or a parameter without a gradient is skipped, and a gradient handle
  // held elsewhere sees the zeros. The gradient here is itself a leaf that requires grad;
  // in-place writes to such a leaf are refused while grad mode is on, so this also checks
  // that zero_grad turns it off.
  Tensor a = tensor<double>({1.0, 2.0}).set_requires_grad();
  Tensor b = tensor<double>({3.0}).set_requires_grad();
  Tensor held = tensor<double>({5.0, -6.0}).set_requires_grad();
  a.set_grad(held);
  gradwire::zero_grad({a, Tensor(), b}, /*set_to_none=*/false);
  EXPECT_EQ(held.to_vector<double>(), (std::vector<double>{0.0, 0.0}));
  EXPECT_FALSE(b.grad().defined());
  gradwire::zero_grad({a, b});
  EXPECT_FALSE(a.grad().defined());
}

TEST(Module, LoadStateDictReportsEveryMismatchAndCopiesNothing) {
  Linear a(3, 2), b(3, 2);
  StateDict sd = a.state_dict();
  EXPECT_TRUE(equal(sd[0].second, a.weight()));
  EXPECT_FALSE(sd[0].second.requires_grad());
  b.load_state_dict(sd);
  EXPECT_TRUE(equal(b.weight(), a.weight()));
  EXPECT_TRUE(b.weight().requires_grad()) << "a load keeps the parameter a leaf that trains";

  Linear c(3, 2);
  const Tensor before = c.weight().clone();
  StateDict bad{{"weight", zeros({2, 4})},
                {"bias", zeros({2}, TensorOptions(kFloat64))},
                {"extra", zeros({1})}};
  const std::string msg = error_of([&] { c.load_state_dict(bad); });
  EXPECT_THAT(msg, HasSubstr("'weight' has shape [2, 4], the module expects [2, 3]"));
  EXPECT_THAT(msg, HasSubstr("'bias' has dtype float64, the module expects float32"));
  EXPECT_THAT(msg, HasSubstr("unexpected key 'extra'"));
  EXPECT_TRUE(equal(c.weight(), before));
  const std::string missing = error_of([&] { c.load_state_dict({{"weight", zeros({2, 3})}}); });
  EXPECT_THAT(missing, HasSubstr("missing key 'bias'"));
  EXPECT_TRUE(equal(c.weight(), before));
  c.load_state_dict({{"weight", zeros({2, 3})}, {"other", zeros({1})}}, /*strict=*/false);
  EXPECT_EQ(sum(abs(c.weight())).item<double>(), 0.0);
}

// ---- layers

TEST(Layers, LinearComputesXWtPlusB) {
  Linear fc(2, 3);
  autograd::NoGradGuard no_grad;
  Tensor w = fc.weight(), b = fc.bias();
  w.copy_(tensor<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
  b.copy_(tensor<float>({0.5f, -1, 0}));
  Tensor y = fc(tensor<float>({1, -1, 2, 0}, {2, 2}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-0.5f, -2.f, -1.f, 2.5f, 5.f, 10.f}));
  EXPECT_THAT(error_of([&] { fc(zeros({2, 3})); }), HasSubstr("expected input [..., 2]"));
  EXPECT_THAT(error_of([&] { fc(zeros({2, 2}, TensorOptions(kFloat64))); }), HasSubstr("dtype"));
  EXPECT_THAT(error_of([] { Linear(0, 3); }), HasSubstr("in_features must be positive"));
}

TEST(Layers, LinearDefaultInitIsKaimingUniform) {
  Generator gen(1);
  Linear fc(LinearOptions{400, 300, true, kFloat32, &gen});
  const double bound = 1.0 / std::sqrt(400.0);
  const Tensor w = fc.weight().detach();
  EXPECT_LE(amax(abs(w)).item<double>(), bound);
  // U(-b, b): mean 0, variance b^2 / 3. With 120000 draws the standard error of the mean
  // is ~b/600 and of the variance ~0.3%; the tolerances are several times wider.
  EXPECT_NEAR(mean(w).item<double>(), 0.0, bound / 100);
  EXPECT_NEAR(mean(square(w)).item<double>(), bound * bound / 3, 0.02 * bound * bound / 3);
  EXPECT_LE(amax(abs(fc.bias().detach())).item<double>(), bound);
  EXPECT_GT(amax(abs(fc.bias().detach())).item<double>(), 0.8 * bound);
}

TEST(Layers, EmbeddingInitIsStandardNormalAndLooksUpRows) {
  Generator gen(2);
  Embedding emb(EmbeddingOptions{1000, 64, kFloat32, &gen});
  const Tensor w = emb.weight().detach();
  EXPECT_NEAR(mean(w).item<double>(), 0.0, 0.02);
  EXPECT_NEAR(mean(square(w)).item<double>(), 1.0, 0.02);
  Tensor out = emb(tensor<int64_t>({3, 999, 3}, {3, 1}));
  EXPECT_EQ(out.sizes(), (Shape{3, 1, 64}));
  EXPECT_TRUE(equal(out[1][0], w[999]));
  EXPECT_TRUE(equal(out[0][0], out[2][0]));
  EXPECT_THAT(error_of([&] {
                emb(tensor<int64_t>({1, 1000}));
              }),
              HasSubstr("index 1000 (position 1) is out of range for 1000 embeddings"));
  EXPECT_THAT(error_of([&] { emb(tensor<float>({1.f})); }), HasSubstr("int64 or int32"));
}

TEST(Layers, EmbeddingBagSumMeanAndEmptyBags) {
  EmbeddingBag sum_bag(EmbeddingBagOptions{4, 2, EmbeddingBagMode::kSum});
  EmbeddingBag mean_bag(EmbeddingBagOptions{4, 2, EmbeddingBagMode::kMean});
  {
    autograd::NoGradGuard no_grad;
    Tensor w1 = sum_bag.weight(), w2 = mean_bag.weight();
    w1.copy_(tensor<float>({0, 1, 10, 11, 20, 21, 30, 31}, {4, 2}));
    w2.copy_(w1);
  }
  Tensor input = tensor<int64_t>({1, 3, 3, 2});
  Tensor offsets = tensor<int64_t>({0, 3, 3});  // {1, 3, 3}, {}, {2}
  EXPECT_EQ(sum_bag.forward(input, offsets).to_vector<float>(),
            (std::vector<float>{70, 73, 0, 0, 20, 21}));
  Tensor m = mean_bag.forward(input, offsets);
  EXPECT_NEAR(m.at({0, 0}), 70.0 / 3, 1e-5);
  EXPECT_EQ(m.at({1, 1}), 0.0);
  EXPECT_EQ(m.at({2, 1}), 21.0);
  EXPECT_EQ(mean_bag(tensor<int64_t>({0, 2, 1, 3}, {2, 2})).to_vector<float>(),
            (std::vector<float>{10, 11, 20, 21}));
  EXPECT_THAT(error_of([&] {
                sum_bag.forward(input, tensor<int64_t>({1, 2}));
              }),
              HasSubstr("offsets[0] must be 0"));
  EXPECT_THAT(error_of([&] {
                sum_bag.forward(input, tensor<int64_t>({0, 3, 2}));
              }),
              HasSubstr("non-decreasing"));
  EXPECT_THAT(error_of([&] {
                sum_bag.forward(input, tensor<int64_t>({0, 9}));
              }),
              HasSubstr("non-decreasing"));
  EXPECT_THAT(error_of([&] { sum_bag(input); }), HasSubstr("must be 2-d"));
}

TEST(Layers, DropoutStatisticsAndModes) {
  Generator gen(42);
  const double p = 0.3;
  Dropout drop(DropoutOptions{p, &gen});
  Tensor x = ones({200000});
  Tensor y = drop(x);
  const auto v = y.to_vector<float>();
  int64_t zeros_seen = 0;
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  for (float e : v) {
    if (e == 0.f) {
      ++zeros_seen;
    } else {
      ASSERT_FLOAT_EQ(e, scale);
    }
  }
  // Binomial(200000, 0.3): standard deviation ~205 zeros; allow 5 sigma.
  EXPECT_NEAR(double(zeros_seen), 0.3 * 200000, 1025);
  gen.set_seed(42);
  EXPECT_TRUE(equal(drop(x), y)) << "a reseeded generator reproduces the mask";
  drop.eval();
  EXPECT_TRUE(drop(x).is_same(x));
  drop.train();
  EXPECT_TRUE(Dropout(0.0)(x).is_same(x));
  EXPECT_EQ(sum(Dropout(1.0)(x)).item<double>(), 0.0);
  EXPECT_THAT(error_of([] { Dropout(1.5); }), HasSubstr("p must be in [0, 1]"));
  EXPECT_THAT(error_of([] { Dropout(-0.1); }), HasSubstr("p must be in [0, 1]"));
}

TEST(Layers, MlpStructureMatchesTorchSequential) {
  MLP net(MLPOptions{.sizes = {4, 8, 8, 2}, .dropout = 0.1});
  std::vector<std::string> kinds;
  for (const auto& [name, m] : net.named_children())
    kinds.push_back(name + ":" + m->type_name());
  EXPECT_THAT(kinds, ElementsAre("0:Linear", "1:ReLU", "2:Dropout", "3:Linear", "4:ReLU",
                                 "5:Dropout", "6:Linear"));
  EXPECT_EQ(net(zeros({5, 4})).sizes(), (Shape{5, 2}));
  EXPECT_THAT(error_of([] { MLP(MLPOptions{.sizes = {3}}); }), HasSubstr("sizes"));
}

TEST(Init, GainsAndFans) {
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::kRelu), std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::kTanh), 5.0 / 3.0);
  EXPECT_DOUBLE_EQ(init::calculate_gain(init::Nonlinearity::kLeakyRelu, std::sqrt(5.0)),
                   std::sqrt(1.0 / 3.0));
  auto [fan_in, fan_out] = init::calculate_fan_in_and_fan_out(empty({8, 4, 3, 3}));
  EXPECT_EQ(fan_in, 36);
  EXPECT_EQ(fan_out, 72);
  Tensor t = empty({100, 200});
  Generator gen(3);
  init::xavier_uniform_(t, 1.0, &gen);
  EXPECT_LE(amax(abs(t)).item<double>(), std::sqrt(6.0 / 300));
  init::kaiming_normal_(t, 0.0, init::FanMode::kFanIn, init::Nonlinearity::kRelu, &gen);
  EXPECT_NEAR(mean(square(t)).item<double>(), 2.0 / 200, 0.03 * 2.0 / 200);
  EXPECT_THAT(error_of([] { init::calculate_fan_in_and_fan_out(empty({3})); }),
              HasSubstr("at least 2 dims"));
}

// ---- losses

TEST(Losses, ValuesWorkedOutByHand) {
  Tensor logits = tensor<double>({1.0, 2.0, 3.0, 0.0, 0.0, 0.0}, {2, 3});
  Tensor target = tensor<int64_t>({2, 0});
  const double lse0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double l0 = lse0 - 3.0, l1 = std::log(3.0);
  EXPECT_NEAR(cross_entropy(logits, target).item<double>(), (l0 + l1) / 2, 1e-15);
  EXPECT_NEAR(cross_entropy(logits, target, Reduction::kSum).item<double>(), l0 + l1, 1e-15);
  Tensor none = cross_entropy(logits, target, Reduction::kNone);
  EXPECT_NEAR(none.at({0}), l0, 1e-15);
  EXPECT_NEAR(nll_loss(log_softmax(logits, 1), target).item<double>(), (l0 + l1) / 2, 1e-15);
  EXPECT_NEAR(mse_loss(tensor<double>({1, 2}), tensor<double>({0, 4})).item<double>(), 2.5, 1e-15);
  Tensor onehot = tensor<double>({0, 0, 1, 1, 0, 0}, {2, 3});
  EXPECT_NEAR(cross_entropy(logits, onehot).item<double>(), (l0 + l1) / 2, 1e-15);
}

TEST(Losses, CrossEntropyIsStableForHugeLogits) {
  Tensor logits = tensor<float>({1e4f, 0.f, -1e4f, -1e4f, 1e4f, 0.f}, {2, 3}).set_requires_grad();
  Tensor loss = cross_entropy(logits, tensor<int64_t>({0, 2}));
  // Sample 0 picks its max (loss 0); sample 1 picks 0 against a max of 1e4 (loss 1e4).
  EXPECT_FLOAT_EQ(loss.item<float>(), 5000.f);
  loss.backward();
  // d/dlogits = (softmax - onehot) / N.
  EXPECT_EQ(logits.grad().to_vector<float>(),
            (std::vector<float>{0.f, 0.f, 0.f, 0.f, 0.5f, -0.5f}));
}

TEST(Losses, BadTargetsAreRejected) {
  Tensor logits = zeros({2, 3});
  EXPECT_THAT(error_of([&] {
                cross_entropy(logits, tensor<int64_t>({0, 3}));
              }),
              HasSubstr("target 3 of sample 1 is out of range for 3 classes"));
  EXPECT_THAT(error_of([&] {
                cross_entropy(logits, tensor<int64_t>({-1, 0}));
              }),
              HasSubstr("out of range"));
  EXPECT_THAT(error_of([&] { nll_loss(logits, tensor<int64_t>({0})); }),
              HasSubstr("expected 2 targets"));
  EXPECT_THAT(error_of([&] { mse_loss(zeros({2}), zeros({3})); }), HasSubstr("differ"));
  EXPECT_THAT(error_of([&] {
                cross_entropy(logits, zeros({2, 2}));
              }),
              HasSubstr("shaped like the logits"));
  CrossEntropyLoss ce(Reduction::kSum);
  EXPECT_NEAR(ce.forward(logits, tensor<int64_t>({0, 1})).item<double>(), 2 * std::log(3.0), 1e-6);
}

// ---- state files

TEST(StateFile, RoundTripKeepsValuesDtypesAndShapes) {
  StateDict sd{{"f32", tensor<float>({1.5f, -2.f, 3.25f, 0.f, 1e-30f, -7.f}, {2, 3})},
               {"f64", tensor<double>({3.141592653589793})},
               {"i64", tensor<int64_t>({-1, 1LL << 40})},
               {"scalar", scalar_tensor(int64_t{7})},
               {"b", tensor<bool>({true, false, true})},
               {"empty", zeros({0, 4})},
               {"h", tensor<float>({0.5f, 2.f}).to(kFloat16)},
               {"strided", arange(6, TensorOptions(kFloat32)).reshape({2, 3}).t()}};
  const StateDict back = deserialize(serialize(sd));
  ASSERT_EQ(back.size(), sd.size());
  for (size_t i = 0; i < sd.size(); ++i) {
    EXPECT_EQ(back[i].first, sd[i].first);
    EXPECT_EQ(back[i].second.dtype(), sd[i].second.dtype()) << sd[i].first;
    EXPECT_EQ(back[i].second.sizes(), sd[i].second.sizes()) << sd[i].first;
    EXPECT_TRUE(equal(back[i].second, sd[i].second)) << sd[i].first;
  }
}

TEST(StateFile, ModuleSaveLoadGivesIdenticalOutputs) {
  Generator g1(1), g2(2);
  MLP a(MLPOptions{.sizes = {5, 7, 3}, .generator = &g1});
  MLP b(MLPOptions{.sizes = {5, 7, 3}, .generator = &g2});
  Tensor x = randn({4, 5}, &g1);
  const std::string path = temp_path("mlp.gw");
  save(a, path);
  EXPECT_FALSE(equal(a(x), b(x)));
  load(b, path);
  EXPECT_TRUE(equal(a(x), b(x)));
  MLP other(MLPOptions{.sizes = {5, 8, 3}});
  const std::string msg = error_of([&] { load(other, path); });
  EXPECT_THAT(msg, HasSubstr(path));
  EXPECT_THAT(msg, HasSubstr("'0.weight' has shape [7, 5], the module expects [8, 5]"));
  EXPECT_THAT(msg, HasSubstr("'2.weight' has shape [3, 7], the module expects [3, 8]"));
  std::remove(path.c_str());
}

// CRC-32 (IEEE, reflected, as zlib), bit by bit: an independent check of the file's sum.
uint32_t reference_crc32(const std::string& bytes) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char byte : bytes) {
    c ^= byte;
    for (int k = 0; k < 8; ++k)
      c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(StateFile, ImageIsHeaderThenNameWireMetaAndDataPerEntry) {
  EXPECT_EQ(reference_crc32("123456789"), 0xCBF43926u);  // the CRC-32 check value
  const std::string image = serialize({{"a", tensor<float>({1.0f, -2.0f})}});
  std::string expected("GWSTATE\0", 8);
  expected += std::string("\x02\0\0\0", 4);          // version 2
  expected += std::string("\x01\0\0\0\0\0\0\0", 8);  // one entry
  expected += std::string("\x01\0\0\0", 4) + "a";    // name
  // tensor/wire.h metadata: version 1, float32 (0), cpu (0), index 0, ndim 1,
  // size zigzag(2) = 4, stride zigzag(1) = 2, offset 0.
  expected += std::string("\x01\x00\x00\x00\x01\x04\x02\x00", 8);
  expected += std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0", 8);  // 1.0f, -2.0f
  const uint32_t crc = reference_crc32(expected);
  for (int k = 0; k < 4; ++k)
    expected.push_back(static_cast<char>((crc >> (8 * k)) & 0xFF));
  EXPECT_EQ(image, expected);
}

TEST(StateFile, DamagedFilesAreRejectedWithTheirName) {
  Linear fc(3, 2);
  const std::string image = serialize(fc.state_dict());
  // Every truncation is an error, never a crash.
  for (size_t n = 0; n < image.size(); ++n) {
    const std::string msg = error_of([&] { deserialize(image.substr(0, n), "cut.gw"); });
    EXPECT_THAT(msg, HasSubstr("cut.gw")) << "length " << n;
  }
  std::string bad = image;
  bad[0] = 'X';
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("bad magic"));
  bad = image;
  bad[8] = 9;
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("unsupported format version 9"));
  bad[8] = 1;  // the format before the wire encoding
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("unsupported format version 1"));
  bad = image;
  bad[image.size() - 10] ^= 0x40;  // a data byte of the bias
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("checksum mismatch"));
  bad = image;
  bad[12] = 3;  // entry count 3 instead of 2: the file ends too early
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("truncated"));
  bad = image;
  bad[12] = 1;  // entry count 1: the second entry is left over
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("unexpected bytes"));
  // The first entry's metadata starts after the header (20 bytes) and "weight" (4 + 6):
  // version, dtype, device type, device index, ndim, sizes [2, 3], strides [3, 1], offset.
  const size_t meta = 8 + 4 + 8 + 4 + 6;
  ASSERT_EQ(image.substr(meta, 10), std::string("\x01\x00\x00\x00\x02\x04\x06\x06\x02\x00", 10));
  bad = image;
  bad[meta + 1] = 42;
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }),
              HasSubstr("entry 0 'weight': decode_tensor_meta: dtype code 42 is out of range"));
  bad = image;
  bad[meta + 4] = 65;  // ndim
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("ndim 65 exceeds the limit"));
  bad = image;
  bad[meta + 5] = 0x7e;  // sizes[0] = 63: 63 x 3 floats do not fit in what is left
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("over the limit of"));
  bad = image;
  bad[meta + 5] = 0x03;  // sizes[0] = -2
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }), HasSubstr("size[0] is negative (-2)"));
  bad = image;
  bad[meta + 7] = 0x02;  // strides[0] = 1: a transposed layout
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }),
              HasSubstr("a state file holds contiguous tensors"));
  bad = image;
  bad[meta + 2] = 1;  // device type cuda
  EXPECT_THAT(error_of([&] { deserialize(bad, "f"); }),
              HasSubstr("stored on cuda:0; a state file holds cpu tensors"));
  EXPECT_THAT(error_of([] { load(temp_path("does_not_exist.gw")); }), HasSubstr("cannot open"));
}

}  // namespace
}  // namespace gradwire::nn
