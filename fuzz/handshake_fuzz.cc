// Fuzz target: the store's handshake (rendezvous/store_admission.h) driven by
// a sequence of requests. Each step takes two input bytes, the request and
// what an AUTH carries: bytes from the input, the right proof for the pending
// nonce, or a proof recorded for an earlier nonce (a replay). Checks: a
// connection is admitted only by the right proof for its pending nonce;
// anything else before that closes it; a nonce is good once.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rendezvous/job_secret.h"
#include "rendezvous/store_admission.h"

namespace sp = tandem::store_protocol;

namespace {

void check(bool ok) {
  if (!ok) std::abort();
}

constexpr sp::Op kRequests[] = {sp::Op::set,     sp::Op::get,       sp::Op::try_get,    sp::Op::add,
                                sp::Op::wait,    sp::Op::check,     sp::Op::erase,      sp::Op::hello,
                                sp::Op::goodbye, sp::Op::heartbeat, sp::Op::auth_begin, sp::Op::auth};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string secret = (data[0] & 1) ? std::string(64, 's') : std::string();
  tandem::Admission a(secret);
  std::string recorded;  // a proof seen on an earlier challenge
  size_t pos = 1;
  while (pos + 2 <= size) {
    const sp::Op op = kRequests[data[pos] % std::size(kRequests)];
    const uint8_t mode = data[pos + 1];
    pos += 2;
    std::string value;
    bool right = false;
    if (op == sp::Op::auth) {
      if (mode % 3 == 0 && !a.nonce().empty()) {
        value = tandem::auth_proof(secret, a.nonce());
        right = true;
      } else if (mode % 3 == 1) {
        value = recorded;
      } else {
        const size_t n = std::min<size_t>(mode % 40, size - pos);
        value.assign(reinterpret_cast<const char*>(data + pos), n);
        pos += n;
      }
    }
    const bool was_in = a.authenticated();
    const std::string nonce = a.nonce();
    tandem::AdmissionStep step = a.on(op, value);
    if (secret.empty() || was_in) {
      check(!step.close);
      check(step.run == (op != sp::Op::auth && op != sp::Op::auth_begin));
      check(a.authenticated());
      continue;
    }
    if (op == sp::Op::auth_begin) {
      check(!step.run && !step.close && step.value.size() == tandem::kNonceBytes && step.value == a.nonce());
      recorded = tandem::auth_proof(secret, a.nonce());
      continue;
    }
    check(!step.run);
    check(a.nonce().empty());  // a proof attempt, or anything else, spends the challenge
    const bool admitted = op == sp::Op::auth && !nonce.empty() && value == tandem::auth_proof(secret, nonce);
    check(a.authenticated() == admitted);
    check(step.close == !admitted);
    if (right) check(admitted);
    if (step.close) return 0;  // the server closes the connection here
  }
  return 0;
}
