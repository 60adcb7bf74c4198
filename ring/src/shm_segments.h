// The shared segments' layout (control block, slots, slot headers), the Call
// every rank publishes there, and the Segments protocol over them: staging,
// the arrival/finish handshake and the hand-off probe. Terms: shm_collectives.cc.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {

constexpr size_t kSlots = 4;
constexpr size_t kControlBytes = 4096;
constexpr size_t kHeaderBytes = 64;
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
// The timed choice between staging and cross-memory attach
// (shm_timed_path.cc): one entry per family and power-of-two class of bytes
// per call (64 KiB steps). Every rank counts its calls of each (the same
// count on all); each round of kPathRoundCalls calls (the first one
// kPathFirstRoundCalls) opens with one untimed call of each path, then
// path_block_calls() pairs of trials, one of each path, a trial being two
// calls of its path with the second timed: as many pairs as move
// kPathBlockBytes, from 3 to kPathMaxBlock, so that small calls give a fair
// sample and a large one few slow trials (two pairs at 1 MiB tied as often
// as not). In place and out of place are families of their own for
// the all-reduce: on one host cross-memory attach won 1.6x in place at
// 16 MiB and lost 1.3x out of place. (The all-to-all in place always stages.)
enum class PathFamily : uint8_t { alltoall, allreduce, allreduce_in_place };
constexpr size_t kPathFamilies = 3;
constexpr size_t kPathClasses = 16;
constexpr size_t kPathBlockBytes = 1 << 20;
constexpr uint64_t kPathMaxBlock = 12;
inline uint64_t path_block_calls(size_t bytes) {
  return std::clamp<uint64_t>(kPathBlockBytes / std::max<size_t>(bytes, 1), 3, kPathMaxBlock);
}
constexpr uint64_t kPathRoundCalls = 1 << 14;
// The first round is short, so that a verdict taken on cold buffers is
// taken again once they are warm (or, for a family with a cold path, first
// taken then): 4 ranks on 2 cores, 16 MiB all-to-all, ran cross-memory
// attach at 7-10 ms per call for its first calls, 3.9 ms after ten,
// staging 5.3; the first verdict staged 5 times in 6, the one at call 64
// chose cross-memory attach 5 times in 6.
constexpr uint64_t kPathFirstRoundCalls = 64;
static_assert(2 + 4 * kPathMaxBlock < kPathFirstRoundCalls, "the first round holds a whole opening");
// The call's place in its round.
inline uint64_t round_call(uint64_t calls) {
  return calls < kPathFirstRoundCalls ? calls : (calls - kPathFirstRoundCalls) % kPathRoundCalls;
}
enum Path : uint64_t { kUntimed = 0, kStaged = 1, kCrossMemory = 2 };
// Rank 0's, written only in a round's opening: peers read the verdict every
// call, so a line rank 0 wrote every call would move between the cores every call.
struct PathTrials {
  uint64_t verdict;  // rank 0's Path for the rest of the round; peers read it racily
  // Rank 0's only: each path's timed calls, summed, and the pairs each won;
  // the first call of the pair under way (kNotTimed: not counted).
  uint64_t staged_ns, cross_memory_ns;
  uint64_t staged_wins, cross_memory_wins;
  uint64_t pair_first_ns;
};
constexpr uint64_t kNotTimed = UINT64_MAX;
using Kind = Collective;  // its wire numbers
// The hand-off probe: rounds of ping-pong per batch; the median batch counts.
constexpr uint64_t kProbeRounds = 100;
constexpr size_t kProbeBatches = 3;

// How a direct call goes when not every rank's buffers are mapped: rank 0
// offers it with its arrival and every rank follows, so all take one path
// whatever their own options say. probe: time the hand-off between the
// ranks' cores first; cross-memory attach if it is far.
enum class Offer : uint8_t { staged, cross_memory, probe };

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
    if (kind == Kind::alltoallv)
      return "alltoallv(" + std::string(to_string(DataType(dtype))) + ")";  // counts per rank
    std::string s =
        std::string(to_string(kind)) + "(" + std::to_string(count) + " x " + std::string(to_string(DataType(dtype)));
    if (kind == Kind::allreduce || kind == Kind::reduce_scatter || kind == Kind::reduce) {
      s += ", " + std::string(to_string(ReduceOp(op)));
    }
    if (kind == Kind::broadcast || kind == Kind::reduce) s += ", root " + std::to_string(root);
    return s + ")";
  }
};

// The start of each rank's segment.
struct Control {
  alignas(64) uint64_t consumed;  // staged chunks this rank has consumed (peers read it)
  // This rank only:
  alignas(64) uint64_t next;  // the next chunk number
  uint64_t peers_consumed;    // a bound on every peer's `consumed`: as last read, or as their stamps imply
  uint64_t direct_calls;      // arrival numbers taken (one per direct-eligible call)
  uint64_t path_calls[kPathFamilies][kPathClasses];  // calls of each timed family and class (PathTrials)
  // When rank 0's hand-off probe last ran (steady clock). Peers read it and
  // the verdict below racily, only to choose whether to arrive; rank 0's
  // offer rules the path.
  alignas(64) uint64_t probed_at_ns;
  // Peers read these once `arrived` says so:
  alignas(64) uint64_t arrived;  // the arrival number of this rank's latest direct-eligible call
  Call call;
  SharedRef input, output;                 // fd -1: not in allocate_shared memory
  uint64_t input_address, output_address;  // in this rank's own process (for cross-memory attach)
  Offer offer;                             // rank 0's word on this call
  alignas(64) uint64_t finished;           // the arrival number of the last direct call this rank completed
  // The hand-off probe, each on its own cache line: rank 0 pings, a peer
  // answers with the same value, rank 0 publishes arrival * 2 + far.
  alignas(64) uint64_t ping;
  alignas(64) uint64_t pong;
  alignas(64) uint64_t verdict;
  alignas(64) PathTrials paths[kPathFamilies][kPathClasses];
};
static_assert(sizeof(Control) <= kControlBytes);

struct SlotHeader {
  uint64_t stamp;    // chunk number + 1 once the data is in
  uint64_t reduced;  // chunk number + 1 once this rank's reduced slice is in (split all-reduce)
  Call call;
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

inline uint64_t load_acquire(const uint64_t& x) {
  return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire);
}
inline void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }
inline uint64_t load_relaxed(const uint64_t& x) {
  return std::atomic_ref<const uint64_t>(x).load(std::memory_order_relaxed);
}
inline void store_relaxed(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_relaxed); }

inline const std::byte* bytes_of(const void* p) { return static_cast<const std::byte*>(p); }
inline std::byte* bytes_of(void* p) { return static_cast<std::byte*>(p); }

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
        self_(control(r_)) {}

  static uint64_t now_ns() {
    return uint64_t(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
            .count());
  }

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

  // Runs `chunks` staged steps. stage(i, slot) fills this rank's slot with
  // its part of chunk i; consume(i, slot_of) reads the stagers' slots
  // (slot_of(p) for rank p). `stager` < 0: every rank stages; else only it.
  // meanwhile(i): chunk i's work that needs no peer, run once the chunk
  // after it is staged, while the peers read instead of before they can.
  template <class Stage, class Consume, class Meanwhile = void (*)(size_t)>
  void staged(
      size_t chunks, int stager, Stage stage, Consume consume, Meanwhile meanwhile = [](size_t) {}) {
    const uint64_t first = self_->next;
    self_->next = first + chunks;
    const bool stages = stager < 0 || stager == r_;
    for (size_t i = 0; i < chunks; ++i) {
      if (stages && i == 0) stage_chunk(first, 0, stage, chunks == 1);
      if (stages && i + 1 < chunks) stage_chunk(first + i + 1, i + 1, stage, false);
      meanwhile(i);
      const uint64_t g = first + i;
      for (int p = 0; p < n_; ++p) {
        if (p == r_ || (stager >= 0 && p != stager)) continue;
        SlotHeader* h = header(p, g);
        const Control* c = control(p);
        await(p, h->stamp, g + 1,
              [&]() -> const Call* { return load_acquire(c->arrived) > self_->direct_calls ? &c->call : nullptr; });
        check_same_call(p, h->call);
      }
      // Every peer staged chunk g, so each had consumed every chunk before
      // g - 1 (it stages one chunk ahead of what it consumes): slots known
      // free without reading the peers' `consumed`, whose line then stays
      // in its writer's cache instead of crossing cores every call.
      if (stager < 0 && g >= 1) self_->peers_consumed = std::max(self_->peers_consumed, g - 1);
      consume(i, [&](int p) -> const std::byte* { return data(header(p, g)); });
      store_release(self_->consumed, g + 1);
    }
  }

  // The split all-reduce's steps: stage as staged(); then reduce(i, slot_of,
  // own_slot) folds this rank's slice into its output and its own slot; then
  // gather(i, p, slot) copies rank p's reduced slice out of p's slot.
  template <class Stage, class Reduce, class Gather>
  void staged_split(size_t chunks, Stage stage, Reduce reduce, Gather gather) {
    const uint64_t first = self_->next;  // staged() numbers this call's chunks from here
    staged(chunks, -1, stage, [&](size_t i, auto slot_of) {
      const uint64_t g = first + i;
      SlotHeader* own = header(r_, g);
      reduce(i, slot_of, data(own));
      store_release(own->reduced, g + 1);
      for (int p = 0; p < n_; ++p) {
        if (p == r_) continue;
        SlotHeader* h = header(p, g);
        await(p, h->reduced, g + 1);
        gather(i, p, data(h));
      }
    });
  }

  // Takes this call's arrival number (every rank does, so the numbers agree)
  // and, when `present`, publishes the call and its buffers and waits for
  // every rank's. True once all have arrived: then every rank sees the same
  // answers from registered(). False as soon as some rank went straight to
  // staging this call instead of arriving: then every rank stages it.
  bool arrive(bool present, const void* in, void* out, const SharedRef* input, const SharedRef* output);
  // Before arrive(), on rank 0: how the call goes if not every buffer is mapped.
  void offer(Offer o) { offer_ = o; }
  // After arrive(): rank 0's offer (the same on every rank).
  Offer rank0_offer() const { return rank0_offer_; }
  // Rank 0's last hand-off verdict, and whether it is older than `period`
  // (every rank reads the same clock).
  bool far() const { return (load_relaxed(control(0)->verdict) & 1) != 0; }
  bool probe_due(std::chrono::nanoseconds period) const {
    const uint64_t at = load_relaxed(control(0)->probed_at_ns);
    return at == 0 || int64_t(now_ns() - at) >= int64_t(period.count());
  }
  // After every rank arrived for this call: rank 0 times kProbeRounds
  // ping-pongs with each peer in turn, kProbeBatches times, through their
  // control blocks and publishes whether the slowest peer's median one-way
  // hand-off exceeds `far_ns`; every rank returns that verdict. Values carry
  // the arrival number, so probes of different calls never mix.
  bool probe_far(uint64_t far_ns);
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
  SlotHeader* header(int rank, uint64_t g) const {
    // Slots are laid out for the communicator's chunk, whatever this call's
    // (a smaller per-call chunk must not move slots a peer may still read).
    const size_t slot_bytes = (seg_.bytes - kControlBytes) / kSlots;
    return reinterpret_cast<SlotHeader*>(seg_.segment[size_t(rank)] + kControlBytes + (g % kSlots) * slot_bytes);
  }
  static std::byte* data(SlotHeader* h) { return reinterpret_cast<std::byte*>(h) + kHeaderBytes; }

  // `alone`: the call's only chunk. A full fence after its stamp, before
  // the wait for the peers' stamps, made small calls faster (2 ranks, median
  // of 6 alternating launches: 4 KiB all-to-all 1.34 -> 1.18 us). After
  // every chunk of staged pipelined calls it measured within the host's
  // spread either way (512 KiB all-reduce 68 against 75 us, 4 MiB 735
  // against 717; after the last chunk only, 68 against 65 and 734 against
  // 686), so only a lone chunk gets it.
  template <class Stage>
  void stage_chunk(uint64_t g, size_t i, Stage& stage, bool alone) {
    if (g >= kSlots) wait_for_free_slot(g - kSlots + 1);
    SlotHeader* h = header(r_, g);
    stage(i, data(h));
    // The call beside the stamp, after the data: a peer already polling this
    // line would otherwise take it back between the two writes.
    h->call = call_;
    store_release(h->stamp, g + 1);
    if (alone) std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  // Every peer has consumed at least `needed` chunks.
  void wait_for_free_slot(uint64_t needed);

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

  Channel& ch_;
  SharedMemory& memory_;
  const SharedSegments& seg_;
  const int n_, r_;
  const size_t chunk_bytes_;
  const Call call_;
  Control* const self_;
  uint64_t arrival_ = 0;
  Offer offer_ = Offer::staged, rank0_offer_ = Offer::staged;
  struct Shared {
    bool input = false, output = false;
  };
  std::vector<Shared> shared_;  // per rank, as read at arrival (registered() answers from it)
};

inline Call call_of(Kind kind, size_t count, DataType dtype, ReduceOp op = ReduceOp::sum, int root = -1) {
  return Call{count, kind, uint8_t(dtype), uint8_t(op), root};
}

inline ReduceOp combining(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

// dst = slot_of(0) op slot_of(1) op ... in rank order, each at `offset` bytes; avg divides once.
template <class SlotOf>
void fold(const Segments& s, DataType dtype, ReduceOp op, void* dst, SlotOf& slot_of, size_t offset, size_t count) {
  reduce(dtype, combining(op), dst, slot_of(0) + offset, slot_of(1) + offset, count);
  for (int p = 2; p < s.size(); ++p) reduce(dtype, combining(op), dst, dst, slot_of(p) + offset, count);
  s.count_traffic(size_t(s.size() + 1) * count * dtype_size(dtype));  // every source read once, dst written
  if (op == ReduceOp::avg) scale_avg(dtype, dst, count, s.size());
}

inline size_t chunks_for(size_t count, size_t per_chunk) { return (count + per_chunk - 1) / per_chunk; }

}  // namespace tandem::ring
