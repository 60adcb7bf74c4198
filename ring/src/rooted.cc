// Rooted collectives. gatherv and scatterv: linear, the root posts one
// receive (send) per rank at once, as Gloo and MPI implementations do for the
// sizes data-parallel jobs use; the root moves (n-1)/n of the data, every
// other rank its own block. reduce: a binomial tree (log2 n rounds of the
// whole buffer) up to kTreeMaxBytes; above it a ring reduce-scatter of
// balanced blocks then a gather of the blocks to the root, which moves
// 2(n-1)/n of the buffer per rank instead of log2(n) times the buffer.
#include <cstring>
#include <vector>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

constexpr size_t kTreeMaxBytes = 256 << 10;
// Tags of reduce's second phase (the gather), clear of the reduce-scatter's.
constexpr Tag kGatherPhase = Tag(1) << 24;

void tree_reduce(Channel& ch, const ReduceArgs& a) {
  const int n = ch.size(), r = ch.rank();
  const size_t bytes = a.count * dtype_size(a.dtype);
  const int vr = mod(r - a.root, n);
  // The running sum: the root's output, else scratch.
  void* acc = r == a.root ? a.output : ch.scratch_in(a.memory, bytes, 0);
  if (acc != a.input) copy(a.memory, acc, a.input, bytes);
  void* incoming = ch.scratch_in(a.memory, bytes, 1);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      Pending p = ch.send(mod(vr - mask + a.root, n), Tag(mask), acc, bytes);
      ch.wait(p);
      return;
    }
    if (vr + mask < n) {
      Pending p = ch.recv(mod(vr + mask + a.root, n), Tag(mask), incoming, bytes);
      ch.wait(p);
      reduce(a.memory, a.dtype, a.op, acc, acc, incoming, a.count);
    }
  }
}

}  // namespace

void gatherv(Channel& ch, const VariableArgs& a, Tag tag) {
  const int n = ch.size(), r = ch.rank();
  const size_t es = dtype_size(a.dtype);
  if (r != a.root) {
    Pending p = ch.send(a.root, tag, a.input, a.count * es);
    ch.wait(p);
    return;
  }
  auto* out = static_cast<std::byte*>(a.output);
  std::vector<Pending> live;
  for (int p = 0; p < n; ++p) {
    if (p != r) live.push_back(ch.recv(p, tag, out + a.blocks.displs[size_t(p)] * es, a.blocks.counts[size_t(p)] * es));
  }
  std::byte* own = out + a.blocks.displs[size_t(r)] * es;
  if (own != a.input) copy(a.memory, own, a.input, a.count * es);
  ch.wait_all(live);
}

void scatterv(Channel& ch, const VariableArgs& a) {
  const int n = ch.size(), r = ch.rank();
  const size_t es = dtype_size(a.dtype);
  if (r != a.root) {
    Pending p = ch.recv(a.root, 0, a.output, a.count * es);
    ch.wait(p);
    return;
  }
  const auto* in = static_cast<const std::byte*>(a.input);
  std::vector<Pending> live;
  for (int p = 0; p < n; ++p) {
    if (p != r) live.push_back(ch.send(p, 0, in + a.blocks.displs[size_t(p)] * es, a.blocks.counts[size_t(p)] * es));
  }
  const std::byte* own = in + a.blocks.displs[size_t(r)] * es;
  if (own != a.output) copy(a.memory, a.output, own, a.count * es);
  ch.wait_all(live);
}

void reduce_to_root(Channel& ch, const ReduceArgs& a) {
  const int n = ch.size(), r = ch.rank();
  const size_t es = dtype_size(a.dtype), bytes = a.count * es;
  if (n == 1 || bytes <= kTreeMaxBytes || a.count < size_t(n)) {
    tree_reduce(ch, a);
  } else {
    // Reduce-scatter balanced blocks (block i to rank i), then gather them at the root.
    Blocks blocks;
    for (int i = 0; i < n; ++i) {
      const Range range = balanced(a.count, size_t(n), size_t(i));
      blocks.counts.push_back(range.size);
      blocks.displs.push_back(range.begin);
    }
    const bool root = r == a.root;
    void* mine = root ? static_cast<std::byte*>(a.output) + blocks.displs[size_t(r)] * es
                      : ch.scratch_in(a.memory, blocks.counts[size_t(r)] * es, 2);
    // A root reducing in place must not overwrite its own input block before the ring has read it.
    const bool staged = root && a.input == a.output;
    void* landing = staged ? ch.scratch_in(a.memory, blocks.counts[size_t(r)] * es, 2) : mine;
    ring_reduce_scatterv(ch, ReduceScattervArgs{a.input, landing, blocks, a.dtype, a.op, a.memory},
                         /*finish_avg=*/false);
    if (staged) copy(a.memory, mine, landing, blocks.counts[size_t(r)] * es);
    gatherv(ch,
            VariableArgs{mine, a.output, blocks.counts[size_t(r)], root ? blocks : Blocks{}, a.dtype, a.root, a.memory},
            kGatherPhase);
  }
  if (r == a.root && a.op == ReduceOp::avg) scale_avg(a.memory, a.dtype, a.output, a.count, n);
}

}  // namespace tandem::ring
