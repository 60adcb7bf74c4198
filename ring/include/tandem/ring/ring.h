// Ring collectives over comm's Channel, and the one-call way to get a
// communicator that runs them.
#pragma once

#include <cstddef>
#include <memory>

#include "tandem/communicator.h"

namespace tandem::ring {

struct RingOptions {
  size_t segment_bytes = 1 << 20;  // largest message of the pipeline
  int segments_in_flight = 4;        // segments walking the ring at once
};

std::shared_ptr<Algorithms> algorithms(const RingOptions& options = {});

// Communicator::create with the ring algorithms, pipelined as options say.
std::unique_ptr<Communicator> connect(const CommOptions& options);

// connect(options_from_env()): rank, size and store from `tandem launch`, mpirun or srun.
std::unique_ptr<Communicator> connect_from_env();

}  // namespace tandem::ring
