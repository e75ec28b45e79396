// gradwire::nn: modules, layers, activations, losses, initialisation and state files.
// See docs/nn.md.
//
// Example:
//   Generator gen(0);
//   nn::MLP net(nn::MLPOptions{.sizes = {784, 256, 10}, .generator = &gen});
//   Tensor loss = nn::cross_entropy(net(x), labels);
//   loss.backward();
//   nn::save(net, "net.gw");
#pragma once

#include "gradwire/nn/activation.h"
#include "gradwire/nn/dropout.h"
#include "gradwire/nn/embedding.h"
#include "gradwire/nn/init.h"
#include "gradwire/nn/linear.h"
#include "gradwire/nn/loss.h"
#include "gradwire/nn/module.h"
#include "gradwire/nn/sequential.h"
#include "gradwire/nn/serialize.h"
