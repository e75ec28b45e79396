// Tensors shared between LibTorch and gradwire without a copy.
//
//   Tensor g = gradwire::torch::from_torch(t);      // g views t's memory
//   at::Tensor u = gradwire::torch::to_torch(g);    // u views g's memory
//
// from_torch wraps the memory of a strided torch tensor (CPU or CUDA) as a gradwire Tensor;
// to_torch wraps the memory of a strided gradwire Tensor as an at::Tensor. Neither copies:
// the result has the same data pointer, dtype, sizes, strides and storage offset, and sees
// every write made through the other side. The whole storage is shared, so a view (a
// slice, a transpose, an expand, a tensor with a storage offset) converts as the same view
// of the same storage, and converting the base too gives tensors of one storage.
//
// Ownership. The result keeps the other side's storage alive: dropping the source tensor
// (and every other tensor of its storage) first is safe; the memory is freed when the last
// tensor of either library that views it is gone. A torch storage shared with gradwire is
// made non-resizable (as a tensor made by at::from_blob is), because growing it would move
// the memory gradwire views: resize_() to a larger size then throws in torch. A tensor that
// to_torch made and from_torch converts back gives a view of the original gradwire storage.
//
// What is carried and what is not. Data and geometry only: the result has no autograd
// state and requires no grad (the rpc converter, value_convert.h, carries requires_grad),
// and the two libraries keep separate version counters (a write through one side is not
// counted by the other's autograd; the collectives of collectives.h do bump torch's).
//
// Element types. Both libraries have float32 (torch.float), float64 (torch.double),
// float16 (torch.half), bfloat16, int32 (torch.int), int64 (torch.long), uint8 and bool;
// each maps to its namesake. Any other torch dtype (int8, int16, complex, quantized ...)
// is refused.
//
// Devices. CPU tensors map to the CPU. A CUDA tensor maps to the same CUDA device of the
// other library, which needs a gradwire built with CUDA (from_torch) or a LibTorch built
// with CUDA (to_torch), and the device present. Nothing is synchronised: gradwire queues
// its device work on the legacy default stream, which is ordered with torch's default
// stream and with every blocking stream; work queued on a non-blocking torch stream (the
// streams of torch's pool) must be synchronised by the caller before gradwire reads it.
//
// Errors (InvalidArgument, naming the function and what was refused):
//   from_torch: an undefined tensor; a layout other than strided (sparse, sparse CSR,
//   mkldnn, ...), naming it; a quantized or other dtype gradwire lacks, naming it; a
//   tensor without storage (nested, functional wrappers); a tensor with its negative or
//   conjugate bit set (call resolve_neg()/resolve_conj()); a device other than CPU and
//   CUDA, or a CUDA device this gradwire cannot use.
//   to_torch: an undefined tensor; a sparse-rows tensor (convert its indices() and
//   values()); a CUDA tensor when LibTorch has no CUDA.
//
// Thread-safety: to_torch and the dtype functions are pure. from_torch reads the torch
// tensor and, the first time one of its storage's tensors is converted, marks the storage
// non-resizable: a metadata write, which (as any in torch) must not race with another
// first conversion or a resize_ of that storage on another thread; later conversions only
// read. The tensors returned follow the usual rule of both libraries (concurrent writes to
// one storage are the caller's race).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <optional>
#include <string>

#include "gradwire/tensor/tensor.h"

namespace gradwire::torch {

// The gradwire dtype of a torch scalar type; nullopt for a type gradwire lacks.
std::optional<DType> dtype_from_torch(c10::ScalarType type);
// The torch scalar type of a gradwire dtype (every gradwire dtype has one).
c10::ScalarType dtype_to_torch(DType dtype);
// "torch.int8 (Char)": how messages name a torch scalar type.
std::string torch_dtype_name(c10::ScalarType type);

// A gradwire Tensor viewing `t`'s memory (see the head of this file). Throws
// InvalidArgument for what it cannot share.
Tensor from_torch(const at::Tensor& t);

// An at::Tensor viewing `t`'s memory (see the head of this file). Throws InvalidArgument
// for what it cannot share.
at::Tensor to_torch(const Tensor& t);

}  // namespace gradwire::torch
