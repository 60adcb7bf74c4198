// The timed choice between staging and cross-memory attach (shm_timed_path.h).
//
// A class's first round stages, untimed, where the caller asks, else it
// opens at once: the all-to-all's with two untimed calls by cross-memory
// attach, then one pair of trials, cross-memory attach's a call longer and
// timed by its faster timed call; a clear win for cross-memory attach
// (kClearRatio) stands through the second round, which then opens with no
// trials. Each later round of a family and size class opens with one
// untimed call of each path (cold pages and caches), then pairs of trials,
// one of each path, staged first in even pairs and last in odd ones, so
// that a drift falls on both alike. A trial is two calls of its path
// (three, two pairs for every three, in the later rounds where ranks
// outnumber cores); rank 0 times all but the first from entry to return, so
// that each path runs as in a run of such calls: a staged call without an
// arrival, its ranks drifting apart by up to the slots' depth, cross-memory
// attach with its arrival and finish
// (docs/algorithms.md, 'shm: trials', 'shm: the first round'). Every rank
// knows from its own count which path an opening call takes. At the first
// call after the opening rank 0 publishes its verdict (staged_won); a peer
// that reads no verdict yet offers cross-memory attach and arrives, and if
// rank 0 stages, that call stages.
#include "shm_timed_path.h"

#include <algorithm>
#include <bit>

namespace tandem::ring {

TimedPath timed_path(const Segments& s, PathFamily family, size_t bytes, bool stage_first, bool shared_cores) {
  const size_t c = std::min<size_t>(std::bit_width(bytes >> 16), kPathClasses - 1);
  const uint64_t calls = s.path_calls(family, c)++;
  const bool first = calls < kPathFirstRoundCalls;
  if (stage_first && first) return {Offer::staged};
  PathTrials& t = s.path_trials(family, c);
  const auto [round, call] = round_place(calls, kPathFirstRoundCalls, kPathRoundCalls);
  if (round == 1 && (load_relaxed(t.verdict) & kClear)) return {verdict_offer(load_relaxed(t.verdict))};
  // The all-to-all's first round opens with untimed calls by cross-memory
  // attach (the first reads from a buffer run slow); a later round with one
  // of each path.
  const uint64_t warm_calls = !first ? 2 : family == PathFamily::alltoall ? kFirstRoundWarmCalls : 0;
  // Longer trials where ranks outnumber cores, two pairs for every three,
  // so that the opening takes no more calls.
  const bool longer = !first && shared_cores;
  const uint64_t per_trial = longer ? kSharedCoresTrialCalls : kTrialCalls;
  // Later rounds' pairs; the first round's one pair is a staged trial, then
  // one of cross-memory attach a call longer (kFirstCrossMemoryTrialCalls).
  static_assert(kFirstOpeningPairs == 1, "the first round opens with one pair");
  const uint64_t pairs = longer ? std::max<uint64_t>(2, trial_pairs(bytes) * 2 / 3) : trial_pairs(bytes);
  const uint64_t end = warm_calls + (first ? kTrialCalls + kFirstCrossMemoryTrialCalls : 2 * per_trial * pairs);
  TimedPath path;
  if (call < end) {
    // Untimed calls, then trials i of per_trial calls of one path, all but
    // the first timed; staged first in even pairs of trials, last in odd ones.
    const bool warm = call < warm_calls;
    const uint64_t k = warm ? 0 : call - warm_calls;
    const bool longer_cma = first && k >= kTrialCalls;
    const uint64_t i = warm ? 0 : longer_cma ? 1 : k / per_trial;
    const uint64_t place = warm ? 0 : longer_cma ? k - kTrialCalls : k % per_trial;
    const uint64_t trial_calls = longer_cma ? kFirstCrossMemoryTrialCalls : per_trial;
    const bool staged = warm ? !first && call == 0 : ((i / 2) % 2 == 0) == (i % 2 == 0);
    path.offer = staged ? Offer::staged : Offer::cross_memory;
    if (s.rank() != 0) return path;
    if (call == 0) {  // peers read only the verdict, and not before the opening's end
      store_relaxed(t.verdict, kUntimed);
      t.staged_ns = t.cross_memory_ns = t.staged_wins = t.cross_memory_wins = 0;
    }
    if (!warm && place >= 1) {
      path.trials = &t;
      path.trial = staged ? Reach::staged : Reach::cross_memory;
      path.second_of_pair = i % 2 == 1;
      path.trial_begins = place == 1;
      path.trial_ends = place + 1 == trial_calls;
      path.fastest = first;
      if (!path.second_of_pair && path.trial_begins) t.pair_first_ns = kNotTimed;
      path.started_ns = trial_clock_ns();
    }
    return path;
  }
  if (s.rank() == 0 && call == end) {
    const uint64_t verdict = staged_won(t, /*first_pair=*/first) ? kStaged : kCrossMemory;
    store_relaxed(t.verdict, verdict | (first && clear_verdict(t) ? kClear : 0));
  }
  path.offer = verdict_offer(load_relaxed(t.verdict));
  return path;
}

bool staged_won(const PathTrials& t, bool first_pair) {
  // Both trials counted (a trial that lost a call leaves its total 0).
  if (first_pair && t.staged_ns > 0 && t.cross_memory_ns > 0) return t.staged_ns * 10 < t.cross_memory_ns * 9;
  const bool cma_more_pairs =
      t.staged_wins != t.cross_memory_wins ? t.cross_memory_wins > t.staged_wins : t.cross_memory_ns < t.staged_ns;
  return !(cma_more_pairs && t.cross_memory_ns * 10 < t.staged_ns * 9);
}

bool clear_verdict(const PathTrials& t) {
  return t.staged_ns > 0 && t.cross_memory_ns > 0 && clear_win(double(t.cross_memory_ns) / double(t.staged_ns));
}

void confirm_trial(TimedPath& p, Reach reach) {
  if (!p.trials || reach == p.trial) return;
  p.trials->trial_ns = kNotTimed;  // the trial lost a call: it does not count
  p.trials = nullptr;
}

void end_trial(TimedPath& p) {
  if (!p.trials) return;
  const uint64_t ns = trial_clock_ns() - p.started_ns;
  PathTrials& t = *p.trials;
  if (p.trial_begins) {
    t.trial_ns = ns;
  } else if (t.trial_ns != kNotTimed) {
    t.trial_ns = p.fastest ? std::min(t.trial_ns, ns) : t.trial_ns + ns;
  }
  // Only whole trials count: in its path's total and in its pair.
  if (!p.trial_ends || t.trial_ns == kNotTimed) return;
  const bool staged = p.trial == Reach::staged;
  (staged ? t.staged_ns : t.cross_memory_ns) += t.trial_ns;
  if (!p.second_of_pair) {
    t.pair_first_ns = t.trial_ns;
  } else if (t.pair_first_ns != kNotTimed) {
    ++((t.trial_ns < t.pair_first_ns) == staged ? t.staged_wins : t.cross_memory_wins);
  }
}

}  // namespace tandem::ring
