// The job secret and the store's challenge-response (HMAC-SHA256, OpenSSL).
//
// When a store has a secret, a connection may do nothing until it proves it
// knows the secret: the client asks for a challenge (AUTH_BEGIN), the server
// answers with a fresh random nonce for this connection, and the client sends
// HMAC-SHA256(secret, kAuthContext || nonce) (AUTH). A proof is good for its
// connection's nonce only, so a recorded handshake replayed on another
// connection fails. The server compares in constant time.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

inline constexpr size_t kSecretBytes = 32;     // what tandem launch generates (hex: 64 characters)
inline constexpr size_t kMinSecretChars = 32;  // what a user-supplied secret must have at least
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kProofBytes = 32;  // SHA-256
inline constexpr std::string_view kAuthContext = "tandem store auth v1";

// `bytes` from OpenSSL's CSPRNG; throws Error if it fails.
std::string random_bytes(size_t bytes);
// new_job_secret() is declared in tandem/store.h (tandem launch uses it).
// HMAC-SHA256(secret, kAuthContext || nonce).
std::string auth_proof(std::string_view secret, std::string_view nonce);
// Constant-time equality (CRYPTO_memcmp); false when the sizes differ.
bool same_proof(std::string_view a, std::string_view b);

}  // namespace tandem
