// Recursive-doubling all-reduce: latency-optimal for small messages.
//
// Terms:
//   pow2    - the largest power of two <= n. The first 2 * (n - pow2) ranks
//             pair up (even r with r + 1) so that pow2 ranks remain.
//   fold    - an even rank of such a pair sends its data to r + 1 and waits;
//   unfold  -   at the end, r + 1 sends it the result.
//   round   - in round k, each remaining rank exchanges its whole buffer with
//             the partner whose remaining-rank number differs in bit k, and
//             both combine the two. log2(pow2) rounds.
// Both partners combine in the same operand order (lower rank's data first),
// so every rank ends bitwise identical whatever the op.
#include <cstring>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

constexpr Tag kFoldTag = 1u << 30;
constexpr Tag kUnfoldTag = (1u << 30) + 1;

}  // namespace

void recursive_doubling_allreduce(Channel& ch, const AllreduceArgs& a) {
  const int n = ch.size(), r = ch.rank();
  const size_t bytes = a.count * dtype_size(a.dtype);
  copy(a.memory, a.output, a.input, bytes);
  if (n == 1 || bytes == 0) return;
  const ReduceOp combine = a.op == ReduceOp::avg ? ReduceOp::sum : a.op;

  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;  // ranks below 2 * extra fold in pairs
  void* theirs = ch.scratch_in(a.memory, bytes, 0);

  if (r < 2 * extra && r % 2 == 0) {  // fold into r + 1, wait for the result
    Pending s = ch.send(r + 1, kFoldTag, a.output, bytes);
    Pending back = ch.recv(r + 1, kUnfoldTag, a.output, bytes);
    ch.wait(s);
    ch.wait(back);
    return;  // the partner sent the final (already averaged) value
  }
  if (r < 2 * extra) {  // r is odd: absorb r - 1
    Pending p = ch.recv(r - 1, kFoldTag, theirs, bytes);
    ch.wait(p);
    reduce(a.memory, a.dtype, combine, a.output, theirs, a.output, a.count);  // lower rank first
  }
  // Remaining ranks are renumbered 0 .. pow2 - 1.
  const int me = r < 2 * extra ? r / 2 : r - extra;
  auto real_rank = [&](int v) { return v < extra ? 2 * v + 1 : v + extra; };
  for (int bit = 1, round = 0; bit < pow2; bit <<= 1, ++round) {
    const int partner = real_rank(me ^ bit);
    Pending recv = ch.recv(partner, Tag(round), theirs, bytes);
    Pending send = ch.send(partner, Tag(round), a.output, bytes);
    ch.wait(recv);
    ch.wait(send);  // our buffer is about to change
    if (partner < r) {
      reduce(a.memory, a.dtype, combine, a.output, theirs, a.output, a.count);
    } else {
      reduce(a.memory, a.dtype, combine, a.output, a.output, theirs, a.count);
    }
  }
  if (a.op == ReduceOp::avg) scale_avg(a.memory, a.dtype, a.output, a.count, n);
  if (r < 2 * extra) {  // unfold: hand the result back to r - 1
    Pending s = ch.send(r - 1, kUnfoldTag, a.output, bytes);
    ch.wait(s);
  }
}

}  // namespace tandem::ring
