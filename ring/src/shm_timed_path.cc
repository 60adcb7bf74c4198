// The timed choice between staging and cross-memory attach (shm_timed_path.h).
//
// Each round of kPathRoundCalls calls of a family and size class opens with
// warm calls alternating the two paths untimed, then a block of staged
// calls and a block by cross-memory attach. Every rank knows from its own
// count which path an opening call takes. In a block every rank arrives (a
// staged trial too), so rank 0 times each call from every rank present until
// every rank is done with it; the first call of each block pays the switch
// and is not timed. At the first call after the opening rank 0 publishes the
// path with the faster call (the minimum: noise only adds time, and one call
// slowed 2x by another job had turned a mean of 15 calls); a peer that reads no verdict yet offers cross-
// memory attach and arrives, and if rank 0 stages, that call stages.
#include "shm_timed_path.h"

#include <algorithm>
#include <bit>

namespace tandem::ring {

TimedPath timed_path(const Segments& s, PathFamily family, size_t bytes) {
  const size_t c = std::min<size_t>(std::bit_width(bytes >> 16), kPathClasses - 1);
  const uint64_t call = s.path_calls(family, c)++ % kPathRoundCalls;
  const uint64_t block = path_block_calls(bytes), warm = std::min(kPathWarmCalls, 2 * block);
  const uint64_t cma_block = warm + block, end = warm + 2 * block;
  PathTrials& t = s.path_trials(family, c);
  TimedPath path;
  if (call < end) {
    const bool staged = call < warm ? call % 2 == 0 : call < cma_block;
    path.offer = !staged ? Offer::cross_memory : call < warm ? Offer::staged : Offer::staged_trial;
    if (s.rank() != 0) return path;
    if (call == 0) {  // peers read only the verdict, and not before the opening's end
      store_relaxed(t.verdict, kUntimed);
      t.staged_ns = t.cross_memory_ns = kNotTimed;
    }
    if (call > warm && call != cma_block) {
      path.trial = staged ? Reach::staged : Reach::cross_memory;
      path.trial_ns = staged ? &t.staged_ns : &t.cross_memory_ns;
    }
    return path;
  }
  if (s.rank() == 0 && call == end) {  // a path never timed loses; neither timed: staged
    store_relaxed(t.verdict, t.staged_ns <= t.cross_memory_ns ? kStaged : kCrossMemory);
  }
  path.offer = load_relaxed(t.verdict) == kStaged ? Offer::staged : Offer::cross_memory;
  return path;
}

void start_trial(TimedPath& p, Reach reach) {
  if (!p.trial_ns) return;
  if (reach != p.trial) {
    p.trial_ns = nullptr;
    return;
  }
  p.started_ns = Segments::now_ns();
}

void end_trial(Segments& s, TimedPath& p) {
  if (!p.trial_ns) return;
  s.settle();
  *p.trial_ns = std::min(*p.trial_ns, Segments::now_ns() - p.started_ns);
}

}  // namespace tandem::ring
