// Saving and loading state dicts (of modules and optimizers) in gradwire's binary format.
//
// Format, version 2 (docs/nn.md has the full table). Header integers are little-endian:
//   magic    8 bytes  "GWSTATE\0"
//   version  u32      2
//   count    u64      number of entries
//   count entries, each:
//     name_len u32, name (name_len bytes of UTF-8, at most 65536)
//     meta     the tensor's wire metadata (tensor/wire.h: varints for dtype, device, sizes,
//              strides, offset), always cpu, contiguous, offset 0
//     data     numel * element_size bytes, row-major, little-endian elements
//   crc32    u32      zlib's crc32 of every byte before it
// Each tensor is described by the same encoding rpc/ and c10d/ put on the wire, so there
// is one tensor description to validate, not two.
//
// load() reads the whole file and validates before it allocates: a wrong magic, an
// unsupported version (version 1 files, from before the wire encoding, included), a
// checksum mismatch, a truncated entry, an oversized name, malformed metadata (bad dtype
// code, rank over 64, negative size, a device other than cpu, a non-contiguous layout),
// data that does not fit the file, or bytes after the last entry each throw
// InvalidArgument naming the file, the entry and the problem (never a crash, never a
// huge allocation). load(module, path) then hands the entries to Module::load_state_dict,
// which reports every missing or unexpected name and every dtype or shape mismatch by name.
// Tensors are written from their CPU, contiguous form; loaded tensors are CPU tensors.
//
// Thread-safety: the functions are reentrant; saving a module while another thread
// updates its parameters saves a torn state.
//
// Example:
//   nn::save(model, "model.gw");
//   nn::load(model2, "model.gw");                 // same architecture
//   nn::save(optimizer.state_dict(), "sgd.gw");   // optim state dicts use the same type
//   optimizer.load_state_dict(nn::load("sgd.gw"));
#pragma once

#include <string>
#include <string_view>

#include "gradwire/nn/module.h"

namespace gradwire::nn {

inline constexpr uint32_t kStateFormatVersion = 2;

// The file image of `state` (what save() writes).
std::string serialize(const StateDict& state);
// Parses a file image; `source` names it in error messages.
StateDict deserialize(std::string_view bytes, const std::string& source = "<memory>");

// Writes atomically enough for a checkpoint: to `path`.tmp, then renamed over `path`.
// Throws Error when the file cannot be written.
void save(const StateDict& state, const std::string& path);
StateDict load(const std::string& path);

// module.state_dict() to a file, and back with strict name/dtype/shape checks.
void save(const Module& module, const std::string& path);
void load(Module& module, const std::string& path);

}  // namespace gradwire::nn
