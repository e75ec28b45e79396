// SparseAdam (torch.optim.SparseAdam, 1.13): Adam for sparse-rows gradients, updating only
// the rows a gradient holds (a "lazy" Adam: a row's moments decay only on the steps that
// touch it). The optimizer of large embedding tables (nn::Embedding with sparse = true).
//
// For each parameter p with a sparse-rows gradient g, at step t (per parameter, from 1),
// on the rows r of g (coalesced: duplicates summed) only:
//   m[r] = m[r] + (1 - beta1) (g[r] - m[r])
//   v[r] = v[r] + (1 - beta2) (g[r]^2 - v[r])
//   p[r] = p[r] - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m[r] / (sqrt(v[r]) + eps)
// Every other row of p, m and v is left as it was; m and v are dense (the table's size),
// as in PyTorch.
//
// Errors: validate() throws InvalidArgument for lr < 0, eps < 0 or a beta outside
// [0, 1); a step with a dense gradient throws InvalidArgument naming the parameter (use
// Adam for dense parameters, e.g. in a second optimizer or a param group of its own), before
// any parameter moves; see optimizer.h for the other checks.
//
// Thread-safety: see optimizer.h.
//
// Example:
//   nn::Embedding table(nn::EmbeddingOptions{.num_embeddings = 1'000'000, .embedding_dim = 64,
//                                            .sparse = true});
//   optim::SparseAdam opt(table.parameters(), optim::SparseAdamOptions{.lr = 1e-3});
//   loss.backward();
//   opt.step();  // touches only the rows the batch looked up
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/optimizer.h"

namespace gradwire::optim {

struct SparseAdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  void validate() const;
};

struct SparseAdamParamState {
  int64_t step = 0;
  Tensor exp_avg;     // m, dense
  Tensor exp_avg_sq;  // v, dense
};

struct SparseAdamState {
  std::vector<SparseAdamParamState> params;

  // "state.<i>.step", "state.<i>.exp_avg" and "state.<i>.exp_avg_sq" per stepped parameter.
  StateDict state_dict() const;
  // Replaces the state with the "state.*" entries of `state`, checked against `params`.
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params);
};

void sparse_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      SparseAdamState& state, const SparseAdamOptions& options);

// SparseAdam as a FunctionalOptimizer (functional_optimizer.h); its type name is
// "SparseAdam".
class FunctionalSparseAdam final : public FunctionalOptimizer {
 public:
  explicit FunctionalSparseAdam(const SparseAdamOptions& options = {});

  const std::string& type_name() const override;
  void step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads) override;
  double lr() const override { return options_.lr; }
  void set_lr(double lr) override;
  StateDict state_dict() const override;
  void load_state_dict(const StateDict& state, const std::vector<Tensor>& params) override;

  const SparseAdamOptions& options() const { return options_; }
  void set_options(const SparseAdamOptions& options);
  const SparseAdamState& state() const { return state_; }

 private:
  SparseAdamOptions options_;
  SparseAdamState state_;
};

class SparseAdam : public TypedOptimizer<FunctionalSparseAdam> {
 public:
  using TypedOptimizer::TypedOptimizer;
};

}  // namespace gradwire::optim
