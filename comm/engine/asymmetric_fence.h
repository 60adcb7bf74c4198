// Fences for a Dekker-style handshake with one side on the hot path: that
// side (light_fence) pays only a compiler barrier between its store and its
// load; the rare side (heavy_fence) makes every running thread of the process
// execute a full barrier (Linux membarrier, private expedited), so the two
// loads cannot both miss the other side's store. A locked instruction on the
// hot side would wait for all its earlier stores to reach the other cores
// (docs/algorithms.md, 'engine: the caller's lease').
#pragma once

#include <atomic>

namespace tandem {

// True once this process is registered for heavy fences; false where the
// kernel (before 4.14) or a sandbox refuses membarrier. Registers on first call.
bool heavy_fences_available();
// Only after heavy_fences_available() returned true.
void heavy_fence();
inline void light_fence() { std::atomic_signal_fence(std::memory_order_seq_cst); }

}  // namespace tandem
