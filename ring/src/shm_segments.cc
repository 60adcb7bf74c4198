// The Segments protocol's out-of-line steps: the arrival handshake,
// the hand-off probe and the check that every rank made the same call.
#include "shm_segments.h"

#include <array>

namespace tandem::ring {

bool Segments::arrive(bool present, const void* in, void* out, const SharedRef* input, const SharedRef* output) {
  arrival_ = ++self_->direct_calls;
  if (!present) return false;
  self_->call = call_;
  self_->input = input ? *input : SharedRef{};
  self_->output = output ? *output : SharedRef{};
  self_->input_address = uint64_t(uintptr_t(in));
  self_->output_address = uint64_t(uintptr_t(out));
  self_->offer = offer_;
  rank0_offer_ = offer_;
  store_release(self_->arrived, arrival_);
  shared_.assign(size_t(n_), {});  // here, not per call: most calls never arrive
  for (int p = 0; p < n_; ++p) {
    if (p == r_) continue;
    const Control* c = control(p);
    const SlotHeader* h = header(p, self_->next);
    for (unsigned spins = 1; load_acquire(c->arrived) < arrival_; ++spins) {
      if (load_acquire(h->stamp) == self_->next + 1) {  // p staged the next chunk: this call, or a mismatch
        check_same_call(p, h->call);
        return false;
      }
      ch_.idle(p, spins);
    }
    // Read what the peer published for this arrival, then check it still is
    // this arrival's. A peer already past it staged this call (a direct call
    // waits for every rank to finish) and may have published a later call's
    // here: stage too; the slots carry this call for the check.
    const Call theirs = c->call;
    shared_[size_t(p)] = {c->input.fd >= 0, c->output.fd >= 0};
    if (p == 0) rank0_offer_ = c->offer;
    if (load_acquire(c->arrived) != arrival_) return false;
    check_same_call(p, theirs);
  }
  shared_[size_t(r_)] = {input != nullptr, output != nullptr};
  return true;
}

bool Segments::probe_far(uint64_t far_ns) {
  const uint64_t base = arrival_ << 32;
  if (r_ == 0) {
    uint64_t slowest = 0;
    for (int p = 1; p < n_; ++p) {
      std::array<uint64_t, kProbeBatches> batch{};
      for (size_t b = 0; b < kProbeBatches; ++b) {
        const uint64_t t0 = now_ns();
        for (uint64_t k = 1; k <= kProbeRounds; ++k) {
          const uint64_t v = base | uint64_t(p) << 16 | (b * kProbeRounds + k);
          store_release(self_->ping, v);
          await(p, control(p)->pong, v);
        }
        batch[b] = (now_ns() - t0) / (2 * kProbeRounds);
      }
      std::sort(batch.begin(), batch.end());
      slowest = std::max(slowest, batch[kProbeBatches / 2]);
    }
    const bool far = slowest >= far_ns;
    store_release(self_->verdict, arrival_ << 1 | uint64_t(far));
    store_relaxed(self_->probed_at_ns, now_ns());
    return far;
  }
  for (uint64_t k = 1; k <= kProbeBatches * kProbeRounds; ++k) {
    const uint64_t v = base | uint64_t(r_) << 16 | k;
    await(0, control(0)->ping, v);
    store_release(self_->pong, v);
  }
  // Rank 0 cannot publish a later verdict before this rank takes part in this call's path.
  await(0, control(0)->verdict, arrival_ << 1);
  return (load_acquire(control(0)->verdict) & 1) != 0;
}

bool Segments::registered(int p, bool output_too) const {
  if (p < 0) {
    for (int q = 0; q < n_; ++q) {
      if (!registered(q, output_too)) return false;
    }
    return true;
  }
  return shared_[size_t(p)].input && (!output_too || shared_[size_t(p)].output);
}

void Segments::wait_for_free_slot(uint64_t needed) {
  if (self_->peers_consumed >= needed) return;
  uint64_t least = UINT64_MAX;
  for (int p = 0; p < n_; ++p) {
    if (p == r_) continue;
    await(p, control(p)->consumed, needed, [] { return static_cast<const Call*>(nullptr); });
    least = std::min(least, load_acquire(control(p)->consumed));
  }
  self_->peers_consumed = least;
}

void Segments::check_same_call(int peer, const Call& theirs) const {
  if (theirs == call_) return;
  const char* field = theirs.kind != call_.kind     ? "kind"
                      : theirs.op != call_.op       ? "op"
                      : theirs.dtype != call_.dtype ? "dtype"
                      : theirs.count != call_.count ? "count"
                                                    : "root";
  throw CollectiveMismatch("mismatched collectives (the " + std::string(field) + " differs): rank " +
                           std::to_string(peer) + " called " + theirs.str() + " while rank " + std::to_string(r_) +
                           " called " + call_.str() +
                           "; every rank must issue the same collectives with the same arguments in the same order");
}

}  // namespace tandem::ring
