// The path table's `timed` runs: which way a call of heap buffers goes,
// staged or by cross-memory attach, when rank 0 times both on the calls
// themselves. Which wins differs by host, by load and by in place or not
// more than any probe predicted (docs/algorithms.md, 'shm: the hand-off
// probe, retired').
#pragma once

#include <algorithm>

#include "shm_segments.h"

namespace tandem::ring {

// How a call reached the peers' buffers.
enum class Reach { staged, mapped, cross_memory };

// Each round of kPathRoundCalls calls of a family and size class opens with
// one untimed call of each path, then trial_pairs() pairs of trials, one of
// each path, a trial being kTrialCalls calls of its path, all but the first
// timed (docs/algorithms.md, 'shm: trials'); the first round,
// kPathFirstRoundCalls calls, opens with kFirstOpeningPairs pairs.
constexpr uint64_t kPathRoundCalls = 1 << 14;
// A first round that opens at a class's first call takes, for the
// all-to-all, kFirstRoundWarmCalls untimed calls by cross-memory attach,
// then kFirstOpeningPairs: its verdict stands from the 8th call (the 6th
// for the others). A class's first calls stage, untimed, where the
// family's caller asks: a short run then pays no trials of the slower
// path, and the opening finds warm buffers (docs/algorithms.md, 'shm: the
// first round').
constexpr uint64_t kPathFirstRoundCalls = 64;

// A call's path; on rank 0 during a round's opening, also its trial's clock.
struct TimedPath {
  Offer offer = Offer::staged;
  // Rank 0, a timed trial: its class's trials, the path it times, its place in its pair, its entry.
  PathTrials* trials = nullptr;
  Reach trial{};
  bool second_of_pair = false;
  bool trial_begins = false, trial_ends = false;  // the trial's first timed call, its last
  bool fastest = false;                           // the trial's time is its fastest timed call's, not their sum
  uint64_t started_ns = 0;
};

// Calls per trial, the first untimed: two, and in later rounds where ranks
// outnumber cores three, since two calls there missed a run's contention
// (docs/algorithms.md, 'shm: trials').
constexpr uint64_t kTrialCalls = 2;
constexpr uint64_t kSharedCoresTrialCalls = 3;
// The first round's one pair: cross-memory attach's trial is three calls,
// timed by the faster of its last two. With one timed call, one slow call
// (at 1 MiB on 2 ranks about one in 40 takes 150-200 us instead of 45)
// made staging win the pair, and the class's first 64 calls, or with a
// clear pair its whole first two rounds, staged at twice the time. The
// staged trial keeps two calls: a slow call there only confirms the way a
// class starts with, and a longer one would put the first call after the
// switch, which runs slow, into a 5-call benchmark's timed calls (4 ranks,
// 16 MiB: 4.68 against 4.24 ms).
constexpr uint64_t kFirstCrossMemoryTrialCalls = 3;
// Untimed calls by cross-memory attach before the all-to-all's first pair,
// whose timed calls of that path are then the sixth and seventh to read
// the buffers: the first two reads from a buffer take about twice a later
// one's time. Not
// before the reductions': there the direct path's first calls on buffers
// just moved to huge pages slowed its next ten (2-rank 16 MiB all-reduce,
// 1,507-1,605 against 1,611-1,847 us in three alternations).
constexpr uint64_t kFirstRoundWarmCalls = 2;
static_assert(kFirstRoundWarmCalls + kTrialCalls + kFirstCrossMemoryTrialCalls < kPathFirstRoundCalls,
              "the first round holds its opening");
static_assert(2 + 2 * kSharedCoresTrialCalls * kTrialMaxPairs < kPathRoundCalls, "a round holds its opening");

// Counts the call in its family and size class (every rank does, so the
// counts agree) and says which path it takes: staged in the class's first
// round if `stage_first` (the same on every rank), then a trial of a round's
// opening, or the verdict rank 0 published after it. `shared_cores`: ranks
// outnumber cores, so later rounds take kSharedCoresTrialCalls a trial.
TimedPath timed_path(const Segments& s, PathFamily family, size_t bytes, bool stage_first, bool shared_cores);

// Rank 0's verdict on a round's trials: staged unless cross-memory attach
// won more pairs (on a tie: the lower total) and is clearly faster in total,
// under 0.9 of staging's (docs/algorithms.md, 'shm: the margin'). The
// first round's one pair (`first_pair`) turns the margin round: cross-memory
// attach unless staging took under 0.9 of its time. Its trials run on
// buffers that cross-memory attach has not read yet, which slows its first
// calls more than staging's.
bool staged_won(const PathTrials& t, bool first_pair = false);
// Whether cross-memory attach clearly won the first round's pair (clear_win; both timed).
bool clear_verdict(const PathTrials& t);
// The path a published verdict names.
inline Offer verdict_offer(uint64_t verdict) {
  return (verdict & ~kClear) == kStaged ? Offer::staged : Offer::cross_memory;
}

// After arrive_direct: a trial counts only if each of its timed calls went
// the way it times (an in-place all-to-all stages whatever the offer).
void confirm_trial(TimedPath& p, Reach reach);

// After the call's work: rank 0 adds the call's time, from its entry to
// now, to its trial's (or keeps the faster, `fastest`); at the trial's last
// call, the trial's to its path's total and, second in a pair, scores the pair.
void end_trial(TimedPath& p);

}  // namespace tandem::ring
