#include "job_end.h"

#include "signals.h"
#include "streams.h"

namespace tandem::launch {

int report_job_end(const JobEnd& e, const LaunchOptions& o) {
  const std::string abnormal = std::to_string(e.failed) + " of " + std::to_string(o.nprocs + o.servers) +
                               " rank(s) failed on their own, " + std::to_string(e.stopped_by_us) +
                               " stopped by the launcher";
  if (e.spawn_failure != 0) return e.spawn_failure;
  if (e.first_failure) {
    const Rank& r = *e.first_failure;
    say("job failed: rank " + std::to_string(r.rank) + " failed first (" + describe(r.status) + "); " + abnormal);
    return exit_code_of(r.status);
  }
  if (e.timed_out) {
    say("job timed out after " + seconds_text(o.timeout_seconds) + " (--timeout); " + abnormal);
    return 124;
  }
  if (e.interrupt_signal != 0) {
    say("job interrupted by " + signal_name(e.interrupt_signal) + "; " + abnormal);
    return 128 + e.interrupt_signal;
  }
  if (e.lost_workers > 0) say("job done without " + std::to_string(e.lost_workers) + " lost worker(s) (--elastic)");
  return 0;
}

}  // namespace tandem::launch
