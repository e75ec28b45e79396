// gradwire::optim: SGD, Adam, AdamW and Adagrad as objects (with parameter groups), as
// FunctionalOptimizers and as functional steps, and learning-rate schedules. See
// docs/optim.md.
//
// Example:
//   optim::Adam opt(net.parameters(), optim::AdamOptions{.lr = 1e-3});
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
//   optim::StepLR sched(opt, /*step_size=*/30, /*gamma=*/0.1);  // after each epoch: sched.step()
#pragma once

#include "gradwire/optim/adagrad.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/lr_scheduler.h"
#include "gradwire/optim/lr_target.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/optim/sgd.h"
#include "gradwire/optim/sparse_adam.h"
