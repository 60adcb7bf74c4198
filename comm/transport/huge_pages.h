// Transparent huge pages for the heap buffers that ranks of one host copy by
// cross-memory attach. The kernel pins a peer's memory and copies it page by
// page: a buffer on 4 KiB pages costs a pin and a page-table walk per 4 KiB,
// one on 2 MiB pages one per 2 MiB (docs/algorithms.md, 'shm: huge pages for
// heap buffers').
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>

namespace tandem {

// Collapses a buffer's whole huge pages (MADV_COLLAPSE) at its first call,
// as a registration cache registers a buffer at its first use: the first
// call pays (about 0.3 ms per 2 MiB, 1–3 ms on fresh or fragmented memory),
// and the timed paths' first trials, from that call on, time the pages the
// buffer keeps. A collapse starts only while the collapses so far took under
// kBudgetNs: a job that calls on fresh buffers every step (new tensors at new
// addresses) pays about that once, then its buffers keep their pages.
class HugePages {
 public:
  static constexpr size_t kHugePage = size_t(2) << 20;
  // Buffers remembered; the least recently seen makes room. A buffer
  // remembered is not collapsed again, even if its memory was freed and
  // mapped anew since: a collapse costs more than a call gains.
  static constexpr size_t kRanges = 32;
  // The time all collapses may take (a collapse starts while the time spent
  // is under it): 2 ranks ping-ponging a fresh 16 MiB buffer every step took
  // 10–48 ms a step collapsing each, 6 ms without huge pages, 3 ms on a
  // buffer kept (docs/algorithms.md, 'shm: huge pages for heap buffers').
  static constexpr uint64_t kBudgetNs = 200'000'000;

  explicit HugePages(uint64_t budget_ns = kBudgetNs) : budget_ns_(budget_ns) {}

  // Collapses the whole huge pages of [p, p + bytes) unless that range was
  // seen lately. Buffers spanning no whole huge page return at once. Any thread.
  void note(const void* p, size_t bytes) {
    if (holds_one(p, bytes)) note_range(round_up(p), round_down(p, bytes));
  }
  // Whether the collapses took the budget: no buffer noted from now on is
  // collapsed, so callers may stop noting. Any thread.
  bool spent() const { return spent_ns_.load(std::memory_order_relaxed) >= budget_ns_; }
  // Whether [p, p + bytes) spans a whole huge page.
  static bool holds_one(const void* p, size_t bytes) { return p && round_down(p, bytes) > round_up(p); }

  // Ranges the kernel was asked to collapse, those it did, and those left
  // alone because the collapses had taken the budget.
  struct Counts {
    uint64_t asked = 0, collapsed = 0, over_budget = 0;
  };
  Counts counts() const;

 private:
  struct Range {
    uintptr_t begin = 0, end = 0;
    uint64_t seen = 0;  // when last noted, on clock_
  };
  static uintptr_t round_up(const void* p) { return (uintptr_t(p) + kHugePage - 1) & ~(kHugePage - 1); }
  static uintptr_t round_down(const void* p, size_t bytes) { return (uintptr_t(p) + bytes) & ~(kHugePage - 1); }
  void note_range(uintptr_t begin, uintptr_t end);
  void collapse(uintptr_t begin, uintptr_t end);

  mutable std::mutex mu_;
  const uint64_t budget_ns_;
  std::atomic<uint64_t> spent_ns_{0};  // written under mu_, read by spent() without it
  std::array<Range, kRanges> ranges_{};
  uint64_t clock_ = 0;
  Counts counts_;
};

}  // namespace tandem
