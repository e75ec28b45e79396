// The LibTorch bridge (target gradwire::torch; docs/libtorch.md): torch tensors shared
// with gradwire without a copy (convert.h), as rpc arguments, results and RRef values
// (value_convert.h), in every collective of a ProcessGroup (collectives.h), and
// data-parallel training of a torch::nn::Module with gradwire's DDP Reducer (ddp.h), and
// distributed autograd and the distributed optimizer over LibTorch's graph
// (dist_autograd.h); LibTorch's CPU tensors in gradwire's host memory (memory.h).
//
// Built only where CMake finds LibTorch (GRADWIRE_WITH_TORCH); not part of the umbrella
// header <gradwire/gradwire.h> or target gradwire::gradwire, since it needs LibTorch to
// compile: link gradwire::torch and include this header.
//
// Example:
//   #include <gradwire/torch/bridge.h>
//   gradwire::Tensor g = gradwire::torch::from_torch(at::ones({2, 3}));  // no copy
//   gradwire::torch::all_reduce(*group, grad).wait();
#pragma once

#include "gradwire/torch/collectives.h"
#include "gradwire/torch/convert.h"
#include "gradwire/torch/ddp.h"
#include "gradwire/torch/dist_autograd.h"
#include "gradwire/torch/memory.h"
#include "gradwire/torch/value_convert.h"
