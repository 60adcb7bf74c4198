// Which way a shared-memory call of heap buffers goes, staged or by
// cross-memory attach, when rank 0 times both on the calls themselves
// (TANDEM_SHM_ALLREDUCE_CMA=timed): which wins differs by host, by load and
// by in place or not more than any probe predicts.
#pragma once

#include <algorithm>
#include <optional>

#include "shm_direct.h"
#include "shm_segments.h"

namespace tandem::ring {

// One entry per family and power-of-two class of bytes per call (64 KiB
// steps). Every rank counts its calls of each (the same count on all); each
// round of kPathRoundCalls calls (the first one kPathFirstRoundCalls) opens
// with one untimed call of each path, then path_block_calls() pairs of
// trials, one of each path, a trial being two calls of its path with the
// second timed: as many pairs as move kPathBlockBytes, from 3 to
// kPathMaxBlock, so that small calls give a fair sample and a large one few
// slow trials (two pairs at 1 MiB tied as often as not). In place and out
// of place are families of their own for the all-reduce: on one host
// cross-memory attach won 1.6x in place at 16 MiB and lost 1.3x out of
// place. (The all-to-all in place always stages.)
constexpr size_t kPathBlockBytes = 1 << 20;
constexpr uint64_t kPathMaxBlock = 12;
inline uint64_t path_block_calls(size_t bytes) {
  return std::clamp<uint64_t>(kPathBlockBytes / std::max<size_t>(bytes, 1), 3, kPathMaxBlock);
}
constexpr uint64_t kPathRoundCalls = 1 << 14;
// The first round is short, so that a verdict taken on cold buffers is
// taken again once they are warm (or, for a family with a cold path, first
// taken then): 4 ranks on 2 cores, 16 MiB all-to-all, ran cross-memory
// attach at 7-10 ms per call for its first calls, 3.9 ms after ten,
// staging 5.3; the first verdict staged 5 times in 6, the one at call 64
// chose cross-memory attach 5 times in 6.
constexpr uint64_t kPathFirstRoundCalls = 64;
static_assert(2 + 4 * kPathMaxBlock < kPathFirstRoundCalls, "the first round holds a whole opening");
// The call's place in its round.
inline uint64_t round_call(uint64_t calls) {
  return calls < kPathFirstRoundCalls ? calls : (calls - kPathFirstRoundCalls) % kPathRoundCalls;
}

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
