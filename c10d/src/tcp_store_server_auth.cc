// TCPStoreServer's handshake: HELLO (magic, version, limits and nonces), then, with a
// secret, AUTH: the client proves it knows the secret first, the server second.
#include "tcp_store_server_impl.h"

#include <string>

#include "gradwire/core/auth.h"

namespace gradwire::c10d {

std::string TCPStoreServer::Impl::proof(std::string_view label, const proto::Transcript& t) const {
  // hmac_sha256 throws on a failure of the library: the caller's handler refuses the client.
  const Digest256 mac = hmac_sha256(secret_, proto::transcript(label, t));
  return std::string(reinterpret_cast<const char*>(mac.data()), mac.size());
}

bool TCPStoreServer::Impl::handle_auth(Connection* c, uint8_t op, uint32_t id, FrameReader& r) {
  const std::string_view got = r.raw(proto::kProofBytes, "client proof");
  if (op != static_cast<uint8_t>(Op::kAuth) || !r.done()) {
    disconnect(c,
               "authentication failed: expected the client's proof, got " +
                   (op == static_cast<uint8_t>(Op::kAuth) ? std::string("a malformed one")
                                                          : std::string("another request")),
               /*refused=*/true);
    return false;
  }
  // The client proves first; a wrong proof is refused without the server's, so whoever
  // does not know the secret learns nothing to test guesses against.
  const std::string want = proof(proto::kClientProofLabel, c->transcript);
  if (!constant_time_equal(want.data(), got.data(), want.size())) {
    disconnect(c, "authentication failed: the client does not know this store's secret",
               /*refused=*/true);
    return false;
  }
  const std::string server_proof = proof(proto::kServerProofLabel, c->transcript);
  c->hello_done = true;
  c->transcript = {};
  FrameWriter w = reply(c, Reply::kOk, id);
  w.raw(server_proof);
  end_reply(c, w);
  return true;
}

bool TCPStoreServer::Impl::handle_hello(Connection* c, uint8_t op, uint32_t id, FrameReader& r) {
  const uint32_t magic = r.u32();
  const uint16_t version = r.u16();
  if (op != static_cast<uint8_t>(Op::kHello) || magic != proto::kMagic) {
    disconnect(c, "not a gradwire TCPStore client (bad handshake" +
                      (r.ok() ? std::string() : ": " + r.error()) + ")");
    return false;
  }
  if (version != proto::kVersion) {
    // Final: a client of another version cannot succeed by trying again.
    disconnect(c,
               "unsupported protocol version " + std::to_string(version) +
                   " (this server speaks version " + std::to_string(proto::kVersion) +
                   "; client and server must come from the same gradwire release)",
               /*refused=*/true);
    return false;
  }
  const uint8_t flags = r.u8();
  const std::string_view client_nonce = r.raw(proto::kNonceBytes, "client nonce");
  if (!r.done() || (flags & ~proto::kFlagSecret) != 0) {
    disconnect(c, "not a gradwire TCPStore client (bad handshake" +
                      (r.ok() ? std::string(": unknown flags") : ": " + r.error()) + ")");
    return false;
  }
  const bool client_secret = (flags & proto::kFlagSecret) != 0;
  if (client_secret != !secret_.empty()) {
    disconnect(c,
               client_secret ? "authentication failed: the client has a secret and this "
                               "store has none"
                             : "authentication failed: this store requires a shared secret "
                               "and the client has none",
               /*refused=*/true);
    return false;
  }
  proto::Transcript t;
  t.client_flags = flags;
  t.server_flags = secret_.empty() ? 0 : proto::kFlagSecret;
  t.client_nonce = std::string(client_nonce);
  t.server_nonce = random_bytes(proto::kNonceBytes);
  t.max_key = options_.max_key_bytes;
  t.max_value = options_.max_value_bytes;
  t.max_keys = options_.max_keys_per_request;
  t.max_frame = static_cast<uint32_t>(frame_limit_);
  c->hello_seen = true;
  FrameWriter w = reply(c, Reply::kHelloOk, id);
  w.u16(proto::kVersion);
  w.u32(t.max_key);
  w.u32(t.max_value);
  w.u32(t.max_keys);
  w.u32(t.max_frame);
  w.u8(t.server_flags);
  w.raw(t.server_nonce);
  end_reply(c, w);
  if (secret_.empty()) {
    c->hello_done = true;
  } else {
    c->transcript = std::move(t);
  }
  return true;
}

}  // namespace gradwire::c10d
