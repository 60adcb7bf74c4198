// The direct shared-memory collectives (shm_direct.cc): every rank reads what
// it needs straight from the others' buffers once all have arrived.
#pragma once

#include "shm_segments.h"

namespace tandem::ring {

// How a direct call reaches the peers' buffers.
enum class Reach { staged, mapped, cross_memory };

// Rank r reduces its slice of every rank's input, piece by piece, into its own
// output, and delivers each piece to the others' outputs: through the
// mappings, or by cross-memory attach.
void direct_allreduce(Segments& s, Channel& ch, const AllreduceArgs& a, Reach reach);

// Rank r folds its block straight from every rank's input, piece by piece.
void direct_reduce_scatter(Segments& s, Channel& ch, const ReduceScatterArgs& a, Reach reach);
void direct_allgather(Segments& s, const AllgatherArgs& a, Reach reach);
void direct_broadcast(Segments& s, const BroadcastArgs& a);

}  // namespace tandem::ring
