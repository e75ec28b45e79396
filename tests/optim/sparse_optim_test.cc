// Optimizers on sparse-rows gradients (nn::Embedding with sparse = true): SGD, Adagrad and
// SparseAdam against PyTorch 1.13's sparse=True runs (fixtures/sparse_steps.txt, written by
// fixtures/make_sparse_fixtures.py), a sparse step against the dense step of the same
// optimizer on the same rows (float64, 1e-12), rows a gradient does not hold left bit for
// bit, the functional and object forms, SparseAdam's state dict, and every refusal (SGD
// with momentum or weight decay, Adagrad with weight decay, Adam, SparseAdam on a dense
// gradient), each naming the parameter and moving nothing.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/autograd/autograd.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/optim/optim.h"
#include "gradwire/optim/sparse_adam.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"
#include "gradwire/tensor/sparse.h"
#include "support/error_text.h"

namespace gradwire {
namespace {

using test::error_text;

struct Fixture {
  std::vector<double> table;
  std::vector<std::vector<int64_t>> batches;
  std::vector<std::vector<double>> w, v;
  struct Case {
    std::string kind;
    std::map<std::string, double> options;
    std::vector<std::vector<double>> steps;
  };
  std::map<std::string, Case> cases;
};

std::vector<double> numbers(std::istringstream& in) {
  std::vector<double> out;
  double x;
  while (in >> x)
    out.push_back(x);
  return out;
}

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    std::ifstream file(std::string(GRADWIRE_TEST_SOURCE_DIR) + "/fixtures/sparse_steps.txt");
    EXPECT_TRUE(file.good()) << "fixtures/sparse_steps.txt is missing";
    std::string line, current;
    while (std::getline(file, line)) {
      std::istringstream in(line);
      std::string tag;
      in >> tag;
      if (tag == "table") {
        out.table = numbers(in);
      } else if (tag == "batch") {
        int k;
        in >> k;
        std::vector<int64_t> b;
        int64_t i;
        while (in >> i)
          b.push_back(i);
        out.batches.push_back(b);
      } else if (tag == "w" || tag == "v") {
        int k;
        in >> k;
        (tag == "w" ? out.w : out.v).push_back(numbers(in));
      } else if (tag == "case") {
        std::string kind, kv;
        in >> current >> kind;
        out.cases[current].kind = kind;
        while (in >> kv) {
          const size_t eq = kv.find('=');
          out.cases[current].options[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
        }
      } else if (tag == "step") {
        int k;
        in >> k;
        out.cases[current].steps.push_back(numbers(in));
      }
    }
    return out;
  }();
  return f;
}

// A float64 sparse embedding holding the fixture's table.
std::unique_ptr<nn::Embedding> table(bool sparse = true) {
  auto emb = std::make_unique<nn::Embedding>(nn::EmbeddingOptions{
      .num_embeddings = 6, .embedding_dim = 3, .dtype = kFloat64, .sparse = sparse});
  autograd::NoGradGuard no_grad;
  Tensor w = emb->weight();
  w.copy_(tensor<double>(fixture().table).view({6, 3}));
  return emb;
}

// Step k's loss: sum(W_k * e^2) + sum(V_k * e), e = the looked-up rows.
Tensor loss_at(nn::Embedding& emb, size_t k) {
  const Fixture& f = fixture();
  const int64_t n = static_cast<int64_t>(f.batches[k].size());
  const Tensor e = emb(tensor<int64_t>(f.batches[k]));
  const Tensor w = tensor<double>(f.w[k]).view({n, 3}), v = tensor<double>(f.v[k]).view({n, 3});
  return add(sum(mul(w, mul(e, e))), sum(mul(v, e)));
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double tol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_NEAR(got[i], want[i], tol) << what << ", element " << i;
}

// Runs the fixture's steps with `opt` over `emb` and checks each against PyTorch's.
void run_case(const std::string& name, nn::Embedding& emb, optim::Optimizer& opt) {
  const Fixture::Case& c = fixture().cases.at(name);
  ASSERT_EQ(c.steps.size(), fixture().batches.size());
  for (size_t k = 0; k < c.steps.size(); ++k) {
    opt.zero_grad();
    loss_at(emb, k).backward();
    ASSERT_TRUE(emb.weight().grad().is_sparse());
    opt.step();
    expect_close(emb.weight().to_vector<double>(), c.steps[k], 1e-12,
                 name + " after step " + std::to_string(k + 1));
  }
}

TEST(SparseOptim, SgdMatchesPyTorch) {
  auto emb = table();
  optim::SGD opt(emb->parameters(),
                 optim::SGDOptions{.lr = fixture().cases.at("sgd").options.at("lr")});
  run_case("sgd", *emb, opt);
}

TEST(SparseOptim, AdagradMatchesPyTorch) {
  for (const std::string name : {"adagrad", "adagrad_decay"}) {
    const auto& o = fixture().cases.at(name).options;
    optim::AdagradOptions options{.lr = o.at("lr")};
    if (o.count("lr_decay")) options.lr_decay = o.at("lr_decay");
    if (o.count("initial_accumulator_value"))
      options.initial_accumulator_value = o.at("initial_accumulator_value");
    if (o.count("eps")) options.eps = o.at("eps");
    auto emb = table();
    optim::Adagrad opt(emb->parameters(), options);
    run_case(name, *emb, opt);
  }
}

TEST(SparseOptim, SparseAdamMatchesPyTorch) {
  for (const std::string name : {"sparse_adam", "sparse_adam_betas"}) {
    const auto& o = fixture().cases.at(name).options;
    optim::SparseAdamOptions options{.lr = o.at("lr")};
    if (o.count("beta1")) options.beta1 = o.at("beta1");
    if (o.count("beta2")) options.beta2 = o.at("beta2");
    if (o.count("eps")) options.eps = o.at("eps");
    auto emb = table();
    optim::SparseAdam opt(emb->parameters(), options);
    run_case(name, *emb, opt);
  }
}

// The same optimizer over a sparse and a dense copy of the table, same batches.
template <typename Opt, typename Options>
void expect_sparse_equals_dense(const Options& options) {
  auto sparse = table(true), dense = table(false);
  Opt opt_s(sparse->parameters(), options), opt_d(dense->parameters(), options);
  for (size_t k = 0; k < fixture().batches.size(); ++k) {
    opt_s.zero_grad();
    opt_d.zero_grad();
    loss_at(*sparse, k).backward();
    loss_at(*dense, k).backward();
    ASSERT_TRUE(sparse->weight().grad().is_sparse());
    ASSERT_FALSE(dense->weight().grad().is_sparse());
    opt_s.step();
    opt_d.step();
    expect_close(sparse->weight().to_vector<double>(), dense->weight().to_vector<double>(), 1e-12,
                 "step " + std::to_string(k + 1));
  }
  // Row 5 is never looked up: untouched, bit for bit.
  EXPECT_EQ(sparse->weight()[5].to_vector<double>(), (std::vector<double>{0.1, 0.2, 0.3}));
}

TEST(SparseOptim, SparseStepEqualsTheDenseStepOnTheSameRows) {
  expect_sparse_equals_dense<optim::SGD>(optim::SGDOptions{.lr = 0.1});
  expect_sparse_equals_dense<optim::Adagrad>(optim::AdagradOptions{.lr = 0.1, .lr_decay = 0.05});
  expect_sparse_equals_dense<optim::Adagrad>(
      optim::AdagradOptions{.lr = 0.2, .initial_accumulator_value = 0.3, .eps = 1e-6});
}

TEST(SparseOptim, SparseAdamIsLazyAndRoundTripsItsState) {
  auto emb = table();
  optim::SparseAdam opt(emb->parameters(), optim::SparseAdamOptions{.lr = 0.1});
  loss_at(*emb, 0).backward();  // rows 1 and 3 only
  opt.step();
  const optim::SparseAdamParamState& s = opt.state().params.at(0);
  EXPECT_EQ(s.step, 1);
  for (int64_t row : {0, 2, 4, 5}) {
    EXPECT_EQ(s.exp_avg[row].to_vector<double>(), std::vector<double>(3, 0.0)) << row;
    EXPECT_EQ(s.exp_avg_sq[row].to_vector<double>(), std::vector<double>(3, 0.0)) << row;
  }
  // The whole optimizer through its state dict, rebuilt by kind.
  auto copy = table();
  {
    autograd::NoGradGuard no_grad;
    Tensor w = copy->weight();
    w.copy_(emb->weight());
  }
  auto rebuilt = optim::make_functional_optimizer(opt.state_dict(), copy->parameters());
  EXPECT_EQ(rebuilt->type_name(), "SparseAdam");
  EXPECT_DOUBLE_EQ(rebuilt->lr(), 0.1);
  opt.zero_grad();
  loss_at(*emb, 1).backward();
  opt.step();
  loss_at(*copy, 1).backward();
  rebuilt->step(copy->parameters(), {copy->weight().grad()});
  EXPECT_EQ(copy->weight().to_vector<double>(), emb->weight().to_vector<double>());
}

TEST(SparseOptim, FunctionalFormsTakeSparseGradients) {
  auto a = table(), b = table();
  optim::Adagrad object(a->parameters(), optim::AdagradOptions{.lr = 0.1});
  optim::FunctionalAdagrad functional(optim::AdagradOptions{.lr = 0.1});
  for (size_t k = 0; k < 2; ++k) {
    object.zero_grad();
    b->zero_grad();
    loss_at(*a, k).backward();
    loss_at(*b, k).backward();
    object.step();
    functional.step(b->parameters(), {b->weight().grad()});
  }
  EXPECT_EQ(a->weight().to_vector<double>(), b->weight().to_vector<double>());
}

TEST(SparseOptim, OptimizersThatCannotTakeThemRefuseNamingTheParameter) {
  auto emb = table();
  const Tensor dense_param = zeros({2}, kFloat64).set_requires_grad();
  const std::vector<double> before = emb->weight().to_vector<double>();
  const auto refused = [&](optim::Optimizer& opt) {
    opt.zero_grad();
    sum(dense_param).backward();
    loss_at(*emb, 0).backward();
    return error_text<InvalidArgument>([&] { opt.step(); });
  };
  // The table is parameter 1: parameter 0 (dense) must not have moved either.
  const std::vector<Tensor> params{dense_param, emb->weight()};
  optim::SGD momentum(params, optim::SGDOptions{.lr = 0.1, .momentum = 0.9});
  EXPECT_NE(refused(momentum).find("sgd_step: parameter 1 (shape [6, 3]) has a sparse-rows "
                                   "gradient, which SGD takes only without momentum"),
            std::string::npos);
  optim::SGD decay(params, optim::SGDOptions{.lr = 0.1, .weight_decay = 0.01});
  EXPECT_NE(refused(decay).find("weight_decay 0.01"), std::string::npos);
  optim::Adagrad adagrad(params, optim::AdagradOptions{.lr = 0.1, .weight_decay = 0.1});
  EXPECT_NE(refused(adagrad).find("adagrad_step: parameter 1 (shape [6, 3]) has a sparse-rows "
                                  "gradient, which Adagrad takes only without weight decay"),
            std::string::npos);
  optim::Adam adam(params, optim::AdamOptions{.lr = 0.1});
  EXPECT_NE(refused(adam).find("adam_step: parameter 1 (shape [6, 3]) has a sparse-rows "
                               "gradient, which Adam and AdamW do not take; use SparseAdam"),
            std::string::npos);
  optim::SparseAdam sparse_adam(params, optim::SparseAdamOptions{});
  EXPECT_NE(refused(sparse_adam)
                .find("sparse_adam_step: parameter 0 (shape [2]) has a dense "
                      "gradient, which SparseAdam does not take"),
            std::string::npos);
  EXPECT_EQ(emb->weight().to_vector<double>(), before);
  EXPECT_EQ(dense_param.to_vector<double>(), (std::vector<double>{0, 0}));
  EXPECT_NE(error_text<InvalidArgument>([] {
              optim::SparseAdamOptions{.beta1 = 1.0}.validate();
            }).find("beta1 must be in [0, 1)"),
            std::string::npos);
}

TEST(SparseOptim, AStepOnALargeTableTouchesOnlyTheBatchRows) {
  // 200k rows: every row the batch missed keeps its bits, and the optimizer state of the
  // untouched rows stays at its initial value.
  nn::Embedding emb(
      nn::EmbeddingOptions{.num_embeddings = 200'000, .embedding_dim = 4, .sparse = true});
  const Tensor before = emb.weight().clone();
  optim::Adagrad opt(emb.parameters(), optim::AdagradOptions{.lr = 0.5});
  const Tensor rows = tensor<int64_t>({7, 199'999, 7, 123'456});
  sum(emb(rows)).backward();
  opt.step();
  const Tensor changed = sum(ne(emb.weight(), before).to(kInt64), {1});
  const std::vector<int64_t> per_row = changed.to_vector<int64_t>();
  int64_t rows_changed = 0;
  for (int64_t r = 0; r < 200'000; ++r)
    rows_changed += per_row[static_cast<size_t>(r)] > 0 ? 1 : 0;
  EXPECT_EQ(rows_changed, 3);
  EXPECT_EQ(per_row[7], 4);
  EXPECT_EQ(per_row[123'456], 4);
  EXPECT_EQ(per_row[199'999], 4);
  const Tensor& state_sum = opt.state().params.at(0).sum;
  EXPECT_EQ(sum(state_sum).item<double>(), 4 * (4.0 + 1 + 1));  // row 7 saw 2, the others 1
}

}  // namespace
}  // namespace gradwire
