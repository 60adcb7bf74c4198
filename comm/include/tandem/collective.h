// Collective: the kinds of call a communicator runs, with their one spelling.
// The numbers travel between ranks (fingerprints, shared-memory call headers): never renumber.
#pragma once

#include <cstdint>

namespace tandem {

// 0 is no collective. Values fit in 5 bits: a tag signature keeps 31 for fingerprints.
enum class Collective : uint8_t {
  allreduce = 1,
  reduce_scatter,
  allgather,
  broadcast,
  barrier,
  exchange,  // Communicator::exchange (libraries' own point-to-point messages)
  alltoall,
  alltoallv,
  reduce,
  gather,
  gatherv,
  scatter,
  scatterv,
  allgatherv,
  reduce_scatterv,
  send_recv,  // Communicator::send, recv and point-to-point groups
  split,
};

// "allreduce", "reduce_scatter", ...; "?" for a number no collective has (from a peer's bytes).
const char* to_string(Collective c);

// Calls whose counts legitimately differ across ranks (alltoallv, gatherv, ...):
// their fingerprints leave the count out; message sizes are checked instead.
bool has_per_rank_counts(Collective c);

// Calls only the ranks they address take part in (exchange, send/recv): not
// numbered, not fingerprinted, not in the flight recorder's sequence.
bool is_point_to_point(Collective c);

}  // namespace tandem
