// The key reference printed from experiment_keys(): docs/training.md's table
// and `tandem train --print-keys`.
#include <algorithm>

#include "config_keys.h"

namespace tandem::trainer {

const char* const kKeyReferenceBegin =
    "<!-- experiment keys: from trainer/config_keys.cc by `tandem train --print-keys --update-doc` -->";
const char* const kKeyReferenceEnd = "<!-- end of experiment keys -->";

namespace {

std::string cell(std::string text) {
  for (size_t at = 0; (at = text.find('|', at)) != std::string::npos; at += 2) text.insert(at, "\\");
  return text.empty() ? "—" : text;
}

// The row's doc, then what the table itself enforces about it.
std::string meaning(const ExperimentKey& k) {
  std::string out = k.doc;
  if (!k.used_with.empty())
    out += " Only while `" + k.used_with + "` is " + join(k.used_by, " or ") + "; given otherwise, an error.";
  if (k.ignored)
    out += " Accepted with one warning and otherwise " + k.note + ".";
  else if (!k.note.empty())
    out += " Accepted with a warning: " + k.note + ".";
  return out;
}

std::string tandem_default(const ExperimentKey& k) { return k.missing.empty() ? k.fallback : "required"; }

}  // namespace

std::string experiment_keys_markdown() {
  std::string out =
      "| key | type | values | default | Determined's default | in tandem |\n"
      "|---|---|---|---|---|---|\n";
  for (const auto& k : experiment_keys())
    out += "| `" + k.path + "` | " + cell(k.type) + " | " + cell(k.values) + " | " + cell(tandem_default(k)) + " | " +
           cell(k.determined) + " | " + cell(meaning(k)) + " |\n";
  return out;
}

std::string experiment_keys_text() {
  std::string out;
  for (const auto& k : experiment_keys()) {
    out += k.path + "  (" + k.type + (k.values.empty() ? "" : ": " + k.values) + ")  default " +
           (tandem_default(k).empty() ? "none" : tandem_default(k)) + "; Determined's " + k.determined + "\n";
    out += "    " + meaning(k) + "\n";
  }
  return out;
}

std::string with_key_reference(const std::string& doc) {
  const size_t begin = doc.find(kKeyReferenceBegin);
  const size_t end = doc.find(kKeyReferenceEnd);
  if (begin == std::string::npos || end == std::string::npos || end < begin)
    throw ConfigError(std::string("the document has no experiment key reference to replace: it needs a line ") +
                      kKeyReferenceBegin + " and, after it, a line " + kKeyReferenceEnd);
  const size_t body = begin + std::string(kKeyReferenceBegin).size();
  return doc.substr(0, body) + "\n" + experiment_keys_markdown() + doc.substr(end);
}

}  // namespace tandem::trainer
