#include "stall_reporter.h"

#include <cstdio>
#include <utility>

namespace tandem::trainer {

void StallReporter::add(const TrainRecord& r, bool communicated, std::span<const fusion::Metric> arrivals) {
  if (pending_ && communicated && log_) {
    int last = 0;
    for (int i = 1; i < world_; ++i)
      if (arrivals[size_t(i)].sum > arrivals[size_t(last)].sum) last = i;
    const double arrival = arrivals[size_t(last)].sum;
    log_->stall(stalled_, median_, last, arrival);
    std::fprintf(stderr,
                 "stall: batch %lld took %.0f ms (%.1fx the median %.0f ms): data %.0f ms, compute %.0f ms, "
                 "exposed communication %.0f ms; rank %d arrived last (%.0f ms before its wait)\n",
                 static_cast<long long>(stalled_.batch), 1e3 * stalled_.step, stalled_.step / median_, 1e3 * median_,
                 1e3 * stalled_.data, 1e3 * stalled_.compute, 1e3 * stalled_.exposed, last, 1e3 * arrival);
    pending_ = false;
  }
  if (std::exchange(skip_next_, false)) return;
  const double median_before = detector_.median();
  if (detector_.add(r.step)) stalled_ = r, median_ = median_before, pending_ = true;
}

}  // namespace tandem::trainer
