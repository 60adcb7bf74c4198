// Shared-memory collectives, for ranks on one host that map each other's
// segments (Channel::shared_segments).
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
//    shm_allreduce_cma_min_bytes to shm_allreduce_cma_max_bytes) by default
//    only at 2 ranks while the
//    *hand-off* between their cores is far: rank 0 times it with a *probe*
//    (ping-pong through the control blocks) in a call of that window, again
//    once the last probe is shm_probe_period old. Near, staging ran 2x
//    faster at 1 MiB; far, 1.4x slower: every line a peer staged crosses
//    between the cores at several times the cost, while cross-memory attach
//    leaves a rank's slice of the peer's buffer in its own cache, where
//    repeated in-place calls find it (buffers rewritten between calls: 1.06x).
//  - Which way a call goes is rank 0's *offer*, published with its arrival,
//    so every rank takes the same path whatever its own options say.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {

namespace {
std::atomic<uint64_t> g_traffic{0};  // bytes read and written by this process's shared-memory collectives
}  // namespace

uint64_t shared_memory_traffic() { return g_traffic.load(std::memory_order_relaxed); }

namespace {

void count_traffic(size_t bytes) { g_traffic.fetch_add(bytes, std::memory_order_relaxed); }

// memcpy, counted: the bytes read and the bytes written.
void counted_copy(void* dst, const void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  count_traffic(2 * bytes);
}

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
    std::string s = std::string(to_string(kind)) + "(" + std::to_string(count) + " x " +
                    std::string(to_string(DataType(dtype)));
    if (kind == Kind::allreduce || kind == Kind::reduce_scatter) s += ", " + std::string(to_string(ReduceOp(op)));
    if (kind == Kind::broadcast) s += ", root " + std::to_string(root);
    return s + ")";
  }
};

// The start of each rank's segment.
struct Control {
  alignas(64) uint64_t consumed;  // staged chunks this rank has consumed (peers read it)
  // This rank only:
  alignas(64) uint64_t next;   // the next chunk number
  uint64_t peers_consumed;     // the least `consumed` last seen among peers
  uint64_t direct_calls;       // arrival numbers taken (one per direct-eligible call)
  // When rank 0's hand-off probe last ran (steady clock). Peers read it and
  // the verdict below racily, only to choose whether to arrive; rank 0's
  // offer rules the path.
  alignas(64) uint64_t probed_at_ns;
  // Peers read these once `arrived` says so:
  alignas(64) uint64_t arrived;  // the arrival number of this rank's latest direct-eligible call
  Call call;
  SharedRef input, output;        // fd -1: not in allocate_shared memory
  uint64_t input_address, output_address;  // in this rank's own process (for cross-memory attach)
  Offer offer;                    // rank 0's word on this call
  alignas(64) uint64_t finished;  // the arrival number of the last direct call this rank completed
  // The hand-off probe, each on its own cache line: rank 0 pings, a peer
  // answers with the same value, rank 0 publishes arrival * 2 + far.
  alignas(64) uint64_t ping;
  alignas(64) uint64_t pong;
  alignas(64) uint64_t verdict;
};
static_assert(sizeof(Control) <= kControlBytes);

struct SlotHeader {
  uint64_t stamp;    // chunk number + 1 once the data is in
  uint64_t reduced;  // chunk number + 1 once this rank's reduced slice is in (split all-reduce)
  Call call;
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);

uint64_t load_acquire(const uint64_t& x) { return std::atomic_ref<const uint64_t>(x).load(std::memory_order_acquire); }
void store_release(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_release); }
uint64_t load_relaxed(const uint64_t& x) { return std::atomic_ref<const uint64_t>(x).load(std::memory_order_relaxed); }
void store_relaxed(uint64_t& x, uint64_t v) { std::atomic_ref<uint64_t>(x).store(v, std::memory_order_relaxed); }

const std::byte* bytes_of(const void* p) { return static_cast<const std::byte*>(p); }
std::byte* bytes_of(void* p) { return static_cast<std::byte*>(p); }

// The slot protocol and the arrival/finish handshake over the segments.
class Segments {
 public:
  Segments(Channel& ch, size_t chunk_bytes, const Call& call)
      : ch_(ch), seg_(*ch.shared_segments()), n_(ch.size()), r_(ch.rank()), chunk_bytes_(chunk_bytes), call_(call),
        self_(control(r_)) {}

  int size() const { return n_; }
  int rank() const { return r_; }
  size_t chunk_bytes() const { return chunk_bytes_; }

  // Runs `chunks` staged steps. stage(i, slot) fills this rank's slot with
  // its part of chunk i; consume(i, slot_of) reads the stagers' slots
  // (slot_of(p) for rank p). `stager` < 0: every rank stages; else only it.
  template <class Stage, class Consume>
  void staged(size_t chunks, int stager, Stage stage, Consume consume) {
    const uint64_t first = self_->next;
    self_->next = first + chunks;
    const bool stages = stager < 0 || stager == r_;
    for (size_t i = 0; i < chunks; ++i) {
      if (stages && i == 0) stage_chunk(first, 0, stage);
      if (stages && i + 1 < chunks) stage_chunk(first + i + 1, i + 1, stage);
      const uint64_t g = first + i;
      for (int p = 0; p < n_; ++p) {
        if (p == r_ || (stager >= 0 && p != stager)) continue;
        SlotHeader* h = header(p, g);
        const Control* c = control(p);
        await(p, h->stamp, g + 1, [&]() -> const Call* {
          return load_acquire(c->arrived) > self_->direct_calls ? &c->call : nullptr;
        });
        check_same_call(p, h->call);
      }
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
  bool arrive(bool present, const void* in, void* out, const SharedRef* input, const SharedRef* output) {
    arrival_ = ++self_->direct_calls;
    if (!present) return false;
    self_->call = call_;
    self_->input = input ? *input : SharedRef{};
    self_->output = output ? *output : SharedRef{};
    self_->input_address = uint64_t(uintptr_t(in));
    self_->output_address = uint64_t(uintptr_t(out));
    self_->offer = offer_;
    rank0_offer_ = offer_;
    store_release(self_->arrived, arrival_);
    shared_.assign(size_t(n_), {});  // here, not per call: most calls never arrive
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      const Control* c = control(p);
      const SlotHeader* h = header(p, self_->next);
      for (unsigned spins = 1; load_acquire(c->arrived) < arrival_; ++spins) {
        if (load_acquire(h->stamp) == self_->next + 1) {  // p staged the next chunk: this call, or a mismatch
          check_same_call(p, h->call);
          return false;
        }
        ch_.idle(p, spins);
      }
      // Read what the peer published for this arrival, then check it still is
      // this arrival's. A peer already past it staged this call (a direct call
      // waits for every rank to finish) and may have published a later call's
      // here: stage too; the slots carry this call for the check.
      const Call theirs = c->call;
      shared_[size_t(p)] = {c->input.fd >= 0, c->output.fd >= 0};
      if (p == 0) rank0_offer_ = c->offer;
      if (load_acquire(c->arrived) != arrival_) return false;
      check_same_call(p, theirs);
    }
    shared_[size_t(r_)] = {input != nullptr, output != nullptr};
    return true;
  }
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
  bool probe_far(uint64_t far_ns) {
    const uint64_t base = arrival_ << 32;
    if (r_ == 0) {
      uint64_t slowest = 0;
      for (int p = 1; p < n_; ++p) {
        std::array<uint64_t, kProbeBatches> batch{};
        for (size_t b = 0; b < kProbeBatches; ++b) {
          const uint64_t t0 = now_ns();
          for (uint64_t k = 1; k <= kProbeRounds; ++k) {
            const uint64_t v = base | uint64_t(p) << 16 | (b * kProbeRounds + k);
            store_release(self_->ping, v);
            await(p, control(p)->pong, v);
          }
          batch[b] = (now_ns() - t0) / (2 * kProbeRounds);
        }
        std::sort(batch.begin(), batch.end());
        slowest = std::max(slowest, batch[kProbeBatches / 2]);
      }
      const bool far = slowest >= far_ns;
      store_release(self_->verdict, arrival_ << 1 | uint64_t(far));
      store_relaxed(self_->probed_at_ns, now_ns());
      return far;
    }
    for (uint64_t k = 1; k <= kProbeBatches * kProbeRounds; ++k) {
      const uint64_t v = base | uint64_t(r_) << 16 | k;
      await(0, control(0)->ping, v);
      store_release(self_->pong, v);
    }
    // Rank 0 cannot publish a later verdict before this rank takes part in this call's path.
    await(0, control(0)->verdict, arrival_ << 1);
    return (load_acquire(control(0)->verdict) & 1) != 0;
  }
  // After arrive(): rank p's input (and output) lie in allocate_shared memory;
  // p < 0: every rank's.
  bool registered(int p, bool output_too) const {
    if (p < 0) {
      for (int q = 0; q < n_; ++q) {
        if (!registered(q, output_too)) return false;
      }
      return true;
    }
    return shared_[size_t(p)].input && (!output_too || shared_[size_t(p)].output);
  }
  std::byte* peer_input(int p) { return ch_.map_shared(p, control(p)->input); }
  std::byte* peer_output(int p) { return ch_.map_shared(p, control(p)->output); }
  // The peer's buffers by its own addresses, for Channel::read_peer/write_peer.
  const std::byte* peer_input_address(int p) const { return reinterpret_cast<const std::byte*>(control(p)->input_address); }
  std::byte* peer_output_address(int p) const { return reinterpret_cast<std::byte*>(control(p)->output_address); }
  // Returns once every rank has finished the direct call it arrived for.
  void finish() {
    store_release(self_->finished, arrival_);
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
  static uint64_t now_ns() {
    return uint64_t(std::chrono::duration_cast<std::chrono::nanoseconds>(
                        std::chrono::steady_clock::now().time_since_epoch())
                        .count());
  }

  template <class Stage>
  void stage_chunk(uint64_t g, size_t i, Stage& stage) {
    if (g >= kSlots) wait_for_free_slot(g - kSlots + 1);
    SlotHeader* h = header(r_, g);
    h->call = call_;
    stage(i, data(h));
    store_release(h->stamp, g + 1);
  }

  // Every peer has consumed at least `needed` chunks.
  void wait_for_free_slot(uint64_t needed) {
    if (self_->peers_consumed >= needed) return;
    uint64_t least = UINT64_MAX;
    for (int p = 0; p < n_; ++p) {
      if (p == r_) continue;
      await(p, control(p)->consumed, needed, [] { return static_cast<const Call*>(nullptr); });
      least = std::min(least, load_acquire(control(p)->consumed));
    }
    self_->peers_consumed = least;
  }

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

  void check_same_call(int peer, const Call& theirs) const {
    if (theirs == call_) return;
    const char* field = theirs.kind != call_.kind     ? "kind"
                        : theirs.op != call_.op       ? "op"
                        : theirs.dtype != call_.dtype ? "dtype"
                        : theirs.count != call_.count ? "count"
                                                      : "root";
    throw CollectiveMismatch("mismatched collectives (the " + std::string(field) + " differs): rank " +
                             std::to_string(peer) + " called " + theirs.str() + " while rank " + std::to_string(r_) +
                             " called " + call_.str() +
                             "; every rank must issue the same collectives with the same arguments in the same order");
  }

  Channel& ch_;
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

Call call_of(Kind kind, size_t count, DataType dtype, ReduceOp op = ReduceOp::sum, int root = -1) {
  return Call{count, kind, uint8_t(dtype), uint8_t(op), root};
}

ReduceOp combining(ReduceOp op) { return op == ReduceOp::avg ? ReduceOp::sum : op; }

// dst = slot_of(0) op slot_of(1) op ... in rank order, each at `offset` bytes; avg divides once.
template <class SlotOf>
void fold(const Segments& s, DataType dtype, ReduceOp op, void* dst, SlotOf& slot_of, size_t offset, size_t count) {
  reduce(dtype, combining(op), dst, slot_of(0) + offset, slot_of(1) + offset, count);
  for (int p = 2; p < s.size(); ++p) reduce(dtype, combining(op), dst, dst, slot_of(p) + offset, count);
  count_traffic(size_t(s.size() + 1) * count * dtype_size(dtype));  // every source read once, dst written
  if (op == ReduceOp::avg) scale_avg(dtype, dst, count, s.size());
}

size_t chunks_for(size_t count, size_t per_chunk) { return (count + per_chunk - 1) / per_chunk; }

// How a direct call reaches the peers' buffers.
enum class Reach { staged, mapped, cross_memory };

// Arrives when `bytes` make a direct call worth it and says how it can run:
// mapped when `registrant`'s buffers (every rank's if < 0; outputs too if
// asked) lie in allocate_shared memory, else as rank 0 offers: by
// cross-memory attach (the caller's `offer` where the kernel allows it), or
// staged. `far_ns`: rank 0's threshold for a probe.
Reach arrive_direct(Segments& s, Channel& ch, Offer offer, size_t bytes, const void* in, size_t in_bytes, void* out,
                    size_t out_bytes, int registrant, bool outputs_too, uint64_t far_ns = 0) {
  if (bytes < kDirectMinBytes) return Reach::staged;
  SharedRef input, output;
  const bool in_ok = in && ch.find_shared(in, in_bytes, input);
  const bool out_ok = outputs_too && ch.find_shared(out, out_bytes, output);
  if (!ch.can_copy_peer()) offer = Offer::staged;
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

// The cross-memory window of the reduce-scatter and the allgather.
Offer window_offer(const RingOptions& o, size_t bytes) {
  return bytes >= kCmaMinBytes && bytes <= o.shm_cma_max_bytes ? Offer::cross_memory : Offer::staged;
}

// The all-reduce of buffers the others cannot map, by cross-memory attach:
// always, or at 2 ranks while rank 0's last probe read the hand-off as far,
// probing again once the last probe is shm_probe_period old. Every rank
// offers by rank 0's published probe, so that while near none arrives (the
// arrival would cost a round trip and the staging's overlap); one that read
// it stale only makes this call stage.
Offer allreduce_offer(const Segments& s, const RingOptions& o, size_t bytes) {
  if (bytes < o.shm_allreduce_cma_min_bytes || bytes > o.shm_allreduce_cma_max_bytes || o.shm_cma_max_bytes == 0) {
    return Offer::staged;
  }
  switch (o.shm_allreduce_cma) {
    case ShmAllreduceCma::always: return Offer::cross_memory;
    case ShmAllreduceCma::far:
      if (s.size() != 2) return Offer::staged;
      if (s.probe_due(o.shm_probe_period)) return Offer::probe;
      return s.far() ? Offer::cross_memory : Offer::staged;
    case ShmAllreduceCma::never: break;
  }
  return Offer::staged;
}

// Copies from a peer's input, `offset` bytes in: through the mapping or by cross-memory attach.
void read_input(Segments& s, Channel& ch, Reach reach, int p, size_t offset, void* dst, size_t bytes) {
  if (reach == Reach::mapped) {
    counted_copy(dst, s.peer_input(p) + offset, bytes);
  } else {
    ch.read_peer(p, s.peer_input_address(p) + offset, dst, bytes);
    count_traffic(2 * bytes);
  }
}

// Where piece `offset` of rank p's input can be read: rank p's input itself
// (through the mapping, or this rank's own), or `local` after a cross-memory
// copy. `copy_own`: this rank's own piece goes to `local` too, since the fold
// writes its input in place before reaching it.
const std::byte* piece_source(Segments& s, Channel& ch, Reach reach, int p, const void* own_input, size_t offset,
                              size_t bytes, bool copy_own, std::byte* local) {
  if (p == s.rank()) {
    if (!copy_own) return bytes_of(own_input) + offset;
    counted_copy(local, bytes_of(own_input) + offset, bytes);
  } else if (reach == Reach::mapped) {
    return s.peer_input(p) + offset;
  } else {
    ch.read_peer(p, s.peer_input_address(p) + offset, local, bytes);
    count_traffic(2 * bytes);
  }
  return local;
}

// Rank r reduces its slice of every rank's input, piece by piece, into its own
// output, and delivers each piece to the others' outputs: through the
// mappings, or by cross-memory attach.
void direct_allreduce(Segments& s, Channel& ch, const AllreduceArgs& a, Reach reach) {
  const int n = s.size(), r = s.rank();
  const size_t esize = dtype_size(a.dtype), piece = s.chunk_bytes() / esize;
  // Rank r >= 2 folding in place would overwrite its input before step r reads it.
  const bool copy_own = a.input == a.output && r >= 2;
  auto* scratch = static_cast<std::byte*>(ch.scratch(s.chunk_bytes() * size_t(n), 0));
  std::vector<std::byte*> outs(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p != r) outs[p] = reach == Reach::mapped ? s.peer_output(p) : s.peer_output_address(p);
  }
  std::vector<const std::byte*> src(static_cast<size_t>(n));
  auto source_of = [&](int p) { return src[p]; };
  const Range slice = balanced(a.count, size_t(n), size_t(r));
  for (size_t begin = slice.begin; begin < slice.begin + slice.size; begin += piece) {
    const size_t count = std::min(piece, slice.begin + slice.size - begin);
    const size_t offset = begin * esize, bytes = count * esize;
    for (int p = 0; p < n; ++p) {
      src[p] = piece_source(s, ch, reach, p, a.input, offset, bytes, copy_own, scratch + size_t(p) * s.chunk_bytes());
    }
    std::byte* result = bytes_of(a.output) + offset;
    fold(s, a.dtype, a.op, result, source_of, 0, count);
    for (int p = 0; p < n; ++p) {
      if (p == r) continue;
      if (reach == Reach::mapped) {
        counted_copy(outs[p] + offset, result, bytes);
      } else {
        ch.write_peer(p, outs[p] + offset, result, bytes);
        count_traffic(2 * bytes);
      }
    }
  }
  s.finish();
}

// Rank r folds its block straight from every rank's input, piece by piece.
void direct_reduce_scatter(Segments& s, Channel& ch, const ReduceScatterArgs& a, Reach reach) {
  const int n = s.size(), r = s.rank();
  const size_t esize = dtype_size(a.dtype), piece = s.chunk_bytes() / esize;
  const size_t block = size_t(r) * a.count * esize;  // where block r starts in every input
  // Rank r >= 2 folding in place would overwrite its input before step r reads it.
  const bool copy_own = bytes_of(a.output) == bytes_of(a.input) + block && r >= 2;
  auto* scratch = static_cast<std::byte*>(ch.scratch(s.chunk_bytes() * size_t(n), 0));
  std::vector<const std::byte*> src(static_cast<size_t>(n));
  auto source_of = [&](int p) { return src[p]; };
  for (size_t begin = 0; begin < a.count; begin += piece) {
    const size_t count = std::min(piece, a.count - begin);
    const size_t offset = block + begin * esize, bytes = count * esize;
    for (int p = 0; p < n; ++p) {
      src[p] = piece_source(s, ch, reach, p, a.input, offset, bytes, copy_own, scratch + size_t(p) * s.chunk_bytes());
    }
    fold(s, a.dtype, a.op, bytes_of(a.output) + begin * esize, source_of, 0, count);
  }
  s.finish();
}

void direct_allgather(Segments& s, Channel& ch, const AllgatherArgs& a, Reach reach) {
  const size_t block = a.count * dtype_size(a.dtype);
  for (int p = 0; p < s.size(); ++p) {
    if (p != s.rank()) read_input(s, ch, reach, p, 0, bytes_of(a.output) + size_t(p) * block, block);
  }
  s.finish();
}

void direct_broadcast(Segments& s, Channel& ch, const BroadcastArgs& a) {
  if (s.rank() != a.root) read_input(s, ch, Reach::mapped, a.root, 0, a.output, a.count * dtype_size(a.dtype));
  s.finish();
}

}  // namespace

std::string shared_memory_plan(const RingOptions& o, int local_ranks, bool oversubscribed) {
  auto kib = [](size_t b) { return b >= (1 << 20) ? std::to_string(b >> 20) + " MiB" : std::to_string(b >> 10) + " KiB"; };
  std::string s = "shared memory for " + std::to_string(local_ranks) + " ranks on this host:\n";
  s += "  below " + kib(kDirectMinBytes) + " and for buffers the others cannot read: staged through " +
       std::to_string(kSlots) + " slots of " + kib(o.shm_chunk_bytes) + " per rank (TANDEM_SHM_CHUNK_BYTES" +
       (oversubscribed ? "; 1 MiB when ranks outnumber cores: fewer hand-offs" : "") + ")\n";
  s += "  staged all-reduce: " +
       std::string(local_ranks >= o.shm_split_min_ranks
                       ? "split: each rank reduces its slice of every chunk once ((5 - 1/N) S moved per rank)"
                       : "every rank folds every slot ((N + 3) S moved per rank)") +
       "; split from " + std::to_string(o.shm_split_min_ranks) + " ranks (TANDEM_SHM_SPLIT_MIN_RANKS) and from " +
       kib(o.shm_split_min_bytes) + " (TANDEM_SHM_SPLIT_MIN_BYTES; below, the split's second hand-off costs more than "
       "the redundant fold saves)\n";
  s += "  from " + kib(kDirectMinBytes) + " (below, the arrival round trip costs more than staging saves): "
       "allocate_shared buffers are read and written in place\n";
  s += "  reduce-scatter and allgather of other buffers: cross-memory attach from " + kib(kCmaMinBytes) + " to " +
       (o.shm_cma_max_bytes >= kCmaMinBytes ? kib(o.shm_cma_max_bytes) : std::string("(off)")) +
       " where the kernel allows it (TANDEM_SHM_CMA_MAX_BYTES; outside, its system calls or page pinning cost more "
       "than staging; the broadcast of such buffers always stages, measured faster)\n";
  const size_t cma_from = std::max(o.shm_allreduce_cma_min_bytes, kDirectMinBytes);
  const std::string window = o.shm_cma_max_bytes > 0 && o.shm_allreduce_cma_max_bytes >= cma_from
                                 ? "from " + kib(cma_from) + " to " + kib(o.shm_allreduce_cma_max_bytes)
                                 : std::string();
  s += "  all-reduce of other buffers: ";
  if (window.empty() || o.shm_allreduce_cma == ShmAllreduceCma::never) {
    s += std::string("staged") +
         (oversubscribed && o.shm_allreduce_cma == ShmAllreduceCma::never
              ? " (ranks outnumber cores: a hand-off probe would time the scheduler, not the cores)"
              : " (TANDEM_SHM_ALLREDUCE_CMA=never or TANDEM_SHM_CMA_MAX_BYTES=0)") +
         "\n";
  } else if (o.shm_allreduce_cma == ShmAllreduceCma::always) {
    s += "cross-memory attach " + window + " (TANDEM_SHM_ALLREDUCE_CMA=always), staged outside\n";
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

void shm_allreduce(Channel& ch, const AllreduceArgs& a, const RingOptions& o, size_t chunk_bytes) {
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::allreduce, a.count, a.dtype, a.op));
  const size_t esize = dtype_size(a.dtype), bytes = a.count * esize;
  const Reach reach = arrive_direct(s, ch, allreduce_offer(s, o, bytes), bytes, a.input, bytes, a.output, bytes, -1,
                                    true, o.shm_far_handoff_ns);
  if (reach != Reach::staged) return direct_allreduce(s, ch, a, reach);
  const size_t per_chunk = chunk_bytes / esize;
  auto stage = [&](size_t i, std::byte* slot) {
    const size_t begin = i * per_chunk;
    counted_copy(slot, bytes_of(a.input) + begin * esize, std::min(per_chunk, a.count - begin) * esize);
  };
  if (s.size() < o.shm_split_min_ranks || s.size() < 2 || bytes < o.shm_split_min_bytes) {
    s.staged(chunks_for(a.count, per_chunk), -1, stage, [&](size_t i, auto slot_of) {
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
        counted_copy(slot, in, lo * esize);
        counted_copy(slot + (lo + n) * esize, in + (lo + n) * esize, (count - lo - n) * esize);
      },
      [&](size_t i, auto slot_of, std::byte* own_slot) {
        const size_t begin = i * per_chunk;
        const auto [lo, n] = slice(std::min(per_chunk, a.count - begin), s.rank());
        if (n == 0) return;
        auto source_of = [&](int p) { return p == s.rank() ? bytes_of(a.input) + begin * esize : slot_of(p); };
        fold(s, a.dtype, a.op, own_slot + lo * esize, source_of, lo * esize, n);
        counted_copy(bytes_of(a.output) + (begin + lo) * esize, own_slot + lo * esize, n * esize);
      },
      [&](size_t i, int p, const std::byte* slot) {
        const size_t begin = i * per_chunk;
        const auto [lo, n] = slice(std::min(per_chunk, a.count - begin), p);
        counted_copy(bytes_of(a.output) + (begin + lo) * esize, slot + lo * esize, n * esize);
      });
}

// Each chunk carries the same run of every block: piece p of the slot holds block p's part.
void shm_reduce_scatter(Channel& ch, const ReduceScatterArgs& a, const RingOptions& o) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::reduce_scatter, a.count, a.dtype, a.op));
  const size_t n = size_t(s.size()), esize = dtype_size(a.dtype), bytes = n * a.count * esize;
  const Reach reach = arrive_direct(s, ch, window_offer(o, bytes), bytes, a.input, bytes, a.output, 0, -1, false);
  if (reach != Reach::staged) return direct_reduce_scatter(s, ch, a, reach);
  const size_t per_block = std::max<size_t>(1, chunk_bytes / esize / n);
  s.staged(
      chunks_for(a.count, per_block), -1,
      [&](size_t i, std::byte* slot) {
        const size_t begin = i * per_block, count = std::min(per_block, a.count - begin);
        for (size_t b = 0; b < n; ++b) {
          counted_copy(slot + b * per_block * esize, bytes_of(a.input) + (b * a.count + begin) * esize, count * esize);
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
  std::byte* own_block = bytes_of(a.output) + size_t(s.rank()) * block;
  if (bytes_of(a.input) != own_block) counted_copy(own_block, a.input, block);
  const size_t bytes = block * size_t(s.size());
  const Reach reach = arrive_direct(s, ch, window_offer(o, bytes), bytes, a.input, block, a.output, 0, -1, false);
  if (reach != Reach::staged) return direct_allgather(s, ch, a, reach);
  s.staged(
      chunks_for(a.count, per_chunk), -1,
      [&](size_t i, std::byte* slot) {
        const size_t begin = i * per_chunk;
        counted_copy(slot, own_block + begin * esize, std::min(per_chunk, a.count - begin) * esize);
      },
      [&](size_t i, auto slot_of) {
        const size_t begin = i * per_chunk, bytes = std::min(per_chunk, a.count - begin) * esize;
        for (int p = 0; p < s.size(); ++p) {
          if (p != s.rank()) counted_copy(bytes_of(a.output) + (size_t(p) * a.count + begin) * esize, slot_of(p), bytes);
        }
      });
}

void shm_broadcast(Channel& ch, const BroadcastArgs& a, const RingOptions& o) {
  const size_t chunk_bytes = o.shm_chunk_bytes;
  if (a.count == 0) return;
  Segments s(ch, chunk_bytes, call_of(Kind::broadcast, a.count, a.dtype, ReduceOp::sum, a.root));
  const size_t esize = dtype_size(a.dtype), per_chunk = chunk_bytes / esize;
  const bool root = s.rank() == a.root;
  if (root && a.input != a.output) counted_copy(a.output, a.input, a.count * esize);
  const size_t bytes = a.count * esize;
  if (arrive_direct(s, ch, Offer::staged, bytes, root ? a.input : nullptr, bytes, a.output, 0, a.root, false) ==
      Reach::mapped) {
    return direct_broadcast(s, ch, a);
  }
  s.staged(
      chunks_for(a.count, per_chunk), a.root,
      [&](size_t i, std::byte* slot) {
        const size_t begin = i * per_chunk;
        counted_copy(slot, bytes_of(a.input) + begin * esize, std::min(per_chunk, a.count - begin) * esize);
      },
      [&](size_t i, auto slot_of) {
        if (root) return;
        const size_t begin = i * per_chunk;
        counted_copy(bytes_of(a.output) + begin * esize, slot_of(a.root), std::min(per_chunk, a.count - begin) * esize);
      });
}

}  // namespace tandem::ring
