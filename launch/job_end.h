// How a launch ended: the line the launcher says and its exit status.
#pragma once

#include "spawn.h"
#include "tandem/launch/launch.h"

namespace tandem::launch {

struct JobEnd {
  int failed = 0;         // ranks that failed on their own
  int stopped_by_us = 0;  // ranks the launcher signalled
  int spawn_failure = 0;  // exit status of a rank that could not start; 0: none
  const Rank* first_failure = nullptr;
  bool timed_out = false;    // --timeout
  int interrupt_signal = 0;  // received and forwarded; 0: none
  int lost_workers = 0;      // --elastic: failed workers the job went on without
};

// Says how the job ended (unless a rank could not start: that was said) and
// returns the launcher's exit status (tandem/launch/launch.h, run_launch).
int report_job_end(const JobEnd& end, const LaunchOptions& o);

}  // namespace tandem::launch
