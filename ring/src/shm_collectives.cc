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
//    reduced (folding all slots moves (N + 3) S; measured 1.3-1.5x slower
//    at 2 ranks from 4 KiB to 32 MiB, level at 64 MiB).
//  - A rank stages chunk g only once every peer has consumed chunk
//    g - kSlots, which freed the slot. It stages one chunk ahead of the one
//    it consumes, so copying and reducing overlap across ranks.
//
// *Direct* (at least kDirectMinBytes). Each rank *arrives*: it publishes
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
//    process_vm_writev into their outputs). The reduce-scatter and allgather
//    from kCmaMinBytes to shm_cma_max_bytes. The all-reduce (from
//    shm_allreduce_cma_min_bytes to shm_allreduce_cma_max_bytes) and the
//    all-to-all by default where rank 0 *timed* it faster than staging on
//    calls of that size (shm_timed_path.h). The all-reduce's earlier rule
//    (far) stays selectable: at 2 ranks while the *hand-off* between their
//    cores is far, as rank 0 times it with a *probe* (ping-pong through the
//    control blocks), again once the last probe is shm_probe_period old.
//    Near, staging ran 2x faster at 1 MiB on one host; far, 1.4x slower:
//    every line a peer staged crosses between the cores at several times the
//    cost, while cross-memory attach leaves a rank's slice of the peer's
//    buffer in its own cache, where repeated in-place calls find it. Another
//    host read near yet ran cross-memory attach 1.7x faster at 1 MiB in place.
//  - Which way a call goes is rank 0's *offer*, published with its arrival,
//    so every rank takes the same path whatever its own options say.
#include <algorithm>
#include <cstring>
#include <string>

#include "collectives.h"
#include "shm_direct.h"
#include "shm_segments.h"
#include "shm_timed_path.h"

namespace tandem::ring {

Reach arrive_direct(Segments& s, Offer offer, size_t bytes, const void* in, size_t in_bytes, void* out,
                    size_t out_bytes, int registrant, bool outputs_too, uint64_t far_ns) {
  if (bytes < kDirectMinBytes) return Reach::staged;
  SharedRef input, output;
  const bool in_ok = in && s.memory().find_shared(in, in_bytes, input);
  const bool out_ok = outputs_too && s.memory().find_shared(out, out_bytes, output);
  if (!s.memory().can_copy_peer()) offer = Offer::staged;
  // Where cross-memory attach cannot run, a rank whose own buffers are not
  // shared rules the direct path out for all: it stages at once, saving
  // everyone the arrival round trip, and the others follow when they see it.
  const bool present = offer != Offer::staged || registrant >= 0 || (in_ok && (out_ok || !outputs_too));
  s.offer(offer);
  if (!s.arrive(present, in, out, in_ok ? &input : nullptr, out_ok ? &output : nullptr)) return Reach::staged;
  if (s.registered(registrant, outputs_too)) return Reach::mapped;
  switch (s.rank0_offer()) {
    case Offer::cross_memory: return Reach::cross_memory;
    case Offer::probe: return s.probe_far(far_ns) ? Reach::cross_memory : Reach::staged;
    case Offer::staged: break;
  }
  return Reach::staged;
}

namespace {

// The cross-memory window of the reduce-scatter and the allgather.
Offer window_offer(const RingOptions& o, size_t bytes) {
  return bytes >= kCmaMinBytes && bytes <= o.shm_cma_max_bytes ? Offer::cross_memory : Offer::staged;
}

// The all-reduce of buffers the others cannot map, by cross-memory attach:
// always; by default (timed) where rank 0 timed it faster than staging for
// calls of that size, in place or out of place (shm_timed_path.h); or (far)
// at 2 ranks while rank 0's last hand-off probe read the cores far apart,
// probing again once the last probe is shm_probe_period old. Under far every
// rank offers by rank 0's published probe, so that while near none arrives
// (the arrival would cost a round trip and the staging's overlap); one that
// read it stale only makes this call stage.
TimedPath allreduce_path(const Segments& s, const RingOptions& o, size_t bytes, bool in_place) {
  if (bytes < o.shm_allreduce_cma_min_bytes || bytes > o.shm_allreduce_cma_max_bytes || o.shm_cma_max_bytes == 0 ||
      !s.memory().can_copy_peer()) {
    return {};
  }
  switch (o.shm_allreduce_cma) {
    case ShmAllreduceCma::always: return {Offer::cross_memory};
    case ShmAllreduceCma::timed:
      // Timed from the first call: no path is a safe guess (cross-memory attach
      // won in place on 2 ranks, lost on 4 ranks on 2 cores and out of place).
      return timed_path(s, in_place ? PathFamily::allreduce_in_place : PathFamily::allreduce, bytes);
    case ShmAllreduceCma::far:
      // Ranks taking turns on a core would time the scheduler, not the cores.
      if (s.size() != 2 || o.ranks_outnumber_cores) return {};
      if (s.probe_due(o.shm_probe_period)) return {Offer::probe};
      return {s.far() ? Offer::cross_memory : Offer::staged};
    case ShmAllreduceCma::never: break;
  }
  return {};
}

std::string kib(size_t b) {
  return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB";
}

// How the all-to-all's timed choice runs, for the plan.
std::string timed_rule() {
  const std::string warm = std::to_string(kPathFirstRoundCalls);
  return "a power of two of bytes per rank; its first " + warm +
         " calls by cross-memory attach (one copy, not "
         "two; trials on cold buffers misled); then one call of each path, then pairs of trials, one of each, "
         "as many as move " +
         kib(kPathBlockBytes) + " (3 to " + std::to_string(kPathMaxBlock) +
         "), a trial two "
         "calls of its path, the second timed on rank 0; the path that won more pairs, again every " +
         std::to_string(kPathRoundCalls) + " calls of the class; TANDEM_SHM_ALLREDUCE_CMA=never|always fixes it";
}

}  // namespace

std::string shared_memory_plan(const RingOptions& o, int local_ranks) {
  const bool oversubscribed = o.ranks_outnumber_cores;
  std::string s = "shared memory for " + std::to_string(local_ranks) + " ranks on this host:\n";
  s += "  below " + kib(kDirectMinBytes) + " and for buffers the others cannot read: staged through " +
       std::to_string(kSlots) + " slots of " + kib(o.shm_chunk_bytes) + " per rank (TANDEM_SHM_CHUNK_BYTES" +
       (oversubscribed ? "; 1 MiB when ranks outnumber cores: fewer hand-offs" : "") + ")\n";
  s += "  staged all-reduce: " +
       std::string(local_ranks >= o.shm_split_min_ranks
                       ? "split: each rank reduces its slice of every chunk once ((5 - 1/N) S moved per rank)"
                       : "every rank folds every slot ((N + 3) S moved per rank)") +
       "; split from " + std::to_string(o.shm_split_min_ranks) + " ranks (TANDEM_SHM_SPLIT_MIN_RANKS) and from " +
       kib(o.shm_split_min_bytes) +
       " (TANDEM_SHM_SPLIT_MIN_BYTES; below, the split's second hand-off costs more than "
       "the redundant fold saves)\n";
  s += "  reduce to a root: the staged all-reduce, only the root writing the result\n";
  s += "  from " + kib(kDirectMinBytes) +
       " (below, the arrival round trip costs more than staging saves): "
       "allocate_shared buffers are read and written in place\n";
  s += "  reduce-scatter and allgather of other buffers: cross-memory attach from " + kib(kCmaMinBytes) + " to " +
       (o.shm_cma_max_bytes >= kCmaMinBytes ? kib(o.shm_cma_max_bytes) : std::string("(off)")) +
       " where the kernel allows it (TANDEM_SHM_CMA_MAX_BYTES; outside, its system calls or page pinning cost more "
       "than staging; the broadcast of such buffers always stages, measured faster)\n";
  s += "  all-to-all of other buffers: staged; out of place from " + kib(kAlltoallCmaMinBytes) + " per rank " +
       (o.shm_cma_max_bytes == 0 || o.shm_allreduce_cma == ShmAllreduceCma::never
            ? std::string("too (TANDEM_SHM_CMA_MAX_BYTES=0 or TANDEM_SHM_ALLREDUCE_CMA=never)")
        : o.shm_allreduce_cma == ShmAllreduceCma::always
            ? std::string("by cross-memory attach (TANDEM_SHM_ALLREDUCE_CMA=always)")
            : "staged or by cross-memory attach, whichever rank 0 timed faster for that size class (" + timed_rule() +
                  ")") +
       "\n";
  const size_t cma_from = std::max(o.shm_allreduce_cma_min_bytes, kDirectMinBytes);
  const std::string window = o.shm_cma_max_bytes > 0 && o.shm_allreduce_cma_max_bytes >= cma_from
                                 ? "from " + kib(cma_from) + " to " + kib(o.shm_allreduce_cma_max_bytes)
                                 : std::string();
  s += "  all-reduce of other buffers: ";
  const bool far_but_oversubscribed = oversubscribed && o.shm_allreduce_cma == ShmAllreduceCma::far;
  if (window.empty() || o.shm_allreduce_cma == ShmAllreduceCma::never || far_but_oversubscribed) {
    s += std::string("staged") +
         (far_but_oversubscribed ? " (ranks outnumber cores: a hand-off probe would time the scheduler, not the cores)"
                                 : " (TANDEM_SHM_ALLREDUCE_CMA=never or TANDEM_SHM_CMA_MAX_BYTES=0)") +
         "\n";
  } else if (o.shm_allreduce_cma == ShmAllreduceCma::always) {
    s += "cross-memory attach " + window + " (TANDEM_SHM_ALLREDUCE_CMA=always), staged outside\n";
  } else if (o.shm_allreduce_cma == ShmAllreduceCma::timed) {
    s += window +
         " staged or by cross-memory attach, whichever rank 0 timed faster for that size class, in "
         "place and out of place apart (as the all-to-all, but timed from the first call, again at call " +
         std::to_string(kPathFirstRoundCalls) +
         "; TANDEM_SHM_ALLREDUCE_CMA=far takes the hand-off probe, "
         "which misjudged a host where cross-memory attach ran 1.7x faster at 1 MiB in place), staged outside\n";
  } else if (local_ranks != 2) {
    s += "staged (TANDEM_SHM_ALLREDUCE_CMA=far switches at 2 ranks only, where it was measured)\n";
  } else {
    s += "staged, but " + window + " cross-memory attach while a hand-off between the ranks' cores takes " +
         std::to_string(o.shm_far_handoff_ns) + " ns or more one way (TANDEM_SHM_ALLREDUCE_CMA=far, " +
         "TANDEM_SHM_FAR_HANDOFF_NS), as rank 0 times it in the first call of that window and again every " +
         std::to_string(o.shm_probe_period.count()) + " ms (" + std::to_string(kProbeBatches * kProbeRounds) +
         " ping-pongs through the segments) and every rank follows its verdict: hosts move the cores apart "
         "(far) and back (near) within minutes; 1 MiB took 37 us staged against 79 by cross-memory attach near "
         "(0.05 us hand-off), 115 against 80 far (0.25 us)\n";
  }
  s += std::string("  waits: ") +
       (oversubscribed ? "ranks outnumber cores: spin briefly, then yield the core to the rank being waited for"
                       : "spin (yielding every 64 turns), then yield for 250 us, then sleep in short naps") +
       "\n";
  return s;
}

size_t shm_segment_bytes(size_t chunk_bytes) { return kControlBytes + kSlots * (kHeaderBytes + chunk_bytes); }

namespace {

// `keeps`: this rank writes the result to its output (a reduce: the root
// only; the other ranks stage, and fold their slice for the root).
void staged_allreduce(Segments& s, const AllreduceArgs& a, const RingOptions& o, size_t chunk_bytes,
                      bool keeps = true) {
  const size_t esize = dtype_size(a.dtype), bytes = a.count * esize;
  const size_t per_chunk = chunk_bytes / esize;
  auto stage = [&](size_t i, std::byte* slot) {
    const size_t begin = i * per_chunk;
    s.counted_copy(slot, bytes_of(a.input) + begin * esize, std::min(per_chunk, a.count - begin) * esize);
  };
  if (s.size() < o.shm_split_min_ranks || s.size() < 2 || bytes < o.shm_split_min_bytes) {
    s.staged(chunks_for(a.count, per_chunk), -1, stage, [&](size_t i, auto slot_of) {
      if (!keeps) return;
      const size_t begin = i * per_chunk;
      fold(s, a.dtype, a.op, bytes_of(a.output) + begin * esize, slot_of, 0, std::min(per_chunk, a.count - begin));
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
      chunks_for(a.count, per_chunk),
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
        fold(s, a.dtype, a.op, own_slot + lo * esize, source_of, lo * esize, n);
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

// The staged all-reduce, only the root writing the result: ranks cannot
// read the root's output before the call, so there is no direct path.
void shm_reduce(Channel& ch, const ReduceArgs& a, const RingOptions& o) {
  if (a.count == 0) return;
  Segments s(ch, o.shm_chunk_bytes, call_of(Kind::reduce, a.count, a.dtype, a.op, a.root));
  const bool root = s.rank() == a.root;
  const AllreduceArgs all{a.input, root ? a.output : nullptr, a.count, a.dtype, a.op, a.memory};
  staged_allreduce(s, all, o, o.shm_chunk_bytes, root);
}

void shm_allreduce(Channel& ch, const AllreduceArgs& a, const RingOptions& o, size_t chunk_bytes) {
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::allreduce, a.count, a.dtype, a.op));
  const size_t bytes = a.count * dtype_size(a.dtype);
  TimedPath path = allreduce_path(s, o, bytes, a.input == a.output);
  const Reach reach =
      arrive_direct(s, path.offer, bytes, a.input, bytes, a.output, bytes, -1, true, o.shm_far_handoff_ns);
  confirm_trial(path, reach);
  if (reach != Reach::staged) {
    direct_allreduce(s, ch, a, reach);
  } else {
    staged_allreduce(s, a, o, chunk_bytes);
  }
  end_trial(path);
}

// Each chunk carries the same run of every block: piece p of the slot holds block p's part.
void shm_reduce_scatter(Channel& ch, const ReduceScatterArgs& a, const RingOptions& o) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::reduce_scatter, a.count, a.dtype, a.op));
  const size_t n = size_t(s.size()), esize = dtype_size(a.dtype), bytes = n * a.count * esize;
  const Reach reach = arrive_direct(s, window_offer(o, bytes), bytes, a.input, bytes, a.output, 0, -1, false);
  if (reach != Reach::staged) return direct_reduce_scatter(s, ch, a, reach);
  const size_t per_block = std::max<size_t>(1, chunk_bytes / esize / n);
  s.staged(
      chunks_for(a.count, per_block), -1,
      [&](size_t i, std::byte* slot) {
        const size_t begin = i * per_block, count = std::min(per_block, a.count - begin);
        for (size_t b = 0; b < n; ++b) {
          s.counted_copy(slot + b * per_block * esize, bytes_of(a.input) + (b * a.count + begin) * esize,
                         count * esize);
        }
      },
      [&](size_t i, auto slot_of) {
        const size_t begin = i * per_block, count = std::min(per_block, a.count - begin);
        fold(s, a.dtype, a.op, bytes_of(a.output) + begin * esize, slot_of, size_t(s.rank()) * per_block * esize,
             count);
      });
}

void shm_allgather(Channel& ch, const AllgatherArgs& a, const RingOptions& o) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::allgather, a.count, a.dtype));
  const size_t esize = dtype_size(a.dtype), per_chunk = chunk_bytes / esize, block = a.count * esize;
  const size_t bytes = block * size_t(s.size());
  const std::byte* in = bytes_of(a.input);
  std::byte* own_block = bytes_of(a.output) + size_t(s.rank()) * block;
  // An input apart from the output is staged from, and each chunk's run of
  // it copied to the own block while the peers read the chunk; any other
  // input is the own block (in place: RingAlgorithms::allgather moves one
  // elsewhere in the output there first).
  const bool apart = in != own_block;
  auto copy_own = [&](size_t offset, size_t n) {
    if (apart) s.counted_copy(own_block + offset, in + offset, n);
  };
  const Reach reach = arrive_direct(s, window_offer(o, bytes), bytes, a.input, block, a.output, 0, -1, false);
  if (reach != Reach::staged) {
    copy_own(0, block);
    return direct_allgather(s, a, reach);
  }
  s.staged(
      chunks_for(a.count, per_chunk), -1,
      [&](size_t i, std::byte* slot) {
        const size_t begin = i * per_chunk;
        s.counted_copy(slot, in + begin * esize, std::min(per_chunk, a.count - begin) * esize);
      },
      [&](size_t i, auto slot_of) {
        const size_t begin = i * per_chunk, bytes = std::min(per_chunk, a.count - begin) * esize;
        for (int p = 0; p < s.size(); ++p) {
          if (p == s.rank()) continue;
          s.counted_copy(bytes_of(a.output) + (size_t(p) * a.count + begin) * esize, slot_of(p), bytes);
        }
      },
      [&](size_t i) {
        const size_t begin = i * per_chunk;
        copy_own(begin * esize, std::min(per_chunk, a.count - begin) * esize);
      });
}

void shm_broadcast(Channel& ch, const BroadcastArgs& a, const RingOptions& o) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::broadcast, a.count, a.dtype, ReduceOp::sum, a.root));
  const size_t esize = dtype_size(a.dtype), per_chunk = chunk_bytes / esize;
  const bool root = s.rank() == a.root;
  if (root && a.input != a.output) s.counted_copy(a.output, a.input, a.count * esize);
  const size_t bytes = a.count * esize;
  if (arrive_direct(s, Offer::staged, bytes, root ? a.input : nullptr, bytes, a.output, 0, a.root, false) ==
      Reach::mapped) {
    return direct_broadcast(s, a);
  }
  s.staged(
      chunks_for(a.count, per_chunk), a.root,
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
