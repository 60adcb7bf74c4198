// The shared segments' words as peers read and write them: acquire loads and
// release stores where a word publishes data written before it, relaxed ones
// where a racy read is only a hint.
#pragma once

#include <atomic>
#include <cstdint>

namespace tandem::ring {

inline uint64_t load_acquire(const uint64_t& x) {
  return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire);
}
inline void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }
inline uint64_t load_relaxed(const uint64_t& x) {
  return std::atomic_ref<const uint64_t>(x).load(std::memory_order_relaxed);
}
inline void store_relaxed(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_relaxed); }

}  // namespace tandem::ring
