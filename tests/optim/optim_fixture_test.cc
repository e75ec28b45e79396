// Optimizers against PyTorch 1.13: fixtures/optimizer_steps.txt holds the parameter after
// each of 5 steps of torch.optim.{SGD, Adam, AdamW, Adagrad} on the same float64 problem
// (fixtures/make_fixtures.py made it). Both the object form and the functional step are
// run (the functional form through FunctionalOptimizer). Tolerance: |ours - torch| <= 1e-12 + 1e-10
// |torch| (the formulas are the same float64 operations in the same order; only pow/sqrt rounding
// can differ).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gradwire/autograd/autograd.h"
#include "gradwire/optim/optim.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::optim {
namespace {

struct Case {
  std::string name;
  std::string kind;
  std::map<std::string, double> options;
  std::vector<std::vector<double>> steps;  // steps[0] is the initial parameter
};

std::vector<Case> read_fixtures() {
  const std::string dir = GRADWIRE_TEST_SOURCE_DIR;
  std::ifstream f(dir + "/fixtures/optimizer_steps.txt");
  EXPECT_TRUE(f.good()) << "cannot open " << dir << "/fixtures/optimizer_steps.txt";
  std::vector<Case> cases;
  std::string line;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    std::string tag;
    in >> tag;
    if (tag == "case") {
      Case c;
      in >> c.name >> c.kind;
      std::string kv;
      while (in >> kv) {
        const auto eq = kv.find('=');
        c.options[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
      }
      cases.push_back(c);
    } else if (tag == "step") {
      int k;
      in >> k;
      std::vector<double> values;
      double v;
      while (in >> v)
        values.push_back(v);
      cases.back().steps.push_back(values);
    }
  }
  return cases;
}

double opt(const Case& c, const std::string& key, double fallback) {
  auto it = c.options.find(key);
  return it == c.options.end() ? fallback : it->second;
}

std::unique_ptr<Optimizer> make(const Case& c, Tensor p) {
  if (c.kind == "SGD") {
    return std::make_unique<SGD>(
        std::vector<Tensor>{p},
        SGDOptions{opt(c, "lr", 0), opt(c, "momentum", 0), opt(c, "dampening", 0),
                   opt(c, "weight_decay", 0), opt(c, "nesterov", 0) != 0});
  }
  if (c.kind == "Adam") {
    return std::make_unique<Adam>(
        std::vector<Tensor>{p},
        AdamOptions{opt(c, "lr", 1e-3), opt(c, "beta1", 0.9), opt(c, "beta2", 0.999),
                    opt(c, "eps", 1e-8), opt(c, "weight_decay", 0), opt(c, "amsgrad", 0) != 0});
  }
  if (c.kind == "AdamW") {
    return std::make_unique<AdamW>(
        std::vector<Tensor>{p},
        AdamWOptions{opt(c, "lr", 1e-3), opt(c, "beta1", 0.9), opt(c, "beta2", 0.999),
                     opt(c, "eps", 1e-8), opt(c, "weight_decay", 1e-2), opt(c, "amsgrad", 0) != 0});
  }
  EXPECT_EQ(c.kind, "Adagrad");
  return std::make_unique<Adagrad>(
      std::vector<Tensor>{p},
      AdagradOptions{opt(c, "lr", 1e-2), opt(c, "lr_decay", 0), opt(c, "weight_decay", 0),
                     opt(c, "initial_accumulator_value", 0), opt(c, "eps", 1e-10)});
}

// The functional form of the same case: the object's FunctionalOptimizer kind with the
// same options, made fresh (make()'s option mapping is reused through a state dict, which
// carries the kind and the hyperparameters).
std::unique_ptr<FunctionalOptimizer> make_functional(const Case& c) {
  Tensor dummy = zeros({1}, kFloat64).set_requires_grad();
  const StateDict hypers = make(c, dummy)->state_dict();  // no step yet: no "state.*"
  return make_functional_optimizer(hypers, {dummy});
}

const Tensor& weights() {
  static const Tensor w = tensor<double>({1.0, 0.5, 2.0, 0.1, 3.0, 0.75}, {2, 3});
  return w;
}
const Tensor& linear_terms() {
  static const Tensor v = tensor<double>({0.3, -0.2, 0.0, 1.0, -1.0, 0.5}, {2, 3});
  return v;
}

void expect_close(const std::vector<double>& ours, const std::vector<double>& torch,
                  const std::string& where) {
  ASSERT_EQ(ours.size(), torch.size()) << where;
  for (size_t i = 0; i < ours.size(); ++i) {
    EXPECT_NEAR(ours[i], torch[i], 1e-12 + 1e-10 * std::abs(torch[i])) << where << " element " << i;
  }
}

TEST(OptimFixtures, ObjectsMatchPyTorch) {
  const auto cases = read_fixtures();
  ASSERT_EQ(cases.size(), 9u);
  for (const Case& c : cases) {
    ASSERT_EQ(c.steps.size(), 6u) << c.name;
    Tensor p = tensor<double>(c.steps[0], {2, 3}).set_requires_grad();
    auto optimizer = make(c, p);
    for (size_t k = 1; k < c.steps.size(); ++k) {
      optimizer->zero_grad();
      Tensor loss = sum(weights() * p * p) + sum(linear_terms() * p);
      loss.backward();
      optimizer->step();
      expect_close(p.to_vector<double>(), c.steps[k], c.name + " step " + std::to_string(k));
    }
  }
}

TEST(OptimFixtures, FunctionalStepsMatchPyTorch) {
  for (const Case& c : read_fixtures()) {
    std::vector<Tensor> params{tensor<double>(c.steps[0], {2, 3})};
    auto optimizer = make_functional(c);
    EXPECT_EQ(optimizer->type_name(), c.kind);
    for (size_t k = 1; k < c.steps.size(); ++k) {
      // Gradient 2 W p + V, computed by hand: the functional form needs no autograd.
      std::vector<Tensor> grads{weights() * params[0] * 2.0 + linear_terms()};
      optimizer->step(params, grads);
      expect_close(params[0].to_vector<double>(), c.steps[k],
                   c.name + " (functional) step " + std::to_string(k));
    }
  }
}

}  // namespace
}  // namespace gradwire::optim
