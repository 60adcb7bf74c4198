// The rows of experiment_keys(), section by section. Determined's defaults
// are those of its experiment configuration schema (expconf v1).
#include "config_key_kinds.h"
#include "entrypoint.h"
#include "tandem/compression/compression.h"

namespace tandem::trainer {
namespace {

const std::string kOwn = "— (tandem's)";              // a key Determined does not have
const std::string kUserDefined = "— (user-defined)";  // a hyperparameter Determined leaves to the trial
const std::string kRequired = "required";

std::vector<ExperimentKey> top_keys() {
  return {
      text_key(
          "name", [](auto& c) -> auto& { return c.name; }, "a string", "— (generated)",
          "The run's name; the output goes to `runs/<name>` unless `--output` says otherwise."),
      text_key(
          "description", [](auto& c) -> auto& { return c.description; }, "a string", "empty", "Free text."),
      required(open_section(section_key(
                   "hyperparameters", kRequired,
                   "The trial's hyperparameters: each a value or Determined's `{type: const, val: V}`; a search "
                   "space (`int`, `double`, `log`, `categorical`) is refused, as `single` does not search. Names "
                   "outside this table are the model's own, recorded as given (below the table).")),
               "missing; give the trial's hyperparameters, e.g. {global_batch_size: 64, learning_rate: 0.01}"),
  };
}

std::vector<ExperimentKey> hyperparameter_keys() {
  const std::string hp = "hyperparameters.", sgd = "sgd";
  const std::vector<std::string> adam = {"adam", "adamw"};
  return {
      with_fallback(integer_key(
                        hp + "global_batch_size", [](auto& c) -> auto& { return c.global_batch_size; }, 1, 1 << 24,
                        "use a positive number of samples per step, e.g. 64", "— (PyTorchTrial's: required)",
                        "Samples per optimizer step over all slots; each slot trains `global_batch_size / "
                        "slots_per_trial`, the remainder dropped with a warning (Determined's rule). More slots than "
                        "samples is an error. Not given: 64 per slot, with a warning (below the table)."),
                    "64 × slots"),
      number_key(
          hp + "learning_rate", [](auto& c) -> auto& { return c.learning_rate; }, 1e-12, 100,
          "use a positive rate, e.g. 0.01", kUserDefined, "The optimizer's rate (before `lr_schedule`)."),
      choice_key(
          hp + "optimizer", [](auto& c) -> auto& { return c.optimizer; }, kOptimizers, kUserDefined,
          "LibTorch's `torch::optim` optimizer, or PyTorch's Adadelta (rho 0.9, eps 1e-6) (`trainer/optimizer.h`). "
          "Not given: an entrypoint module's `optimizer` attribute names it, else `sgd`."),
      used_only_with(number_key(
                         hp + "momentum", [](auto& c) -> auto& { return c.momentum; }, 0, 0.999999,
                         "use a value in [0, 1), e.g. 0.9", kUserDefined, "SGD's momentum."),
                     hp + "optimizer", {sgd}),
      used_only_with(bool_key(
                         hp + "nesterov", [](auto& c) -> auto& { return c.nesterov; }, kUserDefined,
                         "Nesterov momentum; needs `momentum` > 0."),
                     hp + "optimizer", {sgd}),
      number_key(
          hp + "weight_decay", [](auto& c) -> auto& { return c.weight_decay; }, 0, 1,
          "use a value in [0, 1], e.g. 0.0001", kUserDefined, "Every optimizer's (`adamw`'s too)."),
      used_only_with(number_key(
                         hp + "beta1", [](auto& c) -> auto& { return c.beta1; }, 0, 0.999999,
                         "use a value in [0, 1), e.g. 0.9", kUserDefined, "Adam's first moment decay."),
                     hp + "optimizer", adam),
      used_only_with(number_key(
                         hp + "beta2", [](auto& c) -> auto& { return c.beta2; }, 0, 0.999999,
                         "use a value in [0, 1), e.g. 0.999", kUserDefined, "Adam's second moment decay."),
                     hp + "optimizer", adam),
      used_only_with(number_key(
                         hp + "eps", [](auto& c) -> auto& { return c.eps; }, 1e-30, 1,
                         "use a small positive value, e.g. 1e-8", kUserDefined, "Adam's denominator term."),
                     hp + "optimizer", adam),
  };
}

std::vector<ExperimentKey> lr_schedule_keys() {
  const std::string at = "hyperparameters.lr_schedule";
  const std::string ls = at + ".", type = at + ".type";
  return {
      section_key(at, kUserDefined,
                  "A linear warm-up (`lr · step / warmup steps`), then the `type`'s schedule (below the table)."),
      choice_key(
          ls + "type", [](auto& c) -> auto& { return c.lr_schedule.type; }, {"constant", "step", "cosine"}, kOwn,
          "What follows the warm-up."),
      length_key(
          ls + "warmup", [](auto& c) -> auto& { return c.lr_schedule.warmup; }, kOwn,
          "The warm-up's length; none when not given."),
      used_only_with(length_key(
                         ls + "step_size", [](auto& c) -> auto& { return c.lr_schedule.step_size; }, kOwn,
                         "The rate is multiplied by `gamma` every `step_size` after the warm-up (`step` needs it)."),
                     type, {"step"}),
      used_only_with(number_key(
                         ls + "gamma", [](auto& c) -> auto& { return c.lr_schedule.gamma; }, 1e-12, 1,
                         "use a factor in (0, 1], e.g. 0.1", kOwn, "The step's factor."),
                     type, {"step"}),
      used_only_with(number_key(
                         ls + "min_learning_rate", [](auto& c) -> auto& { return c.lr_schedule.min_learning_rate; }, 0,
                         100, "use a rate below hyperparameters.learning_rate, e.g. 0", kOwn,
                         "The rate at the last step; below `learning_rate`."),
                     type, {"cosine"}),
  };
}

// layer_slices: auto, or a count of row blocks.
void read_layer_slices(const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
  if (n && n.IsScalar() && n.Scalar() == "auto") return;
  int64_t slices = 0;
  if (r.integer(n, "hyperparameters.layer_slices", slices, 1, 64,
                "use auto (the default), 1 (whole layers) or up to 64 slices per hidden fully-connected layer, e.g. 8"))
    c.layer_slices = static_cast<int>(slices);
}

std::vector<ExperimentKey> model_keys() {
  const std::string hp = "hyperparameters.";
  ExperimentKey slices = plain_key(hp + "layer_slices", "integer or auto", kOwn,
                                   "Each hidden fully-connected layer computed as that many row blocks of its weight, "
                                   "each reduced on its own (below the table).");
  slices.values = "auto, 1 – 64";
  slices.read = read_layer_slices;
  slices.show = [](const ExperimentConfig& c) {
    return c.layer_slices == kAutoLayerSlices ? std::string("auto") : std::to_string(c.layer_slices);
  };
  return {
      choice_key(
          hp + "model", [](auto& c) -> auto& { return c.model; }, {"convnet", "mlp"}, kOwn,
          "The built-in model: `convnet` (the dataset package's `benchmark/convnet.py`, 3,274,634 parameters) "
          "or `mlp`. Ignored, with a warning, under `entrypoint`."),
      integer_key(
          hp + "mlp_hidden", [](auto& c) -> auto& { return c.mlp_hidden; }, 1, 1 << 16, "use a layer width, e.g. 256",
          kOwn, "The `mlp`'s hidden width. Ignored, with a warning, under `entrypoint`."),
      number_key(
          hp + "dropout", [](auto& c) -> auto& { return c.dropout; }, 0, 0.99,
          "use a drop probability in [0, 0.99], e.g. 0.4 (0 = off)", kOwn,
          "Drop probability before the last layer (0 = off)."),
      with_fallback_shown(std::move(slices)),
  };
}

std::vector<ExperimentKey> resource_keys() {
  ExperimentKey hosts = plain_key("resources.hosts", "list of host names", kOwn,
                                  "The hosts the slots fill in order, `slots_per_host` each, placed through "
                                  "`tandem launch -H` (`--rsh`, `--store-addr` pass through).");
  hosts.read = [](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
    if (!n.IsSequence())
      return r.error("resources.hosts", "expected a list of host names, got " + ConfigReader::show(n));
    for (const auto& h : n) {
      if (!h.IsScalar()) return r.error("resources.hosts", "expected host names, got " + ConfigReader::show(h));
      c.hosts.push_back(h.Scalar());
    }
  };
  hosts.show = [](const ExperimentConfig& c) { return join(c.hosts); };
  return {
      section_key("resources", "{}", "Where the trial runs."),
      integer_key(
          "resources.slots_per_trial", [](auto& c) -> auto& { return c.slots_per_trial; }, 1, 1024,
          "use 1 to 1024 slots", "1", "Workers (ranks) training together; `--slots` overrides it."),
      with_fallback(integer_key(
                        "resources.slots_per_host", [](auto& c) -> auto& { return c.slots_per_host; }, 1, 1024,
                        "use 1 to 1024 slots", kOwn,
                        "Slots per host of a multi-host layout; a layout that could never be placed is an error."),
                    "every slot on this host"),
      with_fallback(std::move(hosts), "this host"),
      section_key("elastic", kOwn,
                  "Training goes on through a lost slot: the survivors shrink and redo the step (below the table)."),
      with_fallback(integer_key(
                        "elastic.min_slots", [](auto& c) -> auto& { return c.elastic_min_slots; }, 2, 1024,
                        "use the fewest slots the trial may go on with, at least 2, e.g. 2", kOwn,
                        "Required in `elastic`: below this many slots the trial restarts from its checkpoint "
                        "instead; at most `slots_per_trial`."),
                    "not elastic"),
      with_fallback(integer_key(
                        "elastic.max_slots", [](auto& c) -> auto& { return c.elastic_max_slots; }, 1, 1024,
                        "use at least slots_per_trial", kOwn,
                        "The most slots: slots a `--host-discovery-script` offers join the trial up to it."),
                    "slots_per_trial"),
  };
}

std::vector<ExperimentKey> searcher_keys() {
  return {
      section_key("searcher", kRequired, "How long to train, and the metric that ranks checkpoints."),
      fixed_key("searcher.name", "single", kRequired, "One trial; Determined's other searchers are refused."),
      choice_key(
          "searcher.metric", [](auto& c) -> auto& { return c.searcher_metric; },
          {"validation_accuracy", "validation_loss"}, kRequired,
          "The metric that ranks checkpoints for `save_trial_best`."),
      with_fallback(length_key(
                        "searcher.max_length", [](auto& c) -> auto& { return c.max_length; },
                        "— (deprecated in 0.38: the training code's)",
                        "How long to train (`--max-batches` overrides it). Without it the entrypoint's `--epochs N` "
                        "or `--batches N` gives the length, else `--max-batches`; with none, `tandem train` stops "
                        "before training and says so."),
                    "--max-batches"),
      with_fallback(bool_key(
                        "searcher.smaller_is_better", [](auto& c) -> auto& { return c.smaller_is_better; }, "true",
                        "The metric's direction. tandem's default metric is the accuracy, so when not given it "
                        "follows the metric."),
                    "true for validation_loss, false for validation_accuracy"),
  };
}

std::vector<ExperimentKey> period_keys() {
  return {
      length_key(
          "min_validation_period", [](auto& c) -> auto& { return c.min_validation_period; }, "{batches: 0}",
          "Validate over the whole test set this often (and after the last batch)."),
      with_fallback(length_key(
                        "min_checkpoint_period", [](auto& c) -> auto& { return c.min_checkpoint_period; },
                        "{batches: 0}", "Checkpoint this often (and after the last batch)."),
                    "as min_validation_period"),
      with_fallback(integer_key(
                        "records_per_epoch", [](auto& c) -> auto& { return c.records_per_epoch; }, 1, int64_t{1} << 40,
                        "use the number of training records per epoch, e.g. 60000", "0",
                        "Records an epoch counts, for lengths in epochs and the epoch order."),
                    "the training set's size"),
  };
}

// optimizations.gradient_compression: Determined's boolean (true = fp16) or the codec's name.
void read_gradient_compression(const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
  if (!n || n.IsNull()) return;
  const auto codec = n.IsScalar() ? compression::parse_codec(n.Scalar()) : std::nullopt;
  if (codec)
    c.optimizations.gradient_compression = std::string(compression::to_string(*codec));
  else
    r.error("optimizations.gradient_compression",
            ConfigReader::show(n) + " is not a codec; use true (fp16), fp16, bf16, false or none");
}

void read_mixed_precision(const YAML::Node& n, ConfigReader& r, ExperimentConfig&) {
  std::string level;
  if (r.text(n, "optimizations.mixed_precision", level, "an apex level (O0)") && level != "O0")
    r.error("optimizations.mixed_precision", "'" + level +
                                                 "': automatic mixed precision (AMP) is not implemented for CPU "
                                                 "training; use O0 (full precision) or remove the key");
}

std::vector<ExperimentKey> optimization_keys() {
  const std::string o = "optimizations.";
  ExperimentKey compression = plain_key(o + "gradient_compression", "true/false or codec", "false",
                                        "f32 gradients travel in 16 bits through `compression::CompressedAllreduce` "
                                        "(f32 accumulation, fp16's range scale, inf/NaN fallback).");
  compression.values = "true (= fp16), fp16, bf16, false, none";
  compression.read = read_gradient_compression;
  compression.show = [](const ExperimentConfig& c) { return c.optimizations.gradient_compression; };
  ExperimentKey mixed = plain_key(o + "mixed_precision", "name", "O0",
                                  "Only `O0`: automatic mixed precision is not implemented for CPU training.");
  mixed.values = "O0";
  mixed.read = read_mixed_precision;
  mixed.show = [](const ExperimentConfig&) { return std::string("O0"); };
  return {
      section_key("optimizations", "{}", "How gradients are exchanged."),
      integer_key(
          o + "aggregation_frequency", [](auto& c) -> auto& { return c.optimizations.aggregation_frequency; }, 1, 1024,
          "use 1 (communicate every batch) or more batches per communication", "1",
          "Backward passes per communication: k accumulate locally, the k-th communicates."),
      bool_key(
          o + "average_aggregated_gradients",
          [](auto& c) -> auto& { return c.optimizations.average_aggregated_gradients; }, "true",
          "Divide aggregated gradients by `aggregation_frequency`."),
      bool_key(
          o + "average_training_metrics", [](auto& c) -> auto& { return c.optimizations.average_training_metrics; },
          "false",
          "Loss and accuracy averaged exactly over the slots (they travel in the last bucket); "
          "otherwise the chief's own."),
      with_fallback_shown(std::move(compression)),
      number_key(
          o + "gradient_predivide_factor", [](auto& c) -> auto& { return c.optimizations.gradient_predivide_factor; },
          1e-6, 1e6, "use a positive factor, e.g. 1.0 (divide before summing, the rest after)", "— (Horovod's: 1)",
          "Compressed gradients are divided by it before the sum and multiplied back after; without compression "
          "it changes nothing (a warning says so)."),
      bool_key(
          o + "error_feedback", [](auto& c) -> auto& { return c.optimizations.error_feedback; }, kOwn,
          "What rounding to 16 bits dropped is sent with the next step; needs `gradient_compression`."),
      bool_key(
          o + "auto_tune_tensor_fusion", [](auto& c) -> auto& { return c.optimizations.auto_tune_tensor_fusion; },
          "false", "Bayesian autotune of the bucket size (trials in `autotune.jsonl`)."),
      integer_key(
          o + "tensor_fusion_threshold", [](auto& c) -> auto& { return c.optimizations.tensor_fusion_threshold_mb; }, 1,
          4096, "use megabytes per fused bucket, 1 to 4096 (Determined's default 64)", "64", "The bucket cap, MB."),
      noted(integer_key(
                o + "tensor_fusion_cycle_time",
                [](auto& c) -> auto& { return c.optimizations.tensor_fusion_cycle_time_ms; }, 1, 10000,
                "use milliseconds, 1 to 10000 (Determined's default 1)", "1", "Milliseconds."),
            "Horovod's cycle time batches the tensors ready within it; tandem launches a bucket as soon as it is "
            "full or backward ends, so the value only bounds the idle engine's sleep"),
      with_fallback_shown(std::move(mixed)),
  };
}

// checkpoint_storage.host_path, then storage_path below it: the checkpoint directory.
void read_storage_path(const YAML::Node& n, ConfigReader& r, ExperimentConfig& c, const std::string& key) {
  std::string dir;
  if (!r.text(n, "checkpoint_storage." + key, dir, "a directory")) return;
  if (key == "host_path")
    c.checkpoint_dir = dir;
  else if (!dir.empty())
    c.checkpoint_dir += (c.checkpoint_dir.empty() ? "" : "/") + dir;
}

std::vector<ExperimentKey> storage_keys() {
  const std::string cs = "checkpoint_storage.", keep = "use a count of checkpoints, e.g. 1";
  std::vector<ExperimentKey> paths;
  for (const std::string name : {"host_path", "storage_path"}) {
    ExperimentKey k = plain_key(cs + name, "string", kRequired,
                                name == "host_path" ? "The checkpoint directory (relative: under `--output`); "
                                                      "needed with `type`."
                                                    : "A directory below `host_path`.");
    k.read = [name](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) { read_storage_path(n, r, c, name); };
    k.show = [](const ExperimentConfig& c) { return c.checkpoint_dir; };
    k.fallback = name == "host_path" ? "checkpoints under --output" : "";
    if (name == "storage_path") k.determined = "—";
    paths.push_back(std::move(k));
  }
  return {
      section_key("checkpoint_storage", "the cluster's", "Where checkpoints go and which are kept."),
      fixed_key(cs + "type", "shared_fs", kRequired, "A directory on this host (or a shared file system)."),
      std::move(paths[0]),
      std::move(paths[1]),
      integer_key(
          cs + "save_trial_latest", [](auto& c) -> auto& { return c.save_trial_latest; }, 0, 1 << 20, keep, "1",
          "The newest checkpoints kept."),
      integer_key(
          cs + "save_trial_best", [](auto& c) -> auto& { return c.save_trial_best; }, 0, 1 << 20, keep, "1",
          "The best checkpoints by `searcher.metric` kept; the newest complete one is always kept."),
      integer_key(
          cs + "save_experiment_best", [](auto& c) -> auto& { return c.save_experiment_best; }, 0, 1 << 20, keep, "0",
          "An experiment is one trial: above `save_trial_best` it has no further effect (a warning says so)."),
      integer_key(
          "max_restarts", [](auto& c) -> auto& { return c.max_restarts; }, 0, 1000,
          "use 0 (never restart) to 1000; Determined's default is 5", "5",
          "Restarts of a failed trial from its newest checkpoint; in an elastic trial also the lost slots each "
          "attempt replaces by a process that joins it."),
      section_key("reproducibility", "{}", "Seeds."),
      integer_key(
          "reproducibility.experiment_seed", [](auto& c) -> auto& { return c.seed; }, 0, (int64_t{1} << 31) - 1,
          "use 0 to 2147483647", "— (drawn)", "Model initialisation, epoch order and dropout follow from it."),
      text_key(
          "dtrain_network_interface", [](auto& c) -> auto& { return c.network_interface; },
          "an interface name or list (eth0, ^docker, =eth0)", "— (chosen)",
          "The slots' interface, as `TANDEM_NETWORK_INTERFACE` (`--dtrain-network-interface`, then the "
          "environment, then this key)."),
  };
}

// Determined's cluster, container and web UI keys: no counterpart in tandem.
std::vector<ExperimentKey> ignored_keys() {
  const std::string no_container = "tandem runs each slot as a process on its host, not in a container";
  return {
      ignored_key("environment", "{} (the default images)",
                  no_container + "; set variables in the shell that runs tandem train"),
      ignored_key("bind_mounts", "[]", no_container + ", which sees the host's file system as it is"),
      ignored_key("resources.shm_size", "— (the cluster's)", no_container + ", which uses the host's /dev/shm"),
      ignored_key("debug", "false", "it turns on Determined's master and agent debug logs; tandem has neither"),
      ignored_key("checkpoint_policy", "best",
                  "tandem checkpoints every min_checkpoint_period and keeps them by checkpoint_storage's counts"),
      ignored_key("scheduling_unit", "100", "it sets how often Determined's master hears from a trial"),
      ignored_key("profiling", "{enabled: false}",
                  "it drives Determined's profiler; tandem's trace of each slot is tandem train --timeline"),
      ignored_key("labels", "[]", "they tag the experiment in Determined's web UI"),
      ignored_key("workspace", "— (Uncategorized)", "it files the experiment in Determined's web UI"),
      ignored_key("project", "— (Uncategorized)", "it files the experiment in Determined's web UI"),
  };
}

std::vector<ExperimentKey> data_keys() {
  const std::vector<std::string> kinds = {"fashion-mnist", "synthetic"};
  ExperimentKey data =
      section_key("data", "{} (user-defined)", "The training data: a map, or its `type` alone (`data: synthetic`).");
  data.read = [kinds](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
    r.choice(n, "data", c.data, kinds);
  };
  return {
      std::move(data),
      choice_key(
          "data.type", [](auto& c) -> auto& { return c.data; }, kinds, kOwn,
          "`fashion-mnist` (the IDX files of `dataset-fashion-mnist`, read by tandem's loader) or `synthetic` "
          "(the same shape; tells data loading apart from communication)."),
      text_key(
          "data.path", [](auto& c) -> auto& { return c.data_path; }, "a directory", kOwn, "The IDX files' directory."),
      ignored_key("data.url", "— (user-defined)",
                  "tandem downloads nothing: it reads the IDX files at data.path (dataset-fashion-mnist's by default)"),
  };
}

ExperimentKey entrypoint_key() {
  ExperimentKey k = plain_key("entrypoint", "TorchScript file [--epochs N | --batches N]",
                              "required (module:TrialClass or a command)",
                              "A module saved with `torch.jit.save`, relative to the YAML's directory, then the "
                              "training length as a 0.38 training script takes it (below the table); Determined's "
                              "`module:TrialClass` form and Python commands are refused, saying how to export.");
  k.read = read_entrypoint;
  k.show = [](const ExperimentConfig& c) { return c.entrypoint; };
  k.fallback = "the built-in model";
  return k;
}

}  // namespace

const std::vector<ExperimentKey>& experiment_keys() {
  static const std::vector<ExperimentKey> keys = [] {
    std::vector<ExperimentKey> all;
    for (auto part : {top_keys, hyperparameter_keys, lr_schedule_keys, model_keys, resource_keys, searcher_keys,
                      period_keys, optimization_keys, storage_keys, data_keys, ignored_keys})
      for (auto& k : part()) all.push_back(std::move(k));
    all.push_back(entrypoint_key());
    return all;
  }();
  return keys;
}

std::vector<const ExperimentKey*> keys_under(const std::string& section) {
  std::vector<const ExperimentKey*> out;
  for (const auto& k : experiment_keys())
    if (k.parent() == section) out.push_back(&k);
  return out;
}

}  // namespace tandem::trainer
