// The algorithms behind ring::algorithms(), one free function each; the
// Algorithms object only picks among them.
#pragma once

#include <algorithm>
#include <cstddef>

#include "tandem/communicator.h"
#include "tandem/ring/ring.h"

namespace tandem::ring {

// A run of elements.
struct Range {
  size_t begin = 0;  // in elements
  size_t size = 0;
};

// The part of [0, total) that piece i of `pieces` balanced pieces covers: the
// first total % pieces pieces hold one element more.
inline Range balanced(size_t total, size_t pieces, size_t i) {
  const size_t base = total / pieces, extra = total % pieces;
  return {i * base + std::min(i, extra), base + (i < extra ? 1 : 0)};
}

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
