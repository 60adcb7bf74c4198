// Ring collectives over comm's Channel, and the one-call way to get a
// communicator that runs them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tandem/communicator.h"
#include "tandem/ring/shm_paths.h"
#include "tandem/settings.h"

namespace tandem::ring {

enum class AllreduceAlgorithm { automatic, ring, recursive_doubling, shared_memory, hierarchical };

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
  // redundant fold saves (docs/algorithms.md, 'shm: the split staged all-reduce').
  size_t shm_split_min_bytes = 16 << 10;
  // Which path each shared-memory call takes, by collective, buffers and
  // size: the defaults with TANDEM_SHM_PATHS's rows over them (shm_paths.h).
  ShmPathTable shm_paths{};
  // Not a setting: ranks outnumber cores (fit_to_host), so the waits yield
  // sooner, the chunk is larger and the all-to-all streams sooner.
  bool ranks_outnumber_cores = false;
  // Not a setting: from this output size an all-to-all writes its own block
  // by streaming stores (fit_to_host): past where the host's ranks' inputs
  // and outputs together fill its last-level cache, or from 1 MiB where that
  // cache is a socket's (over 32 MiB, Intel's; AMD's counts as a CCD's 32 MiB).
  size_t alltoall_stream_min_bytes = 1 << 20;
};

// "auto", "ring", "recursive_doubling" (also "rd"), "shared_memory" (also "shm"),
// "hierarchical" (also "hier");
// throws InvalidArgument listing them.
AllreduceAlgorithm parse_allreduce_algorithm(const std::string& name);
// The full name parse_allreduce_algorithm takes ("auto", "ring", ...).
const char* to_string(AllreduceAlgorithm algorithm);

// Throws InvalidArgument for impossible settings. A shm_chunk_bytes of 0 is
// 256 KiB here (fit_to_host chooses it knowing the host).
std::shared_ptr<Algorithms> algorithms(const RingOptions& options = {});

// What the shared-memory collectives do with these options (fitted to the
// host: fit_to_host) for `local_ranks` ranks on one host, each threshold with
// its reason, and the path table in effect (for `tandem info`).
// `cma_unavailable`: why the host rules out cross-memory attach, or ""
// (cross_memory_attach_limit()).
std::string shared_memory_plan(const RingOptions& options, int local_ranks, const std::string& cma_unavailable);

// The ring's table: one row per TANDEM_* variable that fills RingOptions.
const SettingTable<RingOptions>& ring_settings();

// RingOptions with every variable of ring_settings() that `env` sets; throws
// InvalidArgument naming a malformed one.
RingOptions ring_options_from_env(const EnvLookup& env = process_env());

// `options` fitted to the host `comm` runs on: whether ranks outnumber cores,
// and the automatic shared-memory chunk (0) chosen by it.
RingOptions fit_to_host(RingOptions options, const CommOptions& comm);

// Communicator::create with the ring algorithms, configured by fit_to_host(ring, options).
std::unique_ptr<Communicator> connect(const CommOptions& options, const RingOptions& ring);

// connect(tandem::comm_options_from_env(), ring::ring_options_from_env()): rank, size and
// store from `tandem launch`, mpirun or srun, tuning from TANDEM_* variables.
std::unique_ptr<Communicator> connect_from_env(const EnvLookup& env = process_env());

}  // namespace tandem::ring
