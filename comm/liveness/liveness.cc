// Liveness: the heartbeat, health checks during a wait, and naming the rank
// that failed first.
#include "liveness/liveness.h"

#include <algorithm>
#include <cstdlib>

#include "src/coarse_clock.h"
#include "src/subsystem_log.h"

namespace tandem {
namespace {

// The rank the store saw die first (kFailedRanksKey lists them in order); the
// job's store may also list processes beyond this communicator (joiners).
std::optional<int> first_failed_rank(const std::optional<std::string>& failed_ranks, int size) {
  if (!failed_ranks) return std::nullopt;
  for (int r : parse_rank_list(*failed_ranks)) {
    if (r >= 0 && r < size) return r;
  }
  return std::nullopt;
}

}  // namespace

PeerFailure Liveness::rank_died(int rank, const std::string& detail) {
  const Deadline until = Clock::now() + std::chrono::milliseconds(500);
  std::optional<std::string> host, why;
  try {
    host = ctx_.store->try_get(ctx_.key("host/" + std::to_string(rank)), until);
    why = ctx_.store->try_get(failure_reason_key(rank), until);
  } catch (const Error&) {
    // The store may be going away too; name what we know.
  }
  return PeerFailure(rank, "rank " + std::to_string(rank) + (host ? " (" + *host + ")" : std::string()) +
                               " failed: " + (why ? *why : "its process exited or lost its connection") + detail);
}

// The store knows which rank died first; name that one when it says so.
void Liveness::blame_first_failure(const PeerFailure& seen, const Task& task, uint32_t seq) {
  const int rank = ctx_.rank();
  calls_.throw_published_mismatch(task.what, seq, std::max(0, seen.rank()));
  const std::string during = "; during " + describe_wait(task.what, seq, rank, std::max(0, seen.rank()));
  const Deadline until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until) {
    std::optional<std::string> failed;
    try {
      failed = ctx_.store->try_get(kFailedRanksKey, until);
    } catch (const Error&) {
      break;
    }
    if (auto r = first_failed_rank(failed, ctx_.size())) {
      throw rank_died(*r, during + "; rank " + std::to_string(rank) + " saw: " + seen.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (seen.rank() >= 0)
    throw rank_died(seen.rank(), during + "; rank " + std::to_string(rank) + " saw: " + seen.what());
  throw seen;
}

void Liveness::check(const Task& task, uint32_t seq, int waiting_on, int failed_peer) {
  const Description& what = task.what;
  const int rank = ctx_.rank();
  if (failed_.load(std::memory_order_relaxed)) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = error_;
    }
    ctx_.throw_store_lost(Error(why + "; during " + describe_wait(what, seq, rank, waiting_on)));
  }
  const auto now = Clock::now();
  if (failed_peer >= 0) {
    calls_.throw_published_mismatch(what, seq, waiting_on);
    throw rank_died(failed_peer,
                    "; its UCX endpoint reported an error during " + describe_wait(what, seq, rank, waiting_on));
  }
  last_check_.store(now.time_since_epoch().count(), std::memory_order_relaxed);
  // The store is asked here only when the watch thread found something, after
  // a pause, or when this call has waited a poll interval: a call that
  // completes allocates nothing and makes no round trip to the store.
  const bool due = poll_requested_ || news_.load(std::memory_order_relaxed) ||
                   now - (task.deadline - task.timeout) >= ctx_.opts.failure_poll;
  if (due && now >= next_failure_poll_) {
    poll_requested_ = false;
    next_failure_poll_ = now + ctx_.opts.failure_poll;
    std::optional<std::string> failed_ranks;
    try {
      failed_ranks = ctx_.store->try_get(kFailedRanksKey, now + ctx_.store_patience());
    } catch (const Timeout&) {
      // A slow store is not a dead peer; the collective deadline still bounds us.
    } catch (const PeerFailure& e) {
      ctx_.throw_store_lost(e);
    }
    if (auto r = first_failed_rank(failed_ranks, ctx_.size())) {
      calls_.throw_published_mismatch(what, seq, waiting_on);
      throw rank_died(*r, "; during " + describe_wait(what, seq, rank, waiting_on));
    }
    throw_if_revoked(what, seq, waiting_on, now + ctx_.store_patience());
    calls_.check_calls_match(what, seq, waiting_on, now + ctx_.store_patience());
  }
  if (now >= task.deadline) {
    throw Timeout(describe_wait(what, seq, rank, waiting_on) + " timed out after " +
                  std::to_string(task.timeout.count()) + " ms" +
                  "; check that every rank calls the same collectives with the same dtype in the same order "
                  "(mismatched calls never match); if the job is just slow, raise CommOptions::timeout "
                  "(TANDEM_TIMEOUT_MS)");
  }
}

void Liveness::throw_if_revoked(const Description& what, uint32_t seq, int waiting_on, Deadline deadline) {
  std::optional<std::string> revoked;
  try {
    revoked = ctx_.store->try_get(ctx_.key(kRevokedKey), deadline);
  } catch (const Timeout&) {
    return;  // as for the failed ranks: the collective deadline still bounds us
  } catch (const PeerFailure& e) {
    ctx_.throw_store_lost(e);
  }
  if (revoked) throw Revoked(*revoked + "; during " + describe_wait(what, seq, ctx_.rank(), waiting_on));
}

bool Liveness::paused() {
  // This order: the heartbeat thread sets pause_seen_ before it moves last_beat_ns_ on.
  const int64_t last = last_beat_ns_.load();
  if (last == 0) return false;
  const int64_t bound = std::chrono::duration_cast<std::chrono::nanoseconds>(ctx_.opts.heartbeat).count();
  if (coarse_now_ns() - last < bound && !pause_seen_.load()) return false;
  pause_seen_.store(false);
  return true;
}

std::chrono::microseconds Liveness::until_next_check(const Task& task) const {
  const auto now = Clock::now();
  const auto next = std::min({task.deadline, next_failure_poll_, now + ctx_.opts.failure_poll});
  return std::max(std::chrono::microseconds(0), std::chrono::duration_cast<std::chrono::microseconds>(next - now));
}

void Liveness::start(Deadline deadline) {
  const CommOptions& opts = ctx_.opts;
  store_ = ctx_.store->connect_again(deadline);
  const bool beating = opts.heartbeat.count() > 0;
  // Registered (or the first beat) before any collective.
  if (beating && store_->tracks_liveness()) {
    store_->heartbeat(opts.rank, opts.heartbeat, deadline);
  } else if (beating) {
    peer_watch_ = std::make_unique<PeerWatch>(*store_, opts.prefix, opts.rank, opts.size, opts.heartbeat);
    peer_watch_->beat(deadline);
  }
  const auto beat_interval = !beating      ? std::chrono::milliseconds::max()
                             : peer_watch_ ? peer_watch_->step_interval()
                                           : opts.heartbeat / 2;
  if (beating) last_beat_ns_ = coarse_now_ns();
  thread_ = std::thread([this, beating, beat_interval] {
    const CommOptions& opts = ctx_.opts;
    const int64_t pause = std::chrono::duration_cast<std::chrono::nanoseconds>(opts.heartbeat).count();
    const auto step = std::min<std::chrono::milliseconds>(beat_interval, opts.failure_poll);
    Clock::time_point next_beat = beating ? Clock::now() + beat_interval : Clock::time_point::max();
    Clock::time_point next_poll = Clock::now() + opts.failure_poll;
    Clock::rep polled = 0;
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (cv_.wait_for(lock, step, [&] { return stopping_; })) return;
      lock.unlock();
      const auto now = Clock::now();
      std::string error;
      if (beating && now >= next_beat) {
        next_beat = now + beat_interval;
        const int64_t now_ns = coarse_now_ns();
        if (now_ns - last_beat_ns_.load() >= pause) pause_seen_.store(true);
        last_beat_ns_.store(now_ns);
        try {
          const Deadline until = now + opts.heartbeat;
          if (peer_watch_) {
            peer_watch_->step(now, until);
          } else {
            store_->heartbeat(opts.rank, opts.heartbeat, until);
          }
        } catch (const std::exception& e) {
          error = std::string("rank ") + std::to_string(opts.rank) + " cannot reach the store to send its heartbeat (" +
                  e.what() + ")";
        }
      }
      // Polls only while calls wait (they check health), as often as they would.
      if (error.empty() && now >= next_poll && last_check_.load(std::memory_order_relaxed) > polled) {
        next_poll = now + opts.failure_poll;
        polled = now.time_since_epoch().count();
        news_.store(store_has_news(now + ctx_.store_patience()), std::memory_order_relaxed);
      }
      lock.lock();
      if (!error.empty()) {
        error_ = error;
        failed_ = true;
        return;
      }
    }
  });
}

// Whether the store holds what a waiting call must act on: a failed member,
// a revocation, a published mismatch, or a rank that gave up.
bool Liveness::store_has_news(Deadline until) {
  try {
    if (first_failed_rank(store_->try_get(kFailedRanksKey, until), ctx_.size())) return true;
    for (const char* key : {kRevokedKey, CallCheck::kMismatchKey, CallCheck::kAbandonedKey}) {
      if (store_->try_get(ctx_.key(key), until)) return true;
    }
  } catch (const Timeout&) {
    // A slow store is not a dead peer: ask again next time.
  } catch (const Error&) {
    return true;  // the store is gone: the call's own poll names it
  }
  return false;
}

void Liveness::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
  const bool beating = last_beat_ns_ != 0;
  last_beat_ns_ = 0;
  if (beating && !failed_) {
    try {
      const Deadline until = Clock::now() + std::chrono::seconds(2);
      if (peer_watch_) {
        peer_watch_->leave(until);
      } else {
        store_->goodbye(until);
      }
    } catch (const std::exception& e) {
      subsystem_log(Subsystem::liveness).debug("tandem rank {}: heartbeat goodbye: {}", ctx_.rank(), e.what());
    }
  }
  peer_watch_.reset();
  store_.reset();
}

}  // namespace tandem
