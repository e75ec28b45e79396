// The TCPStore wire protocol, version 2 (documented in docs/wire-format.md).
//
// Every message is a frame: u32 length | u8 opcode | u32 request id | payload, where
// length counts the bytes after itself. Integers are little-endian; a byte string is
// u32 length + bytes; a list is u32 count + items. The first frame of a connection is
// HELLO (magic, version, flags, the client's nonce), answered by HELLO_OK (version, server
// limits, flags, the server's nonce and, when the store has a secret, the server's proof);
// with a secret the client then sends AUTH (its proof), answered by OK. Until then the
// server accepts frames of at most kMaxHandshakeFrame bytes and no request, so garbage with
// a huge length, or a client that does not know the secret, is refused before anything is
// buffered or parsed.
//
// FrameWriter builds frames into a std::string; FrameReader decodes a payload with every
// length checked against what is left and against a limit, recording the first problem.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace gradwire::c10d::proto {

inline constexpr uint32_t kMagic = 0x54535747;  // "GWST" read as a little-endian u32
inline constexpr uint16_t kVersion = 2;
// HELLO and HELLO_OK flags.
inline constexpr uint8_t kFlagSecret = 1;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;
// The labels of the two proofs: HMAC-SHA256(secret, label | client nonce | server nonce).
inline constexpr std::string_view kServerProofLabel = "gradwire-store server";
inline constexpr std::string_view kClientProofLabel = "gradwire-store client";
inline constexpr uint32_t kLengthBytes = 4;
inline constexpr uint32_t kMinFrame = 5;  // opcode + request id
inline constexpr uint32_t kMaxHandshakeFrame = 64;
// Fixed overhead added to the key and value limits when sizing the frame limit.
inline constexpr uint32_t kFrameSlack = 1024;

enum class Op : uint8_t {
  kHello = 1,
  kSet = 2,         // key, value                    -> (no reply; kError if rejected)
  kGet = 3,         // key, u64 timeout_ms           -> kValue | kTimeout
  kAdd = 4,         // key, i64 delta                -> kInt
  kCompareSet = 5,  // key, expected, desired        -> kValue (u8 exists, value)
  kWait = 6,        // keys, u64 timeout_ms          -> kOk | kTimeout
  kCheck = 7,       // keys                          -> kBool
  kDelete = 8,      // key                           -> kBool
  kNumKeys = 9,     //                               -> kInt
  kMultiGet = 10,   // keys, u64 timeout_ms          -> kValues | kTimeout
  kMultiSet = 11,   // u32 n, n x (key, value)       -> (no reply; kError if rejected)
  kAppend = 12,     // key, value                    -> kOk
  kListKeys = 13,   //                               -> kKeys
  kAuth = 14,       // client proof (32 raw bytes)    -> kOk (handshake only)
};

enum class Reply : uint8_t {
  kHelloOk = 0x81,  // u16 version, u32 max_key, u32 max_value, u32 max_keys, u32 max_frame,
                    // u8 flags, server nonce (32 raw bytes), [server proof (32 raw bytes)]
  kOk = 0x82,
  kValue = 0x83,
  kInt = 0x84,
  kBool = 0x85,
  kValues = 0x86,
  kKeys = 0x87,
  kTimeout = 0x88,  // keys still missing
  kError = 0x89,    // u8 ErrorKind, message; request id 0 when the connection is closed
  // The handshake's authentication failed (message); the connection is closed, and the
  // client must not try again with the same secret. Request id 0.
  kRefused = 0x8a,
};

const char* op_name(uint8_t op);

// Frame limit implied by key and value limits: room for compare_set's two values.
inline uint64_t frame_limit(uint32_t max_key, uint32_t max_value) {
  return uint64_t{max_key} + 2 * uint64_t{max_value} + kFrameSlack;
}

class FrameWriter {
 public:
  explicit FrameWriter(std::string& out) : out_(out) {}

  void begin(uint8_t op, uint32_t id) {
    start_ = out_.size();
    u32(0);  // length, patched by end()
    u8(op);
    u32(id);
  }
  // Patches the length of the frame begun last; returns its size in bytes.
  size_t end() {
    const uint64_t len = out_.size() - start_ - kLengthBytes;
    for (int i = 0; i < 4; ++i)
      out_[start_ + i] = static_cast<char>((len >> (8 * i)) & 0xff);
    return out_.size() - start_;
  }
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { le(v, 2); }
  void u32(uint32_t v) { le(v, 4); }
  void u64(uint64_t v) { le(v, 8); }
  void i64(int64_t v) { le(static_cast<uint64_t>(v), 8); }
  void bytes(const void* data, size_t size) {
    u32(static_cast<uint32_t>(size));
    out_.append(static_cast<const char*>(data), size);
  }
  void str(std::string_view s) { bytes(s.data(), s.size()); }
  // Bytes without a length (fixed-size fields: nonces, proofs).
  void raw(std::string_view s) { out_.append(s.data(), s.size()); }

 private:
  void le(uint64_t v, int n) {
    char buf[8];
    for (int i = 0; i < n; ++i)
      buf[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    out_.append(buf, static_cast<size_t>(n));
  }
  std::string& out_;
  size_t start_ = 0;
};

inline uint32_t load_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Decodes one payload. Each accessor returns a zero value once anything went wrong;
// check ok() (or error()) after decoding, and done() to refuse trailing bytes.
class FrameReader {
 public:
  FrameReader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  // True when everything was consumed without error; records trailing bytes otherwise.
  bool done() {
    if (ok() && p_ != end_) fail("trailing bytes after the payload");
    return ok();
  }
  void fail(std::string why) {
    if (error_.empty()) error_ = std::move(why);
  }

  uint8_t u8() { return static_cast<uint8_t>(le(1, "u8")); }
  uint16_t u16() { return static_cast<uint16_t>(le(2, "u16")); }
  uint32_t u32() { return static_cast<uint32_t>(le(4, "u32")); }
  uint64_t u64() { return le(8, "u64"); }
  int64_t i64() { return static_cast<int64_t>(le(8, "i64")); }
  // A byte string of at most `max` bytes, viewed in place.
  std::string_view bytes(uint32_t max, const char* what) {
    const uint32_t n = u32();
    if (!ok()) return {};
    if (n > max) {
      fail(std::string(what) + " of " + std::to_string(n) + " bytes exceeds the limit of " +
           std::to_string(max));
      return {};
    }
    if (static_cast<size_t>(end_ - p_) < n) {
      fail(std::string(what) + " of " + std::to_string(n) + " bytes runs past the frame");
      return {};
    }
    std::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  // Exactly `n` bytes without a length (fixed-size fields), viewed in place.
  std::string_view raw(size_t n, const char* what) {
    if (!ok()) return {};
    if (static_cast<size_t>(end_ - p_) < n) {
      fail(std::string("truncated ") + what);
      return {};
    }
    std::string_view s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  // A count of at most `max`, each item needing at least `min_item_bytes` more bytes.
  uint32_t count(uint32_t max, size_t min_item_bytes, const char* what) {
    const uint32_t n = u32();
    if (!ok()) return 0;
    if (n > max) {
      fail(std::string(what) + " count " + std::to_string(n) + " exceeds the limit of " +
           std::to_string(max));
      return 0;
    }
    if (static_cast<size_t>(end_ - p_) / (min_item_bytes == 0 ? 1 : min_item_bytes) < n) {
      fail(std::string(what) + " count " + std::to_string(n) + " runs past the frame");
      return 0;
    }
    return n;
  }

 private:
  uint64_t le(int n, const char* what) {
    if (!ok()) return 0;
    if (end_ - p_ < n) {
      fail(std::string("truncated ") + what);
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < n; ++i)
      v |= uint64_t{p_[i]} << (8 * i);
    p_ += n;
    return v;
  }
  const uint8_t* p_;
  const uint8_t* end_;
  std::string error_;
};

}  // namespace gradwire::c10d::proto
