// verify_params_across_ranks: do all ranks hold tensors of the same shapes, in the same
// order?
//
// Data-parallel training keeps one replica of a model per rank and combines gradients
// bucket by bucket, position by position. Replicas built differently (a layer sized from a
// rank-local value, parameters registered in another order) would make every later
// collective combine mismatched buffers, or hang; checking once, when the replicas are
// wrapped, turns that into one clear error. DistributedDataParallel calls this at
// construction.
//
// Each rank encodes a compact signature of its list (the count, then per tensor its dtype,
// number of dimensions and sizes) and the group all-gathers it (two all_gathers: the
// lengths, then the signatures padded to the longest). Every rank then compares every
// rank's signature with rank 0's and, when one differs, every rank throws the same
// InvalidArgument, naming the lowest differing rank, the first differing tensor index, the
// expected and the received dtype and shape, and every rank that differs:
//
//   verify_params_across_ranks (group 'default', rank 0): tensors[3] is float32[4, 6] on
//   rank 1, but float32[4, 5] on rank 0; ranks whose tensors differ from rank 0's: [1]
//
// Undefined tensors take part as "undefined" (the check fails on every rank, so no rank is
// left waiting in a later collective). Devices are not compared: with the NCCL backend
// each rank's tensors rightly sit on its own GPU.
//
// The signature travels on the device of tensors[0] (CPU when the list is empty), which
// must be one the group serves: pass the tensors the group will communicate. A rank that
// passes an empty list to an NCCL group therefore throws at the call.
//
// Thread-safety: a collective of `group`; call it on every rank, in the same order as the
// group's other collectives. It waits for the exchange to complete.
// Errors: InvalidArgument as above (the group stays usable); TimeoutError or NetworkError
// when a rank does not take part within `timeout` (zero: the group's timeout), as any
// collective.
//
// Example:
//   std::vector<Tensor> params = model.parameters();
//   c10d::verify_params_across_ranks(*group, params);   // throws on every rank, or passes
#pragma once

#include <chrono>
#include <vector>

#include "gradwire/c10d/process_group.h"
#include "gradwire/tensor/tensor.h"

namespace gradwire::c10d {

void verify_params_across_ranks(ProcessGroup& group, const std::vector<Tensor>& tensors,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

}  // namespace gradwire::c10d
