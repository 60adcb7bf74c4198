// The experiment keys of `tandem train`, one row each: parse_config walks
// this table (a section's rows name its valid keys and the did-you-mean
// candidates), and docs/training.md's key reference is printed from it
// (`tandem train --print-keys --markdown`).
//
// Terms: a section is a key whose value is a map of further keys (its rows
// are those whose path continues the section's); a key is given when the
// YAML holds it, even as null.
#pragma once

#include <yaml-cpp/yaml.h>

#include <functional>
#include <string>
#include <vector>

#include "config.h"
#include "config_reader.h"

namespace tandem::trainer {

struct ExperimentKey {
  std::string path;  // dotted: "optimizations.tensor_fusion_threshold"
  bool section = false;
  std::string type;        // as documented: "integer", "true/false", "length", ...
  std::string values;      // the range or the accepted values, as documented
  std::string fallback;    // tandem's default, as documented
  std::string determined;  // Determined's default, "required", or why there is none
  std::string doc;         // what the key does in tandem (Markdown)
  std::string missing;     // a required key: what to do when it is missing
  std::string note;        // printed when the key is given: it acts differently than in Determined
  bool ignored = false;    // accepted with its note and otherwise ignored (Determined's infrastructure)
  bool open = false;       // a section whose keys outside the table are the user's, recorded as given
  // Only meaningful while the key at `used_with` holds one of `used_by`: given otherwise, it is an error.
  std::string used_with;
  std::vector<std::string> used_by;
  // Stores a given value into the config (null for a section; a section with
  // one takes a scalar in place of its map, as `data: synthetic`).
  std::function<void(const YAML::Node&, ConfigReader&, ExperimentConfig&)> read;
  // The value a config holds, as `used_with` compares it.
  std::function<std::string(const ExperimentConfig&)> show;

  std::string name() const { return path.substr(path.rfind('.') + 1); }
  std::string parent() const { return path.find('.') == std::string::npos ? "" : path.substr(0, path.rfind('.')); }
};

// Every key, sections before their keys, in the order they are read.
const std::vector<ExperimentKey>& experiment_keys();
// The keys directly under `section` ("" = the top level).
std::vector<const ExperimentKey*> keys_under(const std::string& section);

// The reference as one Markdown table, and as plain text for a terminal.
std::string experiment_keys_markdown();
std::string experiment_keys_text();

// The lines that enclose the generated reference in docs/training.md.
extern const char* const kKeyReferenceBegin;
extern const char* const kKeyReferenceEnd;
// `doc` with the text between its markers replaced by experiment_keys_markdown();
// throws ConfigError when `doc` lacks the markers.
std::string with_key_reference(const std::string& doc);

}  // namespace tandem::trainer
