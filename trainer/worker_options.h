// The options of one slot (worker) as one object: the driver writes them once
// per attempt as JSON, each slot reads them back (`tandem-train --worker-options FILE`).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace tandem::trainer {

struct WorkerOptions {
  std::string config_path;
  std::string output_dir;      // metrics.jsonl (chief), params dump
  std::string checkpoint_dir;  // ckpt-<batch>.tck
  int slots = 0;               // overrides resources.slots_per_trial when > 0
  int64_t per_slot_batch = 0;  // when > 0: the global batch is this times the slots (weak scaling)
  bool resume = false;         // continue from the newest intact checkpoint
  bool overlap = true;         // false: the gradient sync reduces every bucket after backward, none during it
  int compute_nice = 19;       // with overlap and several slots, the compute thread's nice value (0 = unchanged)
  // With overlap: each parameter is updated as its bucket lands, as late as
  // its first use in the next forward, instead of all after the last bucket.
  bool deferred_updates = true;
  // With deferred updates: the input-side layers' bucket goes ahead of the
  // last buckets holding up to this many bytes (see GradientSyncOptions).
  size_t input_layers_ahead_bytes = 3 << 20;
  int attempt = 0;          // 0 on the first start, then restarts
  int64_t max_batches = 0;  // overrides searcher.max_length when > 0
  double stall_factor = 3.0;
  int64_t validation_batch = 0;  // images a validation forward takes at once; 0 = the per-slot batch, at least 64
  // Fault injection for tests: SIGKILL this rank at the start of that batch, on attempt 0 only
  // (SIGSTOP with fail_stop: it goes silent, as a hung process would, until a SIGCONT).
  int64_t fail_at_batch = -1;
  int fail_rank = 1;
  bool fail_stop = false;
  // Fault injection for tests: the chief dies (SIGKILL) while writing the checkpoint of that batch, on attempt 0.
  int64_t fail_checkpoint_batch = -1;
  std::string dump_params;  // the chief writes every parameter, float32, model order, here at the end
  bool timeline = false;    // each slot writes a Chrome trace to <output_dir>/timeline-rank<r>.json
};
// Every field, by its name: a new option is one more name here.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(WorkerOptions, config_path, output_dir, checkpoint_dir, slots, per_slot_batch,
                                   resume, overlap, compute_nice, deferred_updates, input_layers_ahead_bytes, attempt,
                                   max_batches, stall_factor, validation_batch, fail_at_batch, fail_rank, fail_stop,
                                   fail_checkpoint_batch, dump_params, timeline)

// Writes `options` as JSON to `path`, replacing it; throws std::runtime_error naming the path.
void save_worker_options(const WorkerOptions& options, const std::string& path);

// Reads what save_worker_options wrote; throws ConfigError naming the path and what is wrong.
WorkerOptions load_worker_options(const std::string& path);

}  // namespace tandem::trainer
