// The direct shared-memory collectives: which path a call takes (the path
// table, rank 0's offer, the arrival), and every rank reading what it needs
// straight from the others' buffers, mapped or by cross-memory attach, once
// all have arrived (terms: shm_collectives.cc).
#include "shm_direct.h"

#include <optional>
#include <vector>

namespace tandem::ring {

namespace {

// A collective's timed family: every one's but the broadcast's (shm_path_valid).
std::optional<PathFamily> timed_family(ShmCollective c, bool in_place) {
  switch (c) {
    case ShmCollective::allreduce: return in_place ? PathFamily::allreduce_in_place : PathFamily::allreduce;
    case ShmCollective::reduce: return PathFamily::reduce;
    case ShmCollective::reduce_scatter: return PathFamily::reduce_scatter;
    case ShmCollective::allgather: return PathFamily::allgather;
    case ShmCollective::alltoall: return PathFamily::alltoall;
    case ShmCollective::broadcast: break;
  }
  return std::nullopt;
}

}  // namespace

PathChoice choose_path(const Segments& s, const RingOptions& o, ShmCollective c, size_t bytes, bool in_place) {
  const ShmPathTable& table = o.shm_paths;
  PathChoice choice;
  if (bytes < kShmDirectMinBytes) return choice;
  choice.map = table.path(c, ShmBuffers::shared, bytes) == ShmPath::mapped;
  if (!s.memory().can_copy_peer()) return choice;
  switch (table.path(c, ShmBuffers::heap, bytes)) {
    case ShmPath::cma: choice.heap.offer = Offer::cross_memory; break;
    case ShmPath::timed:
      // Timed from the first call, except where ranks outnumber cores: there
      // a reduction's class stages its first round untimed (docs/algorithms.md,
      // 'shm: the first round'), the allgather and reduce-scatter always
      // stage: cross-memory attach lost 3.5x there, and its trials cost 10%
      // ('shm: cross-memory attach for the reduce-scatter and allgather'),
      // and the all-to-all stages under 64 KiB per rank, where its trials
      // misjudge ('shm: the all-to-all timed path').
      if (o.ranks_outnumber_cores && (c == ShmCollective::allgather || c == ShmCollective::reduce_scatter)) break;
      if (o.ranks_outnumber_cores && c == ShmCollective::alltoall && bytes < kAlltoallSharedCoresTimedBytes) break;
      if (const auto family = timed_family(c, in_place))
        choice.heap = timed_path(s, *family, bytes, o.ranks_outnumber_cores && *family != PathFamily::alltoall,
                                 o.ranks_outnumber_cores);
      break;
    case ShmPath::staged:
    case ShmPath::mapped: break;
  }
  if (c == ShmCollective::alltoall && in_place) choice.heap.offer = Offer::staged;
  return choice;
}

Reach arrive_direct(Segments& s, const PathChoice& choice, const DirectCall& call) {
  if (call.bytes < kShmDirectMinBytes) return Reach::staged;
  SharedRef input, output;
  const bool in_ok = call.input && s.memory().find_shared(call.input, call.input_bytes, input);
  const bool out_ok = call.map_output && s.memory().find_shared(call.output, call.input_bytes, output);
  const Offer offer = choice.heap.offer;
  // A rank with nothing to offer rules the direct path out for all: it
  // stages at once, saving everyone the arrival round trip, and the others
  // follow when they see it.
  const bool mapped_here = choice.map && (call.registrant >= 0 || (in_ok && (out_ok || !call.map_output)));
  s.offer(offer, choice.map);
  if (!s.arrive(offer != Offer::staged || mapped_here, call.input, call.output, in_ok ? &input : nullptr,
                out_ok ? &output : nullptr)) {
    return Reach::staged;
  }
  if (s.rank0_maps() && s.registered(call.registrant, call.map_output)) return Reach::mapped;
  return s.rank0_offer() == Offer::cross_memory ? Reach::cross_memory : Reach::staged;
}

void read_input(Segments& s, Reach reach, const PeerRun& from, void* dst) {
  if (reach == Reach::mapped) {
    s.counted_copy(dst, s.peer_input(from.peer) + from.offset, from.bytes);
  } else {
    s.memory().read_peer(from.peer, s.peer_input_address(from.peer) + from.offset, dst, from.bytes);
    s.count_traffic(2 * from.bytes);
  }
}

namespace {

// Where every rank's piece of the inputs can be read: rank p's input itself
// (through the mapping, or this rank's own), or p's chunk of `scratch` after
// a cross-memory copy. `copy_own`: this rank's own piece goes to scratch too,
// since the fold writes its input in place before reaching it.
struct PieceSources {
  Segments& s;
  Reach reach;
  const void* own_input;
  bool copy_own;
  std::byte* scratch;  // a chunk per rank
  std::vector<const std::byte*> source = std::vector<const std::byte*>(size_t(s.size()));

  // Finds every rank's piece [offset, offset + bytes).
  void find(size_t offset, size_t bytes) {
    for (int p = 0; p < s.size(); ++p) source[size_t(p)] = find(p, offset, bytes);
  }
  const std::byte* operator()(int p) const { return source[size_t(p)]; }

 private:
  const std::byte* find(int p, size_t offset, size_t bytes) {
    std::byte* local = scratch + size_t(p) * s.chunk_bytes();
    if (p == s.rank()) {
      if (!copy_own) return bytes_of(own_input) + offset;
      s.counted_copy(local, bytes_of(own_input) + offset, bytes);
    } else if (reach == Reach::mapped) {
      return s.peer_input(p) + offset;
    } else {
      s.memory().read_peer(p, s.peer_input_address(p) + offset, local, bytes);
      s.count_traffic(2 * bytes);
    }
    return local;
  }
};

// Rank r's slice of an all-reduce's or a reduce's buffer, piece by piece:
// every rank's piece folded in rank order into into(offset, spare) (`spare`
// a scratch chunk), then passed on by deliver(offset, folded, bytes).
// `copy_own`: rank r >= 2 folding in place would overwrite its input
// before step r reads it. Returns once every rank has finished.
template <class Into, class Deliver>
void fold_own_slice(Segments& s, Channel& ch, Reach reach, const Reduction& whole, const void* input, bool copy_own,
                    Into into, Deliver deliver) {
  const int n = s.size();
  const size_t esize = dtype_size(whole.dtype), piece = s.chunk_bytes() / esize;
  // A chunk per rank's piece, and the spare.
  auto* scratch = static_cast<std::byte*>(ch.scratch(s.chunk_bytes() * size_t(n + 1), 0));
  std::byte* const spare = scratch + size_t(n) * s.chunk_bytes();
  PieceSources sources{s, reach, input, copy_own, scratch};
  const Range slice = balanced(whole.count, size_t(n), size_t(s.rank()));
  for (size_t begin = slice.begin; begin < slice.begin + slice.size; begin += piece) {
    const size_t count = std::min(piece, slice.begin + slice.size - begin);
    const size_t offset = begin * esize, bytes = count * esize;
    sources.find(offset, bytes);
    std::byte* folded = into(offset, spare);
    fold(s, {whole.dtype, whole.op, count}, folded, sources, 0);
    deliver(offset, folded, bytes);
  }
  s.finish();
}

}  // namespace

void direct_allreduce(Segments& s, Channel& ch, const AllreduceArgs& a, Reach reach) {
  const int n = s.size(), r = s.rank();
  std::vector<std::byte*> outs(static_cast<size_t>(n));
  for (int p = 0; p < n; ++p) {
    if (p != r) outs[p] = reach == Reach::mapped ? s.peer_output(p) : s.peer_output_address(p);
  }
  fold_own_slice(
      s, ch, reach, {a.dtype, a.op, a.count}, a.input, a.input == a.output && r >= 2,
      [&](size_t offset, std::byte*) { return bytes_of(a.output) + offset; },
      [&](size_t offset, const std::byte* folded, size_t bytes) {
        for (int p = 0; p < n; ++p) {
          if (p == r) continue;
          if (reach == Reach::mapped) {
            s.counted_copy(outs[p] + offset, folded, bytes);
          } else {
            s.memory().write_peer(p, outs[p] + offset, folded, bytes);
            s.count_traffic(2 * bytes);
          }
        }
      });
}

void direct_reduce(Segments& s, Channel& ch, const ReduceArgs& a) {
  const bool root = s.rank() == a.root;
  std::byte* const root_output = root ? bytes_of(a.output) : s.peer_output_address(a.root);
  // Only the root folds into its output (in place, as the all-reduce's
  // rank r >= 2); the others into the spare, then to the root's.
  fold_own_slice(
      s, ch, Reach::cross_memory, {a.dtype, a.op, a.count}, a.input, root && a.input == a.output && s.rank() >= 2,
      [&](size_t offset, std::byte* spare) { return root ? root_output + offset : spare; },
      [&](size_t offset, const std::byte* folded, size_t bytes) {
        if (root) return;
        s.memory().write_peer(a.root, root_output + offset, folded, bytes);
        s.count_traffic(2 * bytes);
      });
}

void direct_reduce_scatter(Segments& s, Channel& ch, const ReduceScatterArgs& a, Reach reach) {
  const int n = s.size(), r = s.rank();
  const size_t esize = dtype_size(a.dtype), piece = s.chunk_bytes() / esize;
  const size_t block = size_t(r) * a.count * esize;  // where block r starts in every input
  // Rank r >= 2 folding in place would overwrite its input before step r reads it.
  const bool copy_own = bytes_of(a.output) == bytes_of(a.input) + block && r >= 2;
  auto* scratch = static_cast<std::byte*>(ch.scratch(s.chunk_bytes() * size_t(n), 0));
  PieceSources sources{s, reach, a.input, copy_own, scratch};
  for (size_t begin = 0; begin < a.count; begin += piece) {
    const size_t count = std::min(piece, a.count - begin);
    sources.find(block + begin * esize, count * esize);
    fold(s, {a.dtype, a.op, count}, bytes_of(a.output) + begin * esize, sources, 0);
  }
  s.finish();
}

void direct_allgather(Segments& s, const AllgatherArgs& a, Reach reach) {
  const size_t block = a.count * dtype_size(a.dtype);
  for (int p = 0; p < s.size(); ++p) {
    if (p != s.rank()) read_input(s, reach, {p, 0, block}, bytes_of(a.output) + size_t(p) * block);
  }
  s.finish();
}

void direct_broadcast(Segments& s, const BroadcastArgs& a, Reach reach) {
  if (s.rank() != a.root) read_input(s, reach, {a.root, 0, a.count * dtype_size(a.dtype)}, a.output);
  s.finish();
}

}  // namespace tandem::ring
