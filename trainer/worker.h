// One slot of a trial: a rank under the launcher training the model on its
// shard (trial.h has the loop).
#pragma once

#include "worker_options.h"

namespace tandem::trainer {

// Returns the process exit code.
int run_worker(const WorkerOptions& options);

}  // namespace tandem::trainer
