// Shared-memory collectives, for ranks on one host that map each other's
// segments (SharedMemory::segments).
//
// *Staged* (any buffers, every collective). Data is cut into *chunks* of at
// most chunk_bytes. Chunks are numbered over the communicator's lifetime (g),
// so calls chain without any reset. Each rank's segment holds a control
// block and kSlots *slots*; chunk g lives in slot g % kSlots.
//  - To *stage* chunk g, a rank copies its part of the chunk into its slot
//    and stamps the slot with g + 1 (a release store after the data). All
//    ranks stage (broadcast: the root only).
//  - To *consume* chunk g, a rank waits for the stagers' stamps, reads their
//    slots straight into its output (all-reduce and reduce-scatter: folding
//    them in rank order, so every rank computes bitwise the same), and
//    publishes consumed = g + 1. One synchronisation per chunk.
//  - The all-reduce from split_min_ranks ranks on (default: always) and
//    from split_min_bytes (default 16 KiB) *splits* each chunk: rank r
//    stages all but its own slice, folds its slice of every slot and of
//    its own input (in rank order, so bitwise the same result) into its own
//    slot, stamps the slot's `reduced`, copies the result to its output, then
//    copies the other ranks' reduced slices out.
//    Each element is reduced once; a rank moves (5 - 1/N) S bytes for S
//    reduced, where folding all slots moves (N + 3) S (docs/algorithms.md,
//    'shm: the split staged all-reduce').
//  - A rank stages chunk g only once every peer has consumed chunk
//    g - kSlots, which freed the slot. It stages one chunk ahead of the one
//    it consumes, so copying and reducing overlap across ranks.
//
// *Direct* (from kShmDirectMinBytes). Each rank *arrives*: it publishes
// where its buffers are and waits for the others. Then every rank reads what
// it needs straight from the others' inputs, and *finishes*; it returns once
// every rank has finished (peers read its input, and for the all-reduce write
// its output, until then).
//  - All-reduce: rank r reduces its *slice* (the r-th balanced part) of every
//    rank's input, in rank order, and delivers it to every rank's output, so
//    each element is reduced once, by one rank. Reduce-scatter: rank r folds
//    its block from every rank's input. Allgather and broadcast: one copy.
//  - *Mapped*: the buffers come from Communicator::allocate_shared (every
//    rank's; broadcast: the root's); ranks read and write them in place.
//  - *Cross-memory attach* (other buffers, when the kernel allows it):
//    process_vm_readv from the peers' inputs (the all-reduce also
//    process_vm_writev into their outputs).
//  - Which path a call takes is the path table's (tandem/ring/shm_paths.h),
//    consulted in choose_path (shm_direct.cc). Rank 0's *offer*, published
//    with its arrival, rules, so every rank takes the same path whatever its
//    own table says.
#include <algorithm>
#include <cstring>
#include <sstream>
#include <string>

#include "collectives.h"
#include "shm_direct.h"

namespace tandem::ring {

namespace {

std::string kib(size_t b) {
  if (b < (1 << 10)) return std::to_string(b) + " B";
  return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
}

// Up to this size a reduce stays unsplit where its sending ranks return once
// staged: the root folding alone beat the split, whose second hand-off the
// senders wait for (2 ranks: 1.34x at 16 KiB, 1.10x at 64 KiB, 0.92x at 128
// KiB; docs/algorithms.md, 'shm: rooted calls return once staged').
constexpr size_t kReduceUnsplitMaxBytes = 64 << 10;

}  // namespace

std::string shared_memory_plan(const RingOptions& o, int local_ranks, const std::string& cma_unavailable) {
  const bool oversubscribed = o.ranks_outnumber_cores;
  std::string s = "shared memory for " + std::to_string(local_ranks) + " ranks on this host:\n";
  s += "  staged through " + std::to_string(kSlots) + " slots of " + kib(o.shm_chunk_bytes) +
       " per rank (TANDEM_SHM_CHUNK_BYTES" +
       (oversubscribed ? "; 1 MiB when ranks outnumber cores: fewer hand-offs" : "") + "), in " +
       std::to_string(kCells) + " cells of " + kib(cell_bytes_for(o.shm_chunk_bytes)) + ": a chunk that fits a cell " +
       "takes one, one that fits " + std::to_string(kCellsPerRun) + " a run of them, so calls of a cell run up to " +
       std::to_string(kCells) + " ahead, of a run " + std::to_string(kCells / kCellsPerRun) + "\n";
  s += "  staged all-reduce: " +
       std::string(local_ranks >= o.shm_split_min_ranks
                       ? "split: each rank reduces its slice of every chunk once ((5 - 1/N) S moved per rank)"
                       : "every rank folds every slot ((N + 3) S moved per rank)") +
       "; split from " + std::to_string(o.shm_split_min_ranks) + " ranks (TANDEM_SHM_SPLIT_MIN_RANKS) and from " +
       kib(o.shm_split_min_bytes) +
       " (TANDEM_SHM_SPLIT_MIN_BYTES; below, the split's second hand-off costs more than "
       "the redundant fold saves)\n";
  s += "  reduce to a root: the staged all-reduce, only the root writing the result" +
       std::string(oversubscribed ? ""
                                  : "; unsplit up to " + kib(kReduceUnsplitMaxBytes) +
                                        ", the other ranks returning once staged (as a gather's and a scatter's "
                                        "sending side)") +
       "\n";
  std::istringstream table(describe_shm_paths(o.shm_paths, cma_unavailable));
  for (std::string line; std::getline(table, line);) s += "  " + line + "\n";
  if (oversubscribed)
    s += "  ranks outnumber cores: the reduce_scatter and allgather stage where the table says timed, the alltoall "
         "below " +
         kib(kAlltoallSharedCoresTimedBytes) + " per rank\n";
  s += std::string("  waits: ") +
       (oversubscribed ? "ranks outnumber cores: spin briefly, then yield the core to the rank being waited for"
                       : "spin (yielding every 64 turns), then yield for 250 us, then sleep in short naps") +
       "\n";
  return s;
}

size_t shm_segment_bytes(size_t chunk_bytes) {
  return kControlBytes + kCells * (kHeaderBytes + cell_bytes_for(chunk_bytes));
}

size_t shm_chunk_for_segment(size_t segment_bytes) {
  if (segment_bytes <= kControlBytes || (segment_bytes - kControlBytes) % kCells != 0) return 0;
  const size_t per_cell = (segment_bytes - kControlBytes) / kCells;
  if (per_cell <= kHeaderBytes || (per_cell - kHeaderBytes) % kCacheLine != 0) return 0;
  return (per_cell - kHeaderBytes) * kCellsPerChunk;
}

namespace {

// `keeper`: the rank that writes the result to its output (a reduce's root;
// -1: every rank). The other ranks stage, and in the split all-reduce fold
// their slice for it; unsplit, they return once staged.
void staged_allreduce(Segments& s, const AllreduceArgs& a, const RingOptions& o, size_t chunk_bytes, int keeper = -1) {
  const size_t esize = dtype_size(a.dtype), bytes = a.count * esize;
  const bool keeps = keeper < 0 || keeper == s.rank();
  const size_t per_chunk = chunk_bytes / esize;
  auto stage = [&](size_t i, std::byte* slot) {
    const size_t begin = i * per_chunk;
    s.counted_copy(slot, bytes_of(a.input) + begin * esize, std::min(per_chunk, a.count - begin) * esize);
  };
  const size_t chunks = chunks_for(a.count, per_chunk), extent = std::min(per_chunk, a.count) * esize;
  // Unsplit, a reduce's other ranks return once staged (rooted_flow).
  const Flow flow = s.rooted_flow(o, {-1, keeper}, chunks, extent);
  const bool senders_return = flow.reader >= 0;
  if ((senders_return && bytes <= kReduceUnsplitMaxBytes) || s.size() < o.shm_split_min_ranks || s.size() < 2 ||
      bytes < o.shm_split_min_bytes) {
    // Unsplit, no peer reads a reduce's root's slot: the root folds its own
    // input in place of it, unless the fold's output overwrites that input
    // before reading it.
    const bool own_input = keeper >= 0 && keeps && !overlap(a.input, bytes, a.output, bytes);
    s.staged(
        chunks, extent, flow,
        [&](size_t i, std::byte* slot) {
          if (!own_input) stage(i, slot);
        },
        [&](size_t i, auto slot_of) {
          if (!keeps) return;
          const size_t begin = i * per_chunk;
          auto source_of = [&](int p) {
            return own_input && p == s.rank() ? bytes_of(a.input) + begin * esize : slot_of(p);
          };
          fold(s, {a.dtype, a.op, std::min(per_chunk, a.count - begin)}, bytes_of(a.output) + begin * esize, source_of,
               0);
        });
    return;
  }
  // Rank p's slice of a chunk of `count` elements: balanced, in whole 64-byte lines where the chunk allows.
  const size_t line = std::max<size_t>(1, 64 / esize);
  auto slice = [&](size_t count, int p) {
    const size_t per = (count + size_t(s.size()) * line - 1) / (size_t(s.size()) * line) * line;
    const size_t lo = std::min(count, per * size_t(p));
    return std::pair{lo, std::min(count, lo + per) - lo};
  };
  // A rank stages all of a chunk but its own slice, which only it folds,
  // straight from its input, into that place in its slot (not into its output:
  // in place, that would overwrite its input before the fold reads it).
  s.staged_split(
      chunks, extent,
      [&](size_t i, std::byte* slot) {
        const size_t begin = i * per_chunk, count = std::min(per_chunk, a.count - begin);
        const auto [lo, n] = slice(count, s.rank());
        const std::byte* in = bytes_of(a.input) + begin * esize;
        s.counted_copy(slot, in, lo * esize);
        s.counted_copy(slot + (lo + n) * esize, in + (lo + n) * esize, (count - lo - n) * esize);
      },
      [&](size_t i, auto slot_of, std::byte* own_slot) {
        const size_t begin = i * per_chunk;
        const auto [lo, n] = slice(std::min(per_chunk, a.count - begin), s.rank());
        if (n == 0) return;
        auto source_of = [&](int p) { return p == s.rank() ? bytes_of(a.input) + begin * esize : slot_of(p); };
        fold(s, {a.dtype, a.op, n}, own_slot + lo * esize, source_of, lo * esize);
        if (keeps) s.counted_copy(bytes_of(a.output) + (begin + lo) * esize, own_slot + lo * esize, n * esize);
      },
      [&](size_t i, int p, const std::byte* slot) {
        if (!keeps) return;
        const size_t begin = i * per_chunk;
        const auto [lo, n] = slice(std::min(per_chunk, a.count - begin), p);
        s.counted_copy(bytes_of(a.output) + (begin + lo) * esize, slot + lo * esize, n * esize);
      });
}

}  // namespace

// The staged all-reduce, only the root writing the result; or the direct
// one by cross-memory attach, each rank writing its slice to the root's
// output (which it publishes at its arrival).
void shm_reduce(Channel& ch, const ReduceArgs& a, const RingOptions& o) {
  if (a.count == 0) return;
  Segments s(ch, o.shm_chunk_bytes, call_of(Kind::reduce, a.count, a.dtype, a.op, a.root));
  const bool root = s.rank() == a.root;
  const size_t bytes = a.count * dtype_size(a.dtype);
  PathChoice path = choose_path(s, o, ShmCollective::reduce, bytes, false);  // one family, in place or not
  const Reach reach = arrive_direct(s, path, {bytes, a.input, bytes, root ? a.output : nullptr});
  confirm_trial(path.heap, reach);
  if (reach == Reach::cross_memory) {
    direct_reduce(s, ch, a);
  } else {
    staged_allreduce(s, {a.input, root ? a.output : nullptr, a.count, a.dtype, a.op, a.memory}, o, o.shm_chunk_bytes,
                     a.root);
  }
  end_trial(path.heap);
}

void shm_allreduce(Channel& ch, const AllreduceArgs& a, const RingOptions& o, size_t chunk_bytes) {
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::allreduce, a.count, a.dtype, a.op));
  const size_t bytes = a.count * dtype_size(a.dtype);
  PathChoice path = choose_path(s, o, ShmCollective::allreduce, bytes, a.input == a.output);
  const Reach reach = arrive_direct(s, path, {bytes, a.input, bytes, a.output, true});
  confirm_trial(path.heap, reach);
  if (reach != Reach::staged) {
    direct_allreduce(s, ch, a, reach);
  } else {
    staged_allreduce(s, a, o, chunk_bytes);
  }
  end_trial(path.heap);
}

namespace {

// Rank p's block of an allgather(v) or reduce-scatter(v), in elements: equal
// blocks packed in rank order, or the call's own (known on every rank).
struct BlockLayout {
  const Blocks* given = nullptr;  // null: `count` each, packed
  size_t count = 0;
  size_t count_of(int p) const { return given ? given->counts[size_t(p)] : count; }
  size_t displ_of(int p) const { return given ? given->displs[size_t(p)] : size_t(p) * count; }
  size_t largest() const { return given ? *std::max_element(given->counts.begin(), given->counts.end()) : count; }
  // Elements of block p in run i of `per_run` each.
  size_t run(int p, size_t i, size_t per_run) const { return run_of(count_of(p), i, per_run); }
};

// Each chunk carries the same run of every block: piece b of the slot holds
// block b's part, and rank r folds piece r of every slot into its output.
// Piece r of its own slot no peer reads: rank r folds its input's block in
// its place, unless the output overlaps that block (the fold would
// overwrite it before reading it).
void staged_reduce_scatter(Segments& s, const ReduceScattervArgs& a, const BlockLayout& blocks, size_t chunk_bytes) {
  const size_t n = size_t(s.size()), esize = dtype_size(a.dtype), largest = blocks.largest();
  if (largest == 0) return;
  const size_t per_block = std::max<size_t>(1, std::min(chunk_bytes / esize / n, largest));
  const int r = s.rank();
  const std::byte* own_block = bytes_of(a.input) + blocks.displ_of(r) * esize;
  const size_t own_bytes = blocks.count_of(r) * esize;
  const bool own_from_input = !overlap(own_block, own_bytes, a.output, own_bytes);
  s.staged(
      chunks_for(largest, per_block), n * per_block * esize, {},
      [&](size_t i, std::byte* slot) {
        for (size_t b = 0; b < n; ++b) {
          if (own_from_input && int(b) == r) continue;
          const size_t count = blocks.run(int(b), i, per_block);
          s.counted_copy(slot + b * per_block * esize,
                         bytes_of(a.input) + (blocks.displ_of(int(b)) + i * per_block) * esize, count * esize);
        }
      },
      [&](size_t i, auto slot_of) {
        const size_t count = blocks.run(r, i, per_block);
        if (count == 0) return;
        auto piece_of = [&](int p) {
          return own_from_input && p == r ? own_block + i * per_block * esize
                                          : slot_of(p) + size_t(r) * per_block * esize;
        };
        fold(s, {a.dtype, a.op, count}, bytes_of(a.output) + i * per_block * esize, piece_of, 0);
      });
}

// Each rank stages its block; every rank copies the others' out of their
// slots and, from an input apart from its own block, each chunk's run of its
// own block while the peers read that chunk.
void staged_allgather(Segments& s, const void* input, void* output, size_t esize, const BlockLayout& blocks,
                      size_t chunk_bytes) {
  const size_t per_chunk = chunk_bytes / esize, largest = blocks.largest();
  if (largest == 0) return;
  const int r = s.rank();
  const std::byte* in = bytes_of(input);
  std::byte* out = bytes_of(output);
  std::byte* own_block = out + blocks.displ_of(r) * esize;
  s.staged(
      chunks_for(largest, per_chunk), std::min(per_chunk, largest) * esize, {},
      [&](size_t i, std::byte* slot) {
        s.counted_copy(slot, in + i * per_chunk * esize, blocks.run(r, i, per_chunk) * esize);
      },
      [&](size_t i, auto slot_of) {
        for (int p = 0; p < s.size(); ++p) {
          if (p == r) continue;
          s.counted_copy(out + (blocks.displ_of(p) + i * per_chunk) * esize, slot_of(p),
                         blocks.run(p, i, per_chunk) * esize);
        }
      },
      [&](size_t i) {
        if (in != own_block) {
          s.counted_copy(own_block + i * per_chunk * esize, in + i * per_chunk * esize,
                         blocks.run(r, i, per_chunk) * esize);
        }
      });
}

// A variable call's counts, as its Call's count: ranks whose blocks differ
// then differ in their call (named so by Segments::check_same_call), where
// the ring's messages would have differed in size.
uint64_t blocks_digest(const Blocks& b) {
  uint64_t d = 0;
  for (size_t c : b.counts) d = followed_by(d, Call{c});
  return d;
}

}  // namespace

void shm_reduce_scatter(Channel& ch, const ReduceScatterArgs& a, const RingOptions& o, const Blocks* variable) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes,
             variable ? call_of(Kind::reduce_scatterv, blocks_digest(*variable), a.dtype, a.op)
                      : call_of(Kind::reduce_scatter, a.count, a.dtype, a.op));
  const size_t n = size_t(s.size()), esize = dtype_size(a.dtype), bytes = n * a.count * esize;
  PathChoice path = choose_path(s, o, ShmCollective::reduce_scatter, bytes, false);
  const Reach reach = arrive_direct(s, path, {bytes, a.input, bytes, a.output});
  confirm_trial(path.heap, reach);
  if (reach != Reach::staged) {
    direct_reduce_scatter(s, ch, a, reach);
  } else {
    staged_reduce_scatter(s, {a.input, a.output, {}, a.dtype, a.op, a.memory}, {nullptr, a.count}, chunk_bytes);
  }
  end_trial(path.heap);
}

void shm_reduce_scatterv(Channel& ch, const ReduceScattervArgs& a, const RingOptions& o) {
  Segments s(ch, o.shm_chunk_bytes, call_of(Kind::reduce_scatterv, blocks_digest(a.blocks), a.dtype, a.op));
  staged_reduce_scatter(s, a, {&a.blocks}, o.shm_chunk_bytes);
}

void shm_allgather(Channel& ch, const AllgatherArgs& a, const RingOptions& o, const Blocks* variable) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes,
             variable ? call_of(Kind::allgatherv, blocks_digest(*variable), a.dtype)
                      : call_of(Kind::allgather, a.count, a.dtype));
  const size_t esize = dtype_size(a.dtype), block = a.count * esize;
  const size_t bytes = block * size_t(s.size());
  std::byte* own_block = bytes_of(a.output) + size_t(s.rank()) * block;
  // An input apart from the output is staged from; any other input is the
  // own block (in place: RingAlgorithms::allgather moves one elsewhere in
  // the output there first).
  PathChoice path = choose_path(s, o, ShmCollective::allgather, bytes, false);
  const Reach reach = arrive_direct(s, path, {bytes, a.input, block, a.output});
  confirm_trial(path.heap, reach);
  if (reach == Reach::staged) {
    staged_allgather(s, a.input, a.output, esize, {nullptr, a.count}, chunk_bytes);
  } else {
    if (a.input != own_block) s.counted_copy(own_block, a.input, block);
    direct_allgather(s, a, reach);
  }
  end_trial(path.heap);
}

void shm_allgatherv(Channel& ch, const VariableArgs& a, const RingOptions& o) {
  Segments s(ch, o.shm_chunk_bytes, call_of(Kind::allgatherv, blocks_digest(a.blocks), a.dtype));
  staged_allgather(s, a.input, a.output, dtype_size(a.dtype), {&a.blocks}, o.shm_chunk_bytes);
}

void shm_broadcast(Channel& ch, const BroadcastArgs& a, const RingOptions& o) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::broadcast, a.count, a.dtype, ReduceOp::sum, a.root));
  const size_t esize = dtype_size(a.dtype), per_chunk = chunk_bytes / esize;
  const bool root = s.rank() == a.root;
  if (root && a.input != a.output) s.counted_copy(a.output, a.input, a.count * esize);
  const size_t bytes = a.count * esize;
  const PathChoice path = choose_path(s, o, ShmCollective::broadcast, bytes, false);
  const Reach reach = arrive_direct(s, path, {bytes, root ? a.input : nullptr, bytes, a.output, false, a.root});
  if (reach != Reach::staged) return direct_broadcast(s, a, reach);
  s.staged(
      chunks_for(a.count, per_chunk), std::min(per_chunk, a.count) * esize, {a.root},
      [&](size_t i, std::byte* slot) {
        const size_t begin = i * per_chunk;
        s.counted_copy(slot, bytes_of(a.input) + begin * esize, std::min(per_chunk, a.count - begin) * esize);
      },
      [&](size_t i, auto slot_of) {
        if (root) return;
        const size_t begin = i * per_chunk;
        s.counted_copy(bytes_of(a.output) + begin * esize, slot_of(a.root),
                       std::min(per_chunk, a.count - begin) * esize);
      });
}

}  // namespace tandem::ring
