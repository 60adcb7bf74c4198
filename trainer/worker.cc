#include "worker.h"

#include <torch/torch.h>

#include <optional>
#include <stdexcept>

#include "config.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/ring/ring.h"
#include "trial.h"

namespace tandem::trainer {
namespace {

// Connecting failed: not the trial's setup, which fails the same on every attempt.
struct NotSetup : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace

int run_worker(const WorkerOptions& wo) {
  ExperimentConfig cfg = load_config(wo.config_path, wo.max_batches == 0);
  if (wo.slots > 0 || wo.per_slot_batch > 0)
    set_slots(cfg, wo.slots > 0 ? wo.slots : cfg.slots_per_trial, wo.per_slot_batch);
  // One compute thread a slot: intra-op threads (and OpenBLAS's OpenMP pool,
  // which follows them) would fight the other slots and the engine for the cores.
  torch::set_num_threads(1);
  at::set_num_interop_threads(1);
  const CommOptions options = comm_options_from_env();
  const auto connect = [&] {
    try {
      return ring::connect(options, ring::ring_options_from_env());
    } catch (const tandem::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw NotSetup(e.what());
    }
  };
  std::optional<Trial> trial;
  try {
    trial.emplace(wo, std::move(cfg), connect, options.join, options.rank);
    trial->resume();
  } catch (const tandem::Error&) {
    throw;  // the communicator's (a peer, a deadline): a restart may succeed
  } catch (const NotSetup&) {
    throw;
  } catch (const std::exception& e) {
    throw SetupError(e.what());  // the data, the model, a checkpoint: the same on every attempt
  }
  trial->run();
  return 0;
}

}  // namespace tandem::trainer
