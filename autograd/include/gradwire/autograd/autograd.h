// gradwire::autograd: recording of differentiable tensor ops, the backward engine, grad
// mode, tensor and post-accumulate-grad hooks, and grad(). See docs/autograd.md.
//
// Example:
//   Tensor w = randn({3, 2}, nullptr, kFloat64).set_requires_grad();
//   Tensor loss = mm(x, w).relu().sum();
//   loss.backward();
//   Tensor g = w.grad();
#pragma once

#include "gradwire/autograd/accumulate_grad.h"
#include "gradwire/autograd/engine.h"
#include "gradwire/autograd/gradient_sink.h"
#include "gradwire/autograd/graph_task.h"
#include "gradwire/autograd/grad_mode.h"
#include "gradwire/autograd/node.h"
#include "gradwire/autograd/saved_variable.h"
#include "gradwire/autograd/variable.h"
#include "gradwire/tensor/autograd_hooks.h"
#include "gradwire/tensor/ops.h"
