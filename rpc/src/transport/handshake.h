// gradwire's transport handshake: what two ends of a new connection exchange before
// TensorPipe sees a byte of it. A pure state machine over bytes (no sockets), so that it can
// be tested and fuzzed on its own.
//
// The exchange (all integers little-endian):
//   client -> server  hello: "GWTP", version (u8), flags (u8; bit 0: a secret is set),
//                     2 zero bytes, a 32-byte nonce
//   server -> client  hello, then, with a secret, HMAC-SHA256(secret, "gradwire-tp server"
//                     | client nonce | server nonce)
//   client -> server  with a secret: HMAC-SHA256(secret, "gradwire-tp client" | client
//                     nonce | server nonce)
//   server -> client  with a secret: one byte, 1 accepted or 0 refused
// Without a secret the handshake ends after the two hellos. Both ends must agree on whether
// there is a secret; nonces are fresh per connection, so a recorded exchange cannot be
// replayed, and MACs are compared in constant time.
//
// Thread-safety: none (one object per connection, used by one thread at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradwire::rpc::transport {

inline constexpr uint8_t kHandshakeVersion = 1;
inline constexpr size_t kHelloBytes = 40;
inline constexpr size_t kMacBytes = 32;

class Handshake {
 public:
  enum class Role { kClient, kServer };
  enum class State { kRunning, kDone, kFailed };

  // `secret` empty: no authentication. The client's hello is ready in output() at once.
  Handshake(Role role, std::string secret);

  // Consumes bytes received from the peer; returns how many were used (bytes after the end
  // of the handshake belong to the stream that follows and are not consumed).
  size_t feed(const uint8_t* data, size_t size);

  // Bytes to send to the peer; take them (the buffer is cleared).
  std::string take_output();
  bool has_output() const { return !output_.empty(); }

  State state() const { return state_; }
  // Why it failed, for the log and the error (never contains the secret).
  const std::string& error() const { return error_; }
  bool authenticated() const { return !secret_.empty() && state_ == State::kDone; }

 private:
  void on_peer_hello();
  void on_server_mac();
  void on_client_mac();
  void on_verdict();
  void fail(std::string why);
  std::string mac(const char* label) const;

  Role role_;
  std::string secret_;
  State state_ = State::kRunning;
  enum class Step { kPeerHello, kServerMac, kClientMac, kVerdict } step_ = Step::kPeerHello;
  std::string my_nonce_;
  std::string peer_nonce_;
  std::string need_;  // bytes gathered for the current step
  size_t need_size_ = kHelloBytes;
  std::string output_;
  std::string error_;
};

}  // namespace gradwire::rpc::transport
