// Ring collectives over blocks of any size (allgatherv, reduce_scatterv):
// n-1 steps, each rank sending one block to its successor and receiving one
// from its predecessor, so each rank sends and receives (n-1)/n of the data.
// Every step exchanges a message, empty ones too (sizes are checked).
#include <cstring>

#include "collectives.h"
#include "tandem/reduce.h"

namespace tandem::ring {

void ring_allgatherv(Channel& ch, const VariableArgs& a) {
  const int n = ch.size(), r = ch.rank();
  const size_t es = dtype_size(a.dtype);
  auto* out = static_cast<std::byte*>(a.output);
  auto block = [&](int b) { return out + a.blocks.displs[size_t(b)] * es; };
  auto bytes = [&](int b) { return a.blocks.counts[size_t(b)] * es; };
  if (block(r) != a.input) copy(a.memory, block(r), a.input, bytes(r));
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = mod(r - step, n), recv_block = mod(r - step - 1, n);
    Pending rx = ch.recv(prev, Tag(step), block(recv_block), bytes(recv_block));
    Pending tx = ch.send(next, Tag(step), block(send_block), bytes(send_block));
    ch.wait(rx);
    ch.wait(tx);
  }
}

void ring_reduce_scatterv(Channel& ch, const ReduceScattervArgs& a, bool finish_avg) {
  const int n = ch.size(), r = ch.rank();
  const size_t es = dtype_size(a.dtype);
  const auto* in = static_cast<const std::byte*>(a.input);
  auto input = [&](int b) { return in + a.blocks.displs[size_t(b)] * es; };
  auto count = [&](int b) { return a.blocks.counts[size_t(b)]; };
  size_t largest = 0;
  for (size_t c : a.blocks.counts) largest = std::max(largest, c * es);
  // Two partial sums in turn: the one being sent and the one being received.
  std::byte* partial[2] = {static_cast<std::byte*>(ch.scratch_in(a.memory, largest, 3)),
                           static_cast<std::byte*>(ch.scratch_in(a.memory, largest, 4))};
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  // Step s sends block r-s-1 (this rank's input at s = 0, else the partial
  // it just combined) and receives block r-s-2's partial; the last step's is block r.
  const void* outgoing = input(mod(r - 1, n));
  if (n == 1) copy(a.memory, a.output, input(r), count(r) * es);
  for (int step = 0; step < n - 1; ++step) {
    const int send_block = mod(r - step - 1, n), recv_block = mod(r - step - 2, n);
    std::byte* incoming = partial[step % 2];
    Pending rx = ch.recv(prev, Tag(step), incoming, count(recv_block) * es);
    Pending tx = ch.send(next, Tag(step), outgoing, count(send_block) * es);
    ch.wait(rx);
    const bool last = step == n - 2;
    void* into = last ? a.output : incoming;
    reduce(a.memory, a.dtype, a.op, into, incoming, input(recv_block), count(recv_block));
    ch.wait(tx);
    outgoing = incoming;
  }
  if (finish_avg && a.op == ReduceOp::avg) scale_avg(a.memory, a.dtype, a.output, count(r), n);
}

}  // namespace tandem::ring
