// The Segments protocol's out-of-line steps: the arrival handshake and the
// check that every rank made the same call.
#include "shm_segments.h"

#include <algorithm>
#include <array>

namespace tandem::ring {

bool Segments::arrive(bool present, const void* in, void* out, const SharedRef* input, const SharedRef* output) {
  arrival_ = ++self_->direct_calls;
  if (!present) return false;
  // A seqlock: a peer still reading this rank's previous arrival (rooted
  // calls let this rank finish before it) sees `arrived` change and re-reads,
  // instead of taking this call's words for that one.
  store_relaxed(self_->arrived, 0);
  std::atomic_thread_fence(std::memory_order_release);
  self_->call = call_;
  self_->arrived_history = history_;
  self_->input = input ? *input : SharedRef{};
  self_->output = output ? *output : SharedRef{};
  self_->input_address = uint64_t(uintptr_t(in));
  self_->output_address = uint64_t(uintptr_t(out));
  self_->offer = offer_;
  self_->maps = maps_;
  rank0_offer_ = offer_;
  rank0_maps_ = maps_;
  store_release(self_->arrived, arrival_);
  shared_.assign(size_t(n_), {});  // here, not per call: most calls never arrive
  for (int p = 0; p < n_; ++p) {
    if (p == r_) continue;
    const Control* c = control(p);
    for (unsigned spins = 1; load_acquire(c->arrived) < arrival_; ++spins) {
      if (const SlotHeader* h = staged_from(p, self_->next)) {  // p staged this call, or a mismatch
        check_same_calls(p, h->call, h->history);
        return false;
      }
      ch_.idle(p, spins);
    }
    // Read what the peer published for this arrival, then check it still is
    // this arrival's. A peer already past it staged this call (a direct call
    // waits for every rank to finish) and may have published a later call's
    // here: stage too; the slots carry this call for the check.
    const Call theirs = c->call;
    const uint64_t history = c->arrived_history;
    shared_[size_t(p)] = {c->input.fd >= 0, c->output.fd >= 0};
    if (p == 0) rank0_offer_ = c->offer, rank0_maps_ = c->maps != 0;
    std::atomic_thread_fence(std::memory_order_acquire);  // the words above, read before `arrived` again
    if (load_acquire(c->arrived) != arrival_) return false;
    check_same_calls(p, theirs, history);
  }
  shared_[size_t(r_)] = {input != nullptr, output != nullptr};
  return true;
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

const SlotHeader* Segments::staged_from(int peer, uint64_t before) const {
  // The first chunk starts where a chunk of one cell, a run or a whole chunk
  // would be placed: nearest first (a one-cell chunk may be placed past the
  // others). Seeing a later call's stamp past the nearest (a peer that ran
  // ahead) means this call's stamp, written before it, is visible now too:
  // look again from the nearest.
  std::array<uint64_t, 3> starts{placed(before, 1), placed(before, kCellsPerRun), placed(before, kCellsPerChunk)};
  std::sort(starts.begin(), starts.end());
  for (int pass = 0; pass < 2; ++pass) {
    for (const uint64_t g : starts) {
      const SlotHeader* h = header(peer, g);
      if (load_acquire(h->stamp) != g + 1) continue;
      if (pass == 1 || g == starts[0]) return h;
      break;
    }
  }
  return nullptr;
}

void Segments::wait_for_free_slot(uint64_t needed, uint64_t enough) {
  if (self_->peers_consumed >= needed) return;
  uint64_t least = UINT64_MAX;
  for (int p = 0; p < n_; ++p) {
    if (p == r_) continue;
    await(p, control(p)->consumed, enough, [] { return static_cast<const Call*>(nullptr); });
    least = std::min(least, load_acquire(control(p)->consumed));
  }
  self_->peers_consumed = least;
}

void Segments::check_same_call(int peer, const Call& theirs) const {
  if (theirs == call_) return;
  // A variable call's count is a digest of its blocks' counts (shm_collectives.cc).
  const char* what = theirs.kind != call_.kind     ? "kind differs"
                     : theirs.op != call_.op       ? "op differs"
                     : theirs.dtype != call_.dtype ? "dtype differs"
                     : theirs.count != call_.count
                         ? (has_per_rank_counts(call_.kind) ? "blocks differ" : "count differs")
                         : "root differs";
  throw CollectiveMismatch("mismatched collectives (the " + std::string(what) + "): rank " + std::to_string(peer) +
                           " called " + theirs.str() + " while rank " + std::to_string(r_) + " called " + call_.str() +
                           "; every rank must issue the same collectives with the same arguments in the same order");
}

void Segments::check_same_calls(int peer, const Call& theirs, uint64_t history) const {
  check_same_call(peer, theirs);
  if (history == history_) return;
  throw CollectiveMismatch("mismatched collectives before this " + call_.str() + ": rank " + std::to_string(peer) +
                           "'s earlier calls through shared memory differ from rank " + std::to_string(r_) +
                           "'s. A rooted call's sending side (a gather's or reduce's non-root ranks, a scatter's or "
                           "broadcast's root) returns without waiting for its receivers, so such a mismatch shows at "
                           "the next call the ranks wait in; the flight recorders name each rank's calls. Every rank "
                           "must issue the same collectives with the same arguments in the same order");
}

}  // namespace tandem::ring
