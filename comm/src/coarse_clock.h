// The coarse monotonic clock: the steady clock's epoch at a few milliseconds'
// resolution (the kernel's tick), read in about 3 ns where the steady clock
// takes about 20 (docs/running.md, 'Flight recorder'). For the stamps every
// call takes: its deadline, the flight recorder's times, the pause check.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>

#include "tandem/types.h"

namespace tandem {

inline int64_t coarse_now_ns() {
  timespec t{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
  return int64_t(t.tv_sec) * 1'000'000'000 + t.tv_nsec;
}

// On the steady clock's time line (CLOCK_MONOTONIC), up to a tick behind it.
inline Clock::time_point coarse_now() {
  static_assert(Clock::is_steady);
  return Clock::time_point(std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(coarse_now_ns())));
}

}  // namespace tandem
