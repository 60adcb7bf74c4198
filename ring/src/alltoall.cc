// All-to-all (equal and variable blocks) by pairwise exchange: in step s
// each rank sends its block for rank r+s and receives rank r-s's block, so
// every link carries one message per step and no rank is hot. At most
// kStepsInFlight steps are posted at once. Per rank: (n-1)/n of its input sent,
// (n-1)/n of its output received. Every step exchanges a message, empty ones
// too, so a block whose sizes differ between sender and receiver fails at
// once naming the sizes instead of waiting out the deadline. For ranks across
// hosts or with shared memory off; on one host: shm_alltoall.cc.
#include <cstring>
#include <deque>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {
namespace {

constexpr size_t kStepsInFlight = 8;

}  // namespace

void pairwise_alltoallv(Channel& ch, const AlltoallvArgs& a) {
  const int n = ch.size(), r = ch.rank();
  const size_t es = dtype_size(a.dtype);
  const auto* in = static_cast<const std::byte*>(a.input);
  auto* out = static_cast<std::byte*>(a.output);
  if (a.send.counts[size_t(r)] != a.recv.counts[size_t(r)]) {
    throw InvalidArgument("alltoallv: rank " + std::to_string(r) + " sends itself " +
                          std::to_string(a.send.counts[size_t(r)]) + " elements but expects " +
                          std::to_string(a.recv.counts[size_t(r)]));
  }
  // In place (or overlapping buffers): receive into scratch, copy over the
  // input at the end. (Sending from a staged copy of the input instead ran
  // 3x slower at 1 MiB, 2 ranks: UCX's rendezvous from scratch memory.)
  const size_t in_bytes = extent(a.send, es), out_bytes = extent(a.recv, es);
  std::byte* const final_out = out;
  const bool staged = overlap(in, in_bytes, out, out_bytes);
  if (staged) out = static_cast<std::byte*>(ch.scratch_in(a.memory, out_bytes, 0));
  // This rank's own block is copied once the first steps are posted, while the peers move theirs.
  bool own_copied = false;
  const auto copy_own = [&] {
    copy(a.memory, out + a.recv.displs[size_t(r)] * es, in + a.send.displs[size_t(r)] * es,
         a.send.counts[size_t(r)] * es);
    own_copied = true;
  };

  std::deque<std::pair<Pending, Pending>> steps;
  for (int s = 1; s < n; ++s) {
    const int to = mod(r + s, n), from = mod(r - s, n);
    Pending rx = ch.recv(from, Tag(s), out + a.recv.displs[size_t(from)] * es, a.recv.counts[size_t(from)] * es);
    Pending tx = ch.send(to, Tag(s), in + a.send.displs[size_t(to)] * es, a.send.counts[size_t(to)] * es);
    steps.emplace_back(std::move(rx), std::move(tx));
    if (!own_copied && (s == n - 1 || steps.size() == kStepsInFlight)) copy_own();
    if (steps.size() == kStepsInFlight) {
      ch.wait(steps.front().first);
      ch.wait(steps.front().second);
      steps.pop_front();
    }
  }
  if (!own_copied) copy_own();  // one rank: no steps
  for (auto& [rx, tx] : steps) {
    ch.wait(rx);
    ch.wait(tx);
  }
  if (staged) copy(a.memory, final_out, out, out_bytes);
}

}  // namespace tandem::ring
