// Zero-copy exchange with other libraries through DLPack (dlpack.h, version 0.6 ABI).
//
// to_dlpack hands out a DLManagedTensor that views this tensor's memory and keeps the
// storage alive until the consumer calls its deleter. from_dlpack wraps a producer's
// DLManagedTensor as a Tensor without copying and calls the producer's deleter when the
// last view goes away. Strides are in elements on both sides.
//
// Errors: from_dlpack throws InvalidArgument for a null pointer, a dtype gradwire has no
// element type for (naming code, bits and lanes), or a device other than CPU / CUDA; the
// producer's deleter is still called in that case, so nothing leaks.
//
// Thread-safety: as for any tensor; the returned DLManagedTensor is owned by the caller.
//
// Example:
//   DLManagedTensor* m = to_dlpack(x);
//   Tensor y = from_dlpack(m);   // y shares x's memory; m is consumed
#pragma once

#include "gradwire/tensor/tensor.h"

struct DLManagedTensor;  // from <dlpack/dlpack.h>

namespace gradwire {

DLManagedTensor* to_dlpack(const Tensor& t);
// Takes ownership of `managed`.
Tensor from_dlpack(DLManagedTensor* managed);

}  // namespace gradwire
