#include "gradwire/nn/loss.h"

#include "gradwire/core/check.h"
#include "gradwire/tensor/factory.h"
#include "gradwire/tensor/ops.h"

namespace gradwire::nn {
namespace {

Tensor reduce(const Tensor& losses, Reduction reduction) {
  switch (reduction) {
    case Reduction::kNone:
      return losses;
    case Reduction::kMean:
      return mean(losses);
    case Reduction::kSum:
      return sum(losses);
  }
  GRADWIRE_THROW(InvalidArgument) << "loss: unknown reduction " << static_cast<int>(reduction);
}

void check_floating(const Tensor& t, const char* op, const char* what) {
  GRADWIRE_CHECK_ARG(t.defined()) << op << ": undefined " << what;
  GRADWIRE_CHECK_ARG(t.is_floating_point())
      << op << ": " << what << " must be floating, got " << t.dtype();
}

// The class indices of `target` as a [N, 1] int64 column, each checked against [0, C).
Tensor class_column(const Tensor& target, int64_t n, int64_t classes, const char* op) {
  GRADWIRE_CHECK_ARG(target.dtype() == kInt64 || target.dtype() == kInt32)
      << op << ": class-index targets must be int64 or int32, got " << target.dtype();
  GRADWIRE_CHECK_ARG(target.numel() == n)
      << op << ": expected " << n << " targets, got shape " << target.shape_string();
  Tensor t = target.to(kInt64).contiguous().reshape({n, 1});
  const int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    GRADWIRE_CHECK_ARG(p[i] >= 0 && p[i] < classes)
        << op << ": target " << p[i] << " of sample " << i << " is out of range for " << classes
        << " classes";
  }
  return t;
}

}  // namespace

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  check_floating(input, "mse_loss", "input");
  check_floating(target, "mse_loss", "target");
  GRADWIRE_CHECK_ARG(input.sizes() == target.sizes())
      << "mse_loss: input shape " << input.shape_string() << " and target shape "
      << target.shape_string() << " differ";
  return reduce(square(input - target), reduction);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction) {
  check_floating(log_probs, "nll_loss", "input");
  GRADWIRE_CHECK_ARG(target.defined()) << "nll_loss: undefined target";
  if (log_probs.dim() == 1) {  // one sample: [C] with a 0-d target
    GRADWIRE_CHECK_ARG(target.dim() == 0)
        << "nll_loss: a 1-d input [C] takes a 0-d target, got shape " << target.shape_string();
    Tensor l = nll_loss(log_probs.unsqueeze(0), target.reshape({1}), reduction);
    return reduction == Reduction::kNone ? l.squeeze(0) : l;
  }
  GRADWIRE_CHECK_ARG(log_probs.dim() == 2)
      << "nll_loss: expected input [N, C] or [C], got " << log_probs.shape_string();
  const int64_t n = log_probs.size(0), classes = log_probs.size(1);
  GRADWIRE_CHECK_ARG(target.dim() == 1) << "nll_loss: expected a 1-d target of " << n
                                        << " class indices, got shape " << target.shape_string();
  Tensor column = class_column(target, n, classes, "nll_loss");
  Tensor picked = gather(log_probs, 1, column).reshape({n});
  return reduce(-picked, reduction);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction) {
  check_floating(logits, "cross_entropy", "logits");
  GRADWIRE_CHECK_ARG(target.defined()) << "cross_entropy: undefined target";
  GRADWIRE_CHECK_ARG(logits.dim() == 1 || logits.dim() == 2)
      << "cross_entropy: expected logits [N, C] or [C], got " << logits.shape_string();
  const int64_t class_dim = logits.dim() - 1;
  Tensor log_probs = log_softmax(logits, class_dim);
  if (target.is_floating_point()) {
    GRADWIRE_CHECK_ARG(target.sizes() == logits.sizes())
        << "cross_entropy: probability targets must be shaped like the logits "
        << logits.shape_string() << ", got " << target.shape_string();
    Tensor per_sample = -sum(log_probs * target, Shape{class_dim});
    return reduce(per_sample, reduction);
  }
  return nll_loss(log_probs, target, reduction);
}

}  // namespace gradwire::nn
