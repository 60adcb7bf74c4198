// The direct shared-memory collectives (shm_direct.cc): every rank reads what
// it needs straight from the others' buffers once all have arrived.
#pragma once

#include "shm_timed_path.h"
#include "tandem/ring/ring.h"
#include "tandem/ring/shm_paths.h"

namespace tandem::ring {

// What this rank offers for a call, by its path table. Rank 0's offer rules
// for every rank; the others' only say whether they arrive.
struct PathChoice {
  TimedPath heap;    // buffers not all mapped: staged, by cross-memory attach, or a timed trial
  bool map = false;  // every rank's buffers mapped: read and written in place
};

// Where ranks outnumber cores, the all-to-all's timed row starts here
// (docs/algorithms.md, 'shm: the all-to-all timed path').
constexpr size_t kAlltoallSharedCoresTimedBytes = 64 << 10;

// The one place the path table is consulted (o.shm_paths). `in_place`: the
// all-reduce's input is its output (timed apart); the all-to-all's buffers
// overlap (its direct path would receive aside: it stages, counted all the same).
PathChoice choose_path(const Segments& s, const RingOptions& o, ShmCollective c, size_t bytes, bool in_place);

// A call's buffers as the direct path sees them.
struct DirectCall {
  size_t bytes = 0;             // the call's size as the path table counts it
  const void* input = nullptr;  // nullptr: this rank offers no input, so every rank stages
  size_t input_bytes = 0;
  void* output = nullptr;
  bool map_output = false;  // the output (input_bytes long) must be mapped too
  int registrant = -1;      // whose buffers must be mapped: every rank's (-1) or the root's
};

// Arrives when `call.bytes` make a direct call possible and says how it
// runs: mapped when the registrant's buffers lie in allocate_shared memory
// and rank 0 maps them, else as rank 0 offers: by cross-memory attach (where
// the kernel allows it) or staged.
Reach arrive_direct(Segments& s, const PathChoice& choice, const DirectCall& call);

// A run of a peer's input.
struct PeerRun {
  int peer = 0;
  size_t offset = 0;  // bytes into its input
  size_t bytes = 0;
};

// Copies `from` to `dst`: through the mapping or by cross-memory attach.
void read_input(Segments& s, Reach reach, const PeerRun& from, void* dst);

// Rank r reduces its slice of every rank's input, piece by piece, into its own
// output, and delivers each piece to the others' outputs: through the
// mappings, or by cross-memory attach.
void direct_allreduce(Segments& s, Channel& ch, const AllreduceArgs& a, Reach reach);

// The same by cross-memory attach, each piece delivered to the root's output
// alone (published at its arrival).
void direct_reduce(Segments& s, Channel& ch, const ReduceArgs& a);

// Rank r folds its block straight from every rank's input, piece by piece.
void direct_reduce_scatter(Segments& s, Channel& ch, const ReduceScatterArgs& a, Reach reach);
void direct_allgather(Segments& s, const AllgatherArgs& a, Reach reach);
void direct_broadcast(Segments& s, const BroadcastArgs& a, Reach reach);

}  // namespace tandem::ring
