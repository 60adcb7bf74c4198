// Every setting declared once, as one row of its layer's table (variable,
// default, kind, doc), and one reader that parses a row's variable through an
// EnvLookup into the layer's options, with one error format for a bad value.
#pragma once

#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/bootstrap.h"

namespace tandem {

enum class SettingKind { boolean, count, bytes, milliseconds, nanoseconds, choice, text };
// Where a value came from; readers of the environment set default or environment,
// a caller that applies a flag or a config file on top says so.
enum class SettingSource { default_value, environment, flag, config_file };

const char* to_string(SettingKind kind);
const char* to_string(SettingSource source);

// A size as nccl-tests and UCX write it: digits with an optional K, M, G, T,
// P or E suffix (powers of 1024, any case, with an optional B or iB):
// 8, 4K, 128M, 1GB, 1GiB. nullopt for anything else or past 64 bits.
std::optional<size_t> parse_byte_size(std::string_view text);

// One row of a table. Numbers are decimal digits in [min, max]; byte counts
// may carry parse_byte_size's suffixes.
struct Setting {
  std::string layer;     // owning layer: "comm", "ring", "paramserver", ...
  std::string variable;  // e.g. TANDEM_TIMEOUT_MS
  std::string name;      // the options field it fills
  SettingKind kind = SettingKind::text;
  std::string default_value;          // as printed and documented
  std::string doc;                    // one line
  std::vector<std::string> accepted;  // choice: every value taken (aliases included)
  std::string fix;                    // advice after a bad value; derived from the kind when empty
  long long min = 0;
  long long max = std::numeric_limits<long long>::max();
  // Another program's variable (UCX_*): read only to learn the user set it, never parsed.
  bool foreign = false;
};

// A row: owning layer, variable, the options field it fills, kind, default, one-line doc, advice after a bad value.
Setting setting_row(std::string layer, std::string variable, std::string name, SettingKind kind,
                    std::string default_value, std::string doc, std::string fix = "");

// "set it to ...": the row's fix, or one made from its kind and range.
std::string setting_fix(const Setting& s);

// InvalidArgument "tandem: VAR='value' is invalid; <fix>".
[[noreturn]] void throw_bad_setting(const Setting& s, const std::string& value);

// Parsers of each kind; a bad value throws throw_bad_setting's error.
bool parse_bool_setting(const Setting& s, const std::string& value);
long long parse_number_setting(const Setting& s, const std::string& value);
const std::string& parse_choice_setting(const Setting& s, const std::string& value);

// A row bound to where its value goes in Options. `store` parses and stores
// (through the parsers above); `show` prints the value the options hold.
template <class Options>
struct SettingField {
  Setting setting;
  std::function<void(Options&, const std::string&)> store;
  std::function<std::string(const Options&)> show;
};

template <class Options>
using SettingTable = std::vector<SettingField<Options>>;

// One setting as `tandem info --settings` prints it.
struct SettingValue {
  Setting setting;
  std::string value;
  SettingSource source = SettingSource::default_value;
};

// Stores every variable of `table` that `env` sets; throws on the first bad value.
template <class Options>
void read_settings(const SettingTable<Options>& table, const EnvLookup& env, Options& options) {
  for (const auto& f : table)
    if (auto v = env(f.setting.variable)) f.store(options, *v);
}

// The value of each row in `options` (read from `env`), and where it came from.
template <class Options>
std::vector<SettingValue> describe_settings(const SettingTable<Options>& table, const EnvLookup& env,
                                            const Options& options) {
  std::vector<SettingValue> out;
  for (const auto& f : table) {
    const bool set = env(f.setting.variable).has_value();
    out.push_back({f.setting, f.show(options), set ? SettingSource::environment : SettingSource::default_value});
  }
  return out;
}

template <class Options>
std::vector<Setting> settings_of(const SettingTable<Options>& table) {
  std::vector<Setting> out;
  for (const auto& f : table) out.push_back(f.setting);
  return out;
}

// Row builders: a setting plus the member it fills.
template <class Options, class T>
SettingField<Options> number_field(Setting s, T Options::*member) {
  if constexpr ((unsigned long long)std::numeric_limits<T>::max() <
                (unsigned long long)std::numeric_limits<long long>::max()) {
    if (s.max > (long long)std::numeric_limits<T>::max()) s.max = (long long)std::numeric_limits<T>::max();
  }
  return {s, [s, member](Options& o, const std::string& v) { o.*member = T(parse_number_setting(s, v)); },
          [member](const Options& o) { return std::to_string(o.*member); }};
}

template <class Options, class Duration>
SettingField<Options> duration_field(Setting s, Duration Options::*member) {
  return {s, [s, member](Options& o, const std::string& v) { o.*member = Duration(parse_number_setting(s, v)); },
          [member](const Options& o) { return std::to_string((o.*member).count()); }};
}

template <class Options>
SettingField<Options> bool_field(Setting s, bool Options::*member) {
  s.kind = SettingKind::boolean;
  return {s, [s, member](Options& o, const std::string& v) { o.*member = parse_bool_setting(s, v); },
          [member](const Options& o) { return std::string(o.*member ? "1" : "0"); }};
}

template <class Options>
SettingField<Options> text_field(Setting s, std::string Options::*member) {
  return {s, [member](Options& o, const std::string& v) { o.*member = v; },
          [member](const Options& o) { return o.*member; }};
}

// A foreign variable: `member` says whether the user set it.
template <class Options>
SettingField<Options> pinned_field(Setting s, bool Options::*member) {
  s.foreign = true;
  return {s, [member](Options& o, const std::string&) { o.*member = true; },
          [member](const Options& o) { return std::string(o.*member ? "set (left to UCX)" : "unset"); }};
}

// comm's tables (CommOptions): rendezvous and liveness, interface selection,
// the UCX transport, the reduction kernels.
const SettingTable<CommOptions>& comm_settings();
const SettingTable<CommOptions>& netif_settings();
const SettingTable<CommOptions>& transport_settings();
const SettingTable<CommOptions>& reduce_settings();

// The Markdown configuration reference of these settings (docs/configuration.md).
std::string settings_markdown(const std::vector<Setting>& settings);
// One line per value: layer, variable, value, source.
std::string settings_text(const std::vector<SettingValue>& values);

}  // namespace tandem
