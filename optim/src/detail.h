// Private helpers shared by the optimizers: argument checks, the state-dict reader, the
// hyperparameter entries of a saved optimizer, and the fused CPU update loops.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "gradwire/core/error.h"
#include "gradwire/optim/optimizer.h"

namespace gradwire::optim::detail {

// Shared checks of the functional steps: params and grads pair up (same count, each grad
// undefined or shaped and typed like its param), and the state holds `state_size`
// entries (0 meaning "fresh", resized by the caller). `op` names the step in messages.
void check_step_args(const char* op, const std::vector<Tensor>& params,
                     const std::vector<Tensor>& grads, size_t state_size);
// Checks a parameter list given to an optimizer object.
void check_params(const char* op, const std::vector<Tensor>& params, bool need_requires_grad);

std::string state_key(size_t i, const std::string& field);

// The entries that make a state dict a whole optimizer: "type" (the kind's name as a 1-d
// uint8 tensor of its characters), then "hyper.<name>" per hyperparameter (0-d float64,
// or 0-d bool for switches such as nesterov).
void put_type(StateDict& out, const std::string& type_name);
void put_hyper(StateDict& out, const char* name, double value);
void put_hyper(StateDict& out, const char* name, bool value);

// Reads a state dict, collecting every problem (missing, unexpected, wrong shape, dtype or
// type name) so that they can be reported at once, before anything is changed.
class StateReader {
 public:
  StateReader(const char* op, const StateDict& state, const std::vector<Tensor>& params);

  // ---- per-parameter entries "state.<i>.<field>"
  // Whether any entry "state.<i>.*" exists (a parameter never stepped has none).
  bool has(size_t i) const;
  // The entry, checked to be shaped and typed like param i, as a private contiguous copy
  // on the parameter's device; undefined when absent and !required (an absent required
  // entry is an error).
  Tensor tensor(size_t i, const std::string& field, bool required);
  // A 0-d int64 step count >= 0; absent counts as an error.
  int64_t step(size_t i);

  // ---- the optimizer's own entries
  // Checks that "type" names `expected`.
  void type(const std::string& expected);
  // "hyper.<name>": a one-element float64 (number) or bool (flag) tensor. On a problem the
  // error is recorded and `fallback` returned.
  double number(const char* name, double fallback);
  bool flag(const char* name, bool fallback);
  // Marks "type" and "hyper.*" as read without checking them: the per-kind states
  // (SGDState, ...) load only "state.*" and leave the rest to their optimizer.
  void skip_optimizer_entries();

  bool ok() const { return errors_.empty(); }
  // Throws InvalidArgument listing every problem (and every entry never read).
  void finish();

 private:
  const Tensor* find(const std::string& key);

  const char* op_;
  const StateDict& state_;
  const std::vector<Tensor>& params_;
  std::vector<bool> used_;
  std::vector<std::string> errors_;
};

// ---- sparse-rows gradients (sparse_steps.cc): each update touches only the gradient's rows,
// coalesced first, with the dense step's arithmetic on each touched element.
// InvalidArgument "<op>: parameter <i> (shape ...) has a sparse-rows gradient, <why>".
[[noreturn]] void refuse_sparse(const char* op, size_t i, const Tensor& param,
                                const std::string& why);
[[noreturn]] void refuse_dense(const char* op, size_t i, const Tensor& param,
                               const std::string& why);
struct SparseRowsGrad {
  Tensor index;   // sorted unique rows (int64)
  Tensor values;  // their summed gradients, contiguous
};
SparseRowsGrad coalesced_rows(const Tensor& grad);
// p[rows] -= lr * g
void sgd_sparse_update(const Tensor& param, const Tensor& grad, double lr);
// sum[rows] += g^2; p[rows] -= clr * g / (sqrt(sum[rows]) + eps)
void adagrad_sparse_update(const Tensor& param, const Tensor& grad, const Tensor& sum, double clr,
                           double eps);
struct SparseAdamCoefficients {
  double beta1, beta2, eps;
  double step_size;  // lr * sqrt(1 - beta2^t) / (1 - beta1^t)
};
// PyTorch's SparseAdam on the rows: the moments move toward g and g^2, then
// p[rows] -= step_size * m / (sqrt(v) + eps).
void sparse_adam_update(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                        const Tensor& exp_avg_sq, const SparseAdamCoefficients& c);

[[noreturn]] void throw_bad_hyper(const char* op, const std::string& message);

// Runs options.validate() on hyperparameters read from a state dict, rethrowing its
// message as "<op>.load_state_dict: bad hyperparameter: ...".
template <typename Options>
void validate_loaded(const char* op, const Options& options) {
  try {
    options.validate();
  } catch (const InvalidArgument& e) {
    throw_bad_hyper(op, e.what());
  }
}

// ---- a whole optimizer in a state dict. `hypers` is a kind's list of hyperparameters,
// a generic callable hypers(options, f) that calls f(name, field) for each field, so that
// one list serves writing and reading.

// "type", "hyper.*", then `state` (the kind's "state.*" entries).
template <typename Options, typename Hypers>
StateDict save_optimizer(const std::string& type, const Options& options, Hypers hypers,
                         StateDict state) {
  StateDict out;
  put_type(out, type);
  hypers(options, [&](const char* name, auto value) { put_hyper(out, name, value); });
  for (auto& entry : state)
    out.push_back(std::move(entry));
  return out;
}

// Reads type, hyperparameters and state (read_state(reader, params.size()) returns the
// kind's state object), checks them all, and only then assigns `options` and `state`.
template <typename Options, typename State, typename Hypers, typename ReadState>
void load_optimizer(const std::string& type, const StateDict& saved,
                    const std::vector<Tensor>& params, Hypers hypers, ReadState read_state,
                    Options& options, State& state) {
  StateReader reader(type.c_str(), saved, params);
  reader.type(type);
  Options loaded = options;
  hypers(loaded, [&](const char* name, auto& value) {
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(value)>, bool>) {
      value = reader.flag(name, value);
    } else {
      value = reader.number(name, value);
    }
  });
  State loaded_state = read_state(reader, params.size());
  reader.finish();
  validate_loaded(type.c_str(), loaded);
  options = loaded;
  state = std::move(loaded_state);
}

// ---- fused updates: one pass over contiguous float32/float64 CPU data per parameter,
// no temporaries. Each performs the tensor-op formulation's operations, in its order and
// precision (scalars rounded to the element type as the tensor ops round them), so both
// paths give the same bits. fusable() says whether a call may take this path.

// All defined, on the CPU, float32 or float64, of one dtype, contiguous, with as many
// elements as the first, and none overlapping the first (the parameter).
bool fusable(std::initializer_list<const Tensor*> tensors);

struct AdamCoefficients {
  double beta1, beta2, eps, weight_decay;
  bool amsgrad, decoupled;
  double lr;
  double step_size;              // lr / (1 - beta1^t)
  double bias_correction2_sqrt;  // sqrt(1 - beta2^t)
};
// max_exp_avg_sq is read only with amsgrad.
void fused_adam(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq, const AdamCoefficients& c);

struct SGDCoefficients {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
  bool first;  // the momentum buffer is new: it takes the (decayed) gradient as is
};
// momentum_buffer is used only with momentum != 0 (allocated, contiguous, by the caller).
void fused_sgd(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer,
               const SGDCoefficients& c);

struct AdagradCoefficients {
  double clr, eps, weight_decay;
};
void fused_adagrad(const Tensor& param, const Tensor& grad, const Tensor& sum,
                   const AdagradCoefficients& c);
// The same update on the rows `rows` (sorted, unique) of `param` and `sum` only, row k of
// `values` ([rows.size(), ...], contiguous) being row rows[k]'s gradient; `param` and `sum`
// contiguous on the CPU, all three float32 or all float64, no weight decay. Each touched
// element gets the dense loop's arithmetic; the next rows are prefetched, since a large
// table's rows are scattered far beyond the caches.
void fused_adagrad_rows(const Tensor& param, const Tensor& rows, const Tensor& values,
                        const Tensor& sum, const AdagradCoefficients& c);

}  // namespace gradwire::optim::detail
