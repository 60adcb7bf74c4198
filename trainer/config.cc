#include "config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "row_blocks.h"
#include "tandem/compression/compression.h"

namespace tandem::trainer {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

const char* to_string(LengthUnit u) {
  switch (u) {
    case LengthUnit::batches: return "batches";
    case LengthUnit::records: return "records";
    case LengthUnit::epochs: return "epochs";
  }
  return "?";
}

int64_t ExperimentConfig::to_batches(const Length& l, int64_t rpe) const {
  const int64_t g = std::max<int64_t>(1, effective_global_batch());
  switch (l.unit) {
    case LengthUnit::batches: return l.value;
    case LengthUnit::records: return (l.value + g - 1) / g;
    case LengthUnit::epochs: return (l.value * rpe + g - 1) / g;
  }
  return l.value;
}

namespace {

// Walks the YAML tree; every problem is appended to `errors` with the key's
// dotted path, the value and the fix.
class Reader {
 public:
  std::vector<std::string> errors;

  void error(const std::string& key, const std::string& message) { errors.push_back(key + ": " + message); }

  static std::string show(const YAML::Node& n) {
    if (n.IsScalar()) return "'" + n.Scalar() + "'";
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a map";
    return "nothing";
  }

  // Unknown keys of a map, with a did-you-mean among `known`.
  void check_keys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& known) {
    std::vector<std::string> seen;
    for (const auto& kv : map) {
      const std::string key = kv.first.as<std::string>();
      if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
        error(path.empty() ? key : path + "." + key, "given twice (only the first would count); keep one");
        continue;
      }
      seen.push_back(key);
      if (std::find(known.begin(), known.end(), key) != known.end()) continue;
      const std::string full = path.empty() ? key : path + "." + key;
      std::string hint = did_you_mean(key, known);
      std::string valid;
      for (const auto& k : known) valid += (valid.empty() ? "" : ", ") + k;
      error(full,
            "unknown key" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") + " (valid here: " + valid + ")");
    }
  }

  bool is_map(const YAML::Node& n, const std::string& key) {
    if (!n || n.IsNull()) return false;
    if (!n.IsMap()) {
      error(key, "expected a map of keys, got " + show(n));
      return false;
    }
    return true;
  }

  template <class T>
  bool scalar(const YAML::Node& n, const std::string& key, T& out, const std::string& what) {
    if (!n || n.IsNull()) return false;
    if (!n.IsScalar()) {
      error(key, "expected " + what + ", got " + show(n));
      return false;
    }
    try {
      out = n.as<T>();
      return true;
    } catch (const YAML::Exception&) {
      error(key, show(n) + " is not " + what);
      return false;
    }
  }

  void integer(const YAML::Node& n, const std::string& key, int64_t& out, int64_t min, int64_t max,
               const std::string& fix) {
    int64_t v = 0;
    if (!scalar(n, key, v, "an integer")) return;
    if (v < min || v > max) {
      error(key, "'" + n.Scalar() + "' is out of range; " + fix);
      return;
    }
    out = v;
  }
  void integer(const YAML::Node& n, const std::string& key, int& out, int min, int max, const std::string& fix) {
    int64_t v = out;
    integer(n, key, v, min, max, fix);
    out = static_cast<int>(v);
  }

  void number(const YAML::Node& n, const std::string& key, double& out, double min, double max,
              const std::string& fix) {
    double v = 0;
    if (!scalar(n, key, v, "a number")) return;
    if (!std::isfinite(v) || v < min || v > max) {
      error(key, "'" + n.Scalar() + "' is out of range; " + fix);
      return;
    }
    out = v;
  }

  void boolean(const YAML::Node& n, const std::string& key, bool& out) {
    bool v = false;
    if (scalar(n, key, v, "true or false")) out = v;
  }

  void choice(const YAML::Node& n, const std::string& key, std::string& out, const std::vector<std::string>& valid) {
    std::string v;
    if (!scalar(n, key, v, "a name")) return;
    if (std::find(valid.begin(), valid.end(), v) != valid.end()) {
      out = v;
      return;
    }
    std::string list;
    for (const auto& c : valid) list += (list.empty() ? "" : ", ") + c;
    std::string hint = did_you_mean(v, valid);
    error(key, "unknown value '" + v + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                   " (valid: " + list + ")");
  }

  // {batches: N} | {records: N} | {epochs: N}
  void length(const YAML::Node& n, const std::string& key, Length& out) {
    if (!is_map(n, key)) return;
    check_keys(n, key, {"batches", "records", "epochs"});
    int found = 0;
    for (auto [name, unit] : {std::pair{"batches", LengthUnit::batches}, std::pair{"records", LengthUnit::records},
                              std::pair{"epochs", LengthUnit::epochs}}) {
      if (!n[name]) continue;
      ++found;
      int64_t v = 0;
      integer(n[name], key + "." + name, v, 1, int64_t{1} << 40,
              "use a positive count, e.g. {" + std::string(name) + ": 100}");
      out = Length{unit, v};
    }
    if (found > 1) error(key, "give one of batches, records or epochs, not several");
    if (found == 0 && n.size() == 0) error(key, "empty; use e.g. {batches: 100}, {records: 6400} or {epochs: 1}");
  }
};

const std::vector<std::string> kTopKeys = {"name",
                                           "description",
                                           "hyperparameters",
                                           "resources",
                                           "searcher",
                                           "min_validation_period",
                                           "min_checkpoint_period",
                                           "records_per_epoch",
                                           "optimizations",
                                           "checkpoint_storage",
                                           "max_restarts",
                                           "reproducibility",
                                           "dtrain_network_interface",
                                           "data",
                                           "entrypoint"};
const std::vector<std::string> kHyperparameterKeys = {"global_batch_size",
                                                      "learning_rate",
                                                      "optimizer",
                                                      "momentum",
                                                      "nesterov",
                                                      "weight_decay",
                                                      "beta1",
                                                      "beta2",
                                                      "eps",
                                                      "lr_schedule",
                                                      "model",
                                                      "mlp_hidden",
                                                      "dropout",
                                                      "layer_slices"};
const std::vector<std::string> kLrScheduleKeys = {"type", "warmup", "step_size", "gamma", "min_learning_rate"};
const std::vector<std::string> kResourceKeys = {"slots_per_trial", "slots_per_host", "hosts"};
const std::vector<std::string> kSearcherKeys = {"name", "metric", "max_length", "smaller_is_better"};
const std::vector<std::string> kOptimizationKeys = {"aggregation_frequency",     "average_aggregated_gradients",
                                                    "average_training_metrics",  "gradient_compression",
                                                    "gradient_predivide_factor", "error_feedback",
                                                    "auto_tune_tensor_fusion",   "tensor_fusion_threshold",
                                                    "tensor_fusion_cycle_time",  "mixed_precision"};
const std::vector<std::string> kCheckpointStorageKeys = {
    "type", "host_path", "storage_path", "save_trial_latest", "save_trial_best", "save_experiment_best"};
const std::vector<std::string> kReproducibilityKeys = {"experiment_seed"};
const std::vector<std::string> kDataKeys = {"type", "path"};

// hyperparameters: the optimizer's knobs (optimizer.h) and lr_schedule. A key
// the chosen optimizer would not use is an error naming the one that would.
void read_optimizer(Reader& r, const YAML::Node& hp, ExperimentConfig& c) {
  r.choice(hp["optimizer"], "hyperparameters.optimizer", c.optimizer, {"sgd", "adam", "adamw"});
  r.number(hp["momentum"], "hyperparameters.momentum", c.momentum, 0, 0.999999, "use a value in [0, 1), e.g. 0.9");
  r.boolean(hp["nesterov"], "hyperparameters.nesterov", c.nesterov);
  r.number(hp["weight_decay"], "hyperparameters.weight_decay", c.weight_decay, 0, 1,
           "use a value in [0, 1], e.g. 0.0001");
  r.number(hp["beta1"], "hyperparameters.beta1", c.beta1, 0, 0.999999, "use a value in [0, 1), e.g. 0.9");
  r.number(hp["beta2"], "hyperparameters.beta2", c.beta2, 0, 0.999999, "use a value in [0, 1), e.g. 0.999");
  r.number(hp["eps"], "hyperparameters.eps", c.eps, 1e-30, 1, "use a small positive value, e.g. 1e-8");
  const bool sgd = c.optimizer == "sgd";
  for (const char* k : {"momentum", "nesterov"})
    if (!sgd && hp[k])
      r.error(std::string("hyperparameters.") + k, "'" + hp[k].Scalar() + "' is an sgd setting, unused by optimizer " +
                                                       c.optimizer +
                                                       "; remove it or set hyperparameters.optimizer: sgd");
  for (const char* k : {"beta1", "beta2", "eps"})
    if (sgd && hp[k])
      r.error(std::string("hyperparameters.") + k, "'" + hp[k].Scalar() +
                                                       "' is an adam/adamw setting, unused by optimizer sgd; remove it "
                                                       "or set hyperparameters.optimizer: adam or adamw");
  if (!sgd) c.momentum = 0;
  if (sgd && c.nesterov && c.momentum <= 0)
    r.error("hyperparameters.nesterov", "'true' needs momentum > 0 (hyperparameters.momentum is " +
                                            std::to_string(c.momentum) +
                                            "); set momentum, e.g. 0.9, or nesterov: false");

  const auto ls = hp["lr_schedule"];
  if (!r.is_map(ls, "hyperparameters.lr_schedule")) return;
  const std::string at = "hyperparameters.lr_schedule";
  r.check_keys(ls, at, kLrScheduleKeys);
  auto& s = c.lr_schedule;
  r.choice(ls["type"], at + ".type", s.type, {"constant", "step", "cosine"});
  r.length(ls["warmup"], at + ".warmup", s.warmup);
  r.length(ls["step_size"], at + ".step_size", s.step_size);
  r.number(ls["gamma"], at + ".gamma", s.gamma, 1e-12, 1, "use a factor in (0, 1], e.g. 0.1");
  r.number(ls["min_learning_rate"], at + ".min_learning_rate", s.min_learning_rate, 0, 100,
           "use a rate below hyperparameters.learning_rate, e.g. 0");
  for (auto [key, used_by] :
       {std::pair{"step_size", "step"}, std::pair{"gamma", "step"}, std::pair{"min_learning_rate", "cosine"}})
    if (ls[key] && s.type != used_by)
      r.error(at + "." + key, std::string("set, but only type ") + used_by + " uses it (type is " + s.type +
                                  "); remove it or set " + at + ".type: " + used_by);
  if (s.type == "step" && !s.step_size.set() && !ls["step_size"])
    r.error(at + ".step_size", "missing; type step multiplies the rate by gamma every step_size, e.g. {epochs: 1}");
  if (s.type == "cosine" && s.min_learning_rate >= c.learning_rate)
    r.error(at + ".min_learning_rate", std::to_string(s.min_learning_rate) +
                                           " is not below hyperparameters.learning_rate " +
                                           std::to_string(c.learning_rate) + "; use a smaller value, e.g. 0");
}

// entrypoint: a TorchScript module file, relative to the YAML's directory.
void read_entrypoint(Reader& r, const YAML::Node& root, const std::string& base_dir, ExperimentConfig& c) {
  std::string entry;
  if (!r.scalar(root["entrypoint"], "entrypoint", entry, "a TorchScript file (e.g. model.pt)")) return;
  const std::string how =
      "tandem trains TorchScript models: save one with "
      "torch.jit.save(torch.jit.script(model), \"model.pt\") and set entrypoint: model.pt";
  namespace fs = std::filesystem;
  fs::path path(entry);
  if (path.is_relative()) path = fs::absolute(base_dir.empty() ? fs::current_path() : fs::path(base_dir)) / path;
  path = path.lexically_normal();
  if (fs::is_regular_file(path)) {
    c.entrypoint = path.string();
    return;
  }
  if (entry.find(':') != std::string::npos)
    r.error("entrypoint", "'" + entry + "' is Determined's module:TrialClass form; " + how);
  else
    r.error("entrypoint", "'" + entry + "': no file at " + path.string() +
                              " (a relative path is taken from the YAML's directory); " + how);
}

void validate_slots(ExperimentConfig& c, std::vector<std::string>& errors) {
  if (c.global_batch_size > 0 && c.slots_per_trial > c.global_batch_size) {
    errors.push_back("resources.slots_per_trial: " + std::to_string(c.slots_per_trial) +
                     " slots cannot share a global batch of " + std::to_string(c.global_batch_size) +
                     " (hyperparameters.global_batch_size); each slot needs at least one sample: raise "
                     "global_batch_size to at least " +
                     std::to_string(c.slots_per_trial) + " or lower slots_per_trial");
    return;
  }
  if (c.global_batch_size > 0 && c.global_batch_size % c.slots_per_trial != 0) {
    c.warnings.push_back("hyperparameters.global_batch_size " + std::to_string(c.global_batch_size) +
                         " is not a multiple of resources.slots_per_trial " + std::to_string(c.slots_per_trial) +
                         ": each slot trains " + std::to_string(c.per_slot_batch()) + " samples per batch, " +
                         std::to_string(c.global_batch_size - c.effective_global_batch()) +
                         " dropped per step (global batch " + std::to_string(c.effective_global_batch()) + ")");
  }
  // Multi-host layout: slots fill whole hosts.
  if (c.slots_per_host > 0) {
    if (c.slots_per_trial % c.slots_per_host != 0) {
      errors.push_back(
          "resources.slots_per_trial: " + std::to_string(c.slots_per_trial) +
          " is not a multiple of resources.slots_per_host " + std::to_string(c.slots_per_host) +
          "; the trial could never be placed: use a multiple (e.g. " +
          std::to_string(((c.slots_per_trial + c.slots_per_host - 1) / c.slots_per_host) * c.slots_per_host) + ")");
    } else if (!c.hosts.empty() && c.slots_per_trial / c.slots_per_host > static_cast<int>(c.hosts.size())) {
      errors.push_back("resources.slots_per_trial: " + std::to_string(c.slots_per_trial) + " slots at " +
                       std::to_string(c.slots_per_host) + " per host need " +
                       std::to_string(c.slots_per_trial / c.slots_per_host) + " hosts, resources.hosts lists " +
                       std::to_string(c.hosts.size()) + ": add hosts or lower slots_per_trial");
    }
  } else if (!c.hosts.empty() && c.slots_per_trial % static_cast<int>(c.hosts.size()) != 0) {
    errors.push_back("resources.hosts: " + std::to_string(c.slots_per_trial) + " slots do not divide evenly over " +
                     std::to_string(c.hosts.size()) +
                     " hosts; set resources.slots_per_host or a multiple of the host count");
  }
}

[[noreturn]] void fail(const std::vector<std::string>& errors) {
  std::string msg = "invalid experiment configuration (" + std::to_string(errors.size()) + " problem" +
                    (errors.size() == 1 ? "" : "s") + "):";
  for (const auto& e : errors) msg += "\n  " + e;
  throw ConfigError(msg);
}

}  // namespace

ExperimentConfig parse_config(const std::string& yaml_text, const std::string& base_dir) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    throw ConfigError("invalid experiment configuration: not valid YAML: " + std::string(e.what()));
  }
  if (!root.IsMap())
    throw ConfigError(
        "invalid experiment configuration: the top level must be a map of keys (name:, hyperparameters:, ...)");

  ExperimentConfig c;
  Reader r;
  r.check_keys(root, "", kTopKeys);
  r.scalar(root["name"], "name", c.name, "a string");
  r.scalar(root["description"], "description", c.description, "a string");
  read_entrypoint(r, root, base_dir, c);

  const auto hp = root["hyperparameters"];
  if (!hp) r.error("hyperparameters", "missing; set at least hyperparameters.global_batch_size (e.g. 64)");
  if (r.is_map(hp, "hyperparameters")) {
    r.check_keys(hp, "hyperparameters", kHyperparameterKeys);
    if (!hp["global_batch_size"])
      r.error("hyperparameters.global_batch_size",
              "missing; set the samples per optimizer step over all slots, e.g. 64");
    r.integer(hp["global_batch_size"], "hyperparameters.global_batch_size", c.global_batch_size, 1, 1 << 24,
              "use a positive number of samples per step, e.g. 64");
    r.number(hp["learning_rate"], "hyperparameters.learning_rate", c.learning_rate, 1e-12, 100,
             "use a positive rate, e.g. 0.01");
    read_optimizer(r, hp, c);
    r.choice(hp["model"], "hyperparameters.model", c.model, {"convnet", "mlp"});
    r.number(hp["dropout"], "hyperparameters.dropout", c.dropout, 0, 0.99,
             "use a drop probability in [0, 0.99], e.g. 0.4 (0 = off)");
    r.integer(hp["mlp_hidden"], "hyperparameters.mlp_hidden", c.mlp_hidden, 1, 1 << 16, "use a layer width, e.g. 256");
    const YAML::Node slices = hp["layer_slices"];
    if (!(slices && slices.IsScalar() && slices.Scalar() == "auto")) {
      r.integer(hp["layer_slices"], "hyperparameters.layer_slices", c.layer_slices, 1, 64,
                "use auto (the default), 1 (whole layers) or up to 64 slices per hidden fully-connected layer, e.g. 8");
    }
    // fc2 (hidden inputs a row) is the mlp layer with the fewest possible blocks.
    const int64_t most = most_row_blocks(c.mlp_hidden, c.mlp_hidden);
    if (!c.entrypoint.empty()) {
      if (c.layer_slices > 1)
        r.error("hyperparameters.layer_slices", std::to_string(c.layer_slices) +
                                                    " slices apply to the built-in models only, not to entrypoint's "
                                                    "TorchScript module; remove layer_slices or entrypoint");
      for (const char* k : {"model", "mlp_hidden"})
        if (hp[k])
          c.notes.push_back(std::string("hyperparameters.") + k +
                            " is not used: entrypoint's TorchScript module is the model");
    }
    if (c.entrypoint.empty() && c.model == "mlp" && c.layer_slices != kAutoLayerSlices && c.layer_slices > most)
      r.error("hyperparameters.layer_slices", std::to_string(c.layer_slices) + " slices of a " +
                                                  std::to_string(c.mlp_hidden) + "-wide layer; use at most " +
                                                  std::to_string(most) +
                                                  " (each block of fc2 holds a multiple of 16 weights)");
  }

  const auto res = root["resources"];
  if (r.is_map(res, "resources")) {
    r.check_keys(res, "resources", kResourceKeys);
    r.integer(res["slots_per_trial"], "resources.slots_per_trial", c.slots_per_trial, 1, 1024, "use 1 to 1024 slots");
    r.integer(res["slots_per_host"], "resources.slots_per_host", c.slots_per_host, 1, 1024, "use 1 to 1024 slots");
    if (res["hosts"]) {
      if (!res["hosts"].IsSequence()) {
        r.error("resources.hosts", "expected a list of host names, got " + Reader::show(res["hosts"]));
      } else {
        for (const auto& h : res["hosts"]) c.hosts.push_back(h.as<std::string>());
      }
    }
  }

  const auto searcher = root["searcher"];
  if (r.is_map(searcher, "searcher")) {
    r.check_keys(searcher, "searcher", kSearcherKeys);
    std::string name = "single";
    r.choice(searcher["name"], "searcher.name", name, {"single"});
    r.choice(searcher["metric"], "searcher.metric", c.searcher_metric, {"validation_accuracy", "validation_loss"});
    // Determined defaults smaller_is_better to true; tandem's default metric is the accuracy, so the default follows
    // the metric.
    c.smaller_is_better = c.searcher_metric == "validation_loss";
    r.boolean(searcher["smaller_is_better"], "searcher.smaller_is_better", c.smaller_is_better);
    r.length(searcher["max_length"], "searcher.max_length", c.max_length);
  }
  if (!c.max_length.set() && r.errors.empty())
    r.error("searcher.max_length",
            "missing; set how long to train, e.g. searcher: {name: single, metric: validation_accuracy, max_length: "
            "{epochs: 1}}");
  r.length(root["min_validation_period"], "min_validation_period", c.min_validation_period);
  r.length(root["min_checkpoint_period"], "min_checkpoint_period", c.min_checkpoint_period);
  r.integer(root["records_per_epoch"], "records_per_epoch", c.records_per_epoch, 1, int64_t{1} << 40,
            "use the number of training records per epoch, e.g. 60000");

  const auto opt = root["optimizations"];
  if (r.is_map(opt, "optimizations")) {
    r.check_keys(opt, "optimizations", kOptimizationKeys);
    auto& o = c.optimizations;
    r.integer(opt["aggregation_frequency"], "optimizations.aggregation_frequency", o.aggregation_frequency, 1, 1024,
              "use 1 (communicate every batch) or more batches per communication");
    r.boolean(opt["average_aggregated_gradients"], "optimizations.average_aggregated_gradients",
              o.average_aggregated_gradients);
    r.boolean(opt["average_training_metrics"], "optimizations.average_training_metrics", o.average_training_metrics);
    if (const auto gc = opt["gradient_compression"]; gc && !gc.IsNull()) {
      // Determined's key is a boolean (true = fp16); tandem also takes the codec's name.
      const auto codec = gc.IsScalar() ? compression::parse_codec(gc.Scalar()) : std::nullopt;
      if (codec)
        o.gradient_compression = std::string(compression::to_string(*codec));
      else
        r.error("optimizations.gradient_compression",
                Reader::show(gc) + " is not a codec; use true (fp16), fp16, bf16, false or none");
    }
    r.number(opt["gradient_predivide_factor"], "optimizations.gradient_predivide_factor", o.gradient_predivide_factor,
             1e-6, 1e6, "use a positive factor, e.g. 1.0 (divide before summing, the rest after)");
    // The factor only changes what a 16-bit sum can hold; f32 gradients are averaged exactly as they are.
    if (opt["gradient_predivide_factor"] && o.gradient_compression == "none")
      c.notes.push_back(
          "optimizations.gradient_predivide_factor acts only on compressed gradients; "
          "it has no effect while optimizations.gradient_compression is off");
    r.boolean(opt["error_feedback"], "optimizations.error_feedback", o.error_feedback);
    r.boolean(opt["auto_tune_tensor_fusion"], "optimizations.auto_tune_tensor_fusion", o.auto_tune_tensor_fusion);
    r.integer(opt["tensor_fusion_threshold"], "optimizations.tensor_fusion_threshold", o.tensor_fusion_threshold_mb, 1,
              4096, "use megabytes per fused bucket, 1 to 4096 (Determined's default 64)");
    r.integer(opt["tensor_fusion_cycle_time"], "optimizations.tensor_fusion_cycle_time", o.tensor_fusion_cycle_time_ms,
              1, 10000, "use milliseconds, 1 to 10000 (Determined's default 5)");
    if (opt["tensor_fusion_cycle_time"])
      c.notes.push_back(
          "optimizations.tensor_fusion_cycle_time: Horovod's cycle time batches the tensors ready within "
          "it; tandem launches a bucket as soon as it is full or backward ends, so the value only bounds "
          "the idle engine's sleep");
    std::string mp;
    if (r.scalar(opt["mixed_precision"], "optimizations.mixed_precision", mp, "an apex level (O0)") && mp != "O0")
      r.error("optimizations.mixed_precision", "'" + mp +
                                                   "': automatic mixed precision (AMP) is not implemented for "
                                                   "CPU training; use O0 (full precision) or remove the key");
    if (o.error_feedback && o.gradient_compression == "none")
      r.error("optimizations.error_feedback",
              "'true' needs a compressed gradient; set optimizations.gradient_compression: fp16 or bf16, or "
              "error_feedback: false");
  }

  const auto cs = root["checkpoint_storage"];
  if (r.is_map(cs, "checkpoint_storage")) {
    r.check_keys(cs, "checkpoint_storage", kCheckpointStorageKeys);
    std::string type = "shared_fs";
    r.choice(cs["type"], "checkpoint_storage.type", type, {"shared_fs"});
    std::string host_path, storage_path;
    r.scalar(cs["host_path"], "checkpoint_storage.host_path", host_path, "a directory");
    r.scalar(cs["storage_path"], "checkpoint_storage.storage_path", storage_path, "a directory");
    if (host_path.empty() && cs["type"])
      r.error("checkpoint_storage.host_path",
              "missing; set the directory checkpoints go to, e.g. checkpoints (a relative path is under --output)");
    c.checkpoint_dir = host_path;
    if (!storage_path.empty()) c.checkpoint_dir += (host_path.empty() ? "" : "/") + storage_path;
    const std::string fix = "use a count of checkpoints, e.g. 1";
    r.integer(cs["save_trial_best"], "checkpoint_storage.save_trial_best", c.save_trial_best, 0, 1 << 20, fix);
    r.integer(cs["save_trial_latest"], "checkpoint_storage.save_trial_latest", c.save_trial_latest, 0, 1 << 20, fix);
    r.integer(cs["save_experiment_best"], "checkpoint_storage.save_experiment_best", c.save_experiment_best, 0, 1 << 20,
              fix);
    if (c.save_experiment_best > c.save_trial_best)
      c.notes.push_back("checkpoint_storage.save_experiment_best " + std::to_string(c.save_experiment_best) +
                        " has no further effect: an experiment is one trial, whose best are kept by save_trial_best (" +
                        std::to_string(c.save_trial_best) + ")");
  }
  r.integer(root["max_restarts"], "max_restarts", c.max_restarts, 0, 1000,
            "use 0 (never restart) to 1000; Determined's default is 5");

  const auto rep = root["reproducibility"];
  if (r.is_map(rep, "reproducibility")) {
    r.check_keys(rep, "reproducibility", kReproducibilityKeys);
    int64_t seed = 0;
    r.integer(rep["experiment_seed"], "reproducibility.experiment_seed", seed, 0, (int64_t{1} << 31) - 1,
              "use 0 to 2147483647");
    c.seed = static_cast<uint64_t>(seed);
  }
  r.scalar(root["dtrain_network_interface"], "dtrain_network_interface", c.network_interface,
           "an interface name or list (eth0, ^docker, =eth0)");

  if (const auto d = root["data"]; d && !d.IsNull()) {
    const std::vector<std::string> kinds = {"fashion-mnist", "synthetic"};
    if (d.IsMap()) {
      r.check_keys(d, "data", kDataKeys);
      r.choice(d["type"], "data.type", c.data, kinds);
      r.scalar(d["path"], "data.path", c.data_path, "a directory");
    } else {
      r.choice(d, "data", c.data, kinds);
    }
  }

  c.warnings = c.notes;
  if (r.errors.empty()) validate_slots(c, r.errors);
  if (!r.errors.empty()) fail(r.errors);
  return c;
}

ExperimentConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read experiment configuration '" + path + "': no such file or not readable");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_config(ss.str(), std::filesystem::path(path).parent_path().string());
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

const std::vector<std::pair<std::string, std::vector<std::string>>>& known_config_keys() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> keys = {
      {"", kTopKeys},
      {"hyperparameters", kHyperparameterKeys},
      {"hyperparameters.lr_schedule", kLrScheduleKeys},
      {"resources", kResourceKeys},
      {"searcher", kSearcherKeys},
      {"optimizations", kOptimizationKeys},
      {"checkpoint_storage", kCheckpointStorageKeys},
      {"reproducibility", kReproducibilityKeys},
      {"data", kDataKeys}};
  return keys;
}

std::string checkpoint_storage_dir(const ExperimentConfig& config, const std::string& output_dir) {
  if (config.checkpoint_dir.empty()) return "";
  const std::filesystem::path dir(config.checkpoint_dir);
  return dir.is_absolute() ? config.checkpoint_dir : (std::filesystem::path(output_dir) / dir).string();
}

int layer_slices_for(const ExperimentConfig& c, int hosts) {
  if (c.layer_slices != kAutoLayerSlices) return c.layer_slices;
  if (hosts <= 1 || !c.entrypoint.empty()) return 1;
  constexpr int64_t kAcrossHosts = 16;  // the link runs measured best with 16 (performance.md)
  const int64_t most = c.model == "mlp" ? most_row_blocks(c.mlp_hidden, c.mlp_hidden) : kAcrossHosts;
  return int(std::max<int64_t>(1, std::min(kAcrossHosts, most)));
}

void set_slots(ExperimentConfig& c, int slots, int64_t per_slot_batch) {
  c.slots_per_trial = slots;
  if (per_slot_batch > 0) c.global_batch_size = per_slot_batch * slots;
  c.warnings = c.notes;
  std::vector<std::string> errors;
  validate_slots(c, errors);
  if (!errors.empty()) fail(errors);
}

}  // namespace tandem::trainer
