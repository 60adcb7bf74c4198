// Ring collectives over comm's Channel, and the one-call way to get a
// communicator that runs them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tandem/communicator.h"

namespace tandem::ring {

enum class AllreduceAlgorithm { automatic, ring, recursive_doubling, shared_memory, hierarchical };
// How the shared-memory all-reduce treats buffers outside allocate_shared memory (see RingOptions).
enum class ShmAllreduceCma { never, far, always };

struct RingOptions {
  size_t segment_bytes = 2 << 20;  // largest message of the ring pipeline (CommOptions::segment_bytes)
  int segments_in_flight = 4;      // segments walking the ring at once
  // automatic: through shared memory when every rank is on this host (and the
  // buffers are host memory); else recursive doubling up to
  // small_message_bytes; above it hierarchical when there are several hosts
  // with the same number (>= 2) of ranks each, else the ring.
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::automatic;
  size_t small_message_bytes = 64 << 10;
  bool shared_memory = true;         // ask the communicator for shared segments
  size_t shm_chunk_bytes = 256 << 10;  // pipeline chunk of the shared-memory all-reduce
  // The staged shared-memory all-reduce splits each chunk (every element
  // reduced once) from this many ranks on (CommOptions::shm_split_min_ranks).
  int shm_split_min_ranks = 2;
  // ... and only for calls of at least this many bytes (CommOptions::shm_split_min_bytes).
  size_t shm_split_min_bytes = 16 << 10;
  // Cross-memory attach for buffers other ranks cannot map, up to this size
  // (CommOptions::shm_cma_max_bytes).
  size_t shm_cma_max_bytes = 8 << 20;
  // The all-reduce of such buffers, from shm_allreduce_cma_min_bytes to
  // shm_allreduce_cma_max_bytes (none when shm_cma_max_bytes is 0): staged
  // (never), by cross-memory attach (always), or (far) at 2 ranks by
  // cross-memory attach while rank 0's hand-off probe, re-taken every
  // shm_probe_period, reads shm_far_handoff_ns or more one way
  // (CommOptions::shm_allreduce_cma, shm_far_handoff_ns).
  ShmAllreduceCma shm_allreduce_cma = ShmAllreduceCma::far;
  size_t shm_allreduce_cma_min_bytes = 256 << 10;
  size_t shm_allreduce_cma_max_bytes = 16 << 20;
  uint64_t shm_far_handoff_ns = 180;
  std::chrono::milliseconds shm_probe_period{1000};
};

// "auto", "ring", "recursive_doubling" (also "rd"), "shared_memory" (also "shm"),
// "hierarchical" (also "hier");
// throws InvalidArgument listing them.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name);

// "never", "far" or "always" (TANDEM_SHM_ALLREDUCE_CMA); throws InvalidArgument otherwise.
ShmAllreduceCma parse_shm_allreduce_cma(const std::string& name);

// Throws InvalidArgument for impossible settings.
std::shared_ptr<Algorithms> algorithms(const RingOptions& options = {});

// What the shared-memory collectives do with these options for `local_ranks`
// ranks on one host, each threshold with its reason (for `tandem info`).
std::string shared_memory_plan(const RingOptions& options, int local_ranks, bool oversubscribed);

// The RingOptions that CommOptions (and so TANDEM_* variables) ask for.
RingOptions ring_options(const CommOptions& options);

// Communicator::create with the ring algorithms, configured by ring_options(options).
std::unique_ptr<Communicator> connect(const CommOptions& options);

// connect(options_from_env()): rank, size and store from `tandem launch`, mpirun or srun.
std::unique_ptr<Communicator> connect_from_env();

}  // namespace tandem::ring
