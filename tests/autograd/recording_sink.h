// A GradientSink that keeps every (leaf, gradient) pair it receives, for the engine tests.
#pragma once

#include <utility>
#include <vector>

#include "gradwire/autograd/gradient_sink.h"
#include "gradwire/core/mutex.h"

namespace gradwire::test {

class RecordingSink : public autograd::GradientSink {
 public:
  void accumulate(const Tensor& leaf, const Tensor& grad) override {
    MutexLock lock(mutex_);
    grads_.emplace_back(leaf, grad);
  }
  std::vector<std::pair<Tensor, Tensor>> take() {
    MutexLock lock(mutex_);
    return std::move(grads_);
  }

 private:
  Mutex mutex_;
  std::vector<std::pair<Tensor, Tensor>> grads_ GRADWIRE_GUARDED_BY(mutex_);
};

}  // namespace gradwire::test
