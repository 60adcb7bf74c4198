// EngineChannel's messages and waits: tags, fingerprints, the UCX wait and
// the shared-memory idle loop, and the scratch buffers collectives borrow.
#include "engine/engine_channel.h"

#include <immintrin.h>
#include <sched.h>

#include <algorithm>
#include <string>
#include <thread>

#include "engine/wait_policy.h"

namespace tandem {

template <class F>
auto EngineChannel::blaming_first_failure(F f) -> decltype(f()) {
  try {
    return f();
  } catch (const PeerFailure& e) {
    engine_.liveness().blame_first_failure(e, task_, engine_.seq());
  }
}

EngineChannel::EngineChannel(Engine& engine, const Task& task)
    : engine_(engine),
      ctx_(engine.context()),
      ep_(engine.endpoints()),
      task_(task),
      signature_(task.what.signature()),
      point_to_point_(task.what.point_to_point()) {
  // An exchange has no fingerprints: only the ranks it addresses take part.
  fingerprint_posted_ = fingerprint_compared_ = point_to_point_;
  // Without shared memory every collective goes over messages: post at once
  // (a zero-count call sends nothing, yet must be checked). So does split: a
  // rank that sends nothing in it still checks its call. The calls with a
  // shared-memory path check their call in its headers there (allgatherv and
  // reduce_scatterv as themselves, with a digest of their blocks, whichever
  // path their blocks take); where they fall back to messages every rank
  // sends or receives one, which posts the fingerprint.
  const Collective c = task.what.collective;
  const bool shm_path =
      ep_.shm && (c <= Collective::barrier || (c >= Collective::alltoall && c <= Collective::reduce_scatterv));
  if (!shm_path && ctx_.opts.size > 1 && !point_to_point_) post_fingerprint();
}

EngineChannel::~EngineChannel() {
  // Anything still posted belongs to a collective that failed: cancel it so
  // UCX never touches the caller's buffers after we return.
  for (auto& p : live_) ep_.cancel_message(p);
  // One call runs at a time (`busy`): a plain store, no locked add.
  if (traffic_) {
    ep_.shm_traffic.store(ep_.shm_traffic.load(std::memory_order_relaxed) + traffic_, std::memory_order_relaxed);
  }
}

Pending EngineChannel::send(int peer, Tag tag, const void* data, size_t bytes) {
  if (!fingerprint_posted_) post_fingerprint();
  return blaming_first_failure([&] { return track(post_send(peer, full_tag(rank(), tag), data, bytes)); });
}

Pending EngineChannel::recv(int peer, Tag tag, void* data, size_t bytes) {
  if (!fingerprint_posted_) post_fingerprint();
  return track(post_recv(peer, full_tag(peer, tag), data, bytes));
}

Pending EngineChannel::post_send(int peer, Tag tag, const void* data, size_t bytes) {
  return ep_.mailbox ? ep_.mailbox->send(peer, tag, data, bytes) : ep_.ucx->send(peer, tag, data, bytes);
}

Pending EngineChannel::post_recv(int peer, Tag tag, void* data, size_t bytes) {
  return ep_.mailbox ? ep_.mailbox->recv(peer, tag, data, bytes) : ep_.ucx->recv(peer, tag, data, bytes);
}

bool EngineChannel::poll(Pending& p) {
  ep_.progress_messages();
  int source = -1;
  return ep_.poll_message(p, &source);
}

bool EngineChannel::test(Pending& p) {
  if (p.done()) return true;
  void* handle = p.handle();
  try {
    if (!poll(p)) return false;
  } catch (const PeerFailure& e) {
    untrack(handle);  // poll() released the request
    engine_.liveness().blame_first_failure(e, task_, engine_.seq());
  } catch (const CollectiveMismatch&) {
    // A message of the wrong size: the fingerprint says which field differs.
    untrack(handle);
    if (fingerprint_posted_ && !fingerprint_compared_) {
      wait(fp_in_);
      compare_fingerprint();
    }
    engine_.calls().explain_mismatch();  // the predecessor agrees: another rank differs
    throw;
  } catch (...) {
    untrack(handle);
    throw;
  }
  untrack(handle);
  return true;
}

void EngineChannel::wait(Pending& p) {
  // Spin: small messages land within microseconds.
  Clock::time_point spin_until{};
  for (unsigned spins = 1; !test(p); ++spins) {
    back_off(p.peer(), spins);
    if (spins % 16 != 0) continue;
    const auto now = Clock::now();
    if (spin_until == Clock::time_point{}) {
      spin_until = now + kUcxSpin;
    } else if (now >= spin_until) {
      break;
    }
  }
  // While the worker keeps making progress, poll (yielding the core between
  // passes); once it has been quiet for kUcxBusyWindow, sleep on the worker's
  // event fd, waking for the next health check at the latest, and after
  // kUcxSleepSlice in any case: UCX's TCP transport does not signal the fd
  // when a full socket drains, so a send queued behind it would otherwise
  // wait out the whole health-check interval (200 ms stalls on a shaped link).
  const Clock::time_point yield_until = Clock::now() + kMailboxYieldWindow;
  while (!test(p)) {
    poll_fingerprint();  // a stalled wait is what a mismatch looks like
    try {
      engine_.check_health(task_, p.peer());
    } catch (const PeerFailure&) {
      // A peer that sent this message and then left (after its own error)
      // is no failure of this wait: look once more.
      if (!test(p)) throw;
      return;
    }
    if (ep_.mailbox_yields(yield_until)) {
      std::this_thread::yield();  // a sleeping core may wake late (wait_policy.h)
    } else if (ep_.mailbox) {
      // Sleep until a peer rings this rank's doorbell (it wrote to us or read what we sent).
      const uint32_t bell = ep_.mailbox->announce_sleep();
      const bool ready = test(p);
      ep_.mailbox->sleep(bell, ready ? std::chrono::microseconds(0)
                                     : std::min(engine_.liveness().until_next_check(task_), kUcxSleepSlice));
    } else if (Clock::now() - ep_.ucx->last_progress() < kUcxBusyWindow) {
      std::this_thread::yield();
    } else {
      ep_.ucx->sleep(std::min(engine_.liveness().until_next_check(task_), kUcxSleepSlice));
    }
  }
}

template <class F>
void EngineChannel::copying_peer(int peer, F copy) {
  try {
    copy();
  } catch (const PeerFailure&) {
    throw;
  } catch (const Error& e) {
    if (ctx_.opts.heartbeat.count() == 0) throw;
    const auto bound = 2 * ctx_.opts.heartbeat + ctx_.opts.failure_poll;
    for (const auto until = std::chrono::steady_clock::now() + bound; std::chrono::steady_clock::now() < until;) {
      engine_.check_health(task_, peer);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    throw Error(std::string(e.what()) + " (a cross-memory copy with rank " + std::to_string(peer) +
                ", not reported failed within " + std::to_string(bound.count()) + " ms after)");
  }
}

void EngineChannel::read_peer(int peer, const void* remote, void* local, size_t bytes) {
  blaming_first_failure([&] { copying_peer(peer, [&] { ep_.shm->read_peer(peer, remote, local, bytes); }); });
}

void EngineChannel::write_peer(int peer, void* remote, const void* local, size_t bytes) {
  // A rank stopped in this call long enough to be recorded as failed wakes
  // after the others left it: the peer's buffer may be freed by now, and
  // writing it would corrupt the peer. The check leaves a window of a few
  // instructions before the write (docs/api.md, Shrinking).
  blaming_first_failure([&] {
    engine_.check_after_pause(task_);
    copying_peer(peer, [&] { ep_.shm->write_peer(peer, remote, local, bytes); });
  });
}

void EngineChannel::idle(int peer, unsigned spins) {
  if (spins % 128 == 0) {
    engine_.check_health(task_, peer);
    if (spins % 1024 == 0 && !point_to_point_) watch_for_fingerprints();
  }
  if (spins <= kSpinsWithoutPause) return;
  const bool yield_soon = ep_.oversubscribed && spins > kSpinsBeforeYield;
  if (spins <= kIdleSpins && !yield_soon) {
    if (spins % kIdlePauseRun == 0) {
      sched_yield();
    } else {
      _mm_pause();  // spinning on another core's cache line
    }
    return;
  }
  if (yield_soon && spins <= kIdleSpins) {
    sched_yield();
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  if (spins == kIdleSpins + 1) yielding_since_ = now;
  const auto waited = now - yielding_since_;
  if (waited < kIdleYieldWindow) {
    sched_yield();
  } else {
    // A long wait: leave the core to the process's other threads.
    std::this_thread::sleep_for(waited < kIdleLongWait ? kIdleSleep : kIdleLongSleep);
  }
}

void EngineChannel::back_off(int peer, unsigned spins) {
  if (spins % 128 == 0) engine_.check_health(task_, peer);
  if ((ep_.oversubscribed && spins > kSpinsBeforeYield) || spins % 65536 == 0) std::this_thread::yield();
}

Tag EngineChannel::full_tag(int sender, Tag local, uint32_t signature) const {
  if (local >> kLocalBits) throw InvalidArgument("algorithm tag exceeds 32 bits");
  static_assert(kSignatureBits + kSeqBits + kRankBits + kLocalBits == 64);
  // Exchanges are not numbered: their tags are their own, across calls.
  const Tag seq = point_to_point_ ? 0 : engine_.seq() & ((1u << kSeqBits) - 1);
  return (Tag(signature) << (kSeqBits + kRankBits + kLocalBits)) | (seq << (kRankBits + kLocalBits)) |
         (Tag(sender) << kLocalBits) | local;
}

void EngineChannel::post_fingerprint() {
  fingerprint_posted_ = true;
  const int n = size(), r = rank();
  prev_ = (r + n - 1) % n;
  mine_ = Fingerprint::of(task_.what, engine_.seq());
  fp_in_ = track(post_recv(prev_, full_tag(prev_, 0, kFingerprintSignature), &theirs_, sizeof theirs_));
  fp_out_ = blaming_first_failure(
      [&] { return track(post_send((r + 1) % n, full_tag(r, 0, kFingerprintSignature), &mine_, sizeof mine_)); });
}

void EngineChannel::poll_fingerprint() {
  if (fingerprint_posted_ && !fingerprint_compared_ && test(fp_in_)) compare_fingerprint();
}

void EngineChannel::compare_fingerprint() {
  fingerprint_compared_ = true;
  compare(prev_, theirs_);
}

void EngineChannel::finish() {
  if (!fingerprint_posted_ || point_to_point_) return;
  if (!fingerprint_compared_) {
    wait(fp_in_);
    if (!fingerprint_compared_) compare_fingerprint();
  }
  wait(fp_out_);
}

void EngineChannel::watch_for_fingerprints() {
  if (fingerprint_posted_) return;
  const Tag mask = ~((Tag(1) << (kRankBits + kLocalBits)) - 1);  // signature and sequence number, any sender
  if (!fingerprint_arrived(0, mask)) return;
  for (int p = 0; p < size(); ++p) {
    if (p == rank() || !fingerprint_arrived(p, ~Tag(0))) continue;
    fingerprint_posted_ = fingerprint_compared_ = true;
    mine_ = Fingerprint::of(task_.what, engine_.seq());
    Pending in = track(post_recv(p, full_tag(p, 0, kFingerprintSignature), &theirs_, sizeof theirs_));
    wait(in);
    compare(p, theirs_);
    throw CollectiveMismatch("call #" + std::to_string(engine_.seq()) + ": rank " + std::to_string(p) + " runs " +
                             theirs_.description().str() + " over messages while rank " + std::to_string(rank()) +
                             " runs it through the shared segments; TANDEM_SHM, TANDEM_SHM_CHUNK_BYTES and TANDEM_ALGO "
                             "must agree on every rank");
  }
}

void EngineChannel::compare(int peer, const Fingerprint& theirs) {
  if (const char* field = mine_.differing(theirs)) {
    const Description other = theirs.description();
    if (rank() < peer) throw CollectiveMismatch(mismatch_text(engine_.seq(), field, rank(), task_.what, peer, other));
    throw CollectiveMismatch(mismatch_text(engine_.seq(), field, peer, other, rank(), task_.what));
  }
}

bool EngineChannel::fingerprint_arrived(int sender, Tag mask) {
  const Tag tag = full_tag(sender, 0, kFingerprintSignature);
  if (!ep_.mailbox) {
    ep_.ucx->progress();
    return ep_.ucx->probe(tag, mask);
  }
  int source = -1;
  return ep_.mailbox->probe(tag, mask, &source);
}

Pending EngineChannel::track(Pending p) {
  // Keep a shadow handle so a failed collective can cancel what it posted.
  if (!p.done()) live_.emplace_back(p.handle(), p.peer(), p.bytes(), p.is_recv());
  return p;
}

void EngineChannel::untrack(void* handle) {
  for (size_t i = 0; i < live_.size(); ++i) {
    if (live_[i].handle() == handle) {
      live_[i].mark_done();
      live_[i] = std::move(live_.back());
      live_.pop_back();
      return;
    }
  }
}

}  // namespace tandem
