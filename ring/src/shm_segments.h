// The Segments protocol over the shared segments (shm_wire.h): staging
// through the slots and the arrival/finish handshake of the direct paths.
// Terms: shm_collectives.cc.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives.h"
#include "shm_atomics.h"
#include "shm_wire.h"
#include "tandem/reduce.h"

namespace tandem::ring {

inline const std::byte* bytes_of(const void* p) { return static_cast<const std::byte*>(p); }
inline std::byte* bytes_of(void* p) { return static_cast<std::byte*>(p); }

// Who stages a staged() call's chunks and who reads them (-1: every rank).
// A rank that reads nothing returns once its part is staged, waiting for no
// peer (a rooted call's sending side, as MPI's eager sends): its receivers
// check its call, and it checks theirs through the calls' digest at its next
// wait on a peer (followed_by).
struct Flow {
  int stager = -1;
  int reader = -1;
};

// The slot protocol and the arrival/finish handshake over the segments.
class Segments {
 public:
  Segments(Channel& ch, size_t chunk_bytes, const Call& call)
      : ch_(ch),
        memory_(*ch.shared_memory()),
        seg_(*memory_.segments()),
        n_(ch.size()),
        r_(ch.rank()),
        chunk_bytes_(chunk_bytes),
        call_(call),
        cell_bytes_(cell_bytes(seg_)),
        self_(control(r_)),
        history_(self_->history) {
    self_->history = followed_by(history_, call_);
  }

  // A rooted call's flow for staged(chunks, extent), unless ranks outnumber
  // cores and the call takes a whole chunk or more. There a sending side
  // that ran ahead by a few chunks would only wait for a free slot, taking
  // the core from the receiver it waits for: every rank stages and waits for
  // every other instead. A call of a cell or a run runs up to kOneCellCells
  // or kCells / kCellsPerRun calls ahead, and the receiver drains them in its
  // turn on the core (docs/algorithms.md, 'shm: rooted calls return once
  // staged', 'shm: cells'). Its placement does not depend on the flow it
  // gets here, which ranks of a grown job may see differently.
  Flow rooted_flow(const RingOptions& o, Flow flow, size_t chunks, size_t extent) const {
    return o.ranks_outnumber_cores && (chunks > 1 || cells_for(extent, false) == kCellsPerChunk) ? Flow{} : flow;
  }

  // The communicator's cell in `seg` (cell_bytes_for its chunk, as laid out).
  static size_t cell_bytes(const SharedSegments& seg) { return (seg.bytes - kControlBytes) / kCells - kHeaderBytes; }

  int size() const { return n_; }
  int rank() const { return r_; }
  size_t chunk_bytes() const { return chunk_bytes_; }
  SharedMemory& memory() const { return memory_; }

  // Counts bytes read and written into the communicator's shared-memory traffic.
  void count_traffic(size_t bytes) const { memory_.count_traffic(bytes); }
  // A host copy (tandem::copy: no 4K-aliasing stall), counted: the bytes
  // read and the bytes written.
  void counted_copy(void* dst, const void* src, size_t bytes) const {
    copy(MemoryType::host, dst, src, bytes);
    count_traffic(2 * bytes);
  }
  // The same by streaming stores (copy_streaming), for outputs past the caches.
  void counted_stream(void* dst, const void* src, size_t bytes) const {
    copy_streaming(dst, src, bytes);
    count_traffic(2 * bytes);
  }

  // Runs `chunks` staged steps, each chunk's stage writing at most `extent`
  // bytes of its slot (the same on every rank; at most chunk_bytes()): the
  // chunks take cells_for(extent) cells each. stage(i, slot) fills this
  // rank's slot with its part of chunk i, on the flow's stagers; every rank
  // stamps its slot with the call, staging or not, so a peer in another call
  // learns it. consume(i, slot_of) reads the stagers' slots (slot_of(p) for
  // rank p), on the flow's readers. meanwhile(i): chunk i's work that needs
  // no peer, run once the chunk after it is staged, while the peers read
  // instead of before they can.
  template <class Stage, class Consume, class Meanwhile = void (*)(size_t)>
  void staged(
      size_t chunks, size_t extent, Flow flow, Stage stage, Consume consume, Meanwhile meanwhile = [](size_t) {}) {
    const bool stages = flow.stager < 0 || flow.stager == r_;
    const bool reads = flow.reader < 0 || flow.reader == r_;
    const bool symmetric = flow.stager < 0 && flow.reader < 0;  // every rank waits for every stamp
    const uint64_t before = self_->next;
    cells_ = cells_for(extent, symmetric);
    first_ = placed(before, cells_);
    self_->next = first_ + chunks * cells_;
    for (size_t i = 0; i < chunks; ++i) {
      if (i == 0) stage_chunk(0, stage, stages, chunks == 1 && symmetric);
      if (i + 1 < chunks) stage_chunk(i + 1, stage, stages, false);
      meanwhile(i);
      const uint64_t g = cell_of(i);
      if (reads) {
        for (int p = 0; p < n_; ++p) {
          if (p == r_ || (flow.stager >= 0 && p != flow.stager)) continue;
          SlotHeader* h = header(p, g);
          const Control* c = control(p);
          await(p, h->stamp, g + 1, [&]() -> const Call* {
            if (load_acquire(c->arrived) > self_->direct_calls) return &c->call;
            const SlotHeader* elsewhere = i == 0 ? staged_from(p, before) : nullptr;
            return elsewhere && elsewhere != h ? &elsewhere->call : nullptr;
          });
          check_same_calls(p, h->call, h->history);
        }
        // Every peer staged chunk i, so each had consumed every chunk before
        // i - 1 (it stages one chunk ahead of what it consumes), and every
        // call before this one: cells known free without reading the peers'
        // `consumed`, whose line then stays in its writer's cache instead of
        // crossing cores every call.
        if (flow.stager < 0) self_->peers_consumed = std::max(self_->peers_consumed, i >= 2 ? cell_of(i - 1) : before);
        consume(i, [&](int p) -> const std::byte* { return data(p, g); });
      }
      store_release(self_->consumed, g + cells_);
    }
  }

  // A one-cell call's stager whose stage() writes `bytes` from `offset` in
  // its slot takes the next cell's first kTakeNextBytes of them ahead
  // (take_next_cell), if it writes that many, and not where ranks outnumber
  // cores: a rank sharing its core with the readers gained nothing so (4
  // ranks on 2 cores: the gather 5-10 % slower), and fewer lines gained as
  // often as they lost (docs/algorithms.md, 'shm: the next cell taken
  // ahead').
  void take_next_cells(const RingOptions& o, size_t offset, size_t bytes) {
    takes_next_ = !o.ranks_outnumber_cores && bytes >= kTakeNextBytes;
    take_from_ = offset;
  }

  // The split all-reduce's steps: stage as staged(); then reduce(i, slot_of,
  // own_slot) folds this rank's slice into its output and its own slot; then
  // gather(i, p, slot) copies rank p's reduced slice out of p's slot.
  template <class Stage, class Reduce, class Gather>
  void staged_split(size_t chunks, size_t extent, Stage stage, Reduce reduce, Gather gather) {
    staged(chunks, extent, {}, stage, [&](size_t i, auto slot_of) {
      const uint64_t g = cell_of(i);
      SlotHeader* own = header(r_, g);
      reduce(i, slot_of, data(r_, g));
      store_release(own->reduced, g + 1);
      for (int p = 0; p < n_; ++p) {
        if (p == r_) continue;
        SlotHeader* h = header(p, g);
        await(p, h->reduced, g + 1);
        gather(i, p, data(p, g));
      }
    });
  }

  // Takes this call's arrival number (every rank does, so the numbers agree)
  // and, when `present`, publishes the call and its buffers and waits for
  // every rank's. True once all have arrived: then every rank sees the same
  // answers from registered(). False as soon as some rank went straight to
  // staging this call instead of arriving: then every rank stages it.
  bool arrive(bool present, const void* in, void* out, const SharedRef* input, const SharedRef* output);
  // Before arrive(), on rank 0: how the call goes if not every buffer is
  // mapped, and whether mapped buffers are read in place.
  void offer(Offer o, bool maps) { offer_ = o, maps_ = maps; }
  // After arrive(): rank 0's word (the same on every rank).
  Offer rank0_offer() const { return rank0_offer_; }
  bool rank0_maps() const { return rank0_maps_; }
  // The timed path of family `f`, size class `c`: rank 0's trials, and this rank's calls.
  PathTrials& path_trials(PathFamily f, size_t c) const { return control(0)->paths[size_t(f)][c]; }
  uint64_t& path_calls(PathFamily f, size_t c) const { return self_->path_calls[size_t(f)][c]; }
  // After arrive(): rank p's input (and output) lie in allocate_shared memory;
  // p < 0: every rank's.
  bool registered(int p, bool output_too) const;
  std::byte* peer_input(int p) { return memory_.map_shared(p, control(p)->input); }
  std::byte* peer_output(int p) { return memory_.map_shared(p, control(p)->output); }
  // The peer's buffers by its own addresses, for SharedMemory::read_peer/write_peer.
  const std::byte* peer_input_address(int p) const {
    return reinterpret_cast<const std::byte*>(control(p)->input_address);
  }
  std::byte* peer_output_address(int p) const { return reinterpret_cast<std::byte*>(control(p)->output_address); }
  // Returns once every rank has finished the direct call it arrived for.
  // meanwhile(): this rank's work that reads no peer, run after telling the
  // peers it is done reading theirs and before waiting for them.
  template <class Meanwhile = void (*)()>
  void finish(Meanwhile meanwhile = [] {}) {
    store_release(self_->finished, arrival_);
    meanwhile();
    for (int p = 0; p < n_; ++p) {
      if (p != r_) await(p, control(p)->finished, arrival_);
    }
  }

 private:
  Control* control(int rank) const { return reinterpret_cast<Control*>(seg_.segment[size_t(rank)]); }
  // Cells are laid out for the communicator's chunk, whatever this call's
  // (a smaller per-call chunk must not move cells a peer may still read).
  SlotHeader* header(int rank, uint64_t g) const {
    return reinterpret_cast<SlotHeader*>(seg_.segment[size_t(rank)] + kControlBytes + (g % kCells) * kHeaderBytes);
  }
  std::byte* data(int rank, uint64_t g) const {
    return seg_.segment[size_t(rank)] + kControlBytes + kCells * kHeaderBytes + (g % kCells) * cell_bytes_;
  }
  // The cells a chunk of `extent` bytes takes: one if it fits, else a run
  // if that fits, else a whole chunk's. Cycling through every cell, chunks
  // of a few cells would touch up to 8 times the memory whole ones do and
  // miss the caches (4 ranks, 1 MiB allgather: 6% slower). A `symmetric`
  // call (every rank waits for every other, so none runs ahead) takes at
  // least a run: where ranks outnumber cores and share the caches, 256
  // cells of it would not fit them (4 ranks, 4 KiB all-reduce: 14% slower).
  // Not decided by whether ranks outnumber cores: ranks that joined a
  // grown job see more ranks than its first ones, and all must agree.
  size_t cells_for(size_t extent, bool symmetric) const {
    if (extent <= cell_bytes_ && !symmetric) return 1;
    return extent <= kCellsPerRun * cell_bytes_ ? kCellsPerRun : kCellsPerChunk;
  }
  // The first cell of a call whose chunks take `cells` cells each and whose
  // rank's cells are free from `before`: a multiple of `cells`, so that whole
  // chunks never wrap the cells; one-cell chunks among the first
  // kOneCellCells of every kCells.
  static uint64_t placed(uint64_t before, size_t cells) {
    const uint64_t g = (before + cells - 1) & ~uint64_t(cells - 1);  // cells: 1, kCellsPerRun or kCellsPerChunk
    return cells == 1 && g % kCells >= kOneCellCells ? (g / kCells + 1) * kCells : g;
  }
  // The first cell of this call's chunk i (staged() places the call).
  uint64_t cell_of(size_t i) const { return first_ + i * cells_; }
  // The header where `peer` stamped the first chunk of a staged call it began
  // with its cells at `before` (it places it from there, as staged() does, by
  // its own chunk's size), or null.
  const SlotHeader* staged_from(int peer, uint64_t before) const;

  // `stages`: fill the slot (else stamp it only). `alone`: the call's only
  // chunk, in a call where every rank waits for every stamp, fenced after its
  // stamp, before the wait for the peers' stamps: small calls ran faster so,
  // pipelined ones no faster. In a rooted call no peer waits for this
  // rank's stamp, and the fence only stalls it until its earlier stores land
  // (docs/algorithms.md, 'shm: a fence after a lone chunk').
  template <class Stage>
  void stage_chunk(size_t i, Stage& stage, bool stages, bool alone) {
    const uint64_t g = cell_of(i);
    if (g + cells_ > kCells) {
      const uint64_t needed = g + cells_ - kCells;
      wait_for_free_slot(needed, cells_ == 1 ? needed + kOneCellsFreedAtOnce : needed);
    }
    SlotHeader* h = header(r_, g);
    if (stages) stage(i, data(r_, g));
    // The call beside the stamp, after the data: a peer already polling this
    // line would otherwise take it back between the two writes.
    h->call = call_;
    h->history = history_;
    store_release(h->stamp, g + 1);
    if (alone) std::atomic_thread_fence(std::memory_order_seq_cst);
    if (stages && cells_ == 1 && takes_next_) take_next_cell(g);
  }

  // A one-cell call's stager, once it stamped cell g, takes for writing
  // lines it will write in cell g + 1 if its next call is alike, while the
  // caller goes on. The reader copied that cell out a round of cells ago
  // and still holds its lines: written without this, each store waits for
  // its line to leave the reader's cache (docs/algorithms.md, 'shm: the
  // next cell taken ahead').
  void take_next_cell(uint64_t g) const {
    const std::byte* next = data(r_, g + 1) + take_from_;
    for (size_t b = 0; b < kTakeNextBytes; b += kCacheLine) prefetch_for_write(next + b);
  }

  // Every peer has consumed every cell before `needed`. A rank that must
  // wait for it waits until they consumed those before `enough` (at least
  // `needed`), so that its next calls need not read the peers' `consumed`.
  void wait_for_free_slot(uint64_t needed, uint64_t enough);

  // Spins until `value` (written by `peer`) reaches `target`, watching for the
  // peer to be in a different call that never publishes it: `other_call`
  // returns what that call is. The peer publishes `value` before it can move
  // on, so `value` is read again after seeing the other call: a peer that
  // just finished this one is no mismatch.
  template <class OtherCall>
  void await(int peer, const uint64_t& value, uint64_t target, OtherCall other_call) {
    for (unsigned spins = 1; load_acquire(value) < target; ++spins) {
      ch_.idle(peer, spins);
      if (spins % 64 != 0) continue;
      const Call* theirs = other_call();
      if (theirs && load_acquire(value) < target) check_same_call(peer, *theirs);
    }
  }
  void await(int peer, const uint64_t& value, uint64_t target) {
    await(peer, value, target, [] { return static_cast<const Call*>(nullptr); });
  }

  void check_same_call(int peer, const Call& theirs) const;
  // The call, then the calls before it (`history`: followed_by's digest).
  void check_same_calls(int peer, const Call& theirs, uint64_t history) const;

  Channel& ch_;
  SharedMemory& memory_;
  const SharedSegments& seg_;
  const int n_, r_;
  const size_t chunk_bytes_;
  const Call call_;
  const size_t cell_bytes_;  // the communicator's cell (cell_bytes_for its chunk)
  Control* const self_;
  const uint64_t history_;  // this rank's calls before this one (followed_by)
  uint64_t arrival_ = 0;
  uint64_t first_ = 0;  // the cell of staged()'s first chunk
  size_t cells_ = 1;    // and the cells each of its chunks takes
  // take_next_cell's lines: kTakeNextBytes from take_from_ in the slot (take_next_cells).
  static constexpr size_t kTakeNextBytes = 2048;
  bool takes_next_ = false;
  size_t take_from_ = 0;
  Offer offer_ = Offer::staged, rank0_offer_ = Offer::staged;
  bool maps_ = false, rank0_maps_ = false;
  struct Shared {
    bool input = false, output = false;
  };
  std::vector<Shared> shared_;  // per rank, as read at arrival (registered() answers from it)
};

inline Call call_of(Kind kind, size_t count, DataType dtype, ReduceOp op = ReduceOp::sum, int root = -1) {
  return Call{count, kind, uint8_t(dtype), uint8_t(op), root};
}

inline ReduceOp combining(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

// `count` elements of `dtype` combined by `op`.
struct Reduction {
  DataType dtype;
  ReduceOp op;
  size_t count;
};

// dst = slot_of(0) op slot_of(1) op ... in rank order, each at `offset` bytes; avg divides once.
// One pass of reduce_many per kFoldSources sources, each pass after the first
// going on from dst: dst is read and written once a pass, not once a source
// (4 sources of 64 KiB: 2.2 against 4.4 us; docs/algorithms.md, 'shm: one pass
// over every source').
template <class SlotOf>
void fold(const Segments& s, const Reduction& r, void* dst, SlotOf& slot_of, size_t offset) {
  constexpr size_t kFoldSources = 8;
  const void* sources[kFoldSources];
  for (int p = 0; p < s.size();) {
    size_t k = 0;
    if (p > 0) sources[k++] = dst;
    while (k < kFoldSources && p < s.size()) sources[k++] = slot_of(p++) + offset;
    reduce_many(r.dtype, combining(r.op), dst, sources, k, r.count);
  }
  s.count_traffic(size_t(s.size() + 1) * r.count * dtype_size(r.dtype));  // every source read once, dst written
  if (r.op == ReduceOp::avg) scale_avg(r.dtype, dst, r.count, s.size());
}

// (A call of one chunk, the small calls' case, divides nothing: a 64-bit
// division is a few percent of a small call.)
inline size_t chunks_for(size_t count, size_t per_chunk) {
  return count <= per_chunk ? size_t(count != 0) : (count + per_chunk - 1) / per_chunk;
}
// The elements of a block of `count` in its run i of `per_run` each (0 past its end).
inline size_t run_of(size_t count, size_t i, size_t per_run) {
  return std::min(per_run, count - std::min(count, i * per_run));
}

}  // namespace tandem::ring
