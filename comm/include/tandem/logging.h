// Log levels: TANDEM_LOG_LEVEL (or spdlog's own SPDLOG_LEVEL) in spdlog::cfg's
// syntax, a level for every logger and NAME=LEVEL for one subsystem's, as
// NCCL_DEBUG and NCCL_DEBUG_SUBSYS: "warn", "info,liveness=debug".
#pragma once

#include <string>
#include <vector>

#include "tandem/bootstrap.h"
#include "tandem/settings.h"

namespace tandem {

struct LogOptions {
  std::string tandem_levels;  // TANDEM_LOG_LEVEL
  std::string spdlog_levels;  // SPDLOG_LEVEL
  // The levels applied: TANDEM_LOG_LEVEL's when set, else SPDLOG_LEVEL's; empty: spdlog's defaults (info).
  const std::string& levels() const { return tandem_levels.empty() ? spdlog_levels : tandem_levels; }
};

// The log layer's table: TANDEM_LOG_LEVEL and spdlog's own SPDLOG_LEVEL.
const SettingTable<LogOptions>& log_settings();
LogOptions log_options_from_env(const EnvLookup& env = process_env());

// The subsystems that log under their own name: comm, engine, liveness, netif, store, transport.
const std::vector<std::string>& log_subsystems();
// The levels spdlog accepts: trace, debug, info, warn, error, critical, off.
const std::vector<std::string>& log_level_names();

// `value` checked against `s`'s syntax; a bad level or subsystem throws throw_bad_setting's error.
std::string parse_log_levels(const Setting& s, const std::string& value);
// Sets every logger's level as `o` says (nothing when o.levels() is empty).
void apply_log_levels(const LogOptions& o);
// Reads the log settings and applies them, once per process; later calls do nothing.
void configure_logging(const EnvLookup& env = process_env());

}  // namespace tandem
