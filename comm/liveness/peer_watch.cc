#include "liveness/peer_watch.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

#include "src/subsystem_log.h"

namespace tandem {

PeerWatch::PeerWatch(KeyValueStore& store, std::string prefix, int rank, int size, std::chrono::milliseconds heartbeat)
    : store_(store),
      prefix_(std::move(prefix)),
      rank_(rank),
      watched_(size > 1 ? (rank + 1) % size : -1),
      heartbeat_(heartbeat) {}

std::string PeerWatch::beat_key(int rank) const { return prefix_ + "/beat/" + std::to_string(rank); }
std::string PeerWatch::gone_key(int rank) const { return prefix_ + "/gone/" + std::to_string(rank); }

void PeerWatch::beat(Deadline deadline) { store_.add(beat_key(rank_), 1, deadline); }

void PeerWatch::step(Clock::time_point now, Deadline deadline) {
  if (steps_++ % 2 == 1) beat(deadline);
  if (watched_ < 0) return;
  std::optional<std::string> seen = store_.try_get(beat_key(watched_), deadline);
  if (steps_ == 1 || seen != last_seen_) {
    last_seen_ = std::move(seen);
    last_moved_ = now;
    return;
  }
  const auto silent = now - last_moved_;
  if (silent <= kSilentHeartbeats * heartbeat_) return;
  if (store_.check({gone_key(watched_)}, deadline)) {
    watched_ = -1;  // it left cleanly
    return;
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(silent).count();
  std::ostringstream reason;
  reason << "no heartbeat for " << ms / 1000 << "." << ms % 1000 / 100 << " s, " << kSilentHeartbeats
         << " intervals of " << heartbeat_.count() << " ms (the process is stopped, hung or cut off from the store; "
         << "rank " << rank_ << " watches it)";
  subsystem_log(Subsystem::liveness)
      .warn("tandem rank {}: rank {} sent no heartbeat for {} ms (interval {} ms)", rank_, watched_, ms,
            heartbeat_.count());
  record_failed_rank(store_, watched_, reason.str(), deadline);
  watched_ = -1;  // reported once
}

void PeerWatch::leave(Deadline deadline) { store_.set(gone_key(rank_), "1", deadline); }

void record_failed_rank(KeyValueStore& store, int rank, const std::string& reason, Deadline deadline) {
  store.set(failure_reason_key(rank), reason, deadline);  // first: a reader of the list finds the reason
  const std::string me = std::to_string(rank);
  std::optional<std::string> list = store.try_get(kFailedRanksKey, deadline);
  if (list && !list->empty()) {
    std::string entry;
    std::istringstream in(*list);
    while (std::getline(in, entry, ',')) {
      if (entry == me) return;
    }
    store.set(kFailedRanksKey, *list + "," + me, deadline);
    return;
  }
  store.set(kFailedRanksKey, me, deadline);
}

}  // namespace tandem
