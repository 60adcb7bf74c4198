#include "config_reader.h"

#include <algorithm>
#include <cmath>
#include <utility>

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

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

std::string ConfigReader::show(const YAML::Node& n) {
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  if (n.IsMap()) return "a map";
  return "nothing";
}

void ConfigReader::check_keys(const YAML::Node& map, const std::string& path, const std::vector<std::string>& known) {
  std::vector<std::string> seen;
  for (const auto& kv : map) {
    const std::string key = kv.first.as<std::string>();
    const std::string full = path.empty() ? key : path + "." + key;
    if (std::find(seen.begin(), seen.end(), key) != seen.end()) {
      error(full, "given twice (only the first would count); keep one");
      continue;
    }
    seen.push_back(key);
    if (std::find(known.begin(), known.end(), key) != known.end()) continue;
    const std::string hint = did_you_mean(key, known);
    error(full, "unknown key" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                    " (valid here: " + join(known) + ")");
  }
}

bool ConfigReader::is_map(const YAML::Node& n, const std::string& key) {
  if (!n || n.IsNull()) return false;
  if (!n.IsMap()) {
    error(key, "expected a map of keys, got " + show(n));
    return false;
  }
  return true;
}

template <class T>
bool ConfigReader::scalar(const YAML::Node& n, const std::string& key, T& out, const std::string& what) {
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

bool ConfigReader::text(const YAML::Node& n, const std::string& key, std::string& out, const std::string& what) {
  return scalar(n, key, out, what);
}

bool ConfigReader::integer(const YAML::Node& n, const std::string& key, int64_t& out, int64_t min, int64_t max,
                           const std::string& fix) {
  int64_t v = 0;
  if (!scalar(n, key, v, "an integer")) return false;
  if (v < min || v > max) {
    error(key, "'" + n.Scalar() + "' is out of range; " + fix);
    return false;
  }
  out = v;
  return true;
}

bool ConfigReader::number(const YAML::Node& n, const std::string& key, double& out, double min, double max,
                          const std::string& fix) {
  double v = 0;
  if (!scalar(n, key, v, "a number")) return false;
  if (!std::isfinite(v) || v < min || v > max) {
    error(key, "'" + n.Scalar() + "' is out of range; " + fix);
    return false;
  }
  out = v;
  return true;
}

bool ConfigReader::boolean(const YAML::Node& n, const std::string& key, bool& out) {
  return scalar(n, key, out, "true or false");
}

bool ConfigReader::choice(const YAML::Node& n, const std::string& key, std::string& out,
                          const std::vector<std::string>& valid) {
  std::string v;
  if (!scalar(n, key, v, "a name")) return false;
  if (std::find(valid.begin(), valid.end(), v) != valid.end()) {
    out = v;
    return true;
  }
  const std::string hint = did_you_mean(v, valid);
  error(key, "unknown value '" + v + "'" + (hint.empty() ? "" : "; did you mean '" + hint + "'?") +
                 " (valid: " + join(valid) + ")");
  return false;
}

void ConfigReader::length(const YAML::Node& n, const std::string& key, Length& out) {
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

}  // namespace tandem::trainer
