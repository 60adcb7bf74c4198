#include "config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "config_keys.h"
#include "config_reader.h"
#include "row_blocks.h"

namespace tandem::trainer {

const std::vector<std::string> kOptimizers = {"sgd", "adam", "adamw", "adadelta"};

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

// The config being read, the problems found so far, and the YAML it comes from.
struct KeyWalk {
  const YAML::Node& root;
  ConfigReader& reader;
  ExperimentConfig& config;
  std::vector<std::string> refused;  // hyperparameters already reported: their keys are not read again
  std::vector<size_t> near_misses;   // the notes of user keys close to a known one, by index

  // The node at a dotted path, when every section on the way is a map holding the next key.
  std::optional<YAML::Node> node_at(const std::string& path) const {
    YAML::Node n = root;
    for (size_t from = 0;;) {
      const size_t dot = path.find('.', from);
      if (!n.IsMap()) return std::nullopt;
      const YAML::Node next = static_cast<const YAML::Node&>(n)[path.substr(from, dot - from)];
      if (!next) return std::nullopt;
      n.reset(next);
      if (dot == std::string::npos) return n;
      from = dot + 1;
    }
  }
  bool given(const std::string& path) const { return node_at(path).has_value(); }
};

// Determined's hyperparameter types: const is one value; the others are
// search spaces that only a sampling searcher explores.
const std::vector<std::string> kHyperparameterTypes = {"const", "int", "double", "log", "categorical"};

bool is_typed(const YAML::Node& n) {
  if (!n.IsMap() || !n["type"] || !n["type"].IsScalar()) return false;
  const std::string type = n["type"].Scalar();
  return std::find(kHyperparameterTypes.begin(), kHyperparameterTypes.end(), type) != kHyperparameterTypes.end();
}

// Each {type: const, val: V} below `map` replaced by V; a search space is an
// error naming the searcher it needs, and its path is refused.
void resolve_typed(YAML::Node map, const std::string& path, KeyWalk& w) {
  std::vector<std::string> keys;
  for (const auto& kv : map) keys.push_back(kv.first.as<std::string>());
  for (const std::string& key : keys) {
    const std::string full = path + "." + key;
    YAML::Node value = map[key];
    if (!is_typed(value)) {
      if (value.IsMap()) resolve_typed(value, full, w);
      continue;
    }
    const std::string type = value["type"].Scalar();
    if (type != "const") {
      w.reader.error(full, "{type: " + type +
                               "} is a search space, which only a searcher that samples explores (Determined's "
                               "random, grid or adaptive_asha); tandem runs searcher single: give one value, as "
                               "{type: const, val: ...} or the value itself");
      w.refused.push_back(full);
      continue;
    }
    w.reader.check_keys(value, full, {"type", "val"});
    if (!value["val"] || value["val"].IsNull()) {
      w.reader.error(full, "{type: const} without val; give the value, e.g. {type: const, val: 64}");
      w.refused.push_back(full);
      continue;
    }
    map[key] = YAML::Clone(value["val"]);
    if (map[key].IsMap()) resolve_typed(map[key], full, w);
  }
}

std::string flow_yaml(const YAML::Node& n) {
  if (n.IsScalar()) return n.Scalar();
  YAML::Emitter out;
  out << YAML::Flow << n;
  return out.c_str();
}

// A section's keys that the table lacks: recorded as the user's (an open
// section such as hyperparameters), a near miss of a known key noted.
void record_user_keys(const YAML::Node& map, const std::string& section, const std::vector<std::string>& known,
                      KeyWalk& w) {
  std::vector<std::string> all = known;
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    all.push_back(key);
    w.config.user_hyperparameters.emplace_back(key, flow_yaml(kv.second));
    if (const std::string hint = did_you_mean(key, known); !hint.empty())
      w.near_misses.push_back(w.config.notes.size()),
          w.config.notes.push_back(section + "." + key + " is not one tandem reads (did you mean '" + hint +
                                   "'?); it is kept as the model's own, for an entrypoint attribute of that name");
  }
  w.reader.check_keys(map, section, all);  // keys given twice
}

const ExperimentKey* find_key(const std::string& path) {
  for (const auto& k : experiment_keys())
    if (k.path == path) return &k;
  return nullptr;
}

// A section that is absent or empty: its required keys are missing too.
void report_missing(const std::string& section, KeyWalk& w) {
  for (const ExperimentKey* k : keys_under(section)) {
    if (!k->missing.empty())
      w.reader.error(k->path, k->missing);
    else if (k->section)
      report_missing(k->path, w);
  }
}

// Reads a section's keys in the table's order: unknown and repeated keys, then each value.
void read_section(const YAML::Node& map, const std::string& section, KeyWalk& w) {
  const auto keys = keys_under(section);
  std::vector<std::string> names;
  for (const ExperimentKey* k : keys) names.push_back(k->name());
  const ExperimentKey* self = find_key(section);
  if (self && self->open)
    record_user_keys(map, section, names, w);
  else
    w.reader.check_keys(map, section, names);
  for (const ExperimentKey* k : keys) {
    if (std::find(w.refused.begin(), w.refused.end(), k->path) != w.refused.end()) continue;
    const YAML::Node n = map[k->name()];
    const bool empty = !n || n.IsNull();
    if (empty && !k->missing.empty()) {
      w.reader.error(k->path, k->missing);
    } else if (empty && k->section && !k->read) {
      report_missing(k->path, w);
    } else if (n && k->section && n.IsMap()) {
      read_section(n, k->path, w);
    } else if (n && k->read) {
      k->read(n, w.reader, w.config);
    } else if (n && k->section) {
      w.reader.is_map(n, k->path);
    }
    if (n && !k->note.empty()) w.config.notes.push_back(k->path + ": " + k->note);
  }
}

// Keys given while the key they depend on holds another value.
void check_used_with(KeyWalk& w) {
  for (const auto& k : experiment_keys()) {
    if (k.used_with.empty() || !w.given(k.path)) continue;
    const auto& keys = experiment_keys();
    const auto selector = std::find_if(keys.begin(), keys.end(), [&](const auto& s) { return s.path == k.used_with; });
    const std::string value = selector->show(w.config);
    if (std::find(k.used_by.begin(), k.used_by.end(), value) != k.used_by.end()) continue;
    const std::string wanted = join(k.used_by, " or ");
    w.reader.error(k.path, "set, but only " + selector->name() + " " + wanted + " uses it (" + selector->name() +
                               " is " + value + "); remove it or set " + k.used_with + ": " + wanted);
  }
}

void check_hyperparameters(KeyWalk& w) {
  ExperimentConfig& c = w.config;
  if (c.optimizer != "sgd") c.momentum = 0;
  if (c.optimizer == "sgd" && c.nesterov && c.momentum <= 0)
    w.reader.error("hyperparameters.nesterov", "'true' needs momentum > 0 (hyperparameters.momentum is " +
                                                   std::to_string(c.momentum) +
                                                   "); set momentum, e.g. 0.9, or nesterov: false");
  const std::string at = "hyperparameters.lr_schedule";
  const LrSchedule& s = c.lr_schedule;
  if (s.type == "step" && !s.step_size.set() && !w.given(at + ".step_size"))
    w.reader.error(at + ".step_size",
                   "missing; type step multiplies the rate by gamma every step_size, e.g. {epochs: 1}");
  if (s.type == "cosine" && s.min_learning_rate >= c.learning_rate)
    w.reader.error(at + ".min_learning_rate", std::to_string(s.min_learning_rate) +
                                                  " is not below hyperparameters.learning_rate " +
                                                  std::to_string(c.learning_rate) + "; use a smaller value, e.g. 0");
}

// The built-in models' keys against entrypoint's module, and slices the MLP can hold.
void check_model(KeyWalk& w) {
  ExperimentConfig& c = w.config;
  if (!c.entrypoint.empty()) {
    // The module's attributes take such names; the worker names those that none takes.
    for (auto at = w.near_misses.rbegin(); at != w.near_misses.rend(); ++at)
      c.notes.erase(c.notes.begin() + static_cast<std::ptrdiff_t>(*at));
    if (c.layer_slices > 1)
      w.reader.error("hyperparameters.layer_slices",
                     std::to_string(c.layer_slices) +
                         " slices apply to the built-in models only, not to entrypoint's TorchScript module; "
                         "remove layer_slices or entrypoint");
    for (const std::string k : {"hyperparameters.model", "hyperparameters.mlp_hidden"})
      if (w.given(k)) c.notes.push_back(k + " is not used: entrypoint's TorchScript module is the model");
    return;
  }
  // fc2 (hidden inputs a row) is the mlp layer with the fewest possible blocks.
  const int64_t most = most_row_blocks(c.mlp_hidden, c.mlp_hidden);
  if (c.model == "mlp" && c.layer_slices != kAutoLayerSlices && c.layer_slices > most)
    w.reader.error("hyperparameters.layer_slices", std::to_string(c.layer_slices) + " slices of a " +
                                                       std::to_string(c.mlp_hidden) + "-wide layer; use at most " +
                                                       std::to_string(most) +
                                                       " (each block of fc2 holds a multiple of 16 weights)");
}

void check_searcher(KeyWalk& w, bool length_required) {
  const auto length = w.node_at("searcher.max_length");
  if (length_required && !w.config.max_length.set() && (!length || length->IsNull()))
    w.reader.error("searcher.max_length",
                   "not given, and no --max-batches; give the training length as the entrypoint's --epochs N "
                   "(entrypoint: model.pt --epochs 1, as Determined 0.38's training scripts take it), "
                   "searcher.max_length (e.g. {epochs: 1}) or tandem train --max-batches N");
  // Determined defaults smaller_is_better to true; tandem's default metric is the accuracy, so the default follows
  // the metric.
  const auto given = w.node_at("searcher.smaller_is_better");
  if (!given || given->IsNull()) w.config.smaller_is_better = w.config.searcher_metric == "validation_loss";
}

void check_optimizations(KeyWalk& w) {
  ExperimentConfig& c = w.config;
  const bool compressed = c.optimizations.gradient_compression != "none";
  // The factor only changes what a 16-bit sum can hold; f32 gradients are averaged exactly as they are.
  if (w.given("optimizations.gradient_predivide_factor") && !compressed)
    c.notes.push_back(
        "optimizations.gradient_predivide_factor acts only on compressed gradients; "
        "it has no effect while optimizations.gradient_compression is off");
  if (c.optimizations.error_feedback && !compressed)
    w.reader.error("optimizations.error_feedback",
                   "'true' needs a compressed gradient; set optimizations.gradient_compression: fp16 or bf16, or "
                   "error_feedback: false");
}

void check_storage(KeyWalk& w) {
  ExperimentConfig& c = w.config;
  const auto host = w.node_at("checkpoint_storage.host_path");
  if (w.given("checkpoint_storage.type") && (!host || !host->IsScalar() || host->Scalar().empty()))
    w.reader.error(
        "checkpoint_storage.host_path",
        "missing; set the directory checkpoints go to, e.g. checkpoints (a relative path is under --output)");
  if (c.save_experiment_best > c.save_trial_best)
    c.notes.push_back("checkpoint_storage.save_experiment_best " + std::to_string(c.save_experiment_best) +
                      " has no further effect: an experiment is one trial, whose best are kept by save_trial_best (" +
                      std::to_string(c.save_trial_best) + ")");
}

void check_elastic(KeyWalk& w) {
  if (!w.given("elastic")) return;
  if (!w.given("elastic.min_slots")) {
    w.reader.error("elastic.min_slots", "missing; give the fewest slots the trial may go on with, e.g. {min_slots: 2}");
    return;
  }
}

// elastic against the slot count (also after --slots changed it).
void validate_elastic(ExperimentConfig& c, std::vector<std::string>& errors) {
  if (!c.elastic()) return;
  if (c.elastic_min_slots > c.slots_per_trial || c.slots_per_trial > c.elastic_max())
    errors.push_back("elastic.min_slots " + std::to_string(c.elastic_min_slots) + " <= slots " +
                     std::to_string(c.slots_per_trial) + " <= elastic.max_slots " + std::to_string(c.elastic_max()) +
                     " does not hold; the trial starts with resources.slots_per_trial (or --slots) slots, so set "
                     "min_slots at most and max_slots at least that");
}

void validate_slots(ExperimentConfig& c, std::vector<std::string>& errors) {
  validate_elastic(c, errors);
  if (c.global_batch_defaulted) {
    c.global_batch_size = kDefaultPerSlotBatch * c.slots_per_trial;
    c.warnings.push_back("hyperparameters.global_batch_size not given: each slot trains " +
                         std::to_string(kDefaultPerSlotBatch) +
                         " samples a batch (the data loader's batch of Determined's tutorial train.py), a global "
                         "batch of " +
                         std::to_string(c.global_batch_size) + " over " + std::to_string(c.slots_per_trial) + " slot" +
                         (c.slots_per_trial == 1 ? "" : "s") + "; set global_batch_size to choose");
  }
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

ExperimentConfig parse_config(const std::string& yaml_text, const std::string& base_dir, bool length_required) {
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
  ConfigReader r(base_dir);
  root = YAML::Clone(root);
  KeyWalk w{root, r, c, {}, {}};
  if (root["hyperparameters"] && root["hyperparameters"].IsMap())
    resolve_typed(root["hyperparameters"], "hyperparameters", w);
  read_section(root, "", w);
  check_used_with(w);
  check_hyperparameters(w);
  check_model(w);
  c.global_batch_defaulted = c.global_batch_size == 0;
  c.optimizer_given = w.given("hyperparameters.optimizer");
  check_searcher(w, length_required);
  check_optimizations(w);
  check_storage(w);
  check_elastic(w);
  c.warnings = c.notes;
  validate_slots(c, r.errors);
  if (!r.errors.empty()) fail(r.errors);
  return c;
}

ExperimentConfig load_config(const std::string& path, bool length_required) {
  std::ifstream in(path);
  if (!in) throw ConfigError("cannot read experiment configuration '" + path + "': no such file or not readable");
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return parse_config(ss.str(), std::filesystem::path(path).parent_path().string(), length_required);
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
}

int64_t epoch_records(const ExperimentConfig& c, int64_t training_records, std::vector<std::string>& warnings) {
  if (c.records_per_epoch <= 0) return training_records;
  if (c.records_per_epoch <= training_records) return c.records_per_epoch;
  warnings.push_back("records_per_epoch " + std::to_string(c.records_per_epoch) + " is more than the " +
                     std::to_string(training_records) + " training records; an epoch counts " +
                     std::to_string(training_records) + " (set records_per_epoch: " + std::to_string(training_records) +
                     " or less to silence this)");
  return training_records;
}

std::string checkpoint_storage_dir(const ExperimentConfig& config, const std::string& output_dir) {
  if (config.checkpoint_dir.empty()) return "";
  const std::filesystem::path dir(config.checkpoint_dir);
  return dir.is_absolute() ? config.checkpoint_dir : (std::filesystem::path(output_dir) / dir).string();
}

int layer_slices_for(const ExperimentConfig& c, int hosts) {
  if (c.layer_slices != kAutoLayerSlices) return c.layer_slices;
  if (hosts <= 1 || !c.entrypoint.empty()) return 1;
  constexpr int64_t kAcrossHosts =
      16;  // the link runs measured best with 16 (bench/log/measurements.md, "Time to accuracy with whole layers")
  const int64_t most = c.model == "mlp" ? most_row_blocks(c.mlp_hidden, c.mlp_hidden) : kAcrossHosts;
  return int(std::max<int64_t>(1, std::min(kAcrossHosts, most)));
}

int slots_per_placed_host(const ExperimentConfig& c) {
  if (c.hosts.empty()) return c.slots_per_trial;
  return c.slots_per_host > 0 ? c.slots_per_host : std::max(1, c.slots_per_trial / int(c.hosts.size()));
}

int placed_hosts(const ExperimentConfig& c) {
  const int per_host = slots_per_placed_host(c);
  return std::max(1, (c.slots_per_trial + per_host - 1) / per_host);
}

void set_slots(ExperimentConfig& c, int slots, int64_t per_slot_batch) {
  c.slots_per_trial = slots;
  if (per_slot_batch > 0) c.global_batch_size = per_slot_batch * slots, c.global_batch_defaulted = false;
  c.warnings = c.notes;
  std::vector<std::string> errors;
  validate_slots(c, errors);
  if (!errors.empty()) fail(errors);
}

}  // namespace tandem::trainer
