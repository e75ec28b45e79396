#include "transport/nop_scan.h"

#include <cstring>
#include <vector>

namespace gradwire::rpc::transport {

namespace {

// libnop's prefix bytes (nop/base/encoding_byte.h).
enum Prefix : uint8_t {
  kPositiveFixIntMax = 0x7f,
  kU8 = 0x80,
  kU16 = 0x81,
  kU32 = 0x82,
  kU64 = 0x83,
  kI8 = 0x84,
  kI16 = 0x85,
  kI32 = 0x86,
  kI64 = 0x87,
  kF32 = 0x88,
  kF64 = 0x89,
  kVariant = 0xb8,
  kStructure = 0xb9,
  kArray = 0xba,
  kMap = 0xbb,
  kBinary = 0xbc,
  kString = 0xbd,
  kNil = 0xbe,
  kNegativeFixIntMin = 0xc0,
};

class Walker {
 public:
  Walker(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  size_t left() const { return static_cast<size_t>(end_ - p_); }

  bool take(size_t n) {
    if (n > left()) return false;
    p_ += n;
    return true;
  }

  bool byte(uint8_t& out) {
    if (p_ == end_) return false;
    out = *p_++;
    return true;
  }

  // An integer of any of libnop's integer encodings; `negative` when it is below zero.
  bool integer(uint64_t& value, bool& negative) {
    uint8_t prefix = 0;
    if (!byte(prefix)) return false;
    negative = false;
    if (prefix <= kPositiveFixIntMax) {
      value = prefix;
      return true;
    }
    if (prefix >= kNegativeFixIntMin) {
      negative = true;
      value = 0;
      return true;
    }
    size_t width = 0;
    bool is_signed = false;
    switch (prefix) {
      case kU8:
        width = 1;
        break;
      case kU16:
        width = 2;
        break;
      case kU32:
        width = 4;
        break;
      case kU64:
        width = 8;
        break;
      case kI8:
        width = 1;
        is_signed = true;
        break;
      case kI16:
        width = 2;
        is_signed = true;
        break;
      case kI32:
        width = 4;
        is_signed = true;
        break;
      case kI64:
        width = 8;
        is_signed = true;
        break;
      default:
        return false;
    }
    if (width > left()) return false;
    uint64_t v = 0;
    std::memcpy(&v, p_, width);  // little-endian, as libnop writes it on this machine
    p_ += width;
    if (is_signed && (v >> (8 * width - 1)) != 0) {
      negative = true;
      v = 0;
    }
    value = v;
    return true;
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

std::string hex(uint8_t b) {
  static const char* digits = "0123456789abcdef";
  return std::string("0x") + digits[b >> 4] + digits[b & 15];
}

}  // namespace

std::string scan_nop(const uint8_t* data, size_t size, size_t max_values) {
  Walker w(data, size);
  // Values still to read in each open container, innermost last.
  std::vector<uint64_t> open{1};
  size_t values = 0;
  while (!open.empty()) {
    if (open.back() == 0) {
      open.pop_back();
      continue;
    }
    --open.back();
    if (++values > max_values) {
      return "it holds more than " + std::to_string(max_values) +
             " values (the limit for this connection's control frames)";
    }
    uint8_t prefix = 0;
    if (!w.byte(prefix)) return "it ends inside a value";
    if (prefix <= kPositiveFixIntMax || prefix >= kNegativeFixIntMin || prefix == kNil) continue;
    uint64_t n = 0;
    bool negative = false;
    switch (prefix) {
      case kU8:
      case kI8:
        if (!w.take(1)) return "it ends inside an integer";
        continue;
      case kU16:
      case kI16:
        if (!w.take(2)) return "it ends inside an integer";
        continue;
      case kU32:
      case kI32:
      case kF32:
        if (!w.take(4)) return "it ends inside a number";
        continue;
      case kU64:
      case kI64:
      case kF64:
        if (!w.take(8)) return "it ends inside a number";
        continue;
      case kString:
      case kBinary:
        if (!w.integer(n, negative) || negative) return "a string's length is malformed";
        // libnop reads an empty binary (a vector of integers) with a memcpy into the empty
        // vector's null data; no control message sends one (every channel needs a connection).
        if (prefix == kBinary && n == 0) return "it holds an empty binary value";
        if (!w.take(n)) {
          return "a string claims " + std::to_string(n) + " bytes where " +
                 std::to_string(w.left()) + " are left";
        }
        continue;
      case kVariant:
        // The alternative's index (-1: empty), then one value.
        if (!w.integer(n, negative)) return "a variant's index is malformed";
        n = 1;
        break;
      case kArray:
      case kStructure:
      case kMap: {
        if (!w.integer(n, negative) || negative) return "a container's size is malformed";
        // Each value takes at least one byte: a count beyond the bytes left is a lie.
        const uint64_t room = w.left();
        if (n > room || (prefix == kMap && n > room / 2)) {
          return "a container claims " + std::to_string(n) + " elements where " +
                 std::to_string(room) + " bytes are left";
        }
        if (prefix == kMap) n *= 2;
        break;
      }
      default:
        return "it uses encoding " + hex(prefix) + ", which no TensorPipe control message has";
    }
    if (open.size() > static_cast<size_t>(kMaxNopDepth)) {
      return "it nests deeper than " + std::to_string(kMaxNopDepth) + " levels";
    }
    open.push_back(n);
  }
  if (w.left() != 0) return std::to_string(w.left()) + " bytes follow its value";
  return "";
}

}  // namespace gradwire::rpc::transport
