// The store's side of the handshake (job_secret.h) for one connection, as a
// small state machine without sockets, so it can be tested and fuzzed alone.
//
// A connection starts unauthenticated. AUTH_BEGIN draws a fresh nonce (the
// challenge); AUTH must carry HMAC-SHA256(secret, kAuthContext || nonce) for
// that nonce, which is then spent, right or wrong. Any other request before a
// good AUTH, an AUTH without a challenge or a wrong proof rejects the
// connection. Without a secret everything runs at once and AUTH_BEGIN gets an
// empty nonce.
#pragma once

#include <string>
#include <string_view>

#include "rendezvous/store_protocol.h"

namespace tandem {

struct AdmissionStep {
  bool run = false;    // the request may run now; nothing else to do
  bool close = false;  // send the reply, then close the connection (rejected)
  store_protocol::Op reply = store_protocol::Op::ok;
  std::string value;  // the reply's value: a nonce, or why
};

class Admission {
 public:
  // `secret` must outlive this object (the server's options own it).
  explicit Admission(std::string_view secret) : secret_(secret) {}
  AdmissionStep on(store_protocol::Op op, std::string_view value);
  bool authenticated() const { return secret_.empty() || authenticated_; }
  // The challenge pending on this connection (empty if none).
  const std::string& nonce() const { return nonce_; }

 private:
  std::string_view secret_;
  bool authenticated_ = false;
  std::string nonce_;
};

}  // namespace tandem
