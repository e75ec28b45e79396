// Compact wire description of a tensor (dtype, shape, strides, device) that rpc/ and
// c10d/ carry next to the raw bytes.
//
// Encoding (version 1), all integers as unsigned LEB128 varints, signed ones zig-zagged:
//   version(=1) dtype device_type device_index ndim size[0..ndim) stride[0..ndim) offset
// The element bytes travel separately. decode() validates everything it reads: version,
// dtype and device ranges, ndim <= kMaxWireDims, sizes non-negative, the element count and
// the byte span bounded by `max_bytes`, strides that keep every element inside that span,
// and no trailing or truncated varints — a malformed buffer is an InvalidArgument naming
// the field, never a crash or a huge allocation.
//
// Thread-safety: pure functions.
//
// Example:
//   std::string buf;  encode_tensor_meta(TensorMeta::of(x), buf);
//   size_t used = 0;  TensorMeta m = decode_tensor_meta(buf.data(), buf.size(), &used);
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gradwire/tensor/tensor.h"

namespace gradwire {

inline constexpr int kWireMetaVersion = 1;
inline constexpr int64_t kMaxWireDims = 64;
inline constexpr int64_t kDefaultMaxWireBytes = int64_t{1} << 40;

struct TensorMeta {
  DType dtype = kFloat32;
  Shape sizes;
  Shape strides;
  int64_t storage_offset = 0;  // elements
  Device device = Device::cpu();

  static TensorMeta of(const Tensor& t);
  int64_t numel() const;
  // Bytes the elements span in a buffer laid out by these strides and offset.
  int64_t span_bytes() const;
  friend bool operator==(const TensorMeta&, const TensorMeta&) = default;
};

// Appends the encoding to `out`.
void encode_tensor_meta(const TensorMeta& meta, std::string& out);
// Decodes one TensorMeta from the front of [data, data+size); `consumed` (optional) gets
// the bytes read. Throws InvalidArgument for malformed input.
TensorMeta decode_tensor_meta(const void* data, size_t size, size_t* consumed = nullptr,
                              int64_t max_bytes = kDefaultMaxWireBytes);

// A CPU tensor with meta's geometry over a fresh buffer of span_bytes() bytes, ready to
// receive the element bytes (meta.device is not applied: the caller moves it).
Tensor empty_for_meta(const TensorMeta& meta);

}  // namespace gradwire
