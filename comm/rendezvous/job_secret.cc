// The job secret: made (new_job_secret), read from the environment
// (read_secret), proved over a store connection (HMAC-SHA256), and the rule
// that a store reachable from other hosts needs one (check_store_privacy).
#include "rendezvous/job_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "src/subsystem_log.h"
#include "tandem/bootstrap.h"
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

// TANDEM_SECRET, else the file TANDEM_SECRET_FILE names (readable by its owner
// only, like an ssh key), else none.
std::string read_secret(const EnvLookup& env) {
  std::string secret, source = "TANDEM_SECRET";
  if (auto v = env("TANDEM_SECRET")) {
    secret = *v;
  } else if (auto path = env("TANDEM_SECRET_FILE")) {
    source = "TANDEM_SECRET_FILE='" + *path + "'";
    struct stat st {};
    if (::stat(path->c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      throw InvalidArgument("tandem: " + source + " is not a readable file; point it at a file holding the job secret");
    }
    if (st.st_mode & 077) {
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", unsigned(st.st_mode & 07777));
      throw InvalidArgument("tandem: " + source + " has mode " + mode +
                            ": others may read the job secret; chmod 600 it");
    }
    std::ifstream f(*path);
    std::stringstream text;
    text << f.rdbuf();
    secret = text.str();
    while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  } else {
    return {};
  }
  if (secret.size() < kMinSecretChars) {
    throw InvalidArgument("tandem: the job secret in " + source + " has " + std::to_string(secret.size()) +
                          " characters; use at least " + std::to_string(kMinSecretChars) +
                          " (e.g. the output of `openssl rand -hex 32`)");
  }
  return secret;
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "0:0:0:0:0:0:0:1") return true;
  return host.rfind("127.", 0) == 0;
}

void check_store_privacy(const CommOptions& o) {
  if (o.size < 2 || o.store_address.empty()) return;
  const std::string host = parse_host_port(o.store_address).first;
  if (o.host_store && (host == "0.0.0.0" || host == "::")) {
    if (!o.store_listen_all) {
      throw InvalidArgument("tandem: rank 0 would host the store on every address (" + o.store_address +
                            "); give TANDEM_STORE_ADDR the address of rank 0's interface the other ranks reach, or "
                            "set TANDEM_STORE_LISTEN_ALL=1 to listen on all of them");
    }
    subsystem_log(Subsystem::store)
        .warn("tandem: the store listens on every address ({}; TANDEM_STORE_LISTEN_ALL=1)", o.store_address);
  }
  if (is_loopback_host(host) || !o.secret.empty()) return;
  if (!o.allow_no_secret) {
    throw InvalidArgument("tandem: the store at " + o.store_address +
                          " is reachable from other hosts but the job has no secret, so anyone who reaches it could "
                          "read and write the job's keys; give every rank the same TANDEM_SECRET (or "
                          "TANDEM_SECRET_FILE), e.g. from `openssl rand -hex 32`, or set TANDEM_ALLOW_NO_SECRET=1 on "
                          "a trusted network");
  }
  if (o.rank == 0)
    subsystem_log(Subsystem::store)
        .warn(
            "tandem: the store at {} has no secret (TANDEM_ALLOW_NO_SECRET=1): anyone who reaches it can read "
            "and write the job's keys",
            o.store_address);
}

}  // namespace tandem
