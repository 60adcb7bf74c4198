#include "rendezvous/store_admission.h"

#include "rendezvous/job_secret.h"

namespace tandem {

namespace sp = store_protocol;

AdmissionStep Admission::on(sp::Op op, std::string_view value) {
  AdmissionStep step;
  if (op == sp::Op::auth_begin) {
    if (!authenticated()) nonce_ = random_bytes(kNonceBytes);
    step.reply = sp::Op::value;
    step.value = authenticated() ? std::string() : nonce_;
    return step;
  }
  if (authenticated()) {
    if (op != sp::Op::auth) {
      step.run = true;
    } else {
      step.reply = sp::Op::error;
      step.value = "auth: no challenge pending";
    }
    return step;
  }
  step.close = true;
  step.reply = sp::Op::error;
  if (op != sp::Op::auth) {
    step.value = std::string(sp::op_name(uint16_t(op))) +
                 ": this store requires the job secret; set TANDEM_SECRET or TANDEM_SECRET_FILE to the job's secret "
                 "(tandem launch sets it for its ranks)";
  } else if (nonce_.empty()) {
    step.value = "auth: no challenge was asked for on this connection";
  } else if (!same_proof(value, auth_proof(secret_, nonce_))) {
    step.value = "auth: wrong job secret";
  } else {
    authenticated_ = true;
    step.close = false;
    step.reply = sp::Op::ok;
  }
  nonce_.clear();  // one proof per challenge
  return step;
}

}  // namespace tandem
