// Reads the values of an experiment YAML into typed fields, collecting every
// problem as "<dotted key>: <what is wrong and the fix>" instead of stopping
// at the first, so parse_config can list them all.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace tandem::trainer {

class ConfigReader {
 public:
  explicit ConfigReader(std::string base_dir = "") : base_dir(std::move(base_dir)) {}

  std::vector<std::string> errors;
  std::string base_dir;  // the YAML's directory: relative paths are taken from it ("" = the working directory)

  void error(const std::string& key, const std::string& message) { errors.push_back(key + ": " + message); }

  // A value as messages quote it: 'text', a list, a map or nothing.
  static std::string show(const YAML::Node& n);

  // Keys given twice, and keys not in `known` (with a did-you-mean among them).
  void check_keys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& known);

  // Absent or null: false, silently. Otherwise each returns whether it stored a value.
  bool is_map(const YAML::Node& n, const std::string& key);
  bool text(const YAML::Node& n, const std::string& key, std::string& out, const std::string& what);
  bool integer(const YAML::Node& n, const std::string& key, int64_t& out, int64_t min, int64_t max,
               const std::string& fix);
  bool number(const YAML::Node& n, const std::string& key, double& out, double min, double max, const std::string& fix);
  bool boolean(const YAML::Node& n, const std::string& key, bool& out);
  bool choice(const YAML::Node& n, const std::string& key, std::string& out, const std::vector<std::string>& valid);
  // {batches: N} | {records: N} | {epochs: N}
  void length(const YAML::Node& n, const std::string& key, Length& out);

 private:
  template <class T>
  bool scalar(const YAML::Node& n, const std::string& key, T& out, const std::string& what);
};

// "a, b, c"
std::string join(const std::vector<std::string>& items, const std::string& separator = ", ");

}  // namespace tandem::trainer
