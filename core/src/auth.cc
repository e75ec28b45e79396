#include "gradwire/core/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <fstream>
#include <sstream>

#include "gradwire/core/env.h"
#include "gradwire/core/error.h"

namespace gradwire {

namespace {

std::string checked_length(std::string secret, const std::string& source) {
  if (secret.size() < kMinSecretBytes) {
    throw InvalidArgument("the shared secret from " + source + " is " +
                          std::to_string(secret.size()) + " bytes; at least " +
                          std::to_string(kMinSecretBytes) +
                          " are required (e.g. the output of `openssl rand -hex 32`)");
  }
  return secret;
}

}  // namespace

std::string resolve_secret(const std::string& given) {
  if (!given.empty()) return checked_length(given, "the options");
  if (auto env = env_raw("GRADWIRE_SECRET"); env && !env->empty())
    return checked_length(*env, "GRADWIRE_SECRET");
  auto file = env_raw("GRADWIRE_SECRET_FILE");
  if (!file || file->empty()) return std::string();
  std::ifstream in(*file, std::ios::binary);
  if (!in) {
    throw InvalidArgument("GRADWIRE_SECRET_FILE names '" + *file + "', which cannot be read");
  }
  std::ostringstream contents;
  contents << in.rdbuf();
  std::string secret = contents.str();
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  if (secret.empty()) {
    throw InvalidArgument("GRADWIRE_SECRET_FILE names '" + *file +
                          "', which is empty: a secret must not be empty");
  }
  return checked_length(std::move(secret), "GRADWIRE_SECRET_FILE '" + *file + "'");
}

Digest256 hmac_sha256(std::string_view key, std::string_view data) {
  Digest256 out{};
  unsigned int len = 0;
  // Fail closed: a failed HMAC must never leave a zero digest that both sides would agree on.
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(),
           &len) == nullptr ||
      len != out.size()) {
    throw Error("HMAC-SHA256 failed in the cryptographic library");
  }
  return out;
}

std::string random_bytes(size_t n) {
  std::string out(n, '\0');
  if (n > 0 && RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), static_cast<int>(n)) != 1) {
    throw Error("the system's random generator failed to produce " + std::to_string(n) + " bytes");
  }
  return out;
}

bool constant_time_equal(const void* a, const void* b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

}  // namespace gradwire
