// Ring collectives over comm's Channel, and the one-call way to get a
// communicator that runs them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tandem/communicator.h"
#include "tandem/settings.h"

namespace tandem::ring {

enum class AllreduceAlgorithm { automatic, ring, recursive_doubling, shared_memory, hierarchical };
// How the shared-memory all-reduce treats buffers outside allocate_shared memory (see RingOptions).
enum class ShmAllreduceCma { never, far, timed, always };

// The ring's tuning, read once from TANDEM_* variables by ring_options_from_env()
// (one row per field in ring_settings()).
struct RingOptions {
  // Ring pipelining: segment size and how many segments are in flight per step.
  // 2 MiB x 4: 8 MiB in flight keeps a TCP link busy (2 ranks over a veth,
  // 16 MiB: about 20 % more busbw than 1 MiB x 4; see docs/across-hosts.md, the TCP path).
  size_t segment_bytes = 2 << 20;  // largest message of the ring pipeline (TANDEM_SEGMENT_BYTES)
  int segments_in_flight = 4;      // segments walking the ring at once (TANDEM_SEGMENTS_IN_FLIGHT)
  // automatic: through shared memory when every rank is on this host (and the
  // buffers are host memory); else recursive doubling up to
  // small_message_bytes; above it hierarchical when there are several hosts
  // with the same number (>= 2) of ranks each, else the ring (TANDEM_ALGO).
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::automatic;
  // All-reduces up to this many bytes use the latency-optimal algorithm
  // (recursive doubling) instead of the ring (TANDEM_SMALL_MESSAGE_BYTES).
  size_t small_message_bytes = 64 << 10;
  // When every rank runs on this host, ask the communicator to map each
  // other's memory and run collectives through it instead of UCX messages
  // (TANDEM_SHM=0 turns it off).
  bool shared_memory = true;
  // Pipeline chunk of the shared-memory collectives (TANDEM_SHM_CHUNK_BYTES);
  // 0 = 256 KiB, or 1 MiB when ranks outnumber cores (fewer synchronisations
  // for ranks that must take turns; measured steadier there; see fit_to_host).
  size_t shm_chunk_bytes = 0;
  // From how many ranks on the staged shared-memory all-reduce splits its
  // chunks, every element reduced once (TANDEM_SHM_SPLIT_MIN_RANKS; 0 or 1:
  // always, a large value: never).
  int shm_split_min_ranks = 2;
  // Smaller calls stay unsplit (TANDEM_SHM_SPLIT_MIN_BYTES; 0: split every
  // size): there the split's second hand-off between ranks costs more than the
  // redundant fold saves. Measured, 3 interleaved rounds: 4 ranks on 2 cores,
  // 4 KiB 6.8 us unsplit against 9.6 split; 2 ranks 4-8 KiB level (within 0.1
  // us) while the host's cores are near each other, 1.2-1.6 against 1.6-2.3
  // us while they are far; from 16 KiB the split wins while near.
  size_t shm_split_min_bytes = 16 << 10;
  // The shared-memory reduce-scatter and allgather read buffers outside
  // allocate_shared memory by cross-memory attach instead of staging them,
  // from 256 KiB up to this size (TANDEM_SHM_CMA_MAX_BYTES; 0: never, the
  // all-reduce's window below included).
  size_t shm_cma_max_bytes = 8 << 20;
  // The all-reduce of such buffers, from shm_allreduce_cma_min_bytes to
  // shm_allreduce_cma_max_bytes (none when shm_cma_max_bytes is 0): staged
  // (never), by cross-memory attach (always), by whichever rank 0 timed
  // faster on calls of that size, in place and out of place apart (timed),
  // or (far) at 2 ranks by cross-memory attach while rank 0's hand-off probe,
  // re-taken every shm_probe_period, reads shm_far_handoff_ns or more one
  // way (TANDEM_SHM_ALLREDUCE_CMA, TANDEM_SHM_FAR_HANDOFF_NS). The probe
  // predicted one host (1 MiB staged 2x faster while near, 0.04-0.06 us;
  // cross-memory attach 1.4x faster while far, 0.25 us) and misjudged
  // another (near, 0.11-0.21 us, yet cross-memory attach 1.7x faster at 1
  // MiB in place), hence timed. The all-to-all takes the same setting; far
  // means timed there.
  ShmAllreduceCma shm_allreduce_cma = ShmAllreduceCma::timed;
  size_t shm_allreduce_cma_min_bytes = 256 << 10;
  size_t shm_allreduce_cma_max_bytes = 16 << 20;
  uint64_t shm_far_handoff_ns = 180;
  std::chrono::milliseconds shm_probe_period{1000};
  // Not a setting: ranks outnumber cores (fit_to_host), so a hand-off probe
  // would time the scheduler and the all-reduce's far stages; the waits
  // yield sooner and the chunk is larger.
  bool ranks_outnumber_cores = false;
};

// "auto", "ring", "recursive_doubling" (also "rd"), "shared_memory" (also "shm"),
// "hierarchical" (also "hier");
// throws InvalidArgument listing them.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name);
// The full name parse_allreduce_algorithm takes ("auto", "ring", ...).
const char* to_string(AllreduceAlgorithm algorithm);

// "never", "far" or "always" (TANDEM_SHM_ALLREDUCE_CMA); throws InvalidArgument otherwise.
ShmAllreduceCma parse_shm_allreduce_cma(const std::string& name);

// Throws InvalidArgument for impossible settings. A shm_chunk_bytes of 0 is
// 256 KiB here (fit_to_host chooses it knowing the host).
std::shared_ptr<Algorithms> algorithms(const RingOptions& options = {});

// What the shared-memory collectives do with these options (fitted to the
// host: fit_to_host) for `local_ranks` ranks on one host, each threshold with
// its reason (for `tandem info`).
std::string shared_memory_plan(const RingOptions& options, int local_ranks);

// The ring's table: one row per TANDEM_* variable that fills RingOptions.
const SettingTable<RingOptions>& ring_settings();

// RingOptions with every variable of ring_settings() that `env` sets; throws
// InvalidArgument naming a malformed one.
RingOptions ring_options_from_env(const EnvLookup& env = process_env());

// `options` fitted to the host `comm` runs on: the automatic shared-memory
// chunk (0) chosen, and no hand-off probe while ranks outnumber cores.
RingOptions fit_to_host(RingOptions options, const CommOptions& comm);

// Communicator::create with the ring algorithms, configured by fit_to_host(ring, options).
std::unique_ptr<Communicator> connect(const CommOptions& options, const RingOptions& ring);

// connect(tandem::comm_options_from_env(), ring::ring_options_from_env()): rank, size and
// store from `tandem launch`, mpirun or srun, tuning from TANDEM_* variables.
std::unique_ptr<Communicator> connect_from_env(const EnvLookup& env = process_env());

}  // namespace tandem::ring
