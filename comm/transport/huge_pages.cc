#include "huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "src/subsystem_log.h"

#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25  // Linux 6.1; older headers lack it
#endif

namespace tandem {

HugePages::Counts HugePages::counts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

void HugePages::note_range(uintptr_t begin, uintptr_t end) {
  std::lock_guard<std::mutex> lock(mu_);
  ++clock_;
  Range* oldest = &ranges_[0];
  for (Range& r : ranges_) {
    if (r.begin == begin && r.end == end) {
      r.seen = clock_;
      return;
    }
    if (r.seen < oldest->seen) oldest = &r;
  }
  *oldest = Range{begin, end, clock_};
  collapse(begin, end);
}

// Once per range, whatever the outcome: a range the kernel refuses (older
// than Linux 6.1, huge pages disabled for the process, pages pinned by a
// peer's copy at that moment) keeps its pages and costs no further call.
// Refused or not, the time it took counts against the budget.
void HugePages::collapse(uintptr_t begin, uintptr_t end) {
  if (spent()) {
    ++counts_.over_budget;
    return;
  }
  ++counts_.asked;
  const auto start = std::chrono::steady_clock::now();
  const int rc = ::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_COLLAPSE);
  spent_ns_.fetch_add(
      uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count()),
      std::memory_order_relaxed);
  if (spent()) {
    subsystem_log(Subsystem::transport)
        .debug("tandem: huge pages: the collapses took {} ms; later buffers keep their pages",
               spent_ns_.load(std::memory_order_relaxed) / 1'000'000);
  }
  if (rc == 0) {
    ++counts_.collapsed;
    return;
  }
  const int error = errno;
  subsystem_log(Subsystem::transport)
      .debug("tandem: no huge pages for {} MiB at {:#x} ({})", (end - begin) >> 20, begin, std::strerror(error));
}

}  // namespace tandem
