#include "gradwire/core/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <initializer_list>
#include <memory>
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

namespace {

// SHA-256 of the default provider, fetched once as the library is loaded, before the
// process can have started a thread. Later hashing looks nothing up: a look-up takes the
// cryptographic library's global locks, and a lock that another thread holds when the
// process forks stays held in the child (a launcher forks rank processes while its store
// server's threads answer handshakes).
const EVP_MD* sha256_method() {
  static const EVP_MD* const md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}
[[maybe_unused]] const EVP_MD* const kFetchedAtLoad = sha256_method();

struct MdCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};

// SHA-256 of the concatenation of `parts`; throws Error if the library fails.
Digest256 sha256_of(std::initializer_list<std::string_view> parts) {
  const EVP_MD* md = sha256_method();
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  bool ok = md != nullptr && ctx != nullptr && EVP_DigestInit_ex2(ctx.get(), md, nullptr) == 1;
  for (std::string_view part : parts)
    ok = ok && EVP_DigestUpdate(ctx.get(), part.data(), part.size()) == 1;
  Digest256 out{};
  unsigned int len = 0;
  ok = ok && EVP_DigestFinal_ex(ctx.get(), out.data(), &len) == 1 && len == out.size();
  if (!ok) throw Error("SHA-256 failed in the cryptographic library");
  return out;
}

std::string_view view_of(const Digest256& d) {
  return std::string_view(reinterpret_cast<const char*>(d.data()), d.size());
}

}  // namespace

Digest256 hmac_sha256(std::string_view key, std::string_view data) {
  // RFC 2104 over SHA-256 (block 64 bytes): a key longer than a block is hashed first, then
  // zero-padded; H((K ^ opad) || H((K ^ ipad) || data)). Fails closed: an error throws,
  // never leaving a zero digest that both sides would agree on.
  constexpr size_t kBlock = 64;
  std::array<char, kBlock> inner_pad{}, outer_pad{};
  Digest256 hashed_key{};
  if (key.size() > kBlock) {
    hashed_key = sha256_of({key});
    key = view_of(hashed_key);
  }
  for (size_t i = 0; i < kBlock; ++i) {
    const char k = i < key.size() ? key[i] : '\0';
    inner_pad[i] = static_cast<char>(k ^ 0x36);
    outer_pad[i] = static_cast<char>(k ^ 0x5c);
  }
  const Digest256 inner = sha256_of({std::string_view(inner_pad.data(), kBlock), data});
  Digest256 out = sha256_of({std::string_view(outer_pad.data(), kBlock), view_of(inner)});
  OPENSSL_cleanse(inner_pad.data(), kBlock);
  OPENSSL_cleanse(outer_pad.data(), kBlock);
  OPENSSL_cleanse(hashed_key.data(), hashed_key.size());
  return out;
}

std::string random_bytes(size_t n) {
  // The kernel's generator (getrandom): no lock in this process, so a child forked while
  // another thread is in here gets its bytes too.
  std::string out(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(out.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      throw Error("the system's random generator failed to produce " + std::to_string(n) +
                  " bytes: " + std::strerror(errno));
    }
    got += static_cast<size_t>(r);
  }
  return out;
}

bool constant_time_equal(const void* a, const void* b, size_t n) {
  return CRYPTO_memcmp(a, b, n) == 0;
}

}  // namespace gradwire
