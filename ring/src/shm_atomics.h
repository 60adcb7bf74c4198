// The shared segments' words as peers read and write them: acquire loads and
// release stores where a word publishes data written before it, relaxed ones
// where a racy read is only a hint; and the hint that takes a line to write.
#pragma once

#include <atomic>
#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace tandem::ring {

inline uint64_t load_acquire(const uint64_t& x) {
  return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire);
}
inline void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }
inline uint64_t load_relaxed(const uint64_t& x) {
  return std::atomic_ref<const uint64_t>(x).load(std::memory_order_relaxed);
}
inline void store_relaxed(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_relaxed); }

// Asks for the line at `p` in a state this core may write (PREFETCHW where
// the CPU has it, else an ordinary prefetch): a hint, never a fault.
inline void prefetch_for_write(const void* p) {
#if defined(__x86_64__)
  static const bool has_prefetchw = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(0x80000001, &a, &b, &c, &d) && (c & (1u << 8)) != 0;  // PRFCHW
  }();
  if (has_prefetchw) {
    asm volatile("prefetchw %0" ::"m"(*static_cast<const char*>(p)));
    return;
  }
#endif
  __builtin_prefetch(p, 1, 3);
}

}  // namespace tandem::ring
