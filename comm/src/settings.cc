// The settings mechanism: parsing each kind with one error format, and the
// text and Markdown renderings of the tables (`tandem info --settings`).
#include "tandem/settings.h"

#include <cctype>
#include <cstdint>
#include <map>

#include "tandem/errors.h"

namespace tandem {

std::optional<size_t> parse_byte_size(std::string_view text) {
  size_t digits = 0, value = 0;
  for (; digits < text.size() && text[digits] >= '0' && text[digits] <= '9'; ++digits) {
    const size_t d = size_t(text[digits] - '0');
    if (value > (SIZE_MAX - d) / 10) return std::nullopt;
    value = value * 10 + d;
  }
  if (digits == 0) return std::nullopt;
  std::string unit;
  for (char c : text.substr(digits)) unit += char(std::toupper(static_cast<unsigned char>(c)));
  if (unit.empty() || unit == "B") return value;
  if ((unit.size() == 3 && unit.substr(1) == "IB") || (unit.size() == 2 && unit[1] == 'B')) unit.erase(1);  // KiB, KB
  const size_t at = std::string_view("KMGTPE").find(unit);
  if (unit.size() != 1 || at == std::string_view::npos) return std::nullopt;
  const unsigned shift = 10 * unsigned(at + 1);
  if (value > (SIZE_MAX >> shift)) return std::nullopt;
  return value << shift;
}

const char* to_string(SettingKind kind) {
  switch (kind) {
    case SettingKind::boolean: return "bool";
    case SettingKind::count: return "count";
    case SettingKind::bytes: return "bytes";
    case SettingKind::milliseconds: return "milliseconds";
    case SettingKind::nanoseconds: return "nanoseconds";
    case SettingKind::choice: return "enum";
    case SettingKind::text: return "string";
  }
  return "unknown";
}

const char* to_string(SettingSource source) {
  switch (source) {
    case SettingSource::default_value: return "default";
    case SettingSource::environment: return "environment";
    case SettingSource::flag: return "flag";
    case SettingSource::config_file: return "config file";
  }
  return "unknown";
}

namespace {

std::string joined(const std::vector<std::string>& items, const std::string& last_separator) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? last_separator : ", ";
    out += items[i];
  }
  return out;
}

std::string unit_of(SettingKind kind) {
  switch (kind) {
    case SettingKind::bytes: return "byte count";
    case SettingKind::milliseconds: return "number of milliseconds";
    case SettingKind::nanoseconds: return "number of nanoseconds";
    default: return "integer";
  }
}

}  // namespace

Setting setting_row(std::string layer, std::string variable, std::string name, SettingKind kind,
                    std::string default_value, std::string doc, std::string fix) {
  Setting s;
  s.layer = std::move(layer);
  s.variable = std::move(variable);
  s.name = std::move(name);
  s.kind = kind;
  s.default_value = std::move(default_value);
  s.doc = std::move(doc);
  s.fix = std::move(fix);
  return s;
}

std::string setting_fix(const Setting& s) {
  if (!s.fix.empty()) return s.fix;
  switch (s.kind) {
    case SettingKind::boolean: return "set it to 0 or 1";
    case SettingKind::choice: return "use " + joined(s.accepted, " or ");
    case SettingKind::text: return "set it to a string";
    default: break;
  }
  if (s.min > 0 && s.max == std::numeric_limits<long long>::max()) return "set it to a positive " + unit_of(s.kind);
  return "set it to a " + unit_of(s.kind) + " from " + std::to_string(s.min) + " to " + std::to_string(s.max);
}

void throw_bad_setting(const Setting& s, const std::string& value) {
  const std::string sizes = s.kind == SettingKind::bytes ? " (digits, or with K, M or G: 64M)" : "";
  throw InvalidArgument("tandem: " + s.variable + "='" + value + "' is invalid; " + setting_fix(s) + sizes);
}

bool parse_bool_setting(const Setting& s, const std::string& value) {
  if (value != "0" && value != "1") throw_bad_setting(s, value);
  return value == "1";
}

long long parse_number_setting(const Setting& s, const std::string& value) {
  if (s.kind == SettingKind::bytes) {
    const auto bytes = parse_byte_size(value);
    if (!bytes || *bytes > size_t(s.max) || (long long)*bytes < s.min) throw_bad_setting(s, value);
    return (long long)*bytes;
  }
  bool digits = !value.empty() && value.size() <= 18;
  for (char c : value) digits = digits && c >= '0' && c <= '9';
  if (!digits) throw_bad_setting(s, value);
  const long long x = std::stoll(value);
  if (x < s.min || x > s.max) throw_bad_setting(s, value);
  return x;
}

const std::string& parse_choice_setting(const Setting& s, const std::string& value) {
  for (const auto& a : s.accepted)
    if (a == value) return a;
  throw_bad_setting(s, value);
}

std::string settings_markdown(const std::vector<Setting>& settings) {
  std::string out =
      "# Configuration reference\n\n"
      "Every tandem setting is declared once, as a row of its layer's table, and read once, from the "
      "environment, into that layer's options (CommOptions, ring::RingOptions, ps::Options, ...). A value that "
      "does not parse is an error naming the variable, the value and what is accepted; nothing falls back "
      "silently. `tandem info --settings` prints the value each setting has in the current environment and where "
      "it came from. A byte count is digits, or digits with K, M or G (powers of 1024: 64M). This page is generated "
      "from the same tables by `tandem info --settings --markdown`; "
      "the launcher's own variables (TANDEM_RANK, TANDEM_WORLD_SIZE, TANDEM_STORE_ADDR, TANDEM_SECRET, ...) are "
      "described in comm/include/tandem/bootstrap.h.\n";
  std::vector<std::string> layers;
  std::map<std::string, std::vector<const Setting*>> by_layer;
  for (const auto& s : settings) {
    if (!by_layer.count(s.layer)) layers.push_back(s.layer);
    by_layer[s.layer].push_back(&s);
  }
  for (const auto& layer : layers) {
    out += "\n## " + layer + "\n\n| variable | field | kind | default | description |\n|---|---|---|---|---|\n";
    for (const Setting* s : by_layer[layer]) {
      std::string kind = to_string(s->kind);
      if (s->kind == SettingKind::choice) kind += ": " + joined(s->accepted, ", ");
      if (s->foreign) kind += " (UCX's own)";
      const std::string def = s->default_value.empty() ? "(empty)" : "`" + s->default_value + "`";
      out += "| `" + s->variable + "` | `" + s->name + "` | " + kind + " | " + def + " | " + s->doc + " |\n";
    }
  }
  return out;
}

std::string settings_text(const std::vector<SettingValue>& values) {
  size_t layer_width = 5, variable_width = 8, value_width = 5;
  for (const auto& v : values) {
    layer_width = std::max(layer_width, v.setting.layer.size());
    variable_width = std::max(variable_width, v.setting.variable.size());
    value_width = std::max(value_width, v.value.size());
  }
  auto pad = [](std::string s, size_t width) { return s + std::string(width - std::min(width, s.size()) + 2, ' '); };
  std::string out =
      pad("layer", layer_width) + pad("variable", variable_width) + pad("value", value_width) + "source\n";
  for (const auto& v : values) {
    out += pad(v.setting.layer, layer_width) + pad(v.setting.variable, variable_width) +
           pad(v.value.empty() ? "\"\"" : v.value, value_width) + to_string(v.source) + "\n";
  }
  return out;
}

}  // namespace tandem
