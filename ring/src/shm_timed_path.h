// Which way a shared-memory call of heap buffers goes, staged or by
// cross-memory attach, when rank 0 times both on the calls themselves
// (TANDEM_SHM_ALLREDUCE_CMA=timed): which wins differs by host, by load and
// by in place or not more than any probe predicts.
#pragma once

#include <optional>

#include "shm_direct.h"
#include "shm_segments.h"

namespace tandem::ring {

// A call's path; on rank 0 during a round's opening, also its trial's clock.
struct TimedPath {
  Offer offer = Offer::staged;
  // Rank 0, a timed trial: its class's trials, the path it times, its place in its pair, its entry.
  PathTrials* trials = nullptr;
  Reach trial{};
  bool second_of_pair = false;
  uint64_t started_ns = 0;
};

// Counts the call in its family and size class (every rank does, so the
// counts agree) and says which path it takes: a trial of the round's
// opening, or the verdict rank 0 published after it. `cold`, if given, is
// the path of the class's first round, untimed: its first opening then waits
// until the class is warm, and the other path must beat it clearly.
TimedPath timed_path(const Segments& s, PathFamily family, size_t bytes, std::optional<Offer> cold = {});

// Rank 0's verdict on a round's trials: the path that won more pairs; on a
// tie the one with the lower total; neither timed: staged. Against a
// family's cold path the other must also be clearly faster in total (under
// 0.9 of it): on 4 ranks over 2 cores single-call trials under-rated
// cross-memory attach (4.4-5.7 ms per 16 MiB trial at call 64, 3.6-4.0 in a
// run of such calls), and staging won 2 pairs of 3 there by totals 4 % apart
// where cross-memory attach runs 1.2-1.35x faster. (Measured before trials
// became runs of two calls; kept as the cautious rule.)
bool staged_won(const PathTrials& t, std::optional<Offer> cold);

// After arrive_direct: a trial counts only if the call went the way it
// times (an in-place all-to-all stages whatever the offer).
void confirm_trial(TimedPath& p, Reach reach);

// After the call's work: rank 0 adds the trial's time, from its entry to
// now, to its path's total and, second in a pair, scores the pair.
void end_trial(TimedPath& p);

}  // namespace tandem::ring
