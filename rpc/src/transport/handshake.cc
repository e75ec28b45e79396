#include "transport/handshake.h"

#include <algorithm>
#include <cstring>

#include "gradwire/core/auth.h"

namespace gradwire::rpc::transport {

namespace {

constexpr char kMagic[4] = {'G', 'W', 'T', 'P'};
constexpr uint8_t kFlagSecret = 1;
constexpr size_t kNonceBytes = 32;

std::string hello(bool secret, const std::string& nonce) {
  std::string out(kMagic, sizeof(kMagic));
  out.push_back(static_cast<char>(kHandshakeVersion));
  out.push_back(static_cast<char>(secret ? kFlagSecret : 0));
  out.push_back('\0');
  out.push_back('\0');
  out += nonce;
  return out;
}

}  // namespace

Handshake::Handshake(Role role, std::string secret)
    : role_(role), secret_(std::move(secret)), my_nonce_(random_bytes(kNonceBytes)) {
  if (role_ == Role::kClient) output_ = hello(!secret_.empty(), my_nonce_);
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

std::string Handshake::mac(const char* label) const {
  const std::string& client_nonce = role_ == Role::kClient ? my_nonce_ : peer_nonce_;
  const std::string& server_nonce = role_ == Role::kClient ? peer_nonce_ : my_nonce_;
  const Digest256 d = hmac_sha256(secret_, std::string(label) + client_nonce + server_nonce);
  return std::string(reinterpret_cast<const char*>(d.data()), d.size());
}

size_t Handshake::feed(const uint8_t* data, size_t size) {
  size_t used = 0;
  while (state_ == State::kRunning && used < size) {
    const size_t take = std::min(size - used, need_size_ - need_.size());
    need_.append(reinterpret_cast<const char*>(data + used), take);
    used += take;
    if (need_.size() < need_size_) break;
    switch (step_) {
      case Step::kPeerHello:
        on_peer_hello();
        break;
      case Step::kServerMac:
        on_server_mac();
        break;
      case Step::kClientMac:
        on_client_mac();
        break;
      case Step::kVerdict:
        on_verdict();
        break;
    }
  }
  return used;
}

void Handshake::on_peer_hello() {
  const std::string h = std::move(need_);
  need_.clear();
  if (std::memcmp(h.data(), kMagic, sizeof(kMagic)) != 0) {
    fail("not a gradwire transport connection (its first bytes are not the protocol magic)");
    return;
  }
  const auto version = static_cast<uint8_t>(h[4]);
  if (version != kHandshakeVersion) {
    fail("the peer speaks transport protocol version " + std::to_string(version) +
         ", this worker version " + std::to_string(kHandshakeVersion));
    return;
  }
  const auto flags = static_cast<uint8_t>(h[5]);
  if ((flags & ~kFlagSecret) != 0 || h[6] != 0 || h[7] != 0) {
    fail("the peer's hello has unknown flags set");
    return;
  }
  const bool peer_secret = (flags & kFlagSecret) != 0;
  peer_nonce_ = h.substr(8, kNonceBytes);
  if (role_ == Role::kServer) {
    // The server answers even when the secrets' presence differs, so that the client can
    // say why it was refused.
    output_ += hello(!secret_.empty(), my_nonce_);
    if (peer_secret != !secret_.empty()) {
      fail(secret_.empty() ? "authentication failed: the peer offers a secret and this "
                             "worker has none set"
                           : "authentication failed: the peer has no secret set and this "
                             "worker requires one");
      return;
    }
    if (secret_.empty()) {
      state_ = State::kDone;
      return;
    }
    output_ += mac("gradwire-tp server");
    step_ = Step::kClientMac;
    need_size_ = kMacBytes;
    return;
  }
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
  step_ = Step::kServerMac;
  need_size_ = kMacBytes;
}

void Handshake::on_server_mac() {
  const std::string expected = mac("gradwire-tp server");
  if (!constant_time_equal(expected.data(), need_.data(), kMacBytes)) {
    fail("authentication failed: the peer does not know this job's secret");
    return;
  }
  need_.clear();
  output_ += mac("gradwire-tp client");
  step_ = Step::kVerdict;
  need_size_ = 1;
}

void Handshake::on_client_mac() {
  const std::string expected = mac("gradwire-tp client");
  const bool ok = constant_time_equal(expected.data(), need_.data(), kMacBytes);
  need_.clear();
  output_.push_back(ok ? '\1' : '\0');
  if (!ok) {
    fail("authentication failed: the peer does not know this job's secret");
    return;
  }
  state_ = State::kDone;
}

void Handshake::on_verdict() {
  const char verdict = need_[0];
  need_.clear();
  if (verdict != '\1') {
    fail("authentication failed: the peer refused this worker's secret");
    return;
  }
  state_ = State::kDone;
}

}  // namespace gradwire::rpc::transport
