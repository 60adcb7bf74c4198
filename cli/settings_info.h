// `tandem info --settings`: every layer's settings table in one list, printed
// with values and sources, or as the Markdown configuration reference.
#pragma once

#include <string>
#include <vector>

#include "tandem/settings.h"

namespace tandem::cli {

// Every setting of every table, layer by layer (comm, netif, transport, reduce, ring, paramserver, launch, trainer).
std::vector<Setting> all_settings();

// Every setting's value in `env` and where it came from. Throws InvalidArgument for a bad value.
std::vector<SettingValue> all_setting_values(const EnvLookup& env);

// `tandem info --settings [--markdown]`: prints to stdout; returns the exit code.
int run_settings_info(bool markdown);

}  // namespace tandem::cli
