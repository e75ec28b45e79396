// The TCPStore wire protocol, version 3 (documented in docs/wire-format.md).
//
// Every message is a frame: u32 length | u8 opcode | u32 request id | payload, where
// length counts the bytes after itself. Integers are little-endian; a byte string is
// u32 length + bytes; a list is u32 count + items. The first frame of a connection is
// HELLO (magic, version, flags, the client's nonce), answered by HELLO_OK (version, server
// limits, flags, the server's nonce; never a proof). With a secret the client proves first:
// AUTH (its proof), answered by OK carrying the server's proof, or by REFUSED. So a
// stranger who does not know the secret never receives an HMAC it could test guesses
// against. Both proofs cover the version, both flags, both nonces and the limits the server
// announced (see transcript()). Until the handshake is complete the server accepts frames
// of at most kMaxHandshakeFrame bytes and no request, so garbage with a huge length, or a
// client that does not know the secret, is refused before anything is buffered or parsed.
//
// FrameWriter builds frames into a std::string; FrameReader decodes a payload with every
// length checked against what is left and against a limit, recording the first problem.
#pragma once

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>

namespace gradwire::c10d::proto {

inline constexpr uint32_t kMagic = 0x54535747;  // "GWST" read as a little-endian u32
inline constexpr uint16_t kVersion = 3;
// HELLO and HELLO_OK flags.
inline constexpr uint8_t kFlagSecret = 1;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;
// The labels of the two proofs: HMAC-SHA256(secret, label | transcript), see transcript().
inline constexpr std::string_view kServerProofLabel = "gradwire-store v3 server";
inline constexpr std::string_view kClientProofLabel = "gradwire-store v3 client";
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
  kAuth = 14,       // client proof (32 raw bytes)    -> kOk (server proof) | kRefused
  kTime = 15,       //                               -> kInt (the server's system clock, ns
                    //                                  since the Unix epoch)
};

enum class Reply : uint8_t {
  kHelloOk = 0x81,  // u16 version, u32 max_key, u32 max_value, u32 max_keys, u32 max_frame,
                    // u8 flags, server nonce (32 raw bytes)
  kOk = 0x82,       // (empty); the answer to AUTH carries the server proof (32 raw bytes)
  kValue = 0x83,
  kInt = 0x84,
  kBool = 0x85,
  kValues = 0x86,
  kKeys = 0x87,
  kTimeout = 0x88,  // keys still missing
  kError = 0x89,    // u8 ErrorKind, message; request id 0 when the connection is closed
  // The handshake failed for good (message): authentication, or a protocol version this
  // server does not speak. The connection is closed; the client must not try again. Id 0.
  kRefused = 0x8a,
  // A request refused by one of the server's limits: u8 Limit, u64 the limit, message. The
  // store is unchanged by it. With request id 0 the connection itself is refused or closed
  // (kConnections, kUnsentReplies); the client may try again later.
  kLimit = 0x8b,
};

// The server limits a kLimit reply names.
enum class Limit : uint8_t {
  kReplyBytes = 1,     // a reply would exceed the frame limit (max_frame)
  kConnections = 2,    // max_connections
  kKeys = 3,           // max_keys
  kTotalBytes = 4,     // max_total_bytes (keys and values held)
  kParkedWaits = 5,    // max_parked_waits (all clients together)
  kClientWaits = 6,    // max_pending_waits_per_client
  kJournal = 7,        // the journal cannot keep up or cannot be written: writes refused
  kUnsentReplies = 8,  // the client does not read its replies
};

// The option a Limit stands for, as messages name it.
inline const char* limit_name(Limit limit) {
  switch (limit) {
    case Limit::kReplyBytes:
      return "max_frame";
    case Limit::kConnections:
      return "max_connections";
    case Limit::kKeys:
      return "max_keys";
    case Limit::kTotalBytes:
      return "max_total_bytes";
    case Limit::kParkedWaits:
      return "max_parked_waits";
    case Limit::kClientWaits:
      return "max_pending_waits_per_client";
    case Limit::kJournal:
      return "journal_buffer_bytes";
    case Limit::kUnsentReplies:
      return "unsent_high_water_bytes";
  }
  return "an unknown limit";
}

const char* op_name(uint8_t op);

// Frame limit implied by key and value limits: room for compare_set's two values.
inline uint64_t frame_limit(uint32_t max_key, uint32_t max_value) {
  return uint64_t{max_key} + 2 * uint64_t{max_value} + kFrameSlack;
}

// What both proofs sign after their label: u16 version, u8 client flags, u8 server flags,
// the client's nonce, the server's nonce, and the four u32 limits of HELLO_OK (max_key,
// max_value, max_keys, max_frame), so that nobody in the middle can change any of them.
struct Transcript {
  uint8_t client_flags = 0;
  uint8_t server_flags = 0;
  std::string client_nonce;
  std::string server_nonce;
  uint32_t max_key = 0;
  uint32_t max_value = 0;
  uint32_t max_keys = 0;
  uint32_t max_frame = 0;
};

class FrameWriter {
 public:
  explicit FrameWriter(std::string& out) : out_(out) {}

  void begin(uint8_t op, uint32_t id) {
    start_ = out_.size();
    u32(0);  // length, patched by end()
    u8(op);
    u32(id);
  }
  // Patches the length of the frame begun last; returns its size in bytes. A frame whose
  // length does not fit the u32 length field is refused (std::length_error), never cut:
  // callers bound their frames first, so this is the last line of defence.
  size_t end() {
    const uint64_t len = out_.size() - start_ - kLengthBytes;
    if (len > UINT32_MAX) {
      out_.resize(start_);
      throw std::length_error("a TCPStore frame of " + std::to_string(len) +
                              " bytes does not fit the protocol's u32 length");
    }
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
    if (size > UINT32_MAX) {
      throw std::length_error("a TCPStore byte string of " + std::to_string(size) +
                              " bytes does not fit the protocol's u32 length");
    }
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

// The bytes a proof is the HMAC-SHA256 of: label | the fields of `t` (see Transcript).
inline std::string transcript(std::string_view label, const Transcript& t) {
  std::string out(label);
  FrameWriter w(out);
  w.u16(kVersion);
  w.u8(t.client_flags);
  w.u8(t.server_flags);
  w.raw(t.client_nonce);
  w.raw(t.server_nonce);
  w.u32(t.max_key);
  w.u32(t.max_value);
  w.u32(t.max_keys);
  w.u32(t.max_frame);
  return out;
}

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
