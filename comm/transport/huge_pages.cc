#include "huge_pages.h"

#include <sys/mman.h>

#include <cerrno>
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
void HugePages::collapse(uintptr_t begin, uintptr_t end) {
  ++counts_.asked;
  if (::madvise(reinterpret_cast<void*>(begin), end - begin, MADV_COLLAPSE) == 0) {
    ++counts_.collapsed;
    return;
  }
  const int error = errno;
  subsystem_log(Subsystem::transport)
      .debug("tandem: no huge pages for {} MiB at {:#x} ({})", (end - begin) >> 20, begin, std::strerror(error));
}

}  // namespace tandem
