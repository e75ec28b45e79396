// Tensor metadata on the wire (wire.h).
//
// Field encodings, in order: version, dtype, device_type, device_index and ndim are plain
// unsigned varints; every size, every stride and the storage offset is a zig-zagged
// signed varint (they are int64_t in TensorMeta, so a negative value is representable and
// rejected by validation rather than wrapping into a huge one). Varints are canonical:
// at most 10 bytes, no bits beyond 64, and no redundant trailing zero groups; encode only
// produces that form and decode accepts only it, so one meta has exactly one encoding.
//
// Trailing bytes: with `consumed` given, decoding stops after one meta and reports how far
// it read (metas can be concatenated with other data); without it the buffer must hold
// exactly one meta, and anything after it is an InvalidArgument.
//
// span_bytes counts from the start of the buffer (element 0) to the end of the highest
// element the geometry reaches; a meta with no elements spans 0 bytes whatever its strides
// and offset.
//
// Every product and sum on untrusted values is checked for int64 overflow before it is
// used, and nothing is allocated while decoding.
#include "gradwire/tensor/wire.h"

#include <cstring>
#include <limits>

#include "gradwire/core/check.h"

namespace gradwire {

namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr uint64_t kMaxDeviceIndex = 32767;  // Device::index is an int16_t

uint64_t zigzag(int64_t v) {
  return (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63);
}

int64_t unzigzag(uint64_t u) {
  return static_cast<int64_t>((u >> 1) ^ (~(u & 1) + 1));
}

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

// Reads canonical LEB128 varints from a bounded buffer, naming the field on failure.
class Reader {
 public:
  Reader(const void* data, size_t size) : data_(static_cast<const uint8_t*>(data)), size_(size) {}

  uint64_t varint(const char* field) {
    const size_t start = pos_;
    uint64_t result = 0;
    for (int i = 0; i < 10; ++i) {
      GRADWIRE_CHECK_ARG(pos_ < size_)
          << "decode_tensor_meta: buffer of " << size_ << " bytes ends inside " << field
          << " (varint starting at byte " << start << ")";
      const uint8_t byte = data_[pos_++];
      // The tenth group holds bit 63 only.
      GRADWIRE_CHECK_ARG(i < 9 || byte <= 1)
          << "decode_tensor_meta: " << field << " at byte " << start << " does not fit in 64 bits";
      result |= static_cast<uint64_t>(byte & 0x7F) << (7 * i);
      if ((byte & 0x80) == 0) {
        GRADWIRE_CHECK_ARG(i == 0 || byte != 0) << "decode_tensor_meta: " << field << " at byte "
                                                << start << " is not minimally encoded";
        return result;
      }
    }
    // Unreachable: the tenth byte either ends the varint or fails the check above.
    GRADWIRE_THROW(InvalidArgument)
        << "decode_tensor_meta: " << field << " at byte " << start << " is longer than 10 bytes";
  }

  int64_t signed_varint(const char* field) { return unzigzag(varint(field)); }

  size_t position() const { return pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

struct Extent {
  int64_t numel;
  int64_t span_bytes;
};

// Checks everything about a meta except the byte limit, and computes its extent. `who`
// prefixes the messages.
Extent check_meta(const TensorMeta& m, const char* who) {
  GRADWIRE_CHECK_ARG(static_cast<int>(m.dtype) < kNumDTypes)
      << who << ": dtype code " << static_cast<int>(m.dtype) << " is out of range";
  GRADWIRE_CHECK_ARG(m.device.is_cpu() || m.device.is_cuda())
      << who << ": device type " << static_cast<int>(m.device.type) << " is out of range";
  GRADWIRE_CHECK_ARG(m.device.is_cuda() || m.device.index == 0)
      << who << ": a cpu device must have index 0, got " << m.device.index;
  GRADWIRE_CHECK_ARG(m.device.index >= 0) << who << ": negative device index " << m.device.index;
  const int64_t ndim = static_cast<int64_t>(m.sizes.size());
  GRADWIRE_CHECK_ARG(ndim <= kMaxWireDims)
      << who << ": " << ndim << " dims exceed the limit of " << kMaxWireDims;
  GRADWIRE_CHECK_ARG(m.strides.size() == m.sizes.size())
      << who << ": " << m.sizes.size() << " sizes but " << m.strides.size() << " strides";
  GRADWIRE_CHECK_ARG(m.storage_offset >= 0)
      << who << ": negative storage offset " << m.storage_offset;

  int64_t numel = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    const int64_t s = m.sizes[d];
    GRADWIRE_CHECK_ARG(s >= 0) << who << ": size[" << d << "] is negative (" << s << ")";
    GRADWIRE_CHECK_ARG(!__builtin_mul_overflow(numel, s, &numel))
        << who << ": the element count of shape " << shape_to_string(m.sizes) << " overflows int64";
  }
  const int64_t esize = element_size(m.dtype);
  if (numel == 0) return Extent{0, 0};

  // Lowest and highest element offsets the geometry reaches.
  int64_t lo = m.storage_offset, hi = m.storage_offset;
  for (int64_t d = 0; d < ndim; ++d) {
    int64_t reach = 0;
    bool overflow = __builtin_mul_overflow(m.strides[d], m.sizes[d] - 1, &reach);
    if (!overflow) {
      int64_t& end = reach < 0 ? lo : hi;
      overflow = __builtin_add_overflow(end, reach, &end);
    }
    GRADWIRE_CHECK_ARG(!overflow) << who << ": stride[" << d << "] = " << m.strides[d]
                                  << " with size " << m.sizes[d] << " overflows int64";
  }
  GRADWIRE_CHECK_ARG(lo >= 0) << who << ": strides " << shape_to_string(m.strides)
                              << " with offset " << m.storage_offset
                              << " reach before the start of the buffer";
  int64_t span;
  GRADWIRE_CHECK_ARG(hi < kInt64Max && !__builtin_mul_overflow(hi + 1, esize, &span))
      << who << ": the byte span of the tensor overflows int64";
  int64_t numel_bytes;
  GRADWIRE_CHECK_ARG(!__builtin_mul_overflow(numel, esize, &numel_bytes))
      << who << ": the byte size of shape " << shape_to_string(m.sizes) << " overflows int64";
  (void)numel_bytes;
  return Extent{numel, span};
}

void check_limit(const TensorMeta& m, const Extent& e, int64_t max_bytes, const char* who) {
  const int64_t numel_bytes = e.numel * element_size(m.dtype);  // checked in check_meta
  GRADWIRE_CHECK_ARG(numel_bytes <= max_bytes)
      << who << ": shape " << shape_to_string(m.sizes) << " of " << dtype_name(m.dtype) << " holds "
      << numel_bytes << " bytes, over the limit of " << max_bytes;
  GRADWIRE_CHECK_ARG(e.span_bytes <= max_bytes)
      << who << ": the elements span " << e.span_bytes << " bytes, over the limit of " << max_bytes;
}

}  // namespace

TensorMeta TensorMeta::of(const Tensor& t) {
  GRADWIRE_CHECK_ARG(t.defined()) << "TensorMeta::of: tensor is undefined";
  TensorMeta m;
  m.dtype = t.dtype();
  m.sizes = t.sizes();
  m.strides = t.strides();
  m.storage_offset = t.storage_offset();
  m.device = t.device();
  return m;
}

int64_t TensorMeta::numel() const {
  return shape_numel(sizes);
}

int64_t TensorMeta::span_bytes() const {
  return check_meta(*this, "span_bytes").span_bytes;
}

void encode_tensor_meta(const TensorMeta& meta, std::string& out) {
  check_meta(meta, "encode_tensor_meta");
  put_varint(out, static_cast<uint64_t>(kWireMetaVersion));
  put_varint(out, static_cast<uint64_t>(meta.dtype));
  put_varint(out, static_cast<uint64_t>(meta.device.type));
  put_varint(out, static_cast<uint64_t>(meta.device.index));
  put_varint(out, static_cast<uint64_t>(meta.sizes.size()));
  for (int64_t s : meta.sizes)
    put_varint(out, zigzag(s));
  for (int64_t s : meta.strides)
    put_varint(out, zigzag(s));
  put_varint(out, zigzag(meta.storage_offset));
}

TensorMeta decode_tensor_meta(const void* data, size_t size, size_t* consumed, int64_t max_bytes) {
  constexpr const char* kWho = "decode_tensor_meta";
  GRADWIRE_CHECK_ARG(max_bytes >= 0) << kWho << ": negative max_bytes " << max_bytes;
  GRADWIRE_CHECK_ARG(data != nullptr || size == 0)
      << kWho << ": null buffer of " << size << " bytes";
  Reader in(data, size);
  const uint64_t version = in.varint("version");
  GRADWIRE_CHECK_ARG(version == static_cast<uint64_t>(kWireMetaVersion))
      << kWho << ": unsupported version " << version << " (this build reads version "
      << kWireMetaVersion << ")";
  TensorMeta m;
  const uint64_t dtype = in.varint("dtype");
  GRADWIRE_CHECK_ARG(dtype < static_cast<uint64_t>(kNumDTypes))
      << kWho << ": dtype code " << dtype << " is out of range [0, " << kNumDTypes << ")";
  m.dtype = static_cast<DType>(dtype);
  const uint64_t device_type = in.varint("device_type");
  GRADWIRE_CHECK_ARG(device_type <= static_cast<uint64_t>(DeviceType::kCUDA))
      << kWho << ": device type " << device_type << " is out of range (0 = cpu, 1 = cuda)";
  const uint64_t device_index = in.varint("device_index");
  if (device_type == static_cast<uint64_t>(DeviceType::kCPU)) {
    GRADWIRE_CHECK_ARG(device_index == 0)
        << kWho << ": device index " << device_index << " for a cpu tensor (must be 0)";
    m.device = Device::cpu();
  } else {
    GRADWIRE_CHECK_ARG(device_index <= kMaxDeviceIndex)
        << kWho << ": CUDA device index " << device_index << " is out of range [0, "
        << kMaxDeviceIndex << "]";
    m.device = Device::cuda(static_cast<int>(device_index));
  }
  const uint64_t ndim = in.varint("ndim");
  GRADWIRE_CHECK_ARG(ndim <= static_cast<uint64_t>(kMaxWireDims))
      << kWho << ": ndim " << ndim << " exceeds the limit of " << kMaxWireDims;
  m.sizes.resize(ndim);
  m.strides.resize(ndim);
  for (uint64_t d = 0; d < ndim; ++d) {
    m.sizes[d] = in.signed_varint("size");
    GRADWIRE_CHECK_ARG(m.sizes[d] >= 0)
        << kWho << ": size[" << d << "] is negative (" << m.sizes[d] << ")";
  }
  for (uint64_t d = 0; d < ndim; ++d)
    m.strides[d] = in.signed_varint("stride");
  m.storage_offset = in.signed_varint("storage_offset");
  const Extent extent = check_meta(m, kWho);
  check_limit(m, extent, max_bytes, kWho);
  if (consumed != nullptr) {
    *consumed = in.position();
  } else {
    GRADWIRE_CHECK_ARG(in.position() == size)
        << kWho << ": " << (size - in.position()) << " trailing bytes after the meta ("
        << in.position() << " of " << size << " bytes used)";
  }
  return m;
}

Tensor empty_for_meta(const TensorMeta& meta) {
  const Extent extent = check_meta(meta, "empty_for_meta");
  Storage storage = Storage::allocate(static_cast<size_t>(extent.span_bytes), Device::cpu());
  return Tensor(std::move(storage), meta.sizes, meta.strides, meta.storage_offset, meta.dtype);
}

}  // namespace gradwire
