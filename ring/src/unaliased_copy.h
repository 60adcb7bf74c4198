// memcpy that sidesteps the forward copy's 4K-aliasing stall: for a
// destination 1-31 bytes past the source modulo 4 KiB it copies backwards.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::ring {

// On the AMD EPYC hosts measured (glibc 2.36, 2026-11-26) memcpy of 2 KiB-384 KiB
// ran at 1.8-2.8 GB/s instead of 30-80 when dst - src was 1-31 modulo 4 KiB:
// every load matched the page offset of a store just issued. Two heap
// buffers of one size sit exactly 16 bytes apart that way (malloc's header).
// Copied in 256-byte pieces from the end, no load follows a store to its
// offset: 25-50 GB/s there; elsewhere plain memcpy.
inline void copy_unaliased(void* dst, const void* src, size_t bytes) {
  constexpr size_t kPiece = 256, kStallMinBytes = 2048;
  const uintptr_t skew = (reinterpret_cast<uintptr_t>(dst) - reinterpret_cast<uintptr_t>(src)) & 4095;
  if (skew == 0 || skew >= 32 || bytes <= kStallMinBytes) {
    std::memcpy(dst, src, bytes);
    return;
  }
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  size_t end = bytes;
  for (; end >= kPiece; end -= kPiece) std::memcpy(d + end - kPiece, s + end - kPiece, kPiece);
  std::memcpy(d, s, end);
}

}  // namespace tandem::ring
