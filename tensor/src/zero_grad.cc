#include "gradwire/tensor/zero_grad.h"

#include "gradwire/tensor/autograd_hooks.h"

namespace gradwire {
namespace {

// tensor/ cannot use autograd's NoGradGuard (autograd sits above it); the grad-mode
// switch itself is tensor/'s, so a local guard restores it on every exit.
class GradModeOff {
 public:
  GradModeOff() : previous_(is_grad_enabled()) { set_grad_enabled(false); }
  ~GradModeOff() { set_grad_enabled(previous_); }
  GradModeOff(const GradModeOff&) = delete;
  GradModeOff& operator=(const GradModeOff&) = delete;

 private:
  bool previous_;
};

}  // namespace

void zero_grad(const std::vector<Tensor>& params, bool set_to_none) {
  GradModeOff no_grad;
  for (const Tensor& p : params) {
    if (!p.defined()) continue;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
}

}  // namespace gradwire
