// Shared-memory all-reduce, for ranks on one host that map each other's
// segments (Channel::shared_segments).
//
// Terms. The buffer is cut into *chunks* of at most chunk_bytes. Chunks are
// numbered over the communicator's lifetime (g), so calls chain without any
// reset. Each rank's segment holds a control block and kSlots *slots*; chunk
// g lives in slot g % kSlots.
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
// Per rank and element: one copy into cache-resident slots, n reads in the
// fold, one write of the output; the kernel is never entered, no page is pinned.
#include <atomic>
#include <cstring>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

constexpr size_t kSlots = 4;
constexpr size_t kControlBytes = 4096;
constexpr size_t kHeaderBytes = 64;

// The start of each rank's segment.
struct Control {
  alignas(64) uint64_t consumed;  // chunks this rank has folded (peers read it)
  alignas(64) uint64_t next;      // the next chunk number (this rank only)
  uint64_t peers_consumed;        // the least `consumed` last seen among peers (this rank only)
};
static_assert(sizeof(Control) <= kControlBytes);

// Each slot opens with the stamp and what the call was, so a rank that called
// a different all-reduce learns it from the first chunk instead of mixing data.
struct SlotHeader {
  uint64_t stamp;  // chunk number + 1 once the data is in
  uint64_t count;
  uint32_t dtype;
  uint32_t op;
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

uint64_t load_acquire(const uint64_t& x) { return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire); }
void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }

class SharedMemoryAllreduce {
 public:
  SharedMemoryAllreduce(Channel& ch, const AllreduceArgs& a, size_t chunk_bytes)
      : ch_(ch), a_(a), seg_(*ch.shared_segments()), n_(ch.size()), r_(ch.rank()), esize_(dtype_size(a.dtype)) {
    chunk_bytes_ = chunk_bytes;
    chunk_elems_ = chunk_bytes / esize_;
    combine_ = a.op == ReduceOp::avg ? ReduceOp::sum : a.op;
    self_ = control(r_);
  }

  void run() {
    const size_t chunks = (a_.count + chunk_elems_ - 1) / chunk_elems_;
    const uint64_t first = self_->next;
    self_->next = first + chunks;
    for (size_t i = 0; i < chunks; ++i) {
      if (i == 0) stage(first, 0);
      if (i + 1 < chunks) stage(first + i + 1, i + 1);
      fold(first + i, i);
    }
  }

 private:
  Control* control(int rank) const { return reinterpret_cast<Control*>(seg_.segment[size_t(rank)]); }
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
    h->count = a_.count;
    h->dtype = uint32_t(a_.dtype);
    h->op = uint32_t(a_.op);
    std::memcpy(data(h), static_cast<const std::byte*>(a_.input) + c.begin * esize_, c.size * esize_);
    store_release(h->stamp, g + 1);
  }

  // Every peer has consumed at least `needed` chunks.
  void wait_for_free_slot(uint64_t needed) {
    if (self_->peers_consumed >= needed) return;
    uint64_t least = UINT64_MAX;
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      const uint64_t& consumed = control(p)->consumed;
      uint64_t seen = load_acquire(consumed);
      for (unsigned spins = 1; seen < needed; ++spins) {
        ch_.idle(p, spins);
        seen = load_acquire(consumed);
      }
      least = std::min(least, seen);
    }
    self_->peers_consumed = least;
  }

  void fold(uint64_t g, size_t i) {
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      SlotHeader* h = header(p, g);
      for (unsigned spins = 1; load_acquire(h->stamp) != g + 1; ++spins) ch_.idle(p, spins);
      if (h->count != a_.count || h->dtype != uint32_t(a_.dtype) || h->op != uint32_t(a_.op)) mismatch(p, *h);
    }
    const Range c = chunk(i);
    void* out = static_cast<std::byte*>(a_.output) + c.begin * esize_;
    reduce(a_.dtype, combine_, out, data(header(0, g)), data(header(1, g)), c.size);
    for (int p = 2; p < n_; ++p) reduce(a_.dtype, combine_, out, out, data(header(p, g)), c.size);
    if (a_.op == ReduceOp::avg) scale_avg(a_.dtype, out, c.size, n_);
    store_release(self_->consumed, g + 1);
  }

  [[noreturn]] void mismatch(int p, const SlotHeader& h) const {
    auto call = [](uint64_t count, uint32_t dtype, uint32_t op) {
      return "allreduce(" + std::to_string(count) + " x " + std::string(to_string(DataType(dtype))) + ", " +
             std::string(to_string(ReduceOp(op))) + ")";
    };
    throw InvalidArgument("mismatched collectives: rank " + std::to_string(p) + " called " +
                          call(h.count, h.dtype, h.op) + " while rank " + std::to_string(r_) + " called " +
                          call(a_.count, uint32_t(a_.dtype), uint32_t(a_.op)) +
                          "; every rank must issue the same collectives with the same arguments");
  }

  Channel& ch_;
  const AllreduceArgs& a_;
  const SharedSegments& seg_;
  const int n_, r_;
  const size_t esize_;
  size_t chunk_bytes_ = 0, chunk_elems_ = 0;
  ReduceOp combine_;
  Control* self_ = nullptr;
};

}  // namespace

size_t shm_allreduce_bytes(size_t chunk_bytes) { return kControlBytes + kSlots * (kHeaderBytes + chunk_bytes); }

void shm_allreduce(Channel& ch, const AllreduceArgs& args, size_t chunk_bytes) {
  if (args.count == 0) return;
  SharedMemoryAllreduce(ch, args, chunk_bytes).run();
}

}  // namespace tandem::ring
