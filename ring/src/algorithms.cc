// ring::algorithms(): picks an algorithm per call. Every collective goes
// through shared memory when every rank is on this host (and the buffers are
// host memory). Otherwise all-reduce takes recursive doubling up to
// small_message_bytes (latency-bound) and above it (bandwidth-bound) the
// hierarchical all-reduce when several hosts run several ranks each (the same
// number on every host), else the pipelined ring, unless one is forced; the
// others take their ring or chain.
#include <algorithm>
#include <cstring>
#include <string>

#include "collectives.h"
#include "shm_segments.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

constexpr size_t kDefaultShmChunkBytes = 256 << 10;

class RingAlgorithms final : public Algorithms {
 public:
  explicit RingAlgorithms(const RingOptions& o) : options_(o) {
    if (options_.shm_chunk_bytes == 0) options_.shm_chunk_bytes = kDefaultShmChunkBytes;
  }

  // An output that overlaps the input without being it would be written
  // before all of the input is read: the input moves there, and the call runs in place.
  void allreduce(Channel& ch, const AllreduceArgs& call) override {
    AllreduceArgs args = call;
    const size_t bytes = args.count * dtype_size(args.dtype);
    move_into_place(ch, args.memory, args.input, bytes, args.output, args.output, bytes);
    const auto forced = options_.allreduce;
    if (forced == AllreduceAlgorithm::automatic || forced == AllreduceAlgorithm::shared_memory) {
      if (shared(ch, args.memory)) {
        shm_allreduce(ch, args, options_, shm_chunk(ch, args.chunk_bytes));
        return;
      }
      if (forced == AllreduceAlgorithm::shared_memory && ch.size() > 1) {
        throw InvalidArgument(
            "TANDEM_ALGO=shared_memory needs host buffers and every rank on this host with shared memory on "
            "(TANDEM_SHM=1); use auto to fall back to UCX");
      }
    }
    if (forced == AllreduceAlgorithm::hierarchical ||
        (forced == AllreduceAlgorithm::automatic && bytes > options_.small_message_bytes && spans_hosts(ch))) {
      hierarchical_allreduce(ch, args, options_);
      return;
    }
    const bool small = options_.allreduce == AllreduceAlgorithm::recursive_doubling ||
                       (options_.allreduce == AllreduceAlgorithm::automatic && bytes <= options_.small_message_bytes);
    if (small) {
      recursive_doubling_allreduce(ch, args);
    } else if (args.chunk_bytes != 0) {
      RingOptions per_call = options_;
      per_call.segment_bytes = args.chunk_bytes;
      ring_allreduce(ch, args, per_call);
    } else {
      ring_allreduce(ch, args, options_);
    }
  }
  void reduce_scatter(Channel& ch, const ReduceScatterArgs& args) override { reduce_scatter(ch, args, nullptr); }
  void allgather(Channel& ch, const AllgatherArgs& args) override { allgather(ch, args, nullptr); }
  // The root's output overlapping its input without being it: as the all-reduce.
  void broadcast(Channel& ch, const BroadcastArgs& args) override {
    BroadcastArgs a = args;
    const size_t bytes = a.count * dtype_size(a.dtype);
    if (ch.rank() == a.root) move_into_place(ch, a.memory, a.input, bytes, a.output, a.output, bytes);
    if (shared(ch, a.memory)) return shm_broadcast(ch, a, options_);
    pipelined_broadcast(ch, a, options_);
  }
  void barrier(Channel& ch) override { ring::barrier(ch); }
  void alltoallv(Channel& ch, const AlltoallvArgs& args) override {
    if (shared(ch, args.memory) && shm_alltoall_fits(ch, options_)) {
      const Call called = args.equal ? call_of(Kind::alltoall, args.send.counts[0], args.dtype)
                                     : call_of(Kind::alltoallv, 0, args.dtype);
      return shm_alltoallv(ch, args, options_, called);
    }
    pairwise_alltoallv(ch, args);
  }
  // The rooted and variable collectives: overlaps as their equal-block counterparts'.
  void reduce(Channel& ch, const ReduceArgs& args) override {
    ReduceArgs a = args;
    const size_t bytes = a.count * dtype_size(a.dtype);
    if (ch.rank() == a.root) move_into_place(ch, a.memory, a.input, bytes, a.output, a.output, bytes);
    if (shared(ch, a.memory)) return shm_reduce(ch, a, options_);
    reduce_to_root(ch, a);
  }
  // On one host, a gather (scatter) is an all-to-all in which only the root
  // receives (sends): one arrival, then the root reads every block (each rank
  // reads its own), staged or straight from the inputs as the path table says.
  void gatherv(Channel& ch, const VariableArgs& args) override {
    if (shared(ch, args.memory) && shm_alltoall_fits(ch, options_)) {
      const Call called = rooted_call(args, true);
      if (shm_rooted_one_cell(ch, args, options_, called, true)) return;
      return shm_alltoallv(ch, rooted_as_alltoallv(ch, args, true), options_, called);
    }
    VariableArgs& a = adjustable(args);
    if (ch.rank() == a.root) input_into_own_block(ch, a);
    ring::gatherv(ch, a);
  }
  void scatterv(Channel& ch, const VariableArgs& args) override {
    if (shared(ch, args.memory) && shm_alltoall_fits(ch, options_)) {
      const Call called = rooted_call(args, false);
      if (shm_rooted_one_cell(ch, args, options_, called, false)) return;
      return shm_alltoallv(ch, rooted_as_alltoallv(ch, args, false), options_, called);
    }
    if (ch.rank() != args.root) return ring::scatterv(ch, args);
    const size_t es = dtype_size(args.dtype);
    const auto* own = static_cast<const std::byte*>(args.input) + args.blocks.displs[size_t(ch.rank())] * es;
    output_apart(ch, args.memory, args.output, args.count * es, own, args.input, extent(args.blocks, es),
                 [&](void* out) {
                   VariableArgs& a = adjustable(args);
                   a.output = out;
                   ring::scatterv(ch, a);
                 });
  }
  // Equal blocks packed in rank order take the fixed-size call's paths (on
  // one host the segments, not a ring of messages): the same bytes land in
  // the same places.
  // Other blocks go through the segments on one host too, staged.
  void allgatherv(Channel& ch, const VariableArgs& args) override {
    if (packed_equal(args.blocks)) {
      return allgather(ch, {args.input, args.output, args.count, args.dtype, args.memory}, &args.blocks);
    }
    VariableArgs& a = adjustable(args);
    input_into_own_block(ch, a);
    if (shared(ch, a.memory)) return shm_allgatherv(ch, a, options_);
    ring_allgatherv(ch, a);
  }
  void reduce_scatterv(Channel& ch, const ReduceScattervArgs& args) override {
    if (packed_equal(args.blocks)) {
      return reduce_scatter(ch, {args.input, args.output, args.blocks.counts[0], args.dtype, args.op, args.memory},
                            &args.blocks);
    }
    const size_t es = dtype_size(args.dtype), r = size_t(ch.rank());
    const auto* own = static_cast<const std::byte*>(args.input) + args.blocks.displs[r] * es;
    output_apart(ch, args.memory, args.output, args.blocks.counts[r] * es, own, args.input, extent(args.blocks, es),
                 [&](void* out) {
                   ReduceScattervArgs& a = adjustable(args);
                   a.output = out;
                   if (shared(ch, a.memory)) return shm_reduce_scatterv(ch, a, options_);
                   ring_reduce_scatterv(ch, a);
                 });
  }
  size_t shared_bytes() const override {
    return options_.shared_memory ? shm_segment_bytes(options_.shm_chunk_bytes) : 0;
  }
  std::shared_ptr<Algorithms> with_shared_bytes(size_t bytes) const override {
    const size_t chunk = shm_chunk_for_segment(bytes);
    if (!options_.shared_memory || chunk == 0) return nullptr;
    RingOptions o = options_;
    o.shm_chunk_bytes = chunk;
    return std::make_shared<RingAlgorithms>(o);
  }

 private:
  // `variable`: the blocks of the reduce_scatterv or allgatherv of equal
  // packed blocks this call carries out (shm_reduce_scatter, shm_allgather).
  // An output inside the input other than at this rank's block (in place,
  // as NCCL's) would be written while the peers still read that part of the
  // input: the result goes to scratch and is copied there afterwards.
  void reduce_scatter(Channel& ch, const ReduceScatterArgs& args, const Blocks* variable) {
    const size_t block = args.count * dtype_size(args.dtype);
    const auto* own = static_cast<const std::byte*>(args.input) + size_t(ch.rank()) * block;
    output_apart(ch, args.memory, args.output, block, own, args.input, block * size_t(ch.size()), [&](void* out) {
      ReduceScatterArgs a = args;
      a.output = out;
      if (shared(ch, a.memory)) return shm_reduce_scatter(ch, a, options_, variable);
      ring_reduce_scatter(ch, a, options_);
    });
  }
  // An input inside the output other than at this rank's block would be
  // overwritten by a peer's block while it is still being sent: it moves to
  // this rank's block, and the call runs in place.
  void allgather(Channel& ch, const AllgatherArgs& args, const Blocks* variable) {
    const size_t block = args.count * dtype_size(args.dtype);
    AllgatherArgs a = args;
    void* own = static_cast<std::byte*>(args.output) + size_t(ch.rank()) * block;
    move_into_place(ch, a.memory, a.input, block, own, a.output, block * size_t(ch.size()));
    if (shared(ch, a.memory)) return shm_allgather(ch, a, options_, variable);
    ring_allgather(ch, a, options_);
  }
  // Scratch for a buffer that aliases the call's other one. Held while the
  // reduce-scatters and scatterv run, which take slots 0, 2, 3 and 4.
  static constexpr int kAliasedSlot = 5;

  // The all-to-all that moves a gatherv's blocks to the root (gather) or a
  // scatterv's from it; the thread's own, refilled by each call (its blocks
  // keep their capacity: a small rooted call allocates nothing).
  static const AlltoallvArgs& rooted_as_alltoallv(const Channel& ch, const VariableArgs& a, bool gather) {
    const size_t n = size_t(ch.size()), root = size_t(a.root);
    thread_local AlltoallvArgs x;
    x.input = a.input;
    x.output = a.output;
    x.dtype = a.dtype;
    x.memory = a.memory;
    for (Blocks* b : {&x.send, &x.recv}) b->counts.assign(n, 0), b->displs.assign(n, 0);
    Blocks& one = gather ? x.send : x.recv;  // this rank's block, to or from the root
    Blocks& all = gather ? x.recv : x.send;  // the root's blocks, from or to every rank
    one.counts[root] = a.count;
    if (ch.rank() == a.root) all = a.blocks;
    return x;
  }

  // A copy of a variable call's arguments to adjust: the thread's own, so
  // its blocks keep their capacity and a call allocates nothing after its
  // first. No call through it runs another of these on the same thread.
  template <class Args>
  static Args& adjustable(const Args& args) {
    thread_local Args copy;
    copy = args;
    return copy;
  }

  static Call rooted_call(const VariableArgs& a, bool gather) {
    const Kind kind = gather ? (a.equal ? Kind::gather : Kind::gatherv) : (a.equal ? Kind::scatter : Kind::scatterv);
    return call_of(kind, a.equal ? a.count : 0, a.dtype, ReduceOp::sum, a.root);
  }

  // Every block of `b` the same size, packed in rank order (and at least one).
  static bool packed_equal(const Blocks& b) {
    for (size_t p = 0; p < b.counts.size(); ++p) {
      if (b.counts[p] != b.counts[0] || b.displs[p] != p * b.counts[0]) return false;
    }
    return !b.counts.empty();
  }

  // Moves `input` to `place` when it overlaps `region` elsewhere: the call then runs in place there.
  static void move_into_place(Channel& ch, MemoryType memory, const void*& input, size_t bytes, void* place,
                              const void* region, size_t region_bytes) {
    if (input == place || !overlap(input, bytes, region, region_bytes)) return;
    move_block(ch, memory, place, input, bytes);
    input = place;
  }
  // A gatherv's or allgatherv's input, into this rank's block of the output.
  static void input_into_own_block(Channel& ch, VariableArgs& a) {
    const size_t es = dtype_size(a.dtype);
    void* own = static_cast<std::byte*>(a.output) + a.blocks.displs[size_t(ch.rank())] * es;
    move_into_place(ch, a.memory, a.input, a.count * es, own, a.output, extent(a.blocks, es));
  }
  // Runs `run(output)`, into scratch when `output` overlaps `region` other than at `place`, copied out after.
  template <class Run>
  static void output_apart(Channel& ch, MemoryType memory, void* output, size_t bytes, const void* place,
                           const void* region, size_t region_bytes, Run run) {
    if (output == place || !overlap(output, bytes, region, region_bytes)) return run(output);
    void* aside = ch.scratch_in(memory, bytes, kAliasedSlot);
    run(aside);
    copy(memory, output, aside, bytes);
  }
  // dst and src may overlap.
  static void move_block(Channel& ch, MemoryType memory, void* dst, const void* src, size_t bytes) {
    if (memory == MemoryType::host) {
      std::memmove(dst, src, bytes);
      return;
    }
    void* aside = ch.scratch_in(memory, bytes, kAliasedSlot);
    copy(memory, aside, src, bytes);
    copy(memory, dst, aside, bytes);
  }

  // Shared segments carry host memory; reduce-scatter's chunk holds a piece of every rank's block.
  bool shared(Channel& ch, MemoryType memory) const {
    const SharedMemory* m = ch.shared_memory();
    return m && m->segments() && ch.size() > 1 && memory == MemoryType::host &&
           size_t(ch.size()) * 8 <= options_.shm_chunk_bytes;
  }

  // Several hosts, each with the same number (>= 2) of ranks.
  static bool spans_hosts(const Channel& ch) {
    const Topology* t = ch.topology();
    return hierarchical_fits(t) && t->hosts() > 1 && t->local_size() > 1;
  }

  // A per-call chunk fits the slots sized for the configured one, whole cache
  // lines, and holds a piece of every rank.
  size_t shm_chunk(const Channel& ch, size_t requested) const {
    if (requested == 0) return options_.shm_chunk_bytes;
    const size_t floor = std::max<size_t>(4096, size_t(ch.size()) * 64);
    return std::clamp(requested / 64 * 64, floor, options_.shm_chunk_bytes);
  }

  RingOptions options_;
};

}  // namespace

AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name) {
  if (name == "auto") return AllreduceAlgorithm::automatic;
  if (name == "ring") return AllreduceAlgorithm::ring;
  if (name == "recursive_doubling" || name == "rd") return AllreduceAlgorithm::recursive_doubling;
  if (name == "shared_memory" || name == "shm") return AllreduceAlgorithm::shared_memory;
  if (name == "hierarchical" || name == "hier") return AllreduceAlgorithm::hierarchical;
  throw InvalidArgument(
      "unknown all-reduce algorithm '" + name +
      "' (TANDEM_ALGO or --algorithm); use auto, ring, recursive_doubling, shared_memory or hierarchical");
}

std::shared_ptr<Algorithms> algorithms(const RingOptions& options) {
  if (options.segment_bytes < 4096 || options.segments_in_flight < 1 || options.segments_in_flight > 64) {
    throw InvalidArgument("RingOptions: segment_bytes must be >= 4096 and segments_in_flight in 1..64 (got " +
                          std::to_string(options.segment_bytes) + ", " + std::to_string(options.segments_in_flight) +
                          ")");
  }
  // A multiple of 4096: 64 cells of whole cache lines, so that a joiner
  // reads the chunk back from the segment's size (shm_chunk_for_segment).
  const size_t chunk = options.shm_chunk_bytes;  // 0: the default
  if (chunk != 0 && (chunk < 4096 || chunk % 4096 != 0 || chunk > (64 << 20))) {
    throw InvalidArgument("RingOptions: shm_chunk_bytes must be a multiple of 4096 from 4096 to 64 MiB (got " +
                          std::to_string(options.shm_chunk_bytes) + "; TANDEM_SHM_CHUNK_BYTES)");
  }
  return std::make_shared<RingAlgorithms>(options);
}

RingOptions fit_to_host(RingOptions r, const CommOptions& options) {
  r.ranks_outnumber_cores = ranks_outnumber_cores(options);
  r.alltoall_stream_min_bytes = alltoall_stream_min_bytes(last_level_cache_bytes(), options.local_size, cpu_is_amd());
  if (r.shm_chunk_bytes == 0) r.shm_chunk_bytes = r.ranks_outnumber_cores ? 1 << 20 : kDefaultShmChunkBytes;
  return r;
}

std::unique_ptr<Communicator> connect(const CommOptions& options, const RingOptions& ring) {
  return Communicator::create(options, algorithms(fit_to_host(ring, options)));
}

std::unique_ptr<Communicator> connect_from_env(const EnvLookup& env) {
  const CommOptions comm = tandem::comm_options_from_env(env);
  return connect(comm, ring_options_from_env(env));
}

}  // namespace tandem::ring
