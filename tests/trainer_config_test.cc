// The experiment configuration: every bad key or value names the key, the
// value and the fix; per-slot batch arithmetic; layouts; and the pieces of
// the trainer that need no LibTorch (batch plan, checkpoints, metrics); and
// an entrypoint's attributes set from the hyperparameters.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <sstream>

#include "checkpoint.h"
#include "config.h"
#include "config_keys.h"
#include "data.h"
#include "driver.h"
#include "metrics.h"
#include "model.h"

namespace tandem::trainer {
namespace {

const std::string kBase = R"(
name: t
hyperparameters: {global_batch_size: 64, learning_rate: 0.01, model: convnet}
resources: {slots_per_trial: 2}
searcher: {name: single, metric: validation_accuracy, max_length: {batches: 100}}
)";

std::string error_of(const std::string& yaml) {
  try {
    parse_config(yaml);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// Expects parse_config to fail with a message containing every fragment.
void expect_error(const std::string& yaml, std::initializer_list<std::string> fragments) {
  const std::string msg = error_of(yaml);
  ASSERT_FALSE(msg.empty()) << "accepted:\n" << yaml;
  for (const auto& f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "'" << f << "' not in: " << msg;
}

TEST(TrainerConfig, ValidExampleParses) {
  auto c = parse_config(kBase);
  EXPECT_EQ(c.global_batch_size, 64);
  EXPECT_EQ(c.slots_per_trial, 2);
  EXPECT_EQ(c.per_slot_batch(), 32);
  EXPECT_EQ(c.max_length.value, 100);
  EXPECT_EQ(c.max_restarts, 5);  // Determined's default
  EXPECT_TRUE(c.warnings.empty());
  auto example = load_config(std::string(TANDEM_SOURCE_DIR) + "/trainer/examples/fashion_mnist.yaml");
  EXPECT_EQ(example.slots_per_trial, 2);
  EXPECT_EQ(example.checkpoint_dir, "checkpoints/fashion-mnist-convnet");
  EXPECT_EQ(checkpoint_storage_dir(example, "/runs/exp"), "/runs/exp/checkpoints/fashion-mnist-convnet");
}

TEST(TrainerConfig, CheckpointStorageIsUnderTheOutputUnlessAbsolute) {
  auto absolute =
      parse_config(kBase + "checkpoint_storage: {type: shared_fs, host_path: /mnt/ckpt, storage_path: exp}\n");
  EXPECT_EQ(absolute.checkpoint_dir, "/mnt/ckpt/exp");
  EXPECT_EQ(checkpoint_storage_dir(absolute, "/runs/exp"), "/mnt/ckpt/exp");
  auto relative = parse_config(kBase + "checkpoint_storage: {type: shared_fs, host_path: ckpt}\n");
  EXPECT_EQ(checkpoint_storage_dir(relative, "/runs/exp"), "/runs/exp/ckpt");
  EXPECT_EQ(checkpoint_storage_dir(parse_config(kBase), "/runs/exp"), "");  // the driver then uses <output>/checkpoints
  expect_error(kBase + "checkpoint_storage: {type: shared_fs}\n", {"checkpoint_storage.host_path", "missing"});
}

TEST(TrainerConfig, UnknownKeysGetDidYouMean) {
  expect_error(kBase + "max_restart: 3\n", {"max_restart: unknown key", "did you mean 'max_restarts'?"});
  expect_error(kBase + "optimizations: {agregation_frequency: 2}\n",
               {"optimizations.agregation_frequency", "did you mean 'aggregation_frequency'?"});
  // A hyperparameter outside the table is the model's own: a near miss of a known one is noted, not refused.
  const auto typo = parse_config("hyperparameters: {global_batch_size: 64, learning_rat: 0.1}\n");
  ASSERT_EQ(typo.warnings.size(), 1u);
  EXPECT_NE(
      typo.warnings[0].find("hyperparameters.learning_rat is not one tandem reads (did you mean 'learning_rate'?)"),
      std::string::npos)
      << typo.warnings[0];
  EXPECT_DOUBLE_EQ(typo.learning_rate, 0.01);
  expect_error(kBase + "zzzz: 1\n", {"zzzz: unknown key (valid here:"});
}

TEST(TrainerConfig, BadValuesNameKeyValueAndFix) {
  expect_error(R"(
hyperparameters: {global_batch_size: -4}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.global_batch_size", "'-4' is out of range", "e.g. 64"});
  expect_error(R"(
hyperparameters: {global_batch_size: lots}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.global_batch_size", "'lots' is not an integer"});
  expect_error(kBase + "data: fashion_mnist\n", {"data: unknown value 'fashion_mnist'", "did you mean 'fashion-mnist'?",
                                                 "valid: fashion-mnist, synthetic"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64, model: resnet}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.model", "'resnet'", "valid: convnet, mlp"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64, layer_slices: 0}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.layer_slices", "'0' is out of range", "e.g. 8"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64, model: mlp, mlp_hidden: 8, layer_slices: 16}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.layer_slices", "16 slices of a 8-wide layer", "use at most 4"});
  expect_error(kBase + "optimizations: {gradient_compression: fp8}\n",
               {"optimizations.gradient_compression", "'fp8' is not a codec", "use true (fp16), fp16, bf16"});
  expect_error(kBase + "optimizations: {aggregation_frequency: 0}\n",
               {"optimizations.aggregation_frequency", "'0' is out of range", "use 1"});
  expect_error(kBase + "optimizations: {tensor_fusion_threshold: 0}\n",
               {"optimizations.tensor_fusion_threshold", "megabytes"});
  expect_error(kBase + "optimizations: {average_training_metrics: maybe}\n",
               {"optimizations.average_training_metrics", "'maybe' is not true or false"});
  expect_error(kBase + "optimizations: {error_feedback: true}\n",
               {"optimizations.error_feedback", "gradient_compression: fp16 or bf16"});
  expect_error(kBase + "max_restarts: -1\n", {"max_restarts", "'-1' is out of range", "Determined's default is 5"});
  expect_error(kBase + "min_validation_period: {batches: 10, epochs: 1}\n", {"min_validation_period", "not several"});
  expect_error(kBase + "min_validation_period: {bathces: 10}\n",
               {"min_validation_period.bathces", "did you mean 'batches'?"});
  expect_error(kBase + "checkpoint_storage: {type: s3}\n", {"checkpoint_storage.type", "'s3'", "valid: shared_fs"});
  expect_error(kBase + "reproducibility: {experiment_seed: 1.5}\n",
               {"reproducibility.experiment_seed", "'1.5' is not an integer"});
  expect_error("hyperparameters: 3\nsearcher: {max_length: {batches: 1}}\n",
               {"hyperparameters: expected a map of keys, got '3'"});
  expect_error(kBase + "max_restarts: 1\nmax_restarts: 2\n", {"max_restarts: given twice", "keep one"});
  expect_error("name: [unclosed\n", {"not valid YAML"});
}

// One row per key parse_config knows: a YAML snippet and either the field it sets or the text of the
// error or warning naming the key. Every known key must have a row.
struct KeyRow {
  std::string section, key;
  std::string kv;  // "key: value" inside the section; the whole document when `raw`
  bool raw = false;
  std::function<void(const ExperimentConfig&)> check;  // when accepted
  std::string message;                                 // else: an error or warning holding it (and the key)
};

std::string document(const KeyRow& row) {
  if (row.raw) return row.kv;
  std::string hp = "global_batch_size: 64", searcher = "name: single, max_length: {batches: 100}", extra;
  if (row.section == "hyperparameters")
    hp += ", " + row.kv;
  else if (row.section == "hyperparameters.lr_schedule")
    hp += ", lr_schedule: {" + row.kv + "}";
  else if (row.section == "searcher")
    searcher += ", " + row.kv;
  else if (row.section.empty())
    extra = row.kv + "\n";
  else
    extra = row.section + ": {" + row.kv + "}\n";
  return "hyperparameters: {" + hp + "}\nsearcher: {" + searcher + "}\n" + extra;
}

using C = const ExperimentConfig&;
const std::string kMinimal = "hyperparameters: {global_batch_size: 64}\nsearcher: {max_length: {batches: 100}}\n";

std::vector<KeyRow> key_rows() {
  return {
      {"", "name", "name: mnist", false, [](C c) { EXPECT_EQ(c.name, "mnist"); }, ""},
      {"", "description", "description: a run", false, [](C c) { EXPECT_EQ(c.description, "a run"); }, ""},
      {"", "hyperparameters", kMinimal, true, [](C c) { EXPECT_EQ(c.global_batch_size, 64); }, ""},
      {"", "resources", "resources: {slots_per_trial: 4}", false, [](C c) { EXPECT_EQ(c.slots_per_trial, 4); }, ""},
      {"", "searcher", kMinimal, true, [](C c) { EXPECT_EQ(c.max_length.value, 100); }, ""},
      {"", "min_validation_period", "min_validation_period: {records: 640}", false,
       [](C c) {
         EXPECT_EQ(c.min_validation_period.unit, LengthUnit::records);
         EXPECT_EQ(c.min_validation_period.value, 640);
       },
       ""},
      {"", "min_checkpoint_period", "min_checkpoint_period: {epochs: 2}", false,
       [](C c) {
         EXPECT_EQ(c.min_checkpoint_period.unit, LengthUnit::epochs);
         EXPECT_EQ(c.min_checkpoint_period.value, 2);
       },
       ""},
      {"", "records_per_epoch", "records_per_epoch: 6400", false, [](C c) { EXPECT_EQ(c.records_per_epoch, 6400); },
       ""},
      {"", "optimizations", "optimizations: {}", false,
       [](C c) { EXPECT_EQ(c.optimizations.aggregation_frequency, 1); }, ""},
      {"", "checkpoint_storage", "checkpoint_storage: {host_path: /ck}", false,
       [](C c) { EXPECT_EQ(c.checkpoint_dir, "/ck"); }, ""},
      {"", "max_restarts", "max_restarts: 0", false, [](C c) { EXPECT_EQ(c.max_restarts, 0); }, ""},
      {"", "reproducibility", "reproducibility: {experiment_seed: 9}", false, [](C c) { EXPECT_EQ(c.seed, 9u); }, ""},
      {"", "dtrain_network_interface", "dtrain_network_interface: eth1", false,
       [](C c) { EXPECT_EQ(c.network_interface, "eth1"); }, ""},
      {"", "data", "data: synthetic", false, [](C c) { EXPECT_EQ(c.data, "synthetic"); }, ""},
      {"", "entrypoint", "entrypoint: model_def:MNistTrial", false, nullptr,
       "Determined's module:TrialClass form; tandem trains TorchScript models"},
      {"hyperparameters", "global_batch_size",
       "hyperparameters: {global_batch_size: 96}\nsearcher: {max_length: {batches: 1}}\n", true,
       [](C c) { EXPECT_EQ(c.global_batch_size, 96); }, ""},
      {"hyperparameters", "learning_rate", "learning_rate: 0.5", false, [](C c) { EXPECT_EQ(c.learning_rate, 0.5); },
       ""},
      {"hyperparameters", "optimizer", "optimizer: adadelta", false,
       [](C c) {
         EXPECT_EQ(c.optimizer, "adadelta");
         EXPECT_TRUE(c.optimizer_given);
       },
       ""},
      {"hyperparameters", "momentum", "optimizer: adam, momentum: 0.9", false, nullptr,
       "set, but only optimizer sgd uses it (optimizer is adam); remove it or set hyperparameters.optimizer: sgd"},
      {"hyperparameters", "nesterov", "nesterov: true, momentum: 0", false, nullptr, "'true' needs momentum > 0"},
      {"hyperparameters", "weight_decay", "weight_decay: 0.001", false, [](C c) { EXPECT_EQ(c.weight_decay, 0.001); },
       ""},
      {"hyperparameters", "beta1", "beta1: 0.8", false, nullptr,
       "set, but only optimizer adam or adamw uses it (optimizer is sgd)"},
      {"hyperparameters", "beta2", "optimizer: adam, beta2: 0.99", false, [](C c) { EXPECT_EQ(c.beta2, 0.99); }, ""},
      {"hyperparameters", "eps", "optimizer: adam, eps: 1e-6", false, [](C c) { EXPECT_EQ(c.eps, 1e-6); }, ""},
      {"hyperparameters", "lr_schedule", "lr_schedule: {type: cosine}", false,
       [](C c) { EXPECT_EQ(c.lr_schedule.type, "cosine"); }, ""},
      {"hyperparameters", "model", "model: mlp", false, [](C c) { EXPECT_EQ(c.model, "mlp"); }, ""},
      {"hyperparameters", "mlp_hidden", "mlp_hidden: 128", false, [](C c) { EXPECT_EQ(c.mlp_hidden, 128); }, ""},
      {"hyperparameters", "dropout", "dropout: 0", false, [](C c) { EXPECT_EQ(c.dropout, 0); }, ""},
      {"hyperparameters", "layer_slices", "layer_slices: 4", false, [](C c) { EXPECT_EQ(c.layer_slices, 4); }, ""},
      {"hyperparameters.lr_schedule", "type", "type: step, step_size: {epochs: 1}", false,
       [](C c) {
         EXPECT_EQ(c.lr_schedule.type, "step");
         EXPECT_EQ(c.lr_schedule.step_size.unit, LengthUnit::epochs);
       },
       ""},
      {"hyperparameters.lr_schedule", "warmup", "warmup: {batches: 50}", false,
       [](C c) { EXPECT_EQ(c.lr_schedule.warmup.value, 50); }, ""},
      {"hyperparameters.lr_schedule", "step_size", "type: cosine, step_size: {batches: 5}", false, nullptr,
       "step_size: set, but only type step uses it (type is cosine)"},
      {"hyperparameters.lr_schedule", "gamma", "type: step, step_size: {batches: 5}, gamma: 0.5", false,
       [](C c) { EXPECT_EQ(c.lr_schedule.gamma, 0.5); }, ""},
      {"hyperparameters.lr_schedule", "min_learning_rate", "type: cosine, min_learning_rate: 0.001", false,
       [](C c) { EXPECT_EQ(c.lr_schedule.min_learning_rate, 0.001); }, ""},
      {"resources", "slots_per_trial", "slots_per_trial: 8", false, [](C c) { EXPECT_EQ(c.slots_per_trial, 8); }, ""},
      {"resources", "slots_per_host", "slots_per_trial: 4, slots_per_host: 2", false,
       [](C c) { EXPECT_EQ(c.slots_per_host, 2); }, ""},
      {"resources", "hosts", "slots_per_trial: 2, hosts: [a, b]", false,
       [](C c) {
         EXPECT_EQ(c.hosts, (std::vector<std::string>{"a", "b"}));
       },
       ""},
      {"", "elastic", kMinimal + "resources: {slots_per_trial: 3}\nelastic: {min_slots: 2, max_slots: 4}\n", true,
       [](C c) {
         EXPECT_EQ(c.elastic_min_slots, 2);
         EXPECT_EQ(c.elastic_max(), 4);
       },
       ""},
      {"elastic", "min_slots", "max_slots: 2", false, nullptr,
       "missing; give the fewest slots the trial may go on with"},
      {"elastic", "max_slots", kMinimal + "resources: {slots_per_trial: 4}\nelastic: {min_slots: 3, max_slots: 3}\n",
       true, nullptr, "elastic.min_slots 3 <= slots 4 <= elastic.max_slots 3 does not hold"},
      {"searcher", "name",
       "hyperparameters: {global_batch_size: 64}\nsearcher: {name: adaptive_asha, max_length: {batches: 1}}\n", true,
       nullptr, "searcher.name: unknown value 'adaptive_asha'"},
      {"searcher", "metric", "metric: validation_loss", false,
       [](C c) {
         EXPECT_EQ(c.searcher_metric, "validation_loss");
         EXPECT_TRUE(c.smaller_is_better);
       },
       ""},
      {"searcher", "max_length", "hyperparameters: {global_batch_size: 64}\nsearcher: {max_length: {epochs: 3}}\n",
       true,
       [](C c) {
         EXPECT_EQ(c.max_length.unit, LengthUnit::epochs);
         EXPECT_EQ(c.max_length.value, 3);
       },
       ""},
      {"searcher", "smaller_is_better", "smaller_is_better: true", false,
       [](C c) {
         EXPECT_EQ(c.searcher_metric, "validation_accuracy");
         EXPECT_TRUE(c.smaller_is_better);
       },
       ""},
      {"optimizations", "aggregation_frequency", "aggregation_frequency: 4", false,
       [](C c) { EXPECT_EQ(c.optimizations.aggregation_frequency, 4); }, ""},
      {"optimizations", "average_aggregated_gradients", "average_aggregated_gradients: false", false,
       [](C c) { EXPECT_FALSE(c.optimizations.average_aggregated_gradients); }, ""},
      {"optimizations", "average_training_metrics", "average_training_metrics: false", false,
       [](C c) { EXPECT_FALSE(c.optimizations.average_training_metrics); }, ""},
      {"optimizations", "gradient_compression", "gradient_compression: true", false,
       [](C c) { EXPECT_EQ(c.optimizations.gradient_compression, "fp16"); }, ""},
      {"optimizations", "gradient_predivide_factor", "gradient_predivide_factor: 2", false, nullptr,
       "acts only on compressed gradients"},
      {"optimizations", "error_feedback", "gradient_compression: bf16, error_feedback: true", false,
       [](C c) { EXPECT_TRUE(c.optimizations.error_feedback); }, ""},
      {"optimizations", "auto_tune_tensor_fusion", "auto_tune_tensor_fusion: true", false,
       [](C c) { EXPECT_TRUE(c.optimizations.auto_tune_tensor_fusion); }, ""},
      {"optimizations", "tensor_fusion_threshold", "tensor_fusion_threshold: 16", false,
       [](C c) { EXPECT_EQ(c.optimizations.tensor_fusion_threshold_mb, 16); }, ""},
      {"optimizations", "tensor_fusion_cycle_time", "tensor_fusion_cycle_time: 20", false, nullptr,
       "only bounds the idle engine's sleep"},
      {"optimizations", "mixed_precision", "mixed_precision: O1", false, nullptr,
       "'O1': automatic mixed precision (AMP) is not implemented for CPU training"},
      {"checkpoint_storage", "type", "type: shared_fs, host_path: ck", false,
       [](C c) { EXPECT_EQ(c.checkpoint_dir, "ck"); }, ""},
      {"checkpoint_storage", "host_path", "host_path: /data", false, [](C c) { EXPECT_EQ(c.checkpoint_dir, "/data"); },
       ""},
      {"checkpoint_storage", "storage_path", "host_path: /data, storage_path: exp", false,
       [](C c) { EXPECT_EQ(c.checkpoint_dir, "/data/exp"); }, ""},
      {"checkpoint_storage", "save_trial_latest", "save_trial_latest: 3", false,
       [](C c) { EXPECT_EQ(c.save_trial_latest, 3); }, ""},
      {"checkpoint_storage", "save_trial_best", "save_trial_best: 2", false,
       [](C c) { EXPECT_EQ(c.save_trial_best, 2); }, ""},
      {"checkpoint_storage", "save_experiment_best", "save_experiment_best: 5", false, nullptr,
       "save_experiment_best 5 has no further effect"},
      {"reproducibility", "experiment_seed", "experiment_seed: 77", false, [](C c) { EXPECT_EQ(c.seed, 77u); }, ""},
      {"data", "type", "type: synthetic", false, [](C c) { EXPECT_EQ(c.data, "synthetic"); }, ""},
      {"data", "path", "path: /d", false, [](C c) { EXPECT_EQ(c.data_path, "/d"); }, ""},
      {"data", "url", "url: https://example.org/mnist.tar.gz", false, nullptr, "ignored: tandem downloads nothing"},
      {"", "environment", "environment: {image: determinedai/pytorch-ngc:0.38.0}", false, nullptr,
       "ignored: tandem runs each slot as a process"},
      {"", "bind_mounts", "bind_mounts: [{host_path: /data, container_path: /data}]", false, nullptr,
       "ignored: tandem runs each slot as a process"},
      {"resources", "shm_size", "shm_size: 4G", false, nullptr, "ignored: tandem runs each slot as a process"},
      {"", "debug", "debug: true", false, nullptr, "ignored: it turns on Determined's master and agent debug logs"},
      {"", "checkpoint_policy", "checkpoint_policy: all", false, nullptr, "ignored: tandem checkpoints every"},
      {"", "scheduling_unit", "scheduling_unit: 50", false, nullptr, "ignored: it sets how often"},
      {"", "profiling", "profiling: {enabled: true}", false, nullptr, "ignored: it drives Determined's profiler"},
      {"", "labels", "labels: [mnist, const]", false, nullptr, "ignored: they tag the experiment"},
      {"", "workspace", "workspace: research", false, nullptr, "ignored: it files the experiment"},
      {"", "project", "project: mnist", false, nullptr, "ignored: it files the experiment"},
  };
}

// layer_slices: auto (the default) is whole layers on one host and 16 slices
// across hosts, fewer where the MLP's width allows fewer; a number is kept.
TEST(TrainerConfig, LayerSlicesAutoFollowsTheHosts) {
  const ExperimentConfig deflt = parse_config(kBase);
  EXPECT_EQ(deflt.layer_slices, kAutoLayerSlices);
  const ExperimentConfig autos = parse_config(R"(
hyperparameters: {global_batch_size: 64, layer_slices: auto}
searcher: {max_length: {batches: 10}}
)");
  EXPECT_EQ(autos.layer_slices, kAutoLayerSlices);
  EXPECT_EQ(layer_slices_for(autos, 1), 1);
  EXPECT_EQ(layer_slices_for(autos, 2), 16);
  const ExperimentConfig narrow = parse_config(R"(
hyperparameters: {global_batch_size: 64, model: mlp, mlp_hidden: 8}
searcher: {max_length: {batches: 10}}
)");
  EXPECT_EQ(layer_slices_for(narrow, 3), 4);
  const ExperimentConfig fixed = parse_config(R"(
hyperparameters: {global_batch_size: 64, layer_slices: 4}
searcher: {max_length: {batches: 10}}
)");
  EXPECT_EQ(layer_slices_for(fixed, 1), 4);
  EXPECT_EQ(layer_slices_for(fixed, 2), 4);
  expect_error(R"(
hyperparameters: {global_batch_size: 64, layer_slices: many}
searcher: {max_length: {batches: 10}}
)",
               {"hyperparameters.layer_slices", "'many' is not an integer"});
}

TEST(TrainerConfig, EveryKnownKeyIsHonouredOrRefusedByName) {
  const auto rows = key_rows();
  for (const auto& key : experiment_keys()) {
    const bool has_row = std::any_of(rows.begin(), rows.end(), [&](const KeyRow& r) {
      return (r.section.empty() ? "" : r.section + ".") + r.key == key.path;
    });
    EXPECT_TRUE(has_row) << "no row for the key '" << key.path << "'";
  }
  for (const auto& row : rows) {
    const std::string full = (row.section.empty() ? "" : row.section + ".") + row.key, yaml = document(row);
    SCOPED_TRACE(full + " in:\n" + yaml);
    std::string text;
    try {
      const auto c = parse_config(yaml);
      if (row.check) row.check(c);
      for (const auto& w : c.warnings) text += w + "\n";
    } catch (const ConfigError& e) {
      EXPECT_FALSE(row.check) << "refused: " << e.what();
      text = e.what();
    }
    if (row.message.empty()) continue;
    EXPECT_NE(text.find(full), std::string::npos) << "the key is not named: " << text;
    EXPECT_NE(text.find(row.message), std::string::npos) << text;
  }
}

// elastic against the slots it starts with, --slots included, on one host or across resources.hosts.
TEST(TrainerConfig, ElasticNeedsSlotsBetweenItsBounds) {
  const std::string three = kMinimal + "resources: {slots_per_trial: 3}\n";
  EXPECT_FALSE(parse_config(kMinimal).elastic());
  auto c = parse_config(three + "elastic: {min_slots: 2}\n");
  EXPECT_EQ(c.elastic_max(), 3);  // max_slots defaults to the slots
  set_slots(c, 2);
  EXPECT_EQ(c.elastic_max(), 2);
  EXPECT_THROW(set_slots(c, 1), ConfigError);  // below min_slots
  expect_error(three + "elastic: {min_slots: 1}\n", {"elastic.min_slots", "'1' is out of range", "at least 2"});
  expect_error(three + "elastic: {min_slots: 4}\n", {"elastic.min_slots 4 <= slots 3"});
  expect_error(three + "elastic: {}\n", {"elastic.min_slots: missing"});
  const auto example = load_config(std::string(TANDEM_SOURCE_DIR) + "/trainer/examples/fashion_mnist_elastic.yaml");
  EXPECT_EQ(example.elastic_min_slots, 3);
  EXPECT_EQ(example.elastic_max(), 4);
  const auto across =
      parse_config(kMinimal + "resources: {slots_per_trial: 4, hosts: [a, b]}\nelastic: {min_slots: 3}\n");
  EXPECT_EQ(across.elastic_min_slots, 3);
  EXPECT_EQ(placed_hosts(across), 2);
}

// The hosts the launcher fills, which an elastic trial's layer slicing follows
// (a joiner's grown communicator may span fewer).
TEST(TrainerConfig, PlacedHostsFollowTheLaunchersLayout) {
  EXPECT_EQ(placed_hosts(parse_config(kMinimal + "resources: {slots_per_trial: 4}\n")), 1);
  const auto even = parse_config(kMinimal + "resources: {slots_per_trial: 4, hosts: [a, b]}\n");
  EXPECT_EQ(slots_per_placed_host(even), 2);
  EXPECT_EQ(placed_hosts(even), 2);
  auto whole = parse_config(kMinimal + "resources: {slots_per_trial: 4, slots_per_host: 2, hosts: [a, b, c]}\n");
  EXPECT_EQ(placed_hosts(whole), 2);  // slots fill whole hosts in list order
  set_slots(whole, 6);
  EXPECT_EQ(placed_hosts(whole), 3);
}

// Each row says what it is, its sections exist, and the keys it depends on are rows of their own.
TEST(TrainerConfig, TheKeyTableIsComplete) {
  const auto& keys = experiment_keys();
  auto row = [&](const std::string& path) {
    return std::find_if(keys.begin(), keys.end(), [&](const ExperimentKey& k) { return k.path == path; });
  };
  for (const auto& k : keys) {
    SCOPED_TRACE(k.path);
    EXPECT_FALSE(k.type.empty());
    EXPECT_FALSE(k.doc.empty());
    EXPECT_FALSE(k.determined.empty());
    EXPECT_TRUE(k.section || k.read) << "a key without a reader";
    EXPECT_TRUE(k.section || k.show) << "a key that cannot show its value";
    if (!k.parent().empty()) {
      ASSERT_NE(row(k.parent()), keys.end()) << "no section " << k.parent();
      EXPECT_TRUE(row(k.parent())->section);
      EXPECT_LT(row(k.parent()) - keys.begin(), &k - keys.data()) << "the section comes after its key";
    }
    if (!k.used_with.empty()) {
      ASSERT_NE(row(k.used_with), keys.end()) << "depends on an unknown key " << k.used_with;
      EXPECT_FALSE(k.used_by.empty());
    }
    EXPECT_EQ(std::count_if(keys.begin(), keys.end(), [&](const ExperimentKey& o) { return o.path == k.path; }), 1);
  }
}

// docs/training.md's key reference is the table's, as `tandem train --print-keys --markdown` prints it.
TEST(TrainerConfig, TrainingDocsListEveryKeyAsTheTable) {
  std::ifstream file(std::string(TANDEM_SOURCE_DIR) + "/docs/training.md");
  ASSERT_TRUE(file) << "docs/training.md is missing";
  std::stringstream text;
  text << file.rdbuf();
  ASSERT_NE(text.str().find(kKeyReferenceBegin), std::string::npos) << "docs/training.md lacks " << kKeyReferenceBegin;
  EXPECT_EQ(text.str(), with_key_reference(text.str()))
      << "docs/training.md's key reference disagrees with the table (trainer/config_keys.cc); regenerate it with "
         "`tandem train --print-keys --update-doc docs/training.md`";
  const std::string markdown = experiment_keys_markdown();
  for (const auto& k : experiment_keys()) EXPECT_NE(markdown.find("| `" + k.path + "` |"), std::string::npos);
  EXPECT_NE(markdown.find("| `optimizations.tensor_fusion_threshold` | integer | 1 – 4096 | 64 | 64 |"),
            std::string::npos)
      << markdown;
  EXPECT_NE(experiment_keys_text().find("hyperparameters.learning_rate  (number: 1e-12 – 100)  default 0.01"),
            std::string::npos)
      << experiment_keys_text();
  EXPECT_THROW(with_key_reference("# no reference here\n"), ConfigError);
}

// A required key with no value is missing, as one left out.
TEST(TrainerConfig, EmptyRequiredKeysAreMissing) {
  expect_error("hyperparameters:\nsearcher: {max_length: {batches: 10}}\n", {"hyperparameters: missing"});
  EXPECT_TRUE(parse_config("hyperparameters: {global_batch_size: }\nsearcher: {max_length: {batches: 10}}\n")
                  .global_batch_defaulted);
  EXPECT_FALSE(parse_config("hyperparameters: {global_batch_size: 8}\nsearcher:\n").max_length.set());
  expect_error(kMinimal + "resources: {hosts: [a, [b]]}\n", {"resources.hosts: expected host names, got a list"});
}

TEST(TrainerConfig, EntrypointIsATorchScriptFileBesideTheYaml) {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_entry_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "models");
  std::ofstream(dir / "models/net.pt") << "x";
  const std::string yaml = kMinimal + "entrypoint: models/net.pt\n";
  EXPECT_EQ(parse_config(yaml, dir.string()).entrypoint, (dir / "models/net.pt").string());
  std::ofstream(dir / "exp.yaml") << yaml;
  EXPECT_EQ(load_config((dir / "exp.yaml").string()).entrypoint, (dir / "models/net.pt").string());
  const std::string missing = error_of(kMinimal + "entrypoint: nothere.pt\n");
  EXPECT_NE(missing.find("entrypoint: 'nothere.pt': no file at"), std::string::npos) << missing;
  EXPECT_NE(missing.find("torch.jit.save(torch.jit.script(model), \"model.pt\")"), std::string::npos) << missing;
  // The built-in model's keys: layer_slices refused, model and mlp_hidden ignored with a warning.
  const std::string hp = "hyperparameters: {global_batch_size: 64, model: mlp, mlp_hidden: 64";
  const std::string rest = "}\nsearcher: {max_length: {batches: 1}}\nentrypoint: models/net.pt\n";
  std::string sliced;
  try {
    parse_config(hp + ", layer_slices: 4" + rest, dir.string());
  } catch (const ConfigError& e) {
    sliced = e.what();
  }
  EXPECT_NE(sliced.find("hyperparameters.layer_slices: 4 slices apply to the built-in models only"), std::string::npos)
      << sliced;
  const auto c = parse_config(hp + rest, dir.string());
  ASSERT_EQ(c.warnings.size(), 2u);
  EXPECT_EQ(c.warnings[0], "hyperparameters.model is not used: entrypoint's TorchScript module is the model");
  std::filesystem::remove_all(dir);
}

TEST(TrainerConfig, SearcherMetricDirectionDefaultsFromTheMetric) {
  EXPECT_FALSE(parse_config(kMinimal).smaller_is_better);
  auto loss = parse_config(
      "hyperparameters: {global_batch_size: 64}\nsearcher: {metric: validation_loss, max_length: {batches: 1}}\n");
  EXPECT_TRUE(loss.smaller_is_better);
  auto given = parse_config(
      "hyperparameters: {global_batch_size: 64}\n"
      "searcher: {metric: validation_loss, smaller_is_better: false, max_length: {batches: 1}}\n");
  EXPECT_FALSE(given.smaller_is_better);
  const auto keep = parse_config(kMinimal);
  EXPECT_EQ(keep.save_trial_best, 1);
  EXPECT_EQ(keep.save_trial_latest, 1);
  EXPECT_EQ(keep.save_experiment_best, 0);
  EXPECT_TRUE(
      parse_config(kMinimal + "checkpoint_storage: {save_trial_best: 3, save_experiment_best: 2}\n").warnings.empty());
}

TEST(TrainerConfig, GradientCompressionAsDetermined) {
  auto codec = [](const std::string& v) {
    return parse_config(kBase + "optimizations: {gradient_compression: " + v + "}\n")
        .optimizations.gradient_compression;
  };
  EXPECT_EQ(parse_config(kBase).optimizations.gradient_compression, "none");
  EXPECT_EQ(codec("true"), "fp16");  // Determined's boolean
  EXPECT_EQ(codec("false"), "none");
  EXPECT_EQ(codec("fp16"), "fp16");
  EXPECT_EQ(codec("bf16"), "bf16");
  EXPECT_EQ(codec("BF16"), "bf16");
  EXPECT_EQ(codec("none"), "none");
  auto c = parse_config(
      kBase + "optimizations: {gradient_compression: bf16, gradient_predivide_factor: 2, error_feedback: true}\n");
  EXPECT_DOUBLE_EQ(c.optimizations.gradient_predivide_factor, 2.0);
  EXPECT_TRUE(c.optimizations.error_feedback);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_DOUBLE_EQ(parse_config(kBase).optimizations.gradient_predivide_factor, 1.0);  // Determined's default

  expect_error(kBase + "optimizations: {gradient_compression: [fp16]}\n",
               {"optimizations.gradient_compression", "a list is not a codec", "false or none"});
  expect_error(kBase + "optimizations: {gradient_compression: fp16, gradient_predivide_factor: 0}\n",
               {"optimizations.gradient_predivide_factor", "'0' is out of range", "use a positive factor"});
  expect_error(kBase + "optimizations: {gradient_compression: fp16, gradient_predivide_factor: half}\n",
               {"optimizations.gradient_predivide_factor", "'half' is not a number"});
  expect_error(kBase + "optimizations: {gradient_compression: false, error_feedback: true}\n",
               {"optimizations.error_feedback", "'true' needs a compressed gradient"});
  expect_error(kBase + "optimizations: {error_feedback: yes please}\n",
               {"optimizations.error_feedback", "'yes please' is not true or false"});
  expect_error(kBase + "optimizations: {gradient_compresion: true}\n",
               {"optimizations.gradient_compresion", "did you mean 'gradient_compression'?"});

  // A predivide factor without compression changes nothing: a warning, kept when the slot count changes.
  auto w = parse_config(kBase + "optimizations: {gradient_predivide_factor: 4}\n");
  ASSERT_EQ(w.warnings.size(), 1u);
  EXPECT_NE(w.warnings[0].find("gradient_predivide_factor acts only on compressed gradients"), std::string::npos);
  set_slots(w, 3);  // 64 over 3 slots adds the remainder warning
  ASSERT_EQ(w.warnings.size(), 2u);
  EXPECT_NE(w.warnings[0].find("gradient_predivide_factor"), std::string::npos);
  EXPECT_NE(w.warnings[1].find("1 dropped per step"), std::string::npos);
}

TEST(TrainerConfig, MissingRequiredKeys) {
  expect_error("name: x\nsearcher: {max_length: {batches: 10}}\n", {"hyperparameters: missing", "global_batch_size"});
}

// searcher.max_length is optional, as in Determined 0.38: --max-batches gives the length, and with neither
// the length's absence is listed with the other problems before training starts.
TEST(TrainerConfig, TheLengthComesFromMaxLengthOrMaxBatches) {
  const std::string lengthless = "hyperparameters: {global_batch_size: 8}\n";
  EXPECT_FALSE(parse_config(lengthless).max_length.set());  // --max-batches gives it
  EXPECT_EQ(parse_config(kMinimal, "", true).max_length.value, 100);
  std::string msg;
  try {
    parse_config(lengthless + "max_restarts: -1\n", "", true);
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("2 problems"), std::string::npos) << msg;
  EXPECT_NE(msg.find("searcher.max_length: not given, and no --max-batches"), std::string::npos) << msg;
  EXPECT_NE(msg.find("tandem train --max-batches N"), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_restarts: '-1' is out of range"), std::string::npos) << msg;
  // A bad length is one problem, not also a missing one.
  try {
    parse_config(lengthless + "searcher: {max_length: {batches: 0}}\n", "", true);
  } catch (const ConfigError& e) {
    msg = e.what();
  }
  EXPECT_NE(msg.find("(1 problem)"), std::string::npos) << msg;
}

TEST(TrainerConfig, SeveralProblemsAreAllListed) {
  const std::string msg = error_of(kBase + "max_restart: 1\noptimizations: {aggregation_frequency: x}\n");
  EXPECT_NE(msg.find("2 problems"), std::string::npos) << msg;
  // The layout's checks too, beside bad values, in one pass.
  const std::string all = error_of(R"(
hyperparameters: {global_batch_size: 4, learning_rate: 0}
resources: {slots_per_trial: 8}
max_restarts: -1
)");
  EXPECT_NE(all.find("3 problems"), std::string::npos) << all;
  for (const std::string part :
       {"hyperparameters.learning_rate: '0' is out of range", "max_restarts: '-1' is out of range",
        "resources.slots_per_trial: 8 slots cannot share a global batch of 4"})
    EXPECT_NE(all.find(part), std::string::npos) << part << " not in: " << all;
}

TEST(TrainerConfig, PerSlotBatchDropsTheRemainderWithAWarning) {
  auto c = parse_config(R"(
hyperparameters: {global_batch_size: 100}
resources: {slots_per_trial: 3}
searcher: {max_length: {batches: 10}}
)");
  EXPECT_EQ(c.per_slot_batch(), 33);
  EXPECT_EQ(c.effective_global_batch(), 99);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("33 samples per batch, 1 dropped per step"), std::string::npos) << c.warnings[0];
  set_slots(c, 4);
  EXPECT_EQ(c.per_slot_batch(), 25);
  EXPECT_TRUE(c.warnings.empty());
  set_slots(c, 3, 32);  // --per-slot-batch: the global batch follows the slots
  EXPECT_EQ(c.global_batch_size, 96);
  EXPECT_EQ(c.per_slot_batch(), 32);
  EXPECT_TRUE(c.warnings.empty());
}

TEST(TrainerConfig, MoreSlotsThanSamplesIsAnError) {
  expect_error(R"(
hyperparameters: {global_batch_size: 4}
resources: {slots_per_trial: 8}
searcher: {max_length: {batches: 10}}
)",
               {"resources.slots_per_trial", "8 slots cannot share a global batch of 4", "at least 8"});
  auto c = parse_config(kBase);
  EXPECT_THROW(set_slots(c, 65), ConfigError);
}

TEST(TrainerConfig, MultiHostLayoutFailsAtOnceWithTheReason) {
  expect_error(R"(
hyperparameters: {global_batch_size: 64}
resources: {slots_per_trial: 6, slots_per_host: 4}
searcher: {max_length: {batches: 10}}
)",
               {"resources.slots_per_trial", "6 is not a multiple of resources.slots_per_host 4", "e.g. 8"});
  expect_error(R"(
hyperparameters: {global_batch_size: 64}
resources: {slots_per_trial: 8, slots_per_host: 2, hosts: [a, b, c]}
searcher: {max_length: {batches: 10}}
)",
               {"need 4 hosts, resources.hosts lists 3"});
  auto ok = parse_config(R"(
hyperparameters: {global_batch_size: 64}
resources: {slots_per_trial: 4, slots_per_host: 2, hosts: [a, b]}
searcher: {max_length: {batches: 10}}
)");
  EXPECT_EQ(ok.hosts.size(), 2u);
}

TEST(TrainerConfig, LengthsInBatchesRecordsEpochs) {
  auto c = parse_config(kBase);
  EXPECT_EQ(c.to_batches({LengthUnit::batches, 7}, 60000), 7);
  EXPECT_EQ(c.to_batches({LengthUnit::records, 640}, 60000), 10);
  EXPECT_EQ(c.to_batches({LengthUnit::records, 641}, 60000), 11);
  EXPECT_EQ(c.to_batches({LengthUnit::epochs, 1}, 60000), 938);
}

// Determined's typed hyperparameters: const is its value; a search space names the searcher it needs.
TEST(TrainerConfig, TypedHyperparametersAsDetermined) {
  const auto typed = parse_config(R"(
hyperparameters:
  global_batch_size: {type: const, val: 64}
  learning_rate: {type: const, val: 0.05}
  optimizer: {type: const, val: adam}
  lr_schedule: {type: const, val: {type: step, step_size: {batches: 10}}}
searcher: {max_length: {batches: 100}}
)");
  const auto plain = parse_config(R"(
hyperparameters:
  global_batch_size: 64
  learning_rate: 0.05
  optimizer: adam
  lr_schedule: {type: step, step_size: {batches: 10}}
searcher: {max_length: {batches: 100}}
)");
  EXPECT_EQ(typed.global_batch_size, plain.global_batch_size);
  EXPECT_EQ(typed.learning_rate, plain.learning_rate);
  EXPECT_EQ(typed.optimizer, plain.optimizer);
  EXPECT_EQ(typed.lr_schedule.type, "step");
  EXPECT_EQ(typed.lr_schedule.step_size.value, plain.lr_schedule.step_size.value);
  EXPECT_TRUE(typed.warnings.empty());
  for (const std::string space :
       {"{type: int, minval: 32, maxval: 128}", "{type: double, minval: 0.1, maxval: 1}",
        "{type: log, minval: -4, maxval: -1, base: 10}", "{type: categorical, vals: [32, 64]}"}) {
    const std::string type = space.substr(1, space.find(',') - 1);
    expect_error("hyperparameters: {global_batch_size: " + space + "}\n",
                 {"hyperparameters.global_batch_size: {" + type + "} is a search space",
                  "random, grid or adaptive_asha", "tandem runs searcher single", "{type: const, val: ...}"});
  }
  const std::string one = error_of("hyperparameters: {global_batch_size: {type: int, minval: 1, maxval: 2}}\n");
  EXPECT_NE(one.find("(1 problem)"), std::string::npos) << "a refused value is not also missing: " << one;
  expect_error("hyperparameters: {global_batch_size: {type: const}}\n",
               {"hyperparameters.global_batch_size: {type: const} without val"});
  expect_error("hyperparameters: {global_batch_size: {type: const, val: 8, vals: [8]}}\n",
               {"hyperparameters.global_batch_size.vals: unknown key", "did you mean 'val'?"});
}

// Hyperparameters the trainer does not read are the entrypoint's: recorded in order, typed const resolved.
TEST(TrainerConfig, UnknownHyperparametersAreRecorded) {
  const auto c = parse_config(R"(
hyperparameters:
  global_batch_size: 64
  n_filters1: {type: const, val: 32}
  dropout2: 0.5
  head: {width: {type: const, val: 128}, act: relu}
searcher: {max_length: {batches: 100}}
)");
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"n_filters1", "32"}, {"dropout2", "0.5"}, {"head", "{width: 128, act: relu}"}};
  EXPECT_EQ(c.user_hyperparameters, expected);
  ASSERT_EQ(c.warnings.size(), 1u);  // dropout2 is a near miss of dropout
  EXPECT_NE(c.warnings[0].find("hyperparameters.dropout2 is not one tandem reads"), std::string::npos);
  expect_error("hyperparameters: {global_batch_size: 64, n: 1, n: 2}\n", {"hyperparameters.n: given twice"});
  expect_error("hyperparameters: {global_batch_size: 64, head: {width: {type: int, minval: 1, maxval: 9}}}\n",
               {"hyperparameters.head.width: {type: int} is a search space"});
}

// Determined's cluster and web UI keys: accepted, each with one warning saying why it is ignored.
TEST(TrainerConfig, InfrastructureKeysAreIgnoredWithOneNoteEach) {
  int ignored = 0;
  for (const auto& k : experiment_keys()) {
    if (!k.ignored) continue;
    ++ignored;
    SCOPED_TRACE(k.path);
    const std::string yaml = k.parent().empty() ? kMinimal + k.path + ": {anything: [1, 2]}\n"
                                                : kMinimal + k.parent() + ": {" + k.name() + ": 4G}\n";
    const auto c = parse_config(yaml);
    ASSERT_EQ(c.warnings.size(), 1u);
    EXPECT_EQ(c.warnings[0].rfind(k.path + ": ignored: ", 0), 0u) << c.warnings[0];
  }
  EXPECT_EQ(ignored, 11);
}

TEST(TrainerConfig, RecordsPerEpochAboveTheDataSetWarns) {
  std::vector<std::string> warnings;
  EXPECT_EQ(epoch_records(parse_config(kMinimal), 60000, warnings), 60000);
  EXPECT_EQ(epoch_records(parse_config(kMinimal + "records_per_epoch: 6400\n"), 60000, warnings), 6400);
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(epoch_records(parse_config(kMinimal + "records_per_epoch: 70000\n"), 60000, warnings), 60000);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("records_per_epoch 70000 is more than the 60000 training records"), std::string::npos)
      << warnings[0];
}

// Without global_batch_size each slot trains 64 samples a batch (the tutorial
// train.py's loader), said once; the global batch follows the slots.
TEST(TrainerConfig, GlobalBatchSizeDefaultsTo64PerSlot) {
  auto c = parse_config("hyperparameters: {learning_rate: 0.1}\nresources: {slots_per_trial: 2}\n");
  EXPECT_EQ(c.global_batch_size, 128);
  EXPECT_EQ(c.per_slot_batch(), 64);
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("hyperparameters.global_batch_size not given: each slot trains 64 samples"),
            std::string::npos)
      << c.warnings[0];
  EXPECT_NE(c.warnings[0].find("a global batch of 128 over 2 slots"), std::string::npos) << c.warnings[0];
  set_slots(c, 3);
  EXPECT_EQ(c.global_batch_size, 192);
  ASSERT_EQ(c.warnings.size(), 1u);
  set_slots(c, 2, 32);  // --per-slot-batch chooses, silently
  EXPECT_EQ(c.global_batch_size, 64);
  EXPECT_TRUE(c.warnings.empty());
  EXPECT_EQ(parse_config(kMinimal).global_batch_size, 64);
  EXPECT_FALSE(parse_config(kMinimal).global_batch_defaulted);
}

// entrypoint: FILE --epochs N (or --batches N), the length as a 0.38 training
// script takes it; a Python command is refused saying how to export the model.
TEST(TrainerConfig, EntrypointArgumentsGiveTheLength) {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_entry_args_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "net.pt") << "x";
  const std::string hp = "hyperparameters: {learning_rate: 1.0}\n";
  auto parse = [&](const std::string& entry) {
    return parse_config(hp + "entrypoint: " + entry + "\n", dir.string(), true);
  };
  auto error = [&](const std::string& yaml) {
    try {
      parse_config(yaml, dir.string(), true);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const auto epochs = parse("net.pt --epochs 1");
  EXPECT_EQ(epochs.entrypoint, (dir / "net.pt").string());
  EXPECT_EQ(epochs.max_length.unit, LengthUnit::epochs);
  EXPECT_EQ(epochs.max_length.value, 1);
  const auto batches = parse("net.pt --batches=20");
  EXPECT_EQ(batches.max_length.unit, LengthUnit::batches);
  EXPECT_EQ(batches.max_length.value, 20);
  EXPECT_FALSE(parse_config(hp + "entrypoint: net.pt\n", dir.string()).max_length.set());
  for (const auto& [entry, fragment] : std::vector<std::pair<std::string, std::string>>{
           {"net.pt --epochs 0", "--epochs '0' is not a count of epochs; use a positive number, e.g. --epochs 1"},
           {"net.pt --epochs", "--epochs '' is not a count of epochs"},
           {"net.pt --lr 1", "'--lr' is not an argument tandem reads"},
           {"net.pt --epochs 1 --batches 5", "gives the length twice"},
           {"python3 train.py --epochs 1", "runs a Python training script, which tandem does not"},
           {"python3 -m determined.launch.torch_distributed python3 train.py --epochs 1",
            "trainer/examples/mnist_tutorial_model.py"},
           {"model_def:MNistTrial", "module:TrialClass form"}}) {
    const std::string msg = error(hp + "entrypoint: " + entry + "\n");
    EXPECT_NE(msg.find(fragment), std::string::npos) << entry << ": " << msg;
  }
  const std::string twice = error(hp + "searcher: {max_length: {batches: 5}}\nentrypoint: net.pt --epochs 1\n");
  EXPECT_NE(twice.find("and searcher.max_length both give the training length"), std::string::npos) << twice;
  std::filesystem::remove_all(dir);
}

// Determined 0.38's mnist_pytorch tutorial files, as published but for the
// entrypoint line, and their earlier versions (max_length, global_batch_size,
// 8 slots, data.url) parse with the notes tandem owes them.
TEST(TrainerConfig, DeterminedTutorialExperimentsParse) {
  const std::string examples = std::string(TANDEM_SOURCE_DIR) + "/trainer/examples/";
  const std::string published_hp = R"(hyperparameters:
  learning_rate: 1.0
  n_filters1: 32
  n_filters2: 64
  dropout1: 0.25
  dropout2: 0.5
)";
  const std::string searcher = R"(searcher:
  name: single
  metric: validation_loss
  smaller_is_better: true
)";
  const std::string entry = "entrypoint: mnist_net.pt --epochs 1\n";
  auto read = [&](const std::string& file) {
    std::ifstream in(examples + file);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(read("determined_tutorial_const.yaml"), "name: mnist_pytorch_const\n" + published_hp + searcher + entry);
  EXPECT_EQ(read("determined_tutorial_distributed.yaml"), "name: mnist_pytorch_distributed\n" + published_hp +
                                                              "resources:\n  slots_per_trial: 2\n" + searcher + entry);
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_tutorial_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "mnist_net.pt") << "x";
  for (const std::string file : {"determined_tutorial_const.yaml", "determined_tutorial_distributed.yaml"}) {
    const auto c = parse_config(read(file), dir.string(), true);
    EXPECT_EQ(c.max_length.unit, LengthUnit::epochs) << file;
    EXPECT_EQ(c.per_slot_batch(), 64) << file;
    EXPECT_DOUBLE_EQ(c.learning_rate, 1.0);
    EXPECT_FALSE(c.optimizer_given);  // the entrypoint's module names Adadelta
    EXPECT_EQ(c.user_hyperparameters.size(), 4u);
    // dropout1 and dropout2 are the module's attributes, not misspelt keys.
    for (const auto& w : c.warnings) EXPECT_EQ(w.find("did you mean"), std::string::npos) << w;
  }
  const auto old = parse_config(R"(name: mnist_pytorch_distributed
data:
  url: https://s3-us-west-2.amazonaws.com/determined-ai-test-data/pytorch_mnist.tar.gz
hyperparameters:
  learning_rate: 1.0
  global_batch_size: 512
  n_filters1: 32
  n_filters2: 64
  dropout1: 0.25
  dropout2: 0.5
resources:
  slots_per_trial: 8
searcher:
  name: single
  metric: validation_loss
  max_length:
    batches: 117
  smaller_is_better: true
entrypoint: mnist_net.pt
)",
                                dir.string(), true);
  EXPECT_EQ(old.per_slot_batch(), 64);
  EXPECT_EQ(old.max_length.value, 117);
  EXPECT_TRUE(std::any_of(old.warnings.begin(), old.warnings.end(),
                          [](const std::string& w) { return w.rfind("data.url: ignored: ", 0) == 0; }));
  std::filesystem::remove_all(dir);
}

// The example shaped as Determined's mnist_pytorch const.yaml parses with its typed values and notes.
TEST(TrainerConfig, DeterminedStyleExampleParses) {
  const auto c = load_config(std::string(TANDEM_SOURCE_DIR) + "/trainer/examples/determined_const.yaml");
  EXPECT_EQ(c.global_batch_size, 64);
  EXPECT_DOUBLE_EQ(c.learning_rate, 0.05);
  EXPECT_FALSE(c.max_length.set());
  EXPECT_EQ(c.searcher_metric, "validation_loss");
  EXPECT_TRUE(c.smaller_is_better);
  EXPECT_FALSE(c.user_hyperparameters.empty());
  for (const std::string key : {"environment", "resources.shm_size", "workspace", "project", "labels"})
    EXPECT_TRUE(std::any_of(c.warnings.begin(), c.warnings.end(), [&](const std::string& w) {
      return w.rfind(key + ": ignored: ", 0) == 0;
    })) << key;
  EXPECT_THROW(load_config(std::string(TANDEM_SOURCE_DIR) + "/trainer/examples/determined_const.yaml", true),
               ConfigError);
}

// An entrypoint module's attribute of a hyperparameter's name takes its value:
// the example model's logit_scale 0 zeroes its logits.
TEST(TrainerConfig, HyperparametersSetTheEntrypointsAttributes) {
  const auto dir = std::filesystem::temp_directory_path() / ("tandem_attrs_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "model.pt").string();
  const std::string make = "timeout 120 /usr/bin/python3 " + std::string(TANDEM_SOURCE_DIR) +
                           "/trainer/examples/torchscript_model.py " + model + " --hidden 8 > /dev/null 2>&1";
  if (std::system(make.c_str()) != 0) GTEST_SKIP() << "python3-torch cannot save a TorchScript model here";
  const auto c =
      parse_config("hyperparameters: {global_batch_size: 64, logit_scale: {type: const, val: 0.0}, n_filters: 32}\n");
  const torch::Tensor x = torch::ones({2, 1, 28, 28});
  EXPECT_GT(load_torchscript(model).forward(x).abs().sum().item<double>(), 0);
  EXPECT_EQ(load_torchscript(model, c.user_hyperparameters).forward(x).abs().sum().item<double>(), 0);
  EXPECT_EQ(load_torchscript(model, c.user_hyperparameters).unused_hyperparameters,
            std::vector<std::string>{"n_filters"});
  try {
    load_torchscript(model, {{"logit_scale", "big"}});
    ADD_FAILURE() << "a float attribute took 'big'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(
        std::string(e.what()).find("hyperparameters.logit_scale 'big' does not fit the module's attribute of type "
                                   "float"),
        std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(TrainerConfig, EditDistance) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(did_you_mean("slots_per_trail", {"slots_per_trial", "slots_per_host"}), "slots_per_trial");
  EXPECT_EQ(did_you_mean("xyz", {"slots_per_trial"}), "");
  EXPECT_EQ(parse_slot_list("1,2,4"), (std::vector<int>{1, 2, 4}));
  EXPECT_THROW(parse_slot_list("1,,4"), ConfigError);
  EXPECT_THROW(parse_slot_list("0"), ConfigError);
}

TEST(TrainerData, SlotsSplitTheGlobalBatchOfOneEpochOrder) {
  BatchPlan plan(1000, 64, 7);
  EXPECT_EQ(plan.batches_per_epoch(), 15);  // the partial global batch is dropped
  for (int64_t b : {0, 5, 14, 15, 31}) {
    const auto whole = plan.shard(b, 0, 1);
    for (int slots : {2, 3, 5}) {  // 3 and 5 do not divide 64: slices of 21 or 22, 12 or 13
      std::vector<int64_t> joined;
      for (int r = 0; r < slots; ++r) {
        const auto part = plan.shard(b, r, slots);
        EXPECT_LE(std::abs(static_cast<int64_t>(part.size()) * slots - 64), slots) << "batch " << b;
        joined.insert(joined.end(), part.begin(), part.end());
      }
      EXPECT_EQ(whole, joined) << "batch " << b << " over " << slots << " slots";
    }
  }
  // Every record of an epoch at most once; a new order each epoch.
  std::set<int64_t> seen;
  for (int64_t b = 0; b < 15; ++b)
    for (auto i : plan.shard(b, 0, 1)) EXPECT_TRUE(seen.insert(i).second);
  EXPECT_NE(plan.shard(0, 0, 1), plan.shard(15, 0, 1));
  EXPECT_EQ(validation_range(10000, 1, 3), (std::pair<int64_t, int64_t>{3333, 6666}));
}

TEST(TrainerData, FashionMnistFromTheDebianPackage) {
  const std::string dir = "/usr/share/datasets/fashion-mnist";
  if (!std::filesystem::exists(dir + "/t10k-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "dataset-fashion-mnist not installed";
  auto test = load_fashion_mnist(dir, false);
  EXPECT_EQ(test.size, 10000);
  EXPECT_EQ(test.rows, 28);
  std::vector<int> per_class(10);
  for (auto l : test.labels) ++per_class[l];
  for (int n : per_class) EXPECT_EQ(n, 1000);
  EXPECT_THROW(load_idx(dir + "/t10k-labels-idx1-ubyte.gz", dir + "/t10k-labels-idx1-ubyte.gz"), std::runtime_error);
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("tandem_trainer_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

using TrainerMetrics = TempDir;

TEST_F(TrainerMetrics, FileSummaryAndResumeTruncation) {
  const std::string path = (dir_ / "metrics.jsonl").string();
  {
    MetricsWriter w(path, -1);
    w.line(R"({"kind":"start","batch":0,"slots":2,"global_batch":64,"resumed_from":-1})");
    for (int b = 1; b <= 10; ++b) {
      TrainRecord r;
      r.batch = b, r.time = b, r.loss = 1.0 / b, r.samples_per_s = 100, r.step = 0.5, r.exposed = 0.1,
      r.communication = 0.4;
      w.train(r);
    }
    w.validation({5, 5.0, 0.5, 0.80, 10000});
    w.validation({10, 10.0, 0.4, 0.86, 10000});
  }
  auto s = read_metrics(path);
  EXPECT_EQ(s.train.size(), 10u);
  EXPECT_DOUBLE_EQ(s.hidden_fraction(), 0.75);
  EXPECT_DOUBLE_EQ(s.time_to_accuracy(0.85), 10.0);
  EXPECT_LT(s.time_to_accuracy(0.9), 0);
  EXPECT_DOUBLE_EQ(s.samples_per_s(), 100);
  const std::string table = summary_table(s, 0.85);
  EXPECT_NE(table.find("time to 85.0% validation accuracy  10.0 s"), std::string::npos) << table;
  EXPECT_NE(table.find("communication hidden               75.0%"), std::string::npos) << table;
  TrialSummary none;  // a trial that failed before its first step says so, without a table of zeros
  none.restarts = 1;
  const std::string empty = summary_table(none, 0.85);
  EXPECT_NE(empty.find("batches trained                    0 (the trial stopped before its first step)"),
            std::string::npos)
      << empty;
  EXPECT_NE(empty.find("restarts                           1, "), std::string::npos) << empty;
  EXPECT_EQ(empty.find("throughput"), std::string::npos) << empty;
  { MetricsWriter resumed(path, 6); }  // a restart from batch 6 drops what came after
  s = read_metrics(path);
  EXPECT_EQ(s.train.size(), 6u);
  EXPECT_EQ(s.validation.size(), 1u);
}

// A chief taking over after a shrink: the lost chief's lines of the agreed
// steps stay, its torn last line and lines past the agreed batch go, and a
// writer still holding the old file writes where nobody reads.
TEST_F(TrainerMetrics, ATakeOverKeepsTheAgreedLinesAndDropsATornOne) {
  const std::string path = (dir_ / "metrics.jsonl").string();
  auto lost = std::make_unique<MetricsWriter>(path, -1);
  lost->line(R"({"kind":"start","batch":0,"slots":3,"attempt":0})");
  for (int b = 1; b <= 9; ++b) lost->train(TrainRecord{b});
  lost->validation({5, 5.0, 0.5, 0.80, 100});
  lost->line(R"({"kind":"epoch","batch":8,"epoch":0,"records":64,"expected":64})");
  lost->line(R"({"kind":"validation","batch":9,"time":9.0,"loss":0.4)");  // torn: cut before its end
  MetricsWriter chief(path, 8);
  EXPECT_EQ(chief.last_kept("validation", "batch"), std::optional<int64_t>(5));
  EXPECT_EQ(chief.last_kept("epoch", "epoch"), std::optional<int64_t>(0));
  EXPECT_EQ(chief.last_kept("stall", "batch"), std::nullopt);
  lost->train(TrainRecord{10});  // into the replaced file
  chief.train(TrainRecord{9});
  auto s = read_metrics(path);
  ASSERT_EQ(s.train.size(), 9u);
  for (size_t i = 0; i < s.train.size(); ++i) EXPECT_EQ(s.train[i].batch, int64_t(i) + 1);
  EXPECT_EQ(s.validation.size(), 1u);
  EXPECT_EQ(s.epochs.size(), 1u);
  EXPECT_EQ(s.slots, 3);
  EXPECT_EQ(s.restarts, 0);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

// The plots run gnuplot without a shell: a quote in the run's directory works.
TEST_F(TrainerMetrics, PlotsWhereThePathHasAQuote) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) GTEST_SKIP() << "gnuplot not installed";
  const auto dir = dir_ / "it's a run";
  std::filesystem::create_directories(dir);
  TrialSummary s;
  for (int b = 1; b <= 4; ++b) {
    TrainRecord r;
    r.batch = b, r.time = b, r.loss = 1.0 / b, r.accuracy = 0.2 * b;
    s.train.push_back(r);
  }
  s.validation.push_back({4, 4.0, 0.3, 0.8, 100});
  std::string error;
  const auto files = plot_metrics(s, (dir / "metrics").string(), &error);
  EXPECT_EQ(error, "");
  ASSERT_EQ(files.size(), 2u);
  for (const auto& f : files) EXPECT_GT(std::filesystem::file_size(f), 0u) << f;
}

TEST(TrainerStall, SlowStepAgainstTheRunningMedian) {
  StallDetector d(3.0, 50);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(d.add(0.1 + 0.001 * (i % 3)));
  EXPECT_FALSE(d.add(0.25));
  EXPECT_TRUE(d.add(0.5));
  EXPECT_NEAR(d.median(), 0.101, 1e-9);
}

}  // namespace
}  // namespace tandem::trainer
