// What ranks on one host can do with each other's memory, the facet of a
// Channel that the shared-memory algorithms ask for (Channel::shared_memory()):
// mapped segments, buffers in allocate_shared memory, cross-memory attach.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "tandem/errors.h"

namespace tandem {

// Memory every rank of a communicator maps: present only when all ranks run on
// one host and the algorithms ask for it (Algorithms::shared_bytes(); the ring
// asks unless TANDEM_SHM=0). The communicator creates, maps and
// zero-fills it; the algorithms that use it define its layout.
struct SharedSegments {
  std::vector<std::byte*> segment;  // rank r's segment, as mapped in this process
  size_t bytes = 0;                 // the size of each
};

// Where a buffer lies inside memory from Communicator::allocate_shared, in
// terms a peer on the same host can map. Plain data: algorithms pass it to
// peers through their shared segments.
struct SharedRef {
  uint64_t owner = 0;   // process id of the allocating rank
  uint64_t serial = 0;  // allocation number within that process
  int64_t fd = -1;      // the allocation's memfd in the owner
  uint64_t size = 0;    // bytes of the whole allocation
  uint64_t offset = 0;  // where the buffer starts inside it
};

class SharedMemory {
 public:
  virtual ~SharedMemory() = default;

  // The ranks' shared segments, or nullptr when not all of them map them.
  virtual const SharedSegments* segments() const { return nullptr; }
  // When ranks span hosts: the segments of this host's ranks, indexed by local
  // rank (Topology::local_rank), or nullptr when they cannot share memory.
  virtual const SharedSegments* host_segments() const { return nullptr; }
  // If [p, p + bytes) lies in this rank's Communicator::allocate_shared
  // memory (and shared segments exist), where peers can find it.
  virtual bool find_shared(const void* /*p*/, size_t /*bytes*/, SharedRef& /*out*/) const { return false; }
  // A peer's buffer, mapped into this process (cached across calls).
  virtual std::byte* map_shared(int /*peer*/, const SharedRef& /*ref*/) {
    throw InvalidArgument("this channel cannot map peers' memory");
  }

  // Copies between this rank's memory and a peer's by the peer's own
  // addresses (Linux cross-memory attach), for ranks that share segments and
  // whose kernel allows it; a PeerFailure if the peer is gone.
  virtual bool can_copy_peer() const { return false; }
  virtual void read_peer(int /*peer*/, const void* /*remote*/, void* /*local*/, size_t /*bytes*/) {
    throw InvalidArgument("this channel cannot copy from peers' memory");
  }
  virtual void write_peer(int /*peer*/, void* /*remote*/, const void* /*local*/, size_t /*bytes*/) {
    throw InvalidArgument("this channel cannot copy to peers' memory");
  }

  // The algorithms report the bytes they read plus the bytes they wrote
  // through shared memory (copies, folds, cross-memory copies); the
  // communicator keeps the total (Communicator::shared_memory_traffic).
  virtual void count_traffic(uint64_t bytes) = 0;
};

// Timed choices between two ways of moving the same bytes on one host (the
// ring's staging against cross-memory attach, the mailbox's streaming against
// reading the sender's buffer): pairs of trials, one of each way, as many
// pairs as move kTrialBlockBytes, from 3 to kTrialMaxPairs, so that small
// messages give a fair sample and large ones few slow trials
// (docs/algorithms.md, 'shm: trials').
constexpr size_t kTrialBlockBytes = 1 << 20;
constexpr uint64_t kTrialMaxPairs = 12;
inline uint64_t trial_pairs(size_t bytes) {
  return std::clamp<uint64_t>(kTrialBlockBytes / std::max<size_t>(bytes, 1), 3, kTrialMaxPairs);
}
// A first round of a size class opens with one pair, so that its verdict
// stands within a benchmark's warm-up or a job's first steps; the second
// round's full opening checks it (docs/algorithms.md, 'shm: the first round').
constexpr uint64_t kFirstOpeningPairs = 1;
// A first verdict this clear for the way a class starts with (reading from
// the sender; cross-memory attach), its time under 1/kClearRatio of the
// other's, stands through the second round, which then opens with no
// trials; later rounds open in full. Never one for the other way: one slow
// call in the one pair fakes it (a 1 MiB call of 45 us took 150-200 about
// once in 40), and it would hold the slower way for a whole round
// (docs/algorithms.md, 'shm: the first round').
constexpr double kClearRatio = 1.5;
// Whether the first way's time over the other's (`ratio`) is that clear a win.
inline bool clear_win(double ratio) { return ratio <= 1 / kClearRatio; }
// Where a size class's n-th call or message (from 0) falls: its round (0:
// the first, `first_round` long; later ones `every` long) and its place there.
struct RoundPlace {
  uint64_t round, place;
};
inline RoundPlace round_place(uint64_t n, uint64_t first_round, uint64_t every) {
  if (n < first_round) return {0, n};
  return {1 + (n - first_round) / every, (n - first_round) % every};
}
// The trials' clock: the host's monotonic clock, which every process on it reads alike.
inline uint64_t trial_clock_ns() {
  return uint64_t(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
          .count());
}

}  // namespace tandem
