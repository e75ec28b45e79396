// gradwire's transport handshake: what two ends of a new connection exchange before
// TensorPipe sees a byte of it. A pure state machine over bytes (no sockets), so that it can
// be tested and fuzzed on its own.
//
// The exchange, version 2 (all integers little-endian):
//   client -> server  hello: "GWTP", version (u8), flags (u8; bit 0: a secret is set),
//                     2 zero bytes, a 32-byte nonce; then who the client is: its rank (i32),
//                     its incarnation (i32), its name's length (u8) and its name
//   server -> client  hello: the same 40 bytes as the client's first 40 (no identity)
//   with a secret only:
//   client -> server  HMAC-SHA256(secret, "gradwire-tp2 client" | transcript)
//   server -> client  1 byte, then (only when it is 1, accepted)
//                     HMAC-SHA256(secret, "gradwire-tp2 server" | transcript)
// where the transcript is the client's hello (identity included) followed by the server's.
// Without a secret the handshake ends after the two hellos.
//
// Why this order: the client proves first. The server answers a stranger with its nonce
// only; it computes a MAC for nobody who has not shown that they know the secret, so a
// peer that can merely connect gets nothing to test guesses of the secret against. Both
// MACs cover the whole transcript: the versions, the flags, both nonces (fresh per
// connection, so a recorded exchange cannot be replayed) and the client's claimed identity,
// which a man in the middle therefore cannot change. MACs are compared in constant time,
// and a failing cryptographic call fails the handshake (never authenticates by default).
//
// The identity is what the client claims; whether it is admitted is for the listener to
// decide (StreamOptions::verify_peer). With a secret it is authenticated: only a holder of
// the secret could have sent it.
//
// Thread-safety: none (one object per connection, used by one thread at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gradwire::rpc::transport {

inline constexpr uint8_t kHandshakeVersion = 2;
// The hello's fixed part (both ends), and the client's identity header after it.
inline constexpr size_t kHelloBytes = 40;
inline constexpr size_t kIdentityHeaderBytes = 9;
inline constexpr size_t kMaxIdentityNameBytes = 255;
inline constexpr size_t kMacBytes = 32;

// Who the client of a connection says it is: a worker's name, rank and incarnation (how
// many times its rank had been taken over before it). An empty name claims nobody.
struct PeerIdentity {
  std::string name;
  int32_t rank = -1;
  int32_t incarnation = 0;
};

class Handshake {
 public:
  enum class Role { kClient, kServer };
  enum class State { kRunning, kDone, kFailed };

  // `secret` empty: no authentication. A client claims `self` (its name is cut to
  // kMaxIdentityNameBytes); its hello is ready in output() at once. A server ignores `self`.
  Handshake(Role role, std::string secret, PeerIdentity self = {});

  // Consumes bytes received from the peer; returns how many were used (bytes after the end
  // of the handshake belong to the stream that follows and are not consumed).
  size_t feed(const uint8_t* data, size_t size);

  // Bytes to send to the peer; take them (the buffer is cleared).
  std::string take_output();
  bool has_output() const { return !output_.empty(); }

  State state() const { return state_; }
  // Why it failed, for the log and the error (never contains the secret; peer-supplied
  // bytes in it are escaped).
  const std::string& error() const { return error_; }
  bool authenticated() const { return !secret_.empty() && state_ == State::kDone; }
  // A server's view of the client's claim, once the client's hello has arrived whole (empty
  // name before); authenticated only when authenticated() is.
  const PeerIdentity& peer() const { return peer_; }

 private:
  void on_peer_hello();
  void on_identity_header();
  void on_identity_name();
  void on_client_mac();
  void on_verdict();
  void on_server_mac();
  void finish_client_hello();
  void expect(size_t bytes);
  void fail(std::string why);
  // Throws gradwire::Error when the cryptographic library fails.
  std::string mac(const char* label) const;

  Role role_;
  std::string secret_;
  State state_ = State::kRunning;
  enum class Step {
    kPeerHello,
    kIdentityHeader,
    kIdentityName,
    kClientMac,
    kVerdict,
    kServerMac
  } step_ = Step::kPeerHello;
  std::string my_nonce_;
  std::string client_hello_;  // as sent or received: the transcript's first part
  std::string server_hello_;
  PeerIdentity peer_;
  std::string need_;  // bytes gathered for the current step
  size_t need_size_ = kHelloBytes;
  std::string output_;
  std::string error_;
};

}  // namespace gradwire::rpc::transport
