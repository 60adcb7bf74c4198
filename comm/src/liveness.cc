// Liveness and failure attribution: the heartbeat, health checks during a
// wait, naming the rank that failed first, and mismatches other ranks found.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "communicator_impl.h"

namespace tandem {

namespace {

// The rank the store saw die first (kFailedRanksKey lists them in order).
std::optional<int> first_failed_rank(const std::optional<std::string>& failed_ranks) {
  if (!failed_ranks || failed_ranks->empty()) return std::nullopt;
  return std::atoi(failed_ranks->c_str());
}

// A mismatch another rank published, as this rank reports it.
CollectiveMismatch learned_mismatch(const std::string& found, int rank, const std::string& during) {
  return CollectiveMismatch(found + " (rank " + std::to_string(rank) + " learned it during " + during + ")");
}

}  // namespace

// "rank 1 (host vm, pid 42) failed: <why the store recorded it><detail>".
PeerFailure Communicator::Impl::rank_died(int rank, const std::string& detail) {
  const Deadline until = Clock::now() + std::chrono::milliseconds(500);
  std::optional<std::string> host, why;
  try {
    host = store->try_get(key("host/" + std::to_string(rank)), until);
    why = store->try_get(failure_reason_key(rank), until);
  } catch (const Error&) {
    // The store may be going away too; name what we know.
  }
  return PeerFailure(rank, "rank " + std::to_string(rank) + (host ? " (" + *host + ")" : std::string()) +
                               " failed: " + (why ? *why : "its process exited or lost its connection") + detail);
}

void Communicator::Impl::throw_store_lost(const std::exception& e) {
  if (store_host_rank >= 0) {
    throw PeerFailure(store_host_rank, "rank " + std::to_string(store_host_rank) +
                                           " failed: the bootstrap store it hosted is gone (" + e.what() + ")");
  }
  if (opts.store) throw PeerFailure(-1, std::string("lost the store handed to the communicator: ") + e.what());
  throw PeerFailure(-1, std::string("lost the bootstrap store (launcher gone?): ") + e.what());
}

// A transport error names the peer at the other end of one message, which may
// only have died because another rank did (and then exited on its own error).
// The store knows which rank died first; name that one when it says so.
void Communicator::Impl::blame_first_failure(const PeerFailure& seen, const Task& task) {
  throw_published_mismatch(task, std::max(0, seen.rank()));
  const std::string during = "; during " + describe_wait(task.what, seq, opts.rank, std::max(0, seen.rank()));
  const Deadline until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until) {
    std::optional<std::string> failed;
    try {
      failed = store->try_get(kFailedRanksKey, until);
    } catch (const Error&) {
      break;
    }
    if (auto r = first_failed_rank(failed)) {
      throw rank_died(*r, during + "; rank " + std::to_string(opts.rank) + " saw: " + seen.what());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (seen.rank() >= 0)
    throw rank_died(seen.rank(), during + "; rank " + std::to_string(opts.rank) + " saw: " + seen.what());
  throw seen;
}

void Communicator::Impl::publish_mismatch(const std::string& text) {
  if (!store) return;
  try {
    const Deadline until = Clock::now() + std::chrono::milliseconds(500);
    if (!store->try_get(key("mismatch"), until)) store->set(key("mismatch"), text, until);  // the first finding stays
  } catch (const Error& e) {
    spdlog::debug("tandem rank {}: could not publish the mismatch: {}", opts.rank, e.what());
  }
}

// A rank that found a mismatch publishes it, throws and may exit before this
// rank polls the store: its departure is the mismatch's doing, so a transport
// error or a failed-rank entry names the mismatch when one is published.
void Communicator::Impl::throw_published_mismatch(const Task& task, int waiting_on) {
  if (!store) return;
  std::optional<std::string> mismatch;
  try {
    mismatch = store->try_get(key("mismatch"), Clock::now() + std::chrono::milliseconds(500));
  } catch (const Error&) {
    return;  // the store may be going away too: the caller names the failure
  }
  if (mismatch) throw learned_mismatch(*mismatch, opts.rank, describe_wait(task.what, seq, opts.rank, waiting_on));
}

// What other ranks found out about this call: a mismatch, or a rank that
// left the communicator after the previous call (it skipped this one).
void Communicator::Impl::check_calls_match(const Task& task, int waiting_on, Deadline until) {
  std::optional<std::string> mismatch, left, abandoned;
  try {
    mismatch = store->try_get(key("mismatch"), until);
    // An exchange has no call numbers: a peer that gave up after an error is all it can learn.
    if (task.what.point_to_point()) abandoned = store->try_get(key("abandoned"), until);
    if (seq > 1 && !task.what.point_to_point()) left = store->try_get(key("left/" + std::to_string(seq - 1)), until);
  } catch (const Timeout&) {
    return;  // a slow store: ask again at the next poll
  } catch (const PeerFailure& e) {
    throw_store_lost(e);
  }
  const std::string during = describe_wait(task.what, seq, opts.rank, waiting_on);
  if (mismatch) throw learned_mismatch(*mismatch, opts.rank, during);
  if (abandoned) {
    throw PeerFailure(std::atoi(abandoned->c_str()),
                      "rank " + *abandoned + " left the communicator after an error or abort(), during " + during);
  }
  if (left) {
    throw CollectiveMismatch("rank " + *left + " skipped call #" + std::to_string(seq) +
                             ": it destroyed its communicator after call #" + std::to_string(seq - 1) + ", while " +
                             during + "; every rank must issue the same collectives in the same order");
  }
}

void Communicator::Impl::explain_mismatch() {
  if (!store) return;
  const Deadline until = Clock::now() + std::chrono::seconds(1);
  while (Clock::now() < until) {
    std::optional<std::string> found;
    try {
      found = store->try_get(key("mismatch"), until);
    } catch (const Error&) {
      return;
    }
    if (found) throw CollectiveMismatch(*found + " (rank " + std::to_string(opts.rank) + " learned it from the store)");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void Communicator::Impl::check_health(const Task& task, int waiting_on) {
  const Description& what = task.what;
  flight->waiting_on(waiting_on);
  if (aborted.load(std::memory_order_relaxed)) throw_aborted();
  if (heartbeat_failed.load(std::memory_order_relaxed)) {
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu);
      why = heartbeat_error;
    }
    throw_store_lost(Error(why + "; during " + describe_wait(what, seq, opts.rank, waiting_on)));
  }
  const auto now = Clock::now();
  int dead = ucx->failed_peer();
  if (dead >= 0) {
    throw_published_mismatch(task, waiting_on);
    throw rank_died(dead,
                    "; its UCX endpoint reported an error during " + describe_wait(what, seq, opts.rank, waiting_on));
  }
  if (now >= next_failure_poll) {
    next_failure_poll = now + opts.failure_poll;
    std::optional<std::string> failed_ranks;
    try {
      failed_ranks = store->try_get(kFailedRanksKey, now + store_patience());
    } catch (const Timeout&) {
      // A slow store is not a dead peer; the collective deadline still bounds us.
    } catch (const PeerFailure& e) {
      throw_store_lost(e);
    }
    if (auto r = first_failed_rank(failed_ranks)) {
      throw_published_mismatch(task, waiting_on);
      throw rank_died(*r, "; during " + describe_wait(what, seq, opts.rank, waiting_on));
    }
    check_calls_match(task, waiting_on, now + store_patience());
  }
  if (now >= task.deadline) {
    throw Timeout(describe_wait(what, seq, opts.rank, waiting_on) + " timed out after " +
                  std::to_string(task.timeout.count()) + " ms" +
                  "; check that every rank calls the same collectives with the same dtype in the same order "
                  "(mismatched calls never match); if the job is just slow, raise CommOptions::timeout "
                  "(TANDEM_TIMEOUT_MS)");
  }
}

std::chrono::microseconds Communicator::Impl::until_next_check(const Task& task) const {
  const auto now = Clock::now();
  const auto next = std::min({task.deadline, next_failure_poll, now + opts.failure_poll});
  return std::max(std::chrono::microseconds(0), std::chrono::duration_cast<std::chrono::microseconds>(next - now));
}

void Communicator::Impl::start_heartbeat(Deadline deadline) {
  heartbeat_store = store->connect_again(deadline);
  // Registered (or the first beat) before any collective.
  if (heartbeat_store->tracks_liveness()) {
    heartbeat_store->heartbeat(opts.rank, opts.heartbeat, deadline);
  } else {
    peer_watch = std::make_unique<PeerWatch>(*heartbeat_store, opts.prefix, opts.rank, opts.size, opts.heartbeat);
    peer_watch->beat(deadline);
  }
  const auto interval = peer_watch ? peer_watch->step_interval() : opts.heartbeat / 2;
  heartbeat_thread = std::thread([this, interval] {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      if (cv_heartbeat.wait_for(lock, interval, [&] { return heartbeat_stopping; })) return;
      lock.unlock();
      std::string error;
      try {
        const Deadline until = Clock::now() + opts.heartbeat;
        if (peer_watch) {
          peer_watch->step(Clock::now(), until);
        } else {
          heartbeat_store->heartbeat(opts.rank, opts.heartbeat, until);
        }
      } catch (const std::exception& e) {
        error = std::string("rank ") + std::to_string(opts.rank) + " cannot reach the store to send its heartbeat (" +
                e.what() + ")";
      }
      lock.lock();
      if (!error.empty()) {
        heartbeat_error = error;
        heartbeat_failed = true;
        return;
      }
    }
  });
}

void Communicator::Impl::stop_heartbeat() {
  if (!heartbeat_thread.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu);
    heartbeat_stopping = true;
  }
  cv_heartbeat.notify_all();
  heartbeat_thread.join();
  if (!heartbeat_failed) {
    try {
      const Deadline until = Clock::now() + std::chrono::seconds(2);
      if (peer_watch) {
        peer_watch->leave(until);
      } else {
        heartbeat_store->goodbye(until);
      }
    } catch (const std::exception& e) {
      spdlog::debug("tandem rank {}: heartbeat goodbye: {}", opts.rank, e.what());
    }
  }
  peer_watch.reset();
  heartbeat_store.reset();
}

}  // namespace tandem
