// The direct shared-memory collectives (shm_direct.cc): every rank reads what
// it needs straight from the others' buffers once all have arrived.
#pragma once

#include "shm_segments.h"

namespace tandem::ring {

// Below this the arrival round trip costs more than the staging copy saves.
constexpr size_t kDirectMinBytes = 16 << 10;
// Cross-memory attach beats staging for the reduce-scatter and the allgather
// from here to RingOptions::shm_cma_max_bytes (measured, 2 ranks, heap
// buffers: 30-50 % slower at 32-64 KiB, level at 128 KiB, 5-15 % ahead from
// 256 KiB to 8 MiB, slower again at 16 MiB where page pinning and the
// kernel's copy dominate). Never for the broadcast: staged, it ran faster.
constexpr size_t kCmaMinBytes = 256 << 10;
// The all-to-all's cross-memory attach from here per rank, out of place
// (2 ranks on a loaded host, 4 alternations: 64 KiB 32-47 us against 38-55
// staged, 128 KiB 56-73 against 82-98; 32 KiB level). No upper bound: the
// all-to-all moves each block once, where staging copies it twice.
constexpr size_t kAlltoallCmaMinBytes = 64 << 10;

// How a direct call reaches the peers' buffers.
enum class Reach { staged, mapped, cross_memory };

// Arrives when `bytes` make a direct call worth it and says how it can run:
// mapped when `registrant`'s buffers (every rank's if < 0; outputs too if
// asked) lie in allocate_shared memory, else as rank 0 offers: by
// cross-memory attach (the caller's `offer` where the kernel allows it), or
// staged. `far_ns`: rank 0's threshold for a probe.
Reach arrive_direct(Segments& s, Offer offer, size_t bytes, const void* in, size_t in_bytes, void* out,
                    size_t out_bytes, int registrant, bool outputs_too, uint64_t far_ns = 0);

// Copies from a peer's input, `offset` bytes in: through the mapping or by cross-memory attach.
void read_input(Segments& s, Reach reach, int p, size_t offset, void* dst, size_t bytes);

// Rank r reduces its slice of every rank's input, piece by piece, into its own
// output, and delivers each piece to the others' outputs: through the
// mappings, or by cross-memory attach.
void direct_allreduce(Segments& s, Channel& ch, const AllreduceArgs& a, Reach reach);

// Rank r folds its block straight from every rank's input, piece by piece.
void direct_reduce_scatter(Segments& s, Channel& ch, const ReduceScatterArgs& a, Reach reach);
void direct_allgather(Segments& s, const AllgatherArgs& a, Reach reach);
void direct_broadcast(Segments& s, const BroadcastArgs& a);

}  // namespace tandem::ring
