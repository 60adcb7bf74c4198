// Liveness over a store that does not watch ranks itself (a foreign
// KeyValueStore, see store.h): the ranks watch each other through two keys
// per rank, so the store only answers ordinary set/add/get.
//
// Terms. A *beat* is an add of 1 to the rank's beat key, "<prefix>/beat/<rank>".
// Each rank watches one other, its ring successor (rank + 1) % size, by
// reading that key: the watched rank. A *step* runs every heartbeat / 4: it
// beats on every second step (every heartbeat / 2) and reads the watched
// rank's key. A watched key that has not moved for kSilentHeartbeats
// intervals, counted from the step that last saw it move, means the watched
// rank is stopped, hung or cut off: the watcher records it under the keys
// tandem's own store would (failure_reason_key(rank), kFailedRanksKey), where
// every rank's failure poll finds it. A rank that leaves cleanly sets
// "<prefix>/gone/<rank>" first, and its watcher then stops watching.
//
// Cost: one add per rank every heartbeat / 2 and one read every heartbeat / 4,
// whatever the world size. Detection: within kSilentHeartbeats intervals and
// two steps of the last beat (2.5 heartbeats), then one failure poll.
// kFailedRanksKey is read and rewritten, not appended atomically: two ranks
// recorded in the same instant may leave only one of them listed (either is a
// real failure to name).
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include "tandem/store.h"

namespace tandem {

class PeerWatch {
 public:
  PeerWatch(KeyValueStore& store, std::string prefix, int rank, int size, std::chrono::milliseconds heartbeat);

  // How often step() must run.
  std::chrono::milliseconds step_interval() const { return heartbeat_ / 4; }
  int watched() const { return watched_; }
  // Beats now (also the first beat, before any collective).
  void beat(Deadline deadline);
  // One step at time `now` (see above); store errors propagate.
  void step(Clock::time_point now, Deadline deadline);
  // A clean departure: this rank's watcher stops watching it.
  void leave(Deadline deadline);

 private:
  std::string beat_key(int rank) const;
  std::string gone_key(int rank) const;

  KeyValueStore& store_;
  std::string prefix_;
  int rank_;
  int watched_;  // -1: nobody (a world of one, or the watched rank left or was recorded)
  std::chrono::milliseconds heartbeat_;
  unsigned steps_ = 0;
  std::optional<std::string> last_seen_;  // the watched rank's beat count when it last moved
  Clock::time_point last_moved_{};        // the step that saw it move (or the first step)
};

// Records `rank` as failed for `reason` the way tandem's store does (see store.h).
void record_failed_rank(KeyValueStore& store, int rank, const std::string& reason, Deadline deadline);

}  // namespace tandem
