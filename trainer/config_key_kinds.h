// The kinds of experiment key (config_keys.h): each builds a row from the
// config field it fills, so the reader, the range in messages and the
// documented default all come from one declaration. A field is reached by an
// accessor such as [](auto& c) -> auto& { return c.optimizations.error_feedback; }.
#pragma once

#include <cstdio>
#include <type_traits>

#include "config_keys.h"

namespace tandem::trainer {

// The config field an accessor such as [](auto& c) -> auto& { return c.seed; } reaches.
template <class Get>
using FieldOf = std::remove_reference_t<decltype(std::declval<Get>()(std::declval<ExperimentConfig&>()))>;

// As the reference prints numbers: 0.001, 1e-8, 2^24.
inline std::string format_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  std::string s = buf;
  for (const char* zero_exponent : {"e-0", "e+0"})
    if (const size_t at = s.find(zero_exponent); at != std::string::npos) s.erase(at + 2, 1);
  if (const size_t at = s.find("e+"); at != std::string::npos) s.erase(at + 1, 1);
  return s;
}

inline std::string format_integer(int64_t v) {
  if (v >= (int64_t{1} << 16) && (v & (v - 1)) == 0) {
    int bits = 0;
    while ((int64_t{1} << bits) < v) ++bits;
    return "2^" + std::to_string(bits);
  }
  return std::to_string(v);
}

inline ExperimentKey plain_key(std::string path, std::string type, std::string determined, std::string doc) {
  ExperimentKey k;
  k.path = std::move(path);
  k.type = std::move(type);
  k.determined = std::move(determined);
  k.doc = std::move(doc);
  return k;
}

inline ExperimentKey section_key(std::string path, std::string determined, std::string doc) {
  ExperimentKey k = plain_key(std::move(path), "map", std::move(determined), std::move(doc));
  k.section = true;
  return k;
}

// The default a fresh config holds, as `show` prints it.
inline ExperimentKey with_fallback_shown(ExperimentKey k) {
  k.fallback = k.show(ExperimentConfig{});
  return k;
}

template <class Get>
ExperimentKey integer_key(std::string path, Get get, int64_t min, int64_t max, std::string fix, std::string determined,
                          std::string doc) {
  ExperimentKey k = plain_key(path, "integer", std::move(determined), std::move(doc));
  k.values = format_integer(min) + " – " + format_integer(max);
  k.read = [path, get, min, max, fix](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
    int64_t v = 0;
    if (r.integer(n, path, v, min, max, fix)) get(c) = static_cast<FieldOf<Get>>(v);
  };
  k.show = [get](const ExperimentConfig& c) { return std::to_string(get(c)); };
  return with_fallback_shown(std::move(k));
}

template <class Get>
ExperimentKey number_key(std::string path, Get get, double min, double max, std::string fix, std::string determined,
                         std::string doc) {
  ExperimentKey k = plain_key(path, "number", std::move(determined), std::move(doc));
  k.values = format_number(min) + " – " + format_number(max);
  k.read = [path, get, min, max, fix](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
    r.number(n, path, get(c), min, max, fix);
  };
  k.show = [get](const ExperimentConfig& c) { return format_number(get(c)); };
  return with_fallback_shown(std::move(k));
}

template <class Get>
ExperimentKey bool_key(std::string path, Get get, std::string determined, std::string doc) {
  ExperimentKey k = plain_key(path, "true/false", std::move(determined), std::move(doc));
  k.read = [path, get](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) { r.boolean(n, path, get(c)); };
  k.show = [get](const ExperimentConfig& c) { return std::string(get(c) ? "true" : "false"); };
  return with_fallback_shown(std::move(k));
}

template <class Get>
ExperimentKey choice_key(std::string path, Get get, std::vector<std::string> valid, std::string determined,
                         std::string doc) {
  ExperimentKey k = plain_key(path, "name", std::move(determined), std::move(doc));
  k.values = join(valid);
  k.read = [path, get, valid](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
    r.choice(n, path, get(c), valid);
  };
  k.show = [get](const ExperimentConfig& c) { return get(c); };
  return with_fallback_shown(std::move(k));
}

// A Determined key of which tandem implements one value: checked, nothing stored.
inline ExperimentKey fixed_key(std::string path, std::string value, std::string determined, std::string doc) {
  ExperimentKey k = plain_key(path, "name", std::move(determined), std::move(doc));
  k.values = value;
  k.read = [path, value](const YAML::Node& n, ConfigReader& r, ExperimentConfig&) {
    std::string v;
    r.choice(n, path, v, {value});
  };
  k.show = [value](const ExperimentConfig&) { return value; };
  return with_fallback_shown(std::move(k));
}

template <class Get>
ExperimentKey text_key(std::string path, Get get, std::string what, std::string determined, std::string doc) {
  ExperimentKey k = plain_key(path, "string", std::move(determined), std::move(doc));
  k.read = [path, get, what](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) {
    r.text(n, path, get(c), what);
  };
  k.show = [get](const ExperimentConfig& c) { return get(c); };
  return with_fallback_shown(std::move(k));
}

template <class Get>
ExperimentKey length_key(std::string path, Get get, std::string determined, std::string doc) {
  ExperimentKey k = plain_key(path, "length", std::move(determined), std::move(doc));
  k.values = "{batches: N}, {records: N} or {epochs: N}, N ≥ 1";
  k.read = [path, get](const YAML::Node& n, ConfigReader& r, ExperimentConfig& c) { r.length(n, path, get(c)); };
  k.show = [get](const ExperimentConfig& c) {
    const Length& l = get(c);
    return l.set() ? "{" + std::string(to_string(l.unit)) + ": " + std::to_string(l.value) + "}" : std::string("none");
  };
  return with_fallback_shown(std::move(k));
}

inline ExperimentKey with_fallback(ExperimentKey k, std::string fallback) {
  k.fallback = std::move(fallback);
  return k;
}

inline ExperimentKey required(ExperimentKey k, std::string missing) {
  k.missing = std::move(missing);
  return k;
}

inline ExperimentKey used_only_with(ExperimentKey k, std::string selector, std::vector<std::string> values) {
  k.used_with = std::move(selector);
  k.used_by = std::move(values);
  return k;
}

// A section whose keys outside the table are the user's: recorded, not refused.
inline ExperimentKey open_section(ExperimentKey k) {
  k.open = true;
  return k;
}

inline ExperimentKey noted(ExperimentKey k, std::string note) {
  k.note = std::move(note);
  return k;
}

// A Determined key tandem has no use for: any value accepted, its note printed once.
inline ExperimentKey ignored_key(std::string path, std::string determined, std::string why) {
  ExperimentKey k = plain_key(std::move(path), "any", std::move(determined), "No counterpart in tandem.");
  k.fallback = "ignored";
  k.ignored = true;
  k.note = "ignored: " + std::move(why);
  k.read = [](const YAML::Node&, ConfigReader&, ExperimentConfig&) {};
  k.show = [](const ExperimentConfig&) { return std::string(); };
  return k;
}

}  // namespace tandem::trainer
