#include "rendezvous/job_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "tandem/errors.h"
#include "tandem/store.h"

namespace tandem {

std::string random_bytes(size_t bytes) {
  std::string out(bytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(out.data()), int(bytes)) != 1) {
    throw Error("tandem: OpenSSL could not produce random bytes (RAND_bytes failed)");
  }
  return out;
}

std::string new_job_secret() {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned char c : random_bytes(kSecretBytes)) {
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  return hex;
}

std::string auth_proof(std::string_view secret, std::string_view nonce) {
  std::string message(kAuthContext);
  message += nonce;
  unsigned char out[EVP_MAX_MD_SIZE];
  size_t length = 0;
  if (!EVP_Q_mac(nullptr, "HMAC", nullptr, "SHA256", nullptr, secret.data(), secret.size(),
                 reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, sizeof out, &length) ||
      length != kProofBytes) {
    throw Error("tandem: OpenSSL could not compute HMAC-SHA256");
  }
  return std::string(reinterpret_cast<const char*>(out), length);
}

bool same_proof(std::string_view a, std::string_view b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace tandem
