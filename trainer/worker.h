// One slot of a trial: a rank under the launcher training the model on its
// shard (trial.h has the loop).
#pragma once

#include <stdexcept>

#include "worker_options.h"

namespace tandem::trainer {

// The worker's exit code when it could not set the trial up (its data, its
// model, a checkpoint of another model): every restart would fail the same
// way, so the driver does not restart it.
inline constexpr int kSetupFailedExit = 3;

struct SetupError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Returns the process exit code; throws SetupError for a trial that cannot be set up.
int run_worker(const WorkerOptions& options);

}  // namespace tandem::trainer
