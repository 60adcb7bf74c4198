// Collective: the kinds of call a communicator runs, with their one spelling.
// The numbers travel between ranks (fingerprints, shared-memory call headers): never renumber.
#pragma once

#include <cstdint>

namespace tandem {

// 0 is no collective. Values fit in 3 bits: a tag signature keeps 7 for fingerprints.
enum class Collective : uint8_t { allreduce = 1, reduce_scatter, allgather, broadcast, barrier, exchange };

// "allreduce", "reduce_scatter", ...; "?" for a number no collective has (from a peer's bytes).
const char* to_string(Collective c);

}  // namespace tandem
