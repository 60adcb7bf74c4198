// Hierarchical all-reduce, for ranks spread over several hosts with several
// ranks on each (as NCCL's and Horovod's hierarchical all-reduce).
//
// Terms:
//   host      - ranks that share memory (Channel::topology()); every host
//               runs the same number L of ranks, its *local ranks* 0 .. L-1.
//   slice     - the buffer is cut into L slices of c = ceil(count / L)
//               elements; local rank l owns slice l. When L does not divide
//               count, the work runs in a scratch buffer of L * c elements
//               (the padding is reduced too, and dropped).
//   group     - a sub-channel over some ranks: the *host group* (the ranks of
//               this host, by local rank) or the *slice group* (the ranks of
//               every host holding the same local rank, by host number).
//
// Three phases, each an existing collective on a group:
//   1. reduce-scatter in the host group: local rank l ends with its host's
//      sum of slice l (through the host's shared segments when they are
//      mapped, else the UCX ring);
//   2. all-reduce of slice l in its slice group (the ring, or recursive
//      doubling when the slice is small): one ring per local rank, each over
//      1/L of the data, so every rank's link carries traffic at once;
//   3. allgather in the host group: every rank gets every slice.
// Each slice's final value is computed by the slice group's all-reduce, which
// ends bitwise identical on its ranks; phase 3 only copies. So every rank ends
// with the same bits. avg sums throughout and divides once, before phase 3.
#include <cstring>
#include <vector>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

// Group tags: the algorithm's tag with bit 31 set in phase 3, so phases 1 and
// 3 (the same pairs of ranks) never match each other's messages; phase 2
// talks to other pairs. The algorithms use bits 0 .. 30.
constexpr int kPhaseShift = 31;

// The host group's shared memory: the host's segments, which all of the
// group's ranks map; its traffic counts into the parent's.
class GroupSharedMemory final : public SharedMemory {
 public:
  GroupSharedMemory(SharedMemory* parent, const SharedSegments* segments) : parent_(parent), segments_(segments) {}
  const SharedSegments* segments() const override { return segments_; }
  void count_traffic(uint64_t bytes) override { parent_->count_traffic(bytes); }

 private:
  SharedMemory* parent_;
  const SharedSegments* segments_;
};

// A Channel over a subset of the communicator's ranks: rank i of the group is
// members[i] of the parent. Scratch and waits go to the parent.
class GroupChannel final : public Channel {
 public:
  GroupChannel(Channel& parent, std::vector<int> members, int phase, const SharedSegments* segments)
      : parent_(parent),
        members_(std::move(members)),
        phase_(Tag(phase) << kPhaseShift),
        memory_(parent.shared_memory(), segments) {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (members_[i] == parent.rank()) rank_ = int(i);
    }
    if (rank_ < 0) throw InvalidArgument("hierarchical all-reduce: this rank is not in its own group");
  }
  int rank() const override { return rank_; }
  int size() const override { return int(members_.size()); }
  Pending send(int peer, Tag tag, const void* data, size_t bytes) override {
    return parent_.send(members_[size_t(peer)], scoped(tag), data, bytes);
  }
  Pending recv(int peer, Tag tag, void* data, size_t bytes) override {
    return parent_.recv(members_[size_t(peer)], scoped(tag), data, bytes);
  }
  bool test(Pending& p) override { return parent_.test(p); }
  void wait(Pending& p) override { parent_.wait(p); }
  SharedMemory* shared_memory() override { return memory_.segments() ? &memory_ : nullptr; }
  void idle(int peer, unsigned spins) override { parent_.idle(members_[size_t(peer)], spins); }
  void* scratch(size_t bytes, int slot) override { return parent_.scratch(bytes, slot); }
  void* device_scratch(size_t bytes, int slot) override { return parent_.device_scratch(bytes, slot); }

 private:
  Tag scoped(Tag tag) const {
    if (tag >> kPhaseShift) throw InvalidArgument("hierarchical all-reduce: algorithm tag exceeds 31 bits");
    return tag | phase_;
  }
  Channel& parent_;
  std::vector<int> members_;
  Tag phase_;
  GroupSharedMemory memory_;
  int rank_ = -1;
};

// The scratch slot of the padded work buffer: above the ring's walk slots (0 .. 63).
constexpr int kWorkSlot = 64;

}  // namespace

bool hierarchical_fits(const Topology* t) { return t && t->uniform(); }

void hierarchical_allreduce(Channel& ch, const AllreduceArgs& a, const RingOptions& o) {
  const Topology* t = ch.topology();
  if (!hierarchical_fits(t)) {
    throw InvalidArgument("TANDEM_ALGO=hierarchical needs the same number of ranks on every host (this job: " +
                          (t ? t->str() : std::string("no topology")) + "); use auto or ring");
  }
  if (a.count == 0) return;
  const size_t local = size_t(t->local_size()), l = size_t(t->local_rank()), esize = dtype_size(a.dtype);
  const size_t c = (a.count + local - 1) / local;  // elements per slice
  const bool padded = c * local != a.count;
  const ReduceOp combine = a.op == ReduceOp::avg ? ReduceOp::sum : a.op;

  // The work buffer: the output itself, or scratch when the slices need padding.
  std::byte* work = static_cast<std::byte*>(a.output);
  const void* input = a.input;
  if (padded) {
    work = static_cast<std::byte*>(ch.scratch_in(a.memory, c * local * esize, kWorkSlot));
    copy(a.memory, work, a.input, a.count * esize);
    input = work;  // reduce-scatter in place
  }
  std::byte* slice = work + l * c * esize;

  // The host's shared segments run phases 1 and 3 when mapped and the buffers are host memory.
  SharedMemory* memory = ch.shared_memory();
  const SharedSegments* segments = a.memory == MemoryType::host && memory ? memory->host_segments() : nullptr;
  if (segments && local * 8 > o.shm_chunk_bytes) segments = nullptr;
  GroupChannel host(ch, t->ranks[size_t(t->host())], 0, segments);
  GroupChannel slices(ch, t->peers_with_local_rank(int(l)), 0, nullptr);

  // 1. Reduce-scatter within the host.
  if (local == 1) {
    if (input != slice) copy(a.memory, slice, input, c * esize);
  } else {
    const ReduceScatterArgs rs{input, slice, c, a.dtype, combine, a.memory};
    segments ? shm_reduce_scatter(host, rs, o) : ring_reduce_scatter(host, rs, o);
  }
  // 2. All-reduce of this slice across hosts.
  if (slices.size() > 1) {
    AllreduceArgs ar{slice, slice, c, a.dtype, combine, a.memory, a.chunk_bytes};
    if (c * esize <= o.small_message_bytes) {
      recursive_doubling_allreduce(slices, ar);
    } else {
      RingOptions per_call = o;
      if (a.chunk_bytes != 0) per_call.segment_bytes = a.chunk_bytes;
      ring_allreduce(slices, ar, per_call);
    }
  }
  if (a.op == ReduceOp::avg) scale_avg(a.memory, a.dtype, slice, c, ch.size());
  // 3. Allgather within the host.
  if (local > 1) {
    const AllgatherArgs ag{slice, work, c, a.dtype, a.memory};
    GroupChannel host_again(ch, t->ranks[size_t(t->host())], 1, segments);
    segments ? shm_allgather(host_again, ag, o) : ring_allgather(host_again, ag, o);
  }
  if (padded) copy(a.memory, a.output, work, a.count * esize);
}

}  // namespace tandem::ring
