// Log levels (tandem/logging.h) and the subsystems' named loggers (subsystem_log.h).
#include "tandem/logging.h"

#include <spdlog/cfg/helpers.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <mutex>
#include <sstream>

#include "subsystem_log.h"

namespace tandem {
namespace {

std::string trimmed_lower(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  std::string out = text.substr(first, text.find_last_not_of(" \t") - first + 1);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool listed(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

const std::vector<std::string>& log_subsystems() {
  static const std::vector<std::string> names = {"comm", "engine", "liveness", "netif", "store", "transport"};
  return names;
}

const std::vector<std::string>& log_level_names() {
  static const std::vector<std::string> names = {"trace", "debug", "info", "warn", "error", "critical", "off"};
  return names;
}

std::string parse_log_levels(const Setting& s, const std::string& value) {
  // spdlog's own spellings of two levels; load_levels ignores longer values.
  static const std::vector<std::string> aliases = {"warning", "err"};
  if (value.size() > 512) throw_bad_setting(s, value);
  std::stringstream parts(value);
  for (std::string part; std::getline(parts, part, ',');) {
    const auto equals = part.find('=');
    const std::string level = trimmed_lower(equals == std::string::npos ? part : part.substr(equals + 1));
    if (!listed(log_level_names(), level) && !listed(aliases, level)) throw_bad_setting(s, value);
    if (equals == std::string::npos) continue;
    // SPDLOG_LEVEL may name the program's own loggers too; TANDEM_LOG_LEVEL names tandem's.
    const std::string name = trimmed_lower(part.substr(0, equals));
    if (name.empty() || (s.variable == "TANDEM_LOG_LEVEL" && !listed(log_subsystems(), name)))
      throw_bad_setting(s, value);
  }
  return value;
}

void apply_log_levels(const LogOptions& o) {
  if (!o.levels().empty()) spdlog::cfg::helpers::load_levels(o.levels());
}

void configure_logging(const EnvLookup& env) {
  static std::once_flag once;
  std::call_once(once, [&env] { apply_log_levels(log_options_from_env(env)); });
}

LogOptions log_options_from_env(const EnvLookup& env) {
  LogOptions o;
  read_settings(log_settings(), env, o);
  return o;
}

spdlog::logger& subsystem_log(Subsystem subsystem) {
  static const auto loggers = [] {
    std::array<std::shared_ptr<spdlog::logger>, 6> out;
    const auto& sinks = spdlog::default_logger()->sinks();
    for (size_t i = 0; i < out.size(); ++i) {
      const std::string& name = log_subsystems()[i];
      out[i] = spdlog::get(name);
      if (out[i]) continue;
      out[i] = std::make_shared<spdlog::logger>(name, sinks.begin(), sinks.end());
      spdlog::initialize_logger(out[i]);  // takes the level TANDEM_LOG_LEVEL gave its name
    }
    return out;
  }();
  return *loggers[static_cast<size_t>(subsystem)];
}

}  // namespace tandem
