// The algorithms behind ring::algorithms(), one free function each; the
// Algorithms object only picks among them.
#pragma once

#include "tandem/communicator.h"
#include "tandem/ring/ring.h"

namespace tandem::ring {

// ring_allreduce.cc: bandwidth-optimal, pipelined.
void ring_allreduce(Channel& ch, const AllreduceArgs& args, const RingOptions& options);
// recursive_doubling.cc: latency-optimal, log2(n) exchanges of the whole buffer.
void recursive_doubling_allreduce(Channel& ch, const AllreduceArgs& args);

// ring_collectives.cc
void ring_reduce_scatter(Channel& ch, const ReduceScatterArgs& args, const RingOptions& options);
void ring_allgather(Channel& ch, const AllgatherArgs& args, const RingOptions& options);
void pipelined_broadcast(Channel& ch, const BroadcastArgs& args, const RingOptions& options);
void barrier(Channel& ch);

}  // namespace tandem::ring
