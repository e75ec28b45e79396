// Shared-secret authentication primitives: where a job's secret comes from, HMAC-SHA256,
// fresh random bytes, and a comparison whose time does not depend on where two byte
// strings differ. The RPC transports' handshake (and the store's) are built from these.
//
// A job's secret is looked up, first found wins, in: the value given in code (e.g.
// AgentOptions::secret), the environment variable GRADWIRE_SECRET, and the file named by
// GRADWIRE_SECRET_FILE (its contents; one trailing newline is dropped). No secret means
// connections are not authenticated. A secret shorter than kMinSecretBytes (16) is refused:
// the handshakes' proofs are HMACs an eavesdropper can test guesses against offline, so a
// short secret would be guessed. Use e.g. `openssl rand -hex 32`.
//
// Thread-safety: every function is safe to call from any thread, and in a child forked
// while another thread of its parent was inside one of them (random_bytes reads the
// kernel's generator; hmac_sha256 hashes with a SHA-256 looked up once as the library
// loads; neither takes a lock of the process).
// Errors: resolve_secret throws InvalidArgument naming the file when GRADWIRE_SECRET_FILE
// cannot be read or is empty, and naming the source of a secret shorter than
// kMinSecretBytes; hmac_sha256 and random_bytes throw Error if the cryptographic library
// fails (callers fail closed: nothing is authenticated by a zero digest).
//
// Example:
//   std::string secret = gradwire::resolve_secret(options.secret);  // "" when none
//   auto mac = gradwire::hmac_sha256(secret, "server" + nonces);
//   if (!gradwire::constant_time_equal(mac, received)) refuse();
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace gradwire {

using Digest256 = std::array<uint8_t, 32>;

// The shortest secret accepted, in bytes.
inline constexpr size_t kMinSecretBytes = 16;

// The secret to use: `given` if it is not empty, else GRADWIRE_SECRET, else the contents of
// the file named by GRADWIRE_SECRET_FILE, else "" (no authentication). A non-empty secret
// shorter than kMinSecretBytes throws InvalidArgument naming where it came from.
std::string resolve_secret(const std::string& given);

// HMAC-SHA256 of `data` under `key`; throws Error if the library fails.
Digest256 hmac_sha256(std::string_view key, std::string_view data);

// `n` bytes from the kernel's cryptographic generator (getrandom); throws Error naming
// errno if it fails.
std::string random_bytes(size_t n);

// Whether a and b hold the same bytes; for equal sizes, the time taken does not depend on
// the contents.
bool constant_time_equal(const void* a, const void* b, size_t n);

}  // namespace gradwire
