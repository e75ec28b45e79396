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

std::string resolve_secret(const std::string& given) {
  if (!given.empty()) return given;
  if (auto env = env_raw("GRADWIRE_SECRET"); env && !env->empty()) return *env;
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
  return secret;
}

Digest256 hmac_sha256(std::string_view key, std::string_view data) {
  Digest256 out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len);
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
