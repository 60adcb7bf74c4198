// The shared segments' layout, as every rank of a host reads and writes it:
// each rank's segment opens with its Control block, then kCells slot
// headers, then kCells cells of data (cell_bytes_for the communicator's
// chunk). A staged chunk takes one cell, a run of kCellsPerRun cells or a
// whole chunk's kCellsPerChunk cells, from a multiple of what it takes; its
// header is its first cell's. Plain data
// only; the protocol over it is shm_segments.h, the timed choice's use of
// PathTrials shm_timed_path.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "tandem/collective.h"
#include "tandem/shared_memory.h"
#include "tandem/types.h"

namespace tandem::ring {

// A full chunk spans kCellsPerChunk cells, so kSlots full chunks are in
// flight per rank; chunks of a run, kCells / kCellsPerRun; chunks of one
// cell, kOneCellCells: they keep to the first kOneCellCells of every kCells,
// so that a short run of small calls warms few cells (docs/algorithms.md,
// 'shm: cells: small calls run further ahead', 'shm: one-cell calls keep to
// 64 cells').
constexpr size_t kSlots = 4;
constexpr size_t kCellsPerRun = 8;
constexpr size_t kCellsPerChunk = kCellsPerRun * kCellsPerRun;
constexpr size_t kCells = kSlots * kCellsPerChunk;
constexpr size_t kOneCellCells = 64;
static_assert((kCellsPerRun & (kCellsPerRun - 1)) == 0, "cells are placed by masks");
// A sender of one-cell calls that finds its cells all in use waits until
// this many more are free, not one: while it polls a receiver's `consumed`,
// each of the receiver's writes to it must take the line back first
// (docs/algorithms.md, 'shm: one-cell calls keep to 64 cells'). Under
// kOneCellCells, so that the peers' earlier calls alone free them.
constexpr size_t kOneCellsFreedAtOnce = kOneCellCells / 4;
static_assert(kOneCellsFreedAtOnce < kOneCellCells);
constexpr size_t kControlBytes = 8192;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kCacheLine = 64;

// A cell of the communicator's chunk: a 64th of it, in whole cache lines.
constexpr size_t cell_bytes_for(size_t chunk_bytes) {
  return ((chunk_bytes + kCellsPerChunk - 1) / kCellsPerChunk + kCacheLine - 1) / kCacheLine * kCacheLine;
}

using Kind = Collective;  // its wire numbers

// What a rank called, so one that called something else learns it from the
// first exchange instead of mixing data.
struct Call {
  uint64_t count = 0;
  Kind kind{};
  uint8_t dtype = 0;
  uint8_t op = 0;
  int32_t root = -1;

  bool operator==(const Call&) const = default;
  std::string str() const {
    const bool rooted = kind == Kind::broadcast || kind == Kind::reduce || kind == Kind::gather ||
                        kind == Kind::gatherv || kind == Kind::scatter || kind == Kind::scatterv;
    const std::string at_root = rooted ? ", root " + std::to_string(root) : "";
    std::string s = std::string(to_string(kind)) + "(";
    if (!has_per_rank_counts(kind)) s += std::to_string(count) + " x ";
    s += to_string(DataType(dtype));
    if (kind == Kind::allreduce || kind == Kind::reduce_scatter || kind == Kind::reduce ||
        kind == Kind::reduce_scatterv) {
      s += ", " + std::string(to_string(ReduceOp(op)));
    }
    return s + at_root + ")";
  }
};

// A digest of the calls a rank ran through its segments, in order: equal on
// every rank while their calls matched. A rooted call's sending side returns
// without waiting for its receivers, so its call is checked late: a rank
// compares the digests at its next wait on a peer.
inline uint64_t followed_by(uint64_t history, const Call& c) {
  uint64_t x = history ^ (c.count * 0x9e3779b97f4a7c15ull) ^
               (uint64_t(c.kind) << 48 | uint64_t(c.dtype) << 40 | uint64_t(c.op) << 32 | uint32_t(c.root));
  x ^= x >> 31;  // splitmix64's finish: every input bit moves every output bit
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// How a direct call goes when not every rank's buffers are mapped: rank 0
// offers it with its arrival and every rank follows, so all take one path
// whatever their own path tables say.
enum class Offer : uint8_t { staged, cross_memory };

// The timed choice's families (shm_timed_path.h): the all-reduce in place
// and out of place apart, since cross-memory attach won one and lost the
// other on one host (docs/algorithms.md, 'shm: timed families').
enum class PathFamily : uint8_t { alltoall, allreduce, allreduce_in_place, allgather, reduce_scatter, reduce };
constexpr size_t kPathFamilies = 6;
// Power-of-two classes of bytes per call, 64 KiB steps.
constexpr size_t kPathClasses = 16;
// PathTrials::verdict: a Path, with kClear where the first round's pair
// found cross-memory attach clearly faster (clear_verdict), so that the
// second round opens with no trials.
enum Path : uint64_t { kUntimed = 0, kStaged = 1, kCrossMemory = 2 };
constexpr uint64_t kClear = 4;
// PathTrials::pair_first_ns and trial_ns of a trial that did not count.
constexpr uint64_t kNotTimed = UINT64_MAX;

// Rank 0's, written only in a round's opening: peers read the verdict every
// call, so a line rank 0 wrote every call would move between the cores every call.
struct PathTrials {
  uint64_t verdict;  // rank 0's Path for the rest of the round; peers read it racily
  // Rank 0's only: each path's timed calls, summed, and the pairs each won;
  // the first trial of the pair under way and the trial under way, their
  // timed calls summed (kNotTimed: not counted).
  uint64_t staged_ns, cross_memory_ns;
  uint64_t staged_wins, cross_memory_wins;
  uint64_t pair_first_ns, trial_ns;
};

// The start of each rank's segment. Lines a peer polls stay apart from lines
// their writer changes for other reasons.
struct Control {
  alignas(kCacheLine) uint64_t consumed;  // cells before this one are consumed by this rank (peers read it)
  // This rank only:
  alignas(kCacheLine) uint64_t next;  // the next free cell number
  uint64_t peers_consumed;            // a bound on every peer's `consumed`: as last read, or as their stamps imply
  uint64_t direct_calls;              // arrival numbers taken (one per direct-eligible call)
  uint64_t history;                   // followed_by() over the calls run so far, this one included
  uint64_t path_calls[kPathFamilies][kPathClasses];  // calls of each timed family and class (PathTrials)
  // Peers read these once `arrived` says so:
  alignas(kCacheLine) uint64_t arrived;  // the arrival number of this rank's latest direct-eligible call
  Call call;
  uint64_t arrived_history;                // `history` before `call`
  SharedRef input, output;                 // fd -1: not in allocate_shared memory
  uint64_t input_address, output_address;  // in this rank's own process (for cross-memory attach)
  Offer offer;                             // rank 0's word on this call, for buffers not all mapped
  uint8_t maps;                            // rank 0's word: 1 if mapped buffers are read in place
  alignas(kCacheLine) uint64_t finished;   // the arrival number of the last direct call this rank completed
  alignas(kCacheLine) PathTrials paths[kPathFamilies][kPathClasses];
};

struct SlotHeader {
  uint64_t stamp;    // the chunk's first cell number + 1 once the data is in
  uint64_t reduced;  // the same once this rank's reduced slice is in (split all-reduce)
  Call call;
  uint64_t history;  // the stager's calls before `call` (followed_by)
};

// Every rank of a host runs one build, but the layout is what peers read by
// offset: these pin it.
static_assert(std::is_trivially_copyable_v<Call> && std::is_standard_layout_v<Call>);
static_assert(sizeof(Call) == 16 && offsetof(Call, kind) == 8 && offsetof(Call, root) == 12);
static_assert(std::is_trivially_copyable_v<SlotHeader> && std::is_standard_layout_v<SlotHeader>);
static_assert(sizeof(SlotHeader) == 40 && offsetof(SlotHeader, call) == 16 && offsetof(SlotHeader, history) == 32,
              "fuzz/make_seeds.py writes this layout");
static_assert(sizeof(SlotHeader) <= kHeaderBytes, "the stamp and the call share one line");
static_assert(sizeof(PathTrials) == 7 * sizeof(uint64_t));
static_assert(std::is_trivially_copyable_v<Control> && std::is_standard_layout_v<Control>);
static_assert(alignof(Control) == kCacheLine && sizeof(Control) <= kControlBytes);
static_assert(offsetof(Control, consumed) == 0 && offsetof(Control, next) == kCacheLine);
static_assert(offsetof(Control, arrived) % kCacheLine == 0 && offsetof(Control, finished) % kCacheLine == 0 &&
              offsetof(Control, paths) % kCacheLine == 0);
static_assert(offsetof(Control, maps) < offsetof(Control, finished), "the arrival's words on the arrival's lines");
static_assert(kControlBytes % kCacheLine == 0 && kHeaderBytes % kCacheLine == 0);

}  // namespace tandem::ring
