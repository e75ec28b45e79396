// Grad mode: whether operations record a backward graph on the calling thread.
//
// Grad mode is per thread (as in PyTorch), so that an optimizer step under a NoGradGuard
// on one thread does not stop a forward pass on another from recording. It is one of the
// documented exceptions to the rule of a single thread-local, the dist-autograd context id
// (docs/threads.md, "Thread-locals"): the switch itself lives in tensor/ (autograd_hooks.h)
// because tensor/'s frontends read it. The engine runs backward formulas with grad mode
// off (no higher-order graphs).
//
// Example:
//   { gradwire::autograd::NoGradGuard no_grad; w.sub_(w.grad() * lr); }  // not recorded
#pragma once

#include "gradwire/tensor/autograd_hooks.h"

namespace gradwire::autograd {

struct GradMode {
  static bool is_enabled() { return is_grad_enabled(); }
  static void set_enabled(bool enabled) { set_grad_enabled(enabled); }
};

// Sets grad mode for a scope and restores the previous mode on exit.
class AutoGradMode {
 public:
  explicit AutoGradMode(bool enabled) : previous_(GradMode::is_enabled()) {
    GradMode::set_enabled(enabled);
  }
  ~AutoGradMode() { GradMode::set_enabled(previous_); }
  AutoGradMode(const AutoGradMode&) = delete;
  AutoGradMode& operator=(const AutoGradMode&) = delete;

 private:
  bool previous_;
};

// Disables recording in a scope (torch.no_grad()).
class NoGradGuard : public AutoGradMode {
 public:
  NoGradGuard() : AutoGradMode(false) {}
};

// Enables recording in a scope, e.g. inside a NoGradGuard (torch.enable_grad()).
class EnableGradGuard : public AutoGradMode {
 public:
  EnableGradGuard() : AutoGradMode(true) {}
};

}  // namespace gradwire::autograd
