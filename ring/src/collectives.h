// The algorithms behind ring::algorithms(), one free function each; the
// Algorithms object only picks among them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>

#include "tandem/communicator.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"

namespace tandem::ring {

struct Call;  // shm_wire.h: what ranks compare at their first shared-memory exchange

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

// Segments per block: enough that none exceeds segment_bytes (at least one).
inline size_t segments_for(size_t elements, size_t esize, size_t segment_bytes) {
  return std::max<size_t>(1, (elements * esize + segment_bytes - 1) / segment_bytes);
}

// Runs walks 0 .. total-1, at most `window` at once, started and retired in
// order. A Walk offers advance() (every move possible without blocking; true
// if it made one), done(), and blocker(): the operation it waits for. Waiting
// only on the oldest walk cannot deadlock: its next operation depends on
// older steps and older walks alone, never on anything this rank still owes.
template <class Walk, class Start>
inline void run_walks(Channel& ch, size_t total, size_t window, Start start) {
  std::deque<Walk> live;
  size_t next = 0;
  while (next < total || !live.empty()) {
    while (live.size() < window && next < total) start(live.emplace_back(), next++);
    bool moved = false;
    for (auto& w : live) moved |= w.advance();
    while (!live.empty() && live.front().done()) {
      live.pop_front();
      moved = true;
    }
    if (!moved && !live.empty()) ch.wait(live.front().blocker());
  }
}

inline int mod(int x, int n) { return ((x % n) + n) % n; }

// The bytes from the start of a buffer to the end of its last block.
inline size_t extent(const Blocks& b, size_t esize) {
  size_t end = 0;
  for (size_t p = 0; p < b.counts.size(); ++p) end = std::max(end, (b.displs[p] + b.counts[p]) * esize);
  return end;
}

// Whether two byte ranges share a byte (an empty range shares none).
inline bool overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

// Tags: step in the high bits, segment in the low 20.
constexpr int kSegmentBits = 20;
inline Tag step_tag(int step, size_t segment) { return (Tag(step) << kSegmentBits) | segment; }

inline void check_segments(const char* what, size_t segments) {
  if (segments >= (size_t(1) << kSegmentBits)) {
    throw InvalidArgument(std::string(what) + ": too many segments; raise segment_bytes");
  }
}

// ring_allreduce.cc: bandwidth-optimal, pipelined.
void ring_allreduce(Channel& ch, const AllreduceArgs& args, const RingOptions& options);
// recursive_doubling.cc: latency-optimal, log2(n) exchanges of the whole buffer.
void recursive_doubling_allreduce(Channel& ch, const AllreduceArgs& args);
// hierarchical.cc: reduce-scatter within each host, all-reduce of each slice
// across hosts, allgather within each host. Needs a uniform topology (throws
// InvalidArgument otherwise); hierarchical_fits() says whether it has one.
void hierarchical_allreduce(Channel& ch, const AllreduceArgs& args, const RingOptions& options);
bool hierarchical_fits(const Topology* topology);

// shm_collectives.cc: ranks on one host, through their shared segments.
// Chunks of options.shm_chunk_bytes (the all-reduce: chunk_bytes, at most that).
void shm_allreduce(Channel& ch, const AllreduceArgs& args, const RingOptions& options, size_t chunk_bytes);
void shm_reduce(Channel& ch, const ReduceArgs& args, const RingOptions& options);
// `variable`: the blocks of the reduce_scatterv (allgatherv) of equal packed
// blocks this call carries out; the ranks check it as that call (its kind
// and a digest of its blocks), as shm_reduce_scatterv (shm_allgatherv) does.
void shm_reduce_scatter(Channel& ch, const ReduceScatterArgs& args, const RingOptions& options,
                        const Blocks* variable = nullptr);
void shm_allgather(Channel& ch, const AllgatherArgs& args, const RingOptions& options,
                   const Blocks* variable = nullptr);
// Blocks of any sizes, staged only (the fixed-size calls' direct paths need
// equal blocks): the ring over messages trailed 2-2.5x at 16 MiB.
void shm_allgatherv(Channel& ch, const VariableArgs& args, const RingOptions& options);
void shm_reduce_scatterv(Channel& ch, const ReduceScattervArgs& args, const RingOptions& options);
void shm_broadcast(Channel& ch, const BroadcastArgs& args, const RingOptions& options);
// shm_alltoall.cc. Fits: every rank's directory (3 words per rank) fits a chunk.
// `called`: what the ranks compare at their first exchange (alltoall(v), or the gather or scatter it carries out).
void shm_alltoallv(Channel& ch, const AlltoallvArgs& args, const RingOptions& options, const ring::Call& called);
bool shm_alltoall_fits(const Channel& ch, const RingOptions& options);
// RingOptions::alltoall_stream_min_bytes for a host's last-level cache (0:
// unknown) and its ranks: at least 1 MiB, and 1 MiB past a core complex's
// (32 MiB). `cache_per_core_complex` (AMD's CCD, whatever size hwloc
// reports): the cache counts as at most 32 MiB instead.
size_t alltoall_stream_min_bytes(size_t last_level_cache_bytes, int local_ranks, bool cache_per_core_complex);
// A gather (`gather`) or scatter of equal blocks that all fit one cell,
// staged as shm_alltoallv stages it, without its set-up for blocks of any
// size; false, having done nothing, for any other call.
bool shm_rooted_one_cell(Channel& ch, const VariableArgs& args, const RingOptions& options, const ring::Call& called,
                         bool gather);
// The segment bytes the shm_* functions need per rank.
size_t shm_segment_bytes(size_t chunk_bytes);
// The chunk whose segment is `segment_bytes` (shm_segment_bytes' inverse, in
// whole cells: at least the chunk it was sized for); 0 if none.
size_t shm_chunk_for_segment(size_t segment_bytes);

// ring_collectives.cc
void ring_reduce_scatter(Channel& ch, const ReduceScatterArgs& args, const RingOptions& options);
void ring_allgather(Channel& ch, const AllgatherArgs& args, const RingOptions& options);
void pipelined_broadcast(Channel& ch, const BroadcastArgs& args, const RingOptions& options);
void barrier(Channel& ch);

// alltoall.cc
void pairwise_alltoallv(Channel& ch, const AlltoallvArgs& args);
// rooted.cc. gatherv's tag lets reduce run it as a second phase.
void gatherv(Channel& ch, const VariableArgs& args, Tag tag = 0);
void scatterv(Channel& ch, const VariableArgs& args);
void reduce_to_root(Channel& ch, const ReduceArgs& args);
// variable_ring.cc. finish_avg: divide the block by n (reduce divides once at the root instead).
void ring_allgatherv(Channel& ch, const VariableArgs& args);
void ring_reduce_scatterv(Channel& ch, const ReduceScattervArgs& args, bool finish_avg = true);

}  // namespace tandem::ring
