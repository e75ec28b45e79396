// Loss functions (torch.nn.functional.mse_loss, nll_loss, cross_entropy) and their module
// forms (MSELoss, NLLLoss, CrossEntropyLoss).
//
//   mse_loss(input, target)       (input - target)^2, same shapes
//   nll_loss(log_probs, target)   -log_probs[n, target[n]]; log_probs [N, C] (or [C] with
//                                 a 0-d target), target int64/int32 class indices
//   cross_entropy(logits, target) nll_loss(log_softmax(logits, 1), target): the max is
//                                 subtracted inside log_softmax, so logits of 1e4 (or
//                                 -1e4) give finite losses and gradients, unlike
//                                 log(softmax(x)). A floating `target` shaped like the
//                                 logits is read as class probabilities:
//                                 -sum_c target[n, c] * log_softmax(logits)[n, c].
//
// Reduction: kMean (default) averages over the N samples (over every element for MSE),
// kSum adds, kNone returns the per-sample (per-element) losses.
//
// Errors: InvalidArgument for mismatched shapes or dtypes, a class index outside [0, C)
// (naming the sample, the index and C), and non-floating inputs.
//
// Thread-safety: pure functions; safe to call concurrently.
//
// Example:
//   Tensor loss = nn::cross_entropy(net(x), labels);   // labels: int64 [N]
//   loss.backward();
#pragma once

#include "gradwire/nn/module.h"

namespace gradwire::nn {

enum class Reduction { kNone, kMean, kSum };

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction = Reduction::kMean);
Tensor nll_loss(const Tensor& log_probs, const Tensor& target,
                Reduction reduction = Reduction::kMean);
Tensor cross_entropy(const Tensor& logits, const Tensor& target,
                     Reduction reduction = Reduction::kMean);

// Module forms, holding the reduction.
class MSELoss : public Module {
 public:
  explicit MSELoss(Reduction reduction = Reduction::kMean)
      : Module("MSELoss"), reduction_(reduction) {}
  Tensor forward(const Tensor& input, const Tensor& target) const {
    return mse_loss(input, target, reduction_);
  }

 private:
  Reduction reduction_;
};

class NLLLoss : public Module {
 public:
  explicit NLLLoss(Reduction reduction = Reduction::kMean)
      : Module("NLLLoss"), reduction_(reduction) {}
  Tensor forward(const Tensor& log_probs, const Tensor& target) const {
    return nll_loss(log_probs, target, reduction_);
  }

 private:
  Reduction reduction_;
};

class CrossEntropyLoss : public Module {
 public:
  explicit CrossEntropyLoss(Reduction reduction = Reduction::kMean)
      : Module("CrossEntropyLoss"), reduction_(reduction) {}
  Tensor forward(const Tensor& logits, const Tensor& target) const {
    return cross_entropy(logits, target, reduction_);
  }

 private:
  Reduction reduction_;
};

}  // namespace gradwire::nn
