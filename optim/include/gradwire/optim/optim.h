// gradwire::optim: SGD, Adam, AdamW and Adagrad as objects, as FunctionalOptimizers and as
// functional steps. See docs/optim.md.
//
// Example:
//   optim::Adam opt(net.parameters(), optim::AdamOptions{.lr = 1e-3});
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
#pragma once

#include "gradwire/optim/adagrad.h"
#include "gradwire/optim/adam.h"
#include "gradwire/optim/functional_optimizer.h"
#include "gradwire/optim/optimizer.h"
#include "gradwire/optim/sgd.h"
