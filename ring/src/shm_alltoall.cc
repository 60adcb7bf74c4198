// All-to-all (equal and variable blocks) for ranks on one host, through the
// shared segments: small blocks staged through the slots, large ones read
// straight from each peer's input (terms: shm_collectives.cc).
//
// *Directory* (alltoallv only): every rank stages its send counts, send
// displacements and receive counts as one chunk, so each learns the whole
// count matrix. Every rank then checks it the same way (so all fail alike on
// a block whose sizes differ) and takes the same path by the same totals.
// alltoall needs none: every block has the call's count.
//
// *Staged*: each chunk carries the same run of every block, as in the
// reduce-scatter: piece q of rank p's slot holds part of p's block for q.
// Rank r copies piece r out of every peer's slot. One handshake per chunk for
// the whole call, not a message per peer. A rank copies its own block's run
// of each chunk while the peers read it, off the hand-off's critical path.
//
// *Direct*: after the arrival, rank r reads its block from each peer's
// input, one copy per block, starting at peer r+1 so the readers spread over
// the ranks: mapped (allocate_shared inputs) or by cross-memory attach (heap,
// out of place) as the path table says; equal blocks in place stage.
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "collectives.h"
#include "shm_direct.h"

namespace tandem::ring {
namespace {

// What every rank sends and receives: counts and displacements in elements.
// alltoall: every count `equal`, nothing stored (no allocation on the small
// path); gather and scatter (`root` >= 0): `equal` to or from the root.
struct Matrix {
  int n = 0;
  size_t equal = 0;
  std::vector<size_t> send_counts, send_displs, recv_counts;  // [p * n + q]: rank p's entry for rank q
  int root = -1;
  bool gather = false;

  bool stored() const { return !send_counts.empty(); }
  bool rooted() const { return root >= 0; }
  size_t send_count(int p, int q) const {
    if (stored()) return send_counts[size_t(p * n + q)];
    return !rooted() || (gather ? q : p) == root ? equal : 0;
  }
  size_t send_displ(int p, int q) const {
    if (stored()) return send_displs[size_t(p * n + q)];
    return rooted() && gather ? 0 : size_t(q) * equal;  // a gather's input is the one block
  }
  size_t recv_count(int p, int q) const { return stored() ? recv_counts[size_t(p * n + q)] : send_count(q, p); }
  size_t largest_block() const { return stored() ? *std::max_element(send_counts.begin(), send_counts.end()) : equal; }
  size_t total() const {
    if (stored()) return std::accumulate(send_counts.begin(), send_counts.end(), size_t(0));
    return equal * size_t(rooted() ? n : n * n);
  }
  // A rank's share of the total, in bytes of `es` each.
  size_t per_rank(size_t es) const {
    return stored() ? total() * es / size_t(n) : equal * es * size_t(rooted() ? 1 : n);
  }
};

// The directory entries a rank stages: its send counts, send displacements, receive counts.
constexpr size_t kDirectoryFields = 3;

// Exchanges every rank's directory through one staged chunk, into the
// thread's own matrix: its vectors keep their capacity, so a call
// allocates nothing after its first.
const Matrix& exchange_directory(Segments& s, const AlltoallvArgs& a) {
  const int n = s.size();
  thread_local Matrix m;
  thread_local std::vector<uint64_t> mine;
  m.n = n;
  for (auto* v : {&m.send_counts, &m.send_displs, &m.recv_counts}) v->assign(size_t(n * n), 0);
  auto unpack = [&](int p, const std::byte* from) {
    const auto* e = reinterpret_cast<const uint64_t*>(from);
    for (int q = 0; q < n; ++q) {
      m.send_counts[size_t(p * n + q)] = e[q];
      m.send_displs[size_t(p * n + q)] = e[n + q];
      m.recv_counts[size_t(p * n + q)] = e[2 * n + q];
    }
  };
  mine.assign(kDirectoryFields * size_t(n), 0);
  for (int q = 0; q < n; ++q) {
    mine[size_t(q)] = a.send.counts[size_t(q)];
    mine[size_t(n + q)] = a.send.displs[size_t(q)];
    mine[size_t(2 * n + q)] = a.recv.counts[size_t(q)];
  }
  const size_t bytes = mine.size() * sizeof(uint64_t);
  s.staged(
      1, bytes, {}, [&](size_t, std::byte* slot) { s.counted_copy(slot, mine.data(), bytes); },
      [&](size_t, auto slot_of) {
        for (int p = 0; p < n; ++p) {
          if (p != s.rank()) unpack(p, slot_of(p));
        }
      });
  unpack(s.rank(), reinterpret_cast<const std::byte*>(mine.data()));
  return m;
}

// Every rank checks the whole matrix in the same order, so all throw the same error.
void check_matrix(const Matrix& m) {
  for (int p = 0; p < m.n; ++p) {
    for (int q = 0; q < m.n; ++q) {
      const size_t sent = m.send_count(p, q), expected = m.recv_count(q, p);
      if (sent == expected) continue;
      if (p == q) {
        throw InvalidArgument("alltoallv: rank " + std::to_string(p) + " sends itself " + std::to_string(sent) +
                              " elements but expects " + std::to_string(expected));
      }
      throw CollectiveMismatch("alltoallv: rank " + std::to_string(p) + " sends rank " + std::to_string(q) + " " +
                               std::to_string(sent) + " elements but rank " + std::to_string(q) + " expects " +
                               std::to_string(expected) + " from it");
    }
  }
}

// A rank writes its own block by streaming stores from no less output than
// this, and from more where a core complex's last-level cache holds more
// (alltoall_stream_min_bytes): below, the output stays cached, and
// streaming stores, which go to memory, cost more than reading each line
// before writing it. The peers' blocks read through the mappings are
// streamed from twice this, or from this when ranks share cores and evict
// each other's outputs (docs/algorithms.md, 'shm: streaming stores in the
// all-to-all').
constexpr size_t kStreamMinBytes = 1 << 20;
// The largest last-level cache that one core complex has to itself (AMD's
// 32 MiB a CCD). A larger one spans the socket (Intel's mesh: 260 MiB seen
// by a 2-core guest), shared with all its cores: there streaming stores ran
// 6-17 % faster from 4 MiB and level at 1-2 MiB, so the floor holds. AMD's
// is a CCD's whatever hwloc says: a Zen 5 guest was shown the socket's sum
// (508 MB), and ordinary stores ran 10-20 % faster there up to 8 MiB.
constexpr size_t kCoreComplexCacheMaxBytes = 32 << 20;
size_t stream_peers_min_bytes(const RingOptions& o) {
  return o.ranks_outnumber_cores ? kStreamMinBytes : 2 * kStreamMinBytes;
}

}  // namespace

size_t alltoall_stream_min_bytes(size_t last_level_cache_bytes, int local_ranks, bool cache_per_core_complex) {
  if (cache_per_core_complex) last_level_cache_bytes = std::min(last_level_cache_bytes, kCoreComplexCacheMaxBytes);
  if (last_level_cache_bytes == 0 || last_level_cache_bytes > kCoreComplexCacheMaxBytes || local_ranks < 1) {
    return kStreamMinBytes;
  }
  // Each rank's input and output: twice its output.
  return std::max(kStreamMinBytes, last_level_cache_bytes / (2 * size_t(local_ranks)));
}

namespace {

// Where a rank receives: its output, or scratch aside; and which copies
// into it go by streaming stores.
struct Target {
  std::byte* out;
  bool stream;        // this rank's own block
  bool stream_peers;  // the peers' blocks read through the mappings
};

// Elements [begin, begin + count) of this rank's own block, from input to the target.
void copy_own_run(Segments& s, const AlltoallvArgs& a, const Target& t, size_t begin, size_t count) {
  const size_t r = size_t(s.rank()), es = dtype_size(a.dtype);
  const std::byte* from = bytes_of(a.input) + (a.send.displs[r] + begin) * es;
  std::byte* to = t.out + (a.recv.displs[r] + begin) * es;
  if (from == to || count == 0) return;
  if (t.stream) {
    s.counted_stream(to, from, count * es);
  } else {
    s.counted_copy(to, from, count * es);
  }
}

void direct_alltoallv(Segments& s, const AlltoallvArgs& a, const Matrix& m, Reach reach, const Target& t) {
  const int n = s.size(), r = s.rank();
  const size_t es = dtype_size(a.dtype);
  // A gather by cross-memory attach: each sender writes its block into the
  // root's output while the root copies its own, instead of the root
  // reading the blocks one after another ('shm: a gather's senders write').
  // A root whose buffers overlap stages (choose_path), and every rank with
  // it; one receiving aside publishes no output all the same.
  std::byte* const root_output = m.rooted() ? s.peer_output_address(m.root) : nullptr;
  if (m.gather && !m.stored() && reach == Reach::cross_memory && root_output) {
    if (r != m.root) {
      const size_t bytes = m.equal * es;
      s.memory().write_peer(m.root, root_output + size_t(r) * bytes, a.input, bytes);
      s.count_traffic(2 * bytes);
    }
    s.finish([&] { copy_own_run(s, a, t, 0, a.send.counts[size_t(r)]); });
    return;
  }
  for (int k = 1; k < n; ++k) {
    const int p = (r + k) % n;  // rank r starts at r + 1: the readers spread over the ranks
    const size_t bytes = a.recv.counts[size_t(p)] * es;
    if (bytes == 0) continue;
    std::byte* to = t.out + a.recv.displs[size_t(p)] * es;
    if (t.stream_peers && reach == Reach::mapped) {
      s.counted_stream(to, s.peer_input(p) + m.send_displ(p, r) * es, bytes);
    } else {
      read_input(s, reach, {p, m.send_displ(p, r) * es, bytes}, to);
    }
  }
  // The peers read this rank's input until finish(); its own block reads no peer.
  s.finish([&] { copy_own_run(s, a, t, 0, a.send.counts[size_t(r)]); });
}

// A gather's or scatter's ranks that only send return once staged (Flow).
void staged_alltoallv(Segments& s, const AlltoallvArgs& a, const Matrix& m, const Target& t, const RingOptions& o) {
  const int n = s.size(), r = s.rank();
  const size_t es = dtype_size(a.dtype);
  // The largest block whole if a chunk holds it for every rank (no division: small calls).
  const size_t largest = m.largest_block();
  const size_t per_block =
      std::max<size_t>(1, largest * es * size_t(n) <= s.chunk_bytes() ? largest : s.chunk_bytes() / es / size_t(n));
  auto run = [&](size_t count, size_t i) { return run_of(count, i, per_block); };
  const size_t chunks = chunks_for(largest, per_block), extent = size_t(n) * per_block * es;
  s.staged(
      chunks, extent,
      !m.rooted() ? Flow{} : s.rooted_flow(o, m.gather ? Flow{-1, m.root} : Flow{m.root, -1}, chunks, extent),
      [&](size_t i, std::byte* slot) {
        for (int q = 0; q < n; ++q) {
          const size_t count = run(a.send.counts[size_t(q)], i);
          if (q == r || count == 0) continue;
          s.counted_copy(slot + size_t(q) * per_block * es,
                         bytes_of(a.input) + (a.send.displs[size_t(q)] + i * per_block) * es, count * es);
        }
      },
      [&](size_t i, auto slot_of) {
        for (int p = 0; p < n; ++p) {
          const size_t count = run(a.recv.counts[size_t(p)], i);
          if (p == r || count == 0) continue;
          s.counted_copy(t.out + (a.recv.displs[size_t(p)] + i * per_block) * es,
                         slot_of(p) + size_t(r) * per_block * es, count * es);
        }
      },
      [&](size_t i) { copy_own_run(s, a, t, i * per_block, run(a.send.counts[size_t(r)], i)); });
}

// In place at a rooted call's root: its one block (a gather's input, a
// scatter's output) lies where the call puts it. No peer reads or writes
// there, so the overlap needs no staging and no copy aside. Of the calls
// here only the rooted ones name a root (the all-to-all's is -1).
bool own_block_in_place(const AlltoallvArgs& a, const Call& called, int r, size_t es) {
  const size_t rr = size_t(r);
  return r == called.root && bytes_of(a.input) + a.send.displs[rr] * es == bytes_of(a.output) + a.recv.displs[rr] * es;
}

}  // namespace

bool shm_alltoall_fits(const Channel& ch, const RingOptions& o) {
  return kDirectoryFields * sizeof(uint64_t) * size_t(ch.size()) <= o.shm_chunk_bytes;
}

void shm_alltoallv(Channel& ch, const AlltoallvArgs& a, const RingOptions& o, const Call& called) {
  const int n = ch.size();
  const size_t es = dtype_size(a.dtype), count = a.send.counts[0];
  if (a.equal && count == 0) return;
  Segments s(ch, o.shm_chunk_bytes, called);
  // A gather's or scatter's counts are known everywhere: no directory.
  const bool rooted = called.kind == Kind::gather || called.kind == Kind::scatter;
  const Matrix fixed = a.equal ? Matrix{n, count, {}, {}, {}}
                               : Matrix{n, called.count, {}, {}, {}, called.root, called.kind == Kind::gather};
  const Matrix& m = a.equal || rooted ? fixed : exchange_directory(s, a);
  if (m.stored()) check_matrix(m);
  if (m.total() == 0) return;
  const size_t per_rank = m.per_rank(es);  // the same on every rank
  const size_t in_bytes = extent(a.send, es), out_bytes = extent(a.recv, es);
  auto* out = bytes_of(a.output);
  const bool overlap = ring::overlap(a.input, in_bytes, out, out_bytes) && !own_block_in_place(a, called, s.rank(), es);
  PathChoice path = choose_path(s, o, ShmCollective::alltoall, per_rank, overlap);
  // An equal all-to-all in place stages without a copy aside; read directly,
  // even from allocate_shared inputs, it would receive aside and copy back
  // (docs/algorithms.md, 'shm: the all-to-all in place'): such a rank offers
  // no input, so every rank stages.
  const bool stages_in_place = a.equal && a.input == a.output;
  // In place (equal blocks, so staged), chunk i overwrites only the runs
  // chunk i staged: safe. Other overlaps would overwrite runs not yet staged,
  // or that peers read directly until finish(): receive aside.
  const bool aside = overlap && !stages_in_place;
  const Reach reach =
      arrive_direct(s, path, {per_rank, stages_in_place ? nullptr : a.input, in_bytes, aside ? nullptr : out});
  confirm_trial(path.heap, reach);
  // Scratch is read back at once: no streaming stores into it.
  const Target target{aside ? static_cast<std::byte*>(ch.scratch(out_bytes, 0)) : out,
                      !aside && out_bytes >= o.alltoall_stream_min_bytes,
                      !aside && out_bytes >= stream_peers_min_bytes(o)};
  if (reach != Reach::staged) {
    direct_alltoallv(s, a, m, reach, target);
  } else {
    staged_alltoallv(s, a, m, target, o);
  }
  if (aside) s.counted_copy(out, target.out, out_bytes);
  end_trial(path.heap);
}

bool shm_rooted_one_cell(Channel& ch, const VariableArgs& a, const RingOptions& o, const Call& called, bool gather) {
  const size_t es = dtype_size(a.dtype), block = a.count * es, n = size_t(ch.size());
  // As staged_alltoallv places it: every block whole in one chunk, the
  // chunk in one cell; under the direct paths' least size, so staged.
  const size_t cell = Segments::cell_bytes(*ch.shared_memory()->segments());
  if (!a.equal || block == 0 || block >= kShmDirectMinBytes || n * block > std::min(o.shm_chunk_bytes, cell))
    return false;
  const int r = ch.rank(), root = a.root;
  const std::byte* in = bytes_of(a.input);
  std::byte* out = bytes_of(a.output);
  // The root's own block: from a gather's input, or to a scatter's output.
  const std::byte* own_from = gather ? in : in + size_t(root) * block;
  std::byte* own_to = gather ? out + size_t(root) * block : out;
  // A root whose buffers overlap elsewhere receives aside (shm_alltoallv).
  const size_t in_bytes = gather ? block : n * block, out_bytes = gather ? n * block : block;
  if (r == root && own_from != own_to && overlap(in, in_bytes, out, out_bytes)) return false;
  Segments s(ch, o.shm_chunk_bytes, called);
  // Piece q of a slot is rank q's block, as in staged_alltoallv: a gather's
  // sender writes piece `root`; a scatter's root every other piece, taken
  // ahead from piece 1 if it is rank 0, else the pieces before its own.
  if (gather) {
    s.take_next_cells(o, size_t(root) * block, block);
  } else {
    s.take_next_cells(o, root == 0 ? block : 0, root == 0 ? (n - 1) * block : size_t(root) * block);
  }
  s.staged(
      1, n * block, gather ? Flow{-1, root} : Flow{root, -1},
      [&](size_t, std::byte* slot) {
        if (gather && r != root) s.counted_copy(slot + size_t(root) * block, in, block);
        if (gather || r != root) return;
        for (size_t q = 0; q < n; ++q) {
          if (q != size_t(root)) s.counted_copy(slot + q * block, in + q * block, block);
        }
      },
      [&](size_t, auto slot_of) {
        if (!gather) {
          if (r != root) s.counted_copy(out, slot_of(root) + size_t(r) * block, block);
          return;
        }
        for (int p = 0; p < int(n); ++p) {
          if (p != root) s.counted_copy(out + size_t(p) * block, slot_of(p) + size_t(root) * block, block);
        }
      },
      [&](size_t) {
        if (r == root && own_from != own_to) s.counted_copy(own_to, own_from, block);
      });
  return true;
}

}  // namespace tandem::ring
