// The experiment configuration of `tandem train`, in the shape of a
// Determined experiment YAML (name, hyperparameters, resources, searcher,
// min_validation_period, records_per_epoch, optimizations,
// checkpoint_storage, max_restarts, reproducibility, dtrain_network_interface)
// plus `data`.
//
// Terms:
//  - slot: one worker process (one rank); slots_per_trial of them train together.
//  - global batch: the samples of one optimizer step over all slots;
//    per-slot batch = global_batch_size / slots_per_trial, the remainder
//    dropped (Determined's rule). Not given: kDefaultPerSlotBatch a slot,
//    as the data loader of Determined's tutorial train.py (0.38's Core API
//    has no global batch: each worker's loader batch is its own).
//  - length: a count in batches, records or epochs (searcher.max_length,
//    min_validation_period, min_checkpoint_period), converted to batches
//    (optimizer steps) with the global batch and records_per_epoch.
//
// Every check runs before a worker starts: parse_config() throws ConfigError
// listing every problem, each naming the key, the value and the fix. The keys,
// their ranges and defaults are one table (config_keys.h).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace tandem::trainer {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class LengthUnit { batches, records, epochs };

struct Length {
  LengthUnit unit = LengthUnit::batches;
  int64_t value = 0;
  bool set() const { return value > 0; }
};

struct Optimizations {
  int aggregation_frequency = 1;
  bool average_aggregated_gradients = true;
  bool average_training_metrics = true;
  std::string gradient_compression = "none";  // none | fp16 | bf16 (Determined's true = fp16)
  // Horovod's and Determined's: compressed gradients are divided by it before
  // the sum and multiplied back after (so 16-bit partial sums stay in range).
  double gradient_predivide_factor = 1.0;
  bool error_feedback = false;  // what rounding to 16 bits dropped is sent with the next step
  bool auto_tune_tensor_fusion = false;
  int tensor_fusion_threshold_mb = 64;  // Determined's unit and default
  int tensor_fusion_cycle_time_ms = 5;  // bounds the idle engine's sleep only (buckets launch when full)
};

// hyperparameters.lr_schedule: linear warm-up, then constant | step | cosine (optimizer.h).
struct LrSchedule {
  std::string type = "constant";  // constant | step | cosine
  Length warmup;                  // unset: no warm-up
  Length step_size;               // step: the learning rate is multiplied by gamma every step_size
  double gamma = 0.1;
  double min_learning_rate = 0;  // cosine: the rate at the last step
};

// hyperparameters.optimizer's names (optimizer.h).
extern const std::vector<std::string> kOptimizers;

// The per-slot batch when hyperparameters.global_batch_size is not given.
constexpr int64_t kDefaultPerSlotBatch = 64;

// hyperparameters.layer_slices: auto, resolved by layer_slices_for() once the hosts are known.
constexpr int kAutoLayerSlices = 0;

struct ExperimentConfig {
  std::string name = "experiment";
  std::string description;
  // hyperparameters
  int64_t global_batch_size = 0;
  bool global_batch_defaulted = false;  // not given: kDefaultPerSlotBatch × slots, with a warning
  double learning_rate = 0.01;
  std::string optimizer = "sgd";  // sgd | adam | adamw (LibTorch's) | adadelta (adadelta.h)
  bool optimizer_given = false;   // else an entrypoint's `optimizer` attribute names it
  double momentum = 0.9;          // sgd
  bool nesterov = false;          // sgd, with momentum > 0
  double weight_decay = 0.0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  LrSchedule lr_schedule;
  std::string model = "convnet";  // convnet | mlp
  int mlp_hidden = 256;
  double dropout = 0.4;  // before the last layer, as the dataset's convnet
  // Hidden fully-connected layers computed in this many output slices
  // (model.h); kAutoLayerSlices: layer_slices_for() decides by the hosts.
  int layer_slices = kAutoLayerSlices;
  // entrypoint: the absolute path of a TorchScript module (torch.jit.save); "" = the built-in model
  std::string entrypoint;
  // resources
  int slots_per_trial = 1;
  int slots_per_host = 0;          // 0 = every slot on this host
  std::vector<std::string> hosts;  // multi-host layout; empty = this host
  // elastic: the survivors of a lost slot go on while min_slots remain; 0 = not elastic
  int elastic_min_slots = 0;
  int elastic_max_slots = 0;  // 0 = slots_per_trial
  // lengths
  Length max_length;
  std::string searcher_metric = "validation_accuracy";  // validation_accuracy | validation_loss
  bool smaller_is_better = false;                       // unless given: true for the loss, false for the accuracy
  Length min_validation_period;
  Length min_checkpoint_period;
  int64_t records_per_epoch = 0;  // 0 = the training set's size
  Optimizations optimizations;
  // checkpoint_storage (shared_fs); a relative path is under the trial's output (checkpoint_storage_dir)
  std::string checkpoint_dir;    // host_path / storage_path
  int save_trial_best = 1;       // checkpoints kept by the searcher metric
  int save_trial_latest = 1;     // checkpoints kept by recency
  int save_experiment_best = 0;  // one trial per experiment: no further effect
  int max_restarts = 5;
  uint64_t seed = 0;
  std::string network_interface;       // dtrain_network_interface
  std::string data = "fashion-mnist";  // fashion-mnist | synthetic
  std::string data_path = "/usr/share/datasets/fashion-mnist";
  // hyperparameters the trainer does not read, in the YAML's order: the name
  // under hyperparameters and the value as flow YAML ({type: const} resolved)
  std::vector<std::pair<std::string, std::string>> user_hyperparameters;

  std::vector<std::string> warnings;  // notes, then the slot-dependent ones (e.g. batch remainder)
  std::vector<std::string> notes;     // found while parsing, independent of the slot count

  bool elastic() const { return elastic_min_slots > 0; }
  int elastic_max() const { return elastic_max_slots > 0 ? elastic_max_slots : slots_per_trial; }
  int64_t per_slot_batch() const { return global_batch_size / slots_per_trial; }
  // The global batch actually trained: per-slot batch times slots.
  int64_t effective_global_batch() const { return per_slot_batch() * slots_per_trial; }
  // A length in optimizer steps; records_per_epoch must be known (> 0).
  int64_t to_batches(const Length& l, int64_t records_per_epoch) const;
};

// The slices the trial computes with: as configured, or for auto whole layers
// while every slot shares one host (the shared-memory all-reduce hides behind
// compute, and whole layers round as PyTorch does) and 16 across hosts
// (their gradient reaches a slow link block by block; fewer where the MLP's
// width allows fewer).
int layer_slices_for(const ExperimentConfig& config, int hosts);

// resources.hosts as the launcher fills them: slots_per_host each (default:
// the slots spread evenly) in list order; 1 without hosts.
int slots_per_placed_host(const ExperimentConfig& config);
int placed_hosts(const ExperimentConfig& config);

// Parses and validates; throws ConfigError listing every problem. A relative
// entrypoint is resolved against `base_dir` (the YAML's directory; "" = the
// working directory). `length_required`: no --max-batches gives the training
// length, so searcher.max_length must.
ExperimentConfig parse_config(const std::string& yaml_text, const std::string& base_dir = "",
                              bool length_required = false);
ExperimentConfig load_config(const std::string& path, bool length_required = false);

// The records an epoch counts: records_per_epoch, at most the training set's
// `training_records` (a clamp adds a line to `warnings`), or the whole set when not given.
int64_t epoch_records(const ExperimentConfig& config, int64_t training_records, std::vector<std::string>& warnings);

// Re-applies the slot-dependent checks after a flag changed slots_per_trial;
// per_slot_batch > 0 also sets the global batch to per_slot_batch * slots
// (so does a global batch not given, at kDefaultPerSlotBatch).
void set_slots(ExperimentConfig& config, int slots, int64_t per_slot_batch = 0);

// Levenshtein distance; the closest of `candidates` within a small distance, or "".
size_t edit_distance(const std::string& a, const std::string& b);
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

const char* to_string(LengthUnit u);

// checkpoint_storage's directory: an absolute one as written, a relative one
// under `output_dir` (so runs keep their checkpoints beside their metrics); "" when not set.
std::string checkpoint_storage_dir(const ExperimentConfig& config, const std::string& output_dir);

}  // namespace tandem::trainer
