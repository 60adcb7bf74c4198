// Shared-memory all-reduce, for ranks on one host that map each other's
// segments (Channel::shared_segments). Two ways, chosen per call:
//
// *Staged* (any buffers). The buffer is cut into *chunks* of at most
// chunk_bytes. Chunks are numbered over the communicator's lifetime (g), so
// calls chain without any reset. Each rank's segment holds a control block
// and kSlots *slots*; chunk g lives in slot g % kSlots.
//  - To *stage* chunk g, a rank copies its input chunk into its slot and
//    stamps the slot with g + 1 (a release store after the data).
//  - To *fold* chunk g, a rank waits for every peer's stamp, then combines
//    all ranks' slots in rank order into its output, and publishes
//    consumed = g + 1. Every rank folds every chunk with the same operations
//    in the same order, so results are bitwise identical; one
//    synchronisation per chunk, and no second pass to spread results.
//  - A rank stages chunk g only once every peer has consumed chunk
//    g - kSlots, which freed the slot. It stages one chunk ahead of the one
//    it folds, so copying and reducing overlap across ranks.
//
// *Direct* (every rank's buffers from Communicator::allocate_shared, at
// least kDirectMinBytes). Each rank *arrives*: it publishes where its buffers
// are and waits for the others. Then rank r reduces its *slice* (the r-th
// balanced part) straight from every rank's input, in rank order, into rank
// 0's output, copies the result to the other ranks' outputs, and *finishes*;
// it returns once every rank has finished (peers write into its output and
// read its input until then). No staging copy; each element is reduced once.
#include <atomic>
#include <cstring>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

constexpr size_t kSlots = 4;
constexpr size_t kControlBytes = 4096;
constexpr size_t kHeaderBytes = 64;
// Below this the arrival round trip costs more than the staging copy saves.
constexpr size_t kDirectMinBytes = 16 << 10;

// What a rank called, so one that called a different all-reduce learns it
// from the first exchange instead of mixing data.
struct Call {
  uint64_t count;
  uint32_t dtype;
  uint32_t op;
};

// The start of each rank's segment.
struct Control {
  alignas(64) uint64_t consumed;  // staged chunks this rank has folded (peers read it)
  // This rank only:
  alignas(64) uint64_t next;   // the next chunk number
  uint64_t peers_consumed;     // the least `consumed` last seen among peers
  uint64_t direct_calls;       // arrivals so far
  // Peers read these once `arrived` says so:
  alignas(64) uint64_t arrived;  // the arrival number of this rank's latest call
  Call call;
  SharedRef input, output;       // fd -1: not in allocate_shared memory
  alignas(64) uint64_t finished;  // the arrival number of the last direct call this rank completed
};
static_assert(sizeof(Control) <= kControlBytes);

struct SlotHeader {
  uint64_t stamp;  // chunk number + 1 once the data is in
  Call call;
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

uint64_t load_acquire(const uint64_t& x) { return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire); }
void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }

class SharedMemoryAllreduce {
 public:
  SharedMemoryAllreduce(Channel& ch, const AllreduceArgs& a, size_t chunk_bytes)
      : ch_(ch),
        a_(a),
        seg_(*ch.shared_segments()),
        n_(ch.size()),
        r_(ch.rank()),
        esize_(dtype_size(a.dtype)),
        chunk_bytes_(chunk_bytes),
        chunk_elems_(chunk_bytes / esize_),
        combine_(a.op == ReduceOp::avg ? ReduceOp::sum : a.op),
        call_{a.count, uint32_t(a.dtype), uint32_t(a.op)},
        self_(control(r_)) {}

  void run() {
    if (a_.count * esize_ >= kDirectMinBytes && arrive()) {
      direct();
    } else {
      staged();
    }
  }

 private:
  Control* control(int rank) const { return reinterpret_cast<Control*>(seg_.segment[size_t(rank)]); }
  std::byte* in(size_t element) const { return static_cast<std::byte*>(const_cast<void*>(a_.input)) + element * esize_; }
  std::byte* out(size_t element) const { return static_cast<std::byte*>(a_.output) + element * esize_; }

  // Spins until `value` reaches `target` (written by `peer`).
  void await(int peer, const uint64_t& value, uint64_t target) {
    for (unsigned spins = 1; load_acquire(value) < target; ++spins) ch_.idle(peer, spins);
  }
  // The same, while watching for the peer to be in the other way of a
  // different call (counts on either side of kDirectMinBytes): then it
  // never comes, and `other_way` returns what it called. The peer publishes
  // `value` before it can move on, so `value` is read again after seeing it
  // elsewhere: a peer that just finished this call is no mismatch.
  template <class OtherWay>
  void await(int peer, const uint64_t& value, uint64_t target, OtherWay other_way) {
    for (unsigned spins = 1; load_acquire(value) < target; ++spins) {
      ch_.idle(peer, spins);
      if (spins % 64 != 0) continue;
      const Call* theirs = other_way();
      if (theirs && load_acquire(value) < target) check_same_call(peer, *theirs);
    }
  }

  void check_same_call(int peer, const Call& theirs) const {
    if (theirs.count == call_.count && theirs.dtype == call_.dtype && theirs.op == call_.op) return;
    auto str = [](const Call& c) {
      return "allreduce(" + std::to_string(c.count) + " x " + std::string(to_string(DataType(c.dtype))) + ", " +
             std::string(to_string(ReduceOp(c.op))) + ")";
    };
    throw InvalidArgument("mismatched collectives: rank " + std::to_string(peer) + " called " + str(theirs) +
                          " while rank " + std::to_string(r_) + " called " + str(call_) +
                          "; every rank must issue the same collectives with the same arguments");
  }

  // ---- staged ----

  void staged() {
    const size_t chunks = (a_.count + chunk_elems_ - 1) / chunk_elems_;
    const uint64_t first = self_->next;
    self_->next = first + chunks;
    for (size_t i = 0; i < chunks; ++i) {
      if (i == 0) stage(first, 0);
      if (i + 1 < chunks) stage(first + i + 1, i + 1);
      fold(first + i, i);
    }
  }

  SlotHeader* header(int rank, uint64_t g) const {
    const size_t slot_bytes = kHeaderBytes + chunk_bytes_;  // the same for every dtype
    return reinterpret_cast<SlotHeader*>(seg_.segment[size_t(rank)] + kControlBytes + (g % kSlots) * slot_bytes);
  }
  static std::byte* data(SlotHeader* h) { return reinterpret_cast<std::byte*>(h) + kHeaderBytes; }
  Range chunk(size_t i) const {
    const size_t begin = i * chunk_elems_;
    return {begin, std::min(chunk_elems_, a_.count - begin)};
  }

  void stage(uint64_t g, size_t i) {
    if (g >= kSlots) wait_for_free_slot(g - kSlots + 1);
    SlotHeader* h = header(r_, g);
    const Range c = chunk(i);
    h->call = call_;
    std::memcpy(data(h), in(c.begin), c.size * esize_);
    store_release(h->stamp, g + 1);
  }

  // Every peer has consumed at least `needed` chunks.
  void wait_for_free_slot(uint64_t needed) {
    if (self_->peers_consumed >= needed) return;
    uint64_t least = UINT64_MAX;
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      await(p, control(p)->consumed, needed);
      least = std::min(least, load_acquire(control(p)->consumed));
    }
    self_->peers_consumed = least;
  }

  void fold(uint64_t g, size_t i) {
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      SlotHeader* h = header(p, g);
      const Control* c = control(p);
      await(p, h->stamp, g + 1, [&]() -> const Call* {
        return load_acquire(c->arrived) > self_->direct_calls ? &c->call : nullptr;
      });
      check_same_call(p, h->call);
    }
    const Range c = chunk(i);
    reduce(a_.dtype, combine_, out(c.begin), data(header(0, g)), data(header(1, g)), c.size);
    for (int p = 2; p < n_; ++p) reduce(a_.dtype, combine_, out(c.begin), out(c.begin), data(header(p, g)), c.size);
    if (a_.op == ReduceOp::avg) scale_avg(a_.dtype, out(c.begin), c.size, n_);
    store_release(self_->consumed, g + 1);
  }

  // ---- direct ----

  // Publishes this call and its buffers, waits for every rank's; true when
  // every rank's buffers can be mapped (all ranks see the same answer).
  bool arrive() {
    const size_t bytes = a_.count * esize_;
    SharedRef input, output;
    const bool mine = ch_.find_shared(a_.input, bytes, input) && ch_.find_shared(a_.output, bytes, output);
    arrival_ = ++self_->direct_calls;
    self_->call = call_;
    self_->input = mine ? input : SharedRef{};
    self_->output = mine ? output : SharedRef{};
    store_release(self_->arrived, arrival_);
    bool all = mine;
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      const Control* c = control(p);
      const SlotHeader* h = header(p, self_->next);
      await(p, c->arrived, arrival_, [&]() -> const Call* {
        return load_acquire(h->stamp) == self_->next + 1 ? &h->call : nullptr;
      });
      check_same_call(p, c->call);
      all = all && c->input.fd >= 0 && c->output.fd >= 0;
    }
    return all;
  }

  void direct() {
    std::vector<const std::byte*> ins(static_cast<size_t>(n_));
    std::vector<std::byte*> outs(static_cast<size_t>(n_));
    for (int p = 0; p < n_; ++p) {
      ins[p] = p == r_ ? in(0) : ch_.map_shared(p, control(p)->input);
      outs[p] = p == r_ ? out(0) : ch_.map_shared(p, control(p)->output);
    }
    // Pieces of the slice small enough to stay in cache between the reduction and the copies.
    const Range slice = balanced(a_.count, size_t(n_), size_t(r_));
    for (size_t begin = slice.begin; begin < slice.begin + slice.size; begin += chunk_elems_) {
      const size_t count = std::min(chunk_elems_, slice.begin + slice.size - begin);
      const size_t offset = begin * esize_, bytes = count * esize_;
      // Into rank 0's output: it may alias rank 0's input, which the first step reads first.
      std::byte* result = outs[0] + offset;
      reduce(a_.dtype, combine_, result, ins[0] + offset, ins[1] + offset, count);
      for (int p = 2; p < n_; ++p) reduce(a_.dtype, combine_, result, result, ins[p] + offset, count);
      if (a_.op == ReduceOp::avg) scale_avg(a_.dtype, result, count, n_);
      for (int p = 1; p < n_; ++p) std::memcpy(outs[p] + offset, result, bytes);
    }
    store_release(self_->finished, arrival_);
    for (int p = 0; p < n_; ++p) {
      if (p != r_) await(p, control(p)->finished, arrival_);
    }
  }

  Channel& ch_;
  const AllreduceArgs& a_;
  const SharedSegments& seg_;
  const int n_, r_;
  const size_t esize_, chunk_bytes_, chunk_elems_;
  const ReduceOp combine_;
  const Call call_;
  Control* const self_;
  uint64_t arrival_ = 0;
};

}  // namespace

size_t shm_allreduce_bytes(size_t chunk_bytes) { return kControlBytes + kSlots * (kHeaderBytes + chunk_bytes); }

void shm_allreduce(Channel& ch, const AllreduceArgs& args, size_t chunk_bytes) {
  if (args.count == 0) return;
  SharedMemoryAllreduce(ch, args, chunk_bytes).run();
}

}  // namespace tandem::ring
