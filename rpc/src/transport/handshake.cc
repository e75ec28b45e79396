#include "transport/handshake.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "gradwire/core/auth.h"

namespace gradwire::rpc::transport {

namespace {

constexpr char kMagic[4] = {'G', 'W', 'T', 'P'};
constexpr uint8_t kFlagSecret = 1;
constexpr size_t kNonceBytes = 32;
constexpr char kClientLabel[] = "gradwire-tp2 client";
constexpr char kServerLabel[] = "gradwire-tp2 server";

std::string hello(bool secret, const std::string& nonce) {
  std::string out(kMagic, sizeof(kMagic));
  out.push_back(static_cast<char>(kHandshakeVersion));
  out.push_back(static_cast<char>(secret ? kFlagSecret : 0));
  out.push_back('\0');
  out.push_back('\0');
  out += nonce;
  return out;
}

void put_i32(std::string& out, int32_t v) {
  const auto u = static_cast<uint32_t>(v);
  for (int i = 0; i < 4; ++i)
    out.push_back(static_cast<char>((u >> (8 * i)) & 0xff));
}

int32_t get_i32(const char* p) {
  uint32_t u = 0;
  for (int i = 0; i < 4; ++i)
    u |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return static_cast<int32_t>(u);
}

}  // namespace

Handshake::Handshake(Role role, std::string secret, PeerIdentity self)
    : role_(role), secret_(std::move(secret)) {
  try {
    my_nonce_ = random_bytes(kNonceBytes);
  } catch (const std::exception& e) {
    fail(std::string("cannot draw a fresh nonce: ") + e.what());
    return;
  }
  if (role_ != Role::kClient) return;
  if (self.name.size() > kMaxIdentityNameBytes) self.name.resize(kMaxIdentityNameBytes);
  client_hello_ = hello(!secret_.empty(), my_nonce_);
  put_i32(client_hello_, self.rank);
  put_i32(client_hello_, self.incarnation);
  client_hello_.push_back(static_cast<char>(self.name.size()));
  client_hello_ += self.name;
  output_ = client_hello_;
}

std::string Handshake::take_output() {
  std::string out;
  out.swap(output_);
  return out;
}

void Handshake::fail(std::string why) {
  state_ = State::kFailed;
  error_ = std::move(why);
}

void Handshake::expect(size_t bytes) {
  need_.clear();
  need_size_ = bytes;
}

std::string Handshake::mac(const char* label) const {
  const Digest256 d = hmac_sha256(secret_, std::string(label) + client_hello_ + server_hello_);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

size_t Handshake::feed(const uint8_t* data, size_t size) {
  size_t used = 0;
  while (state_ == State::kRunning && used < size) {
    const size_t take = std::min(size - used, need_size_ - need_.size());
    need_.append(reinterpret_cast<const char*>(data + used), take);
    used += take;
    if (need_.size() < need_size_) break;
    try {
      switch (step_) {
        case Step::kPeerHello:
          on_peer_hello();
          break;
        case Step::kIdentityHeader:
          on_identity_header();
          break;
        case Step::kIdentityName:
          on_identity_name();
          break;
        case Step::kClientMac:
          on_client_mac();
          break;
        case Step::kVerdict:
          on_verdict();
          break;
        case Step::kServerMac:
          on_server_mac();
          break;
      }
    } catch (const std::exception& e) {
      // A failing cryptographic call: nobody is authenticated by it.
      fail(std::string("authentication failed: ") + e.what());
    }
  }
  return used;
}

void Handshake::on_peer_hello() {
  const std::string h = need_;
  if (std::memcmp(h.data(), kMagic, sizeof(kMagic)) != 0) {
    fail("not a gradwire transport connection (its first bytes are not the protocol magic)");
    return;
  }
  const auto version = static_cast<uint8_t>(h[4]);
  if (version != kHandshakeVersion) {
    // The server still says its own version, so that an older client can name the mismatch
    // too; a hello carries nothing secret.
    if (role_ == Role::kServer) output_ += hello(!secret_.empty(), my_nonce_);
    fail("the peer speaks transport protocol version " + std::to_string(version) +
         ", this worker version " + std::to_string(kHandshakeVersion) +
         ": every worker of a job must run a gradwire release with the same protocol");
    return;
  }
  const auto flags = static_cast<uint8_t>(h[5]);
  if ((flags & ~kFlagSecret) != 0 || h[6] != 0 || h[7] != 0) {
    fail("the peer's hello has unknown flags set");
    return;
  }
  if (role_ == Role::kServer) {
    client_hello_ = h;
    step_ = Step::kIdentityHeader;
    expect(kIdentityHeaderBytes);
    return;
  }
  server_hello_ = h;
  const bool peer_secret = (flags & kFlagSecret) != 0;
  if (peer_secret != !secret_.empty()) {
    fail(secret_.empty()
             ? "authentication failed: the peer requires a shared secret and none is set here "
               "(AgentOptions::secret, GRADWIRE_SECRET or GRADWIRE_SECRET_FILE)"
             : "authentication failed: the peer has no secret set and this worker requires one");
    return;
  }
  if (secret_.empty()) {
    state_ = State::kDone;
    return;
  }
  // The client proves first.
  output_ += mac(kClientLabel);
  step_ = Step::kVerdict;
  expect(1);
}

void Handshake::on_identity_header() {
  client_hello_ += need_;
  peer_.rank = get_i32(need_.data());
  peer_.incarnation = get_i32(need_.data() + 4);
  const auto length = static_cast<uint8_t>(need_[8]);
  if (length == 0) {
    finish_client_hello();
    return;
  }
  step_ = Step::kIdentityName;
  expect(length);
}

void Handshake::on_identity_name() {
  client_hello_ += need_;
  peer_.name = need_;
  finish_client_hello();
}

// The server has the client's whole hello: it answers with its own, and with a secret
// waits for the client's proof.
void Handshake::finish_client_hello() {
  server_hello_ = hello(!secret_.empty(), my_nonce_);
  output_ += server_hello_;
  const bool peer_secret = (static_cast<uint8_t>(client_hello_[5]) & kFlagSecret) != 0;
  if (peer_secret != !secret_.empty()) {
    // Answered anyway, so that the client can say why it was refused.
    fail(secret_.empty()
             ? "authentication failed: the peer offers a secret and this worker has none set"
             : "authentication failed: the peer has no secret set and this worker requires one");
    return;
  }
  if (secret_.empty()) {
    state_ = State::kDone;
    return;
  }
  step_ = Step::kClientMac;
  expect(kMacBytes);
}

void Handshake::on_client_mac() {
  const std::string expected = mac(kClientLabel);
  const bool ok = constant_time_equal(expected.data(), need_.data(), kMacBytes);
  if (!ok) {
    output_.push_back('\0');
    fail("authentication failed: the peer does not know this job's secret");
    return;
  }
  // Computed before anything is sent: a failure here sends no verdict at all.
  const std::string proof = mac(kServerLabel);
  output_.push_back('\1');
  output_ += proof;
  state_ = State::kDone;
}

void Handshake::on_verdict() {
  if (need_[0] != '\1') {
    fail("authentication failed: the peer refused this worker's secret");
    return;
  }
  step_ = Step::kServerMac;
  expect(kMacBytes);
}

void Handshake::on_server_mac() {
  const std::string expected = mac(kServerLabel);
  if (!constant_time_equal(expected.data(), need_.data(), kMacBytes)) {
    fail("authentication failed: the peer does not know this job's secret");
    return;
  }
  state_ = State::kDone;
}

}  // namespace gradwire::rpc::transport
