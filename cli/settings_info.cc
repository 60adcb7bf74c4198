// `tandem info --settings`: collects every layer's table (comm cannot see the
// layers above it, so the list is assembled here) and prints it.
#include "settings_info.h"

#include <cstdio>

#include "../trainer/trainer_settings.h"
#include "tandem/launch/launch.h"
#include "tandem/logging.h"
#include "tandem/paramserver.h"
#include "tandem/ring/ring.h"

namespace tandem::cli {
namespace {

template <class Options>
void append(std::vector<SettingValue>& out, const SettingTable<Options>& table, const EnvLookup& env,
            const Options& options) {
  for (auto& v : describe_settings(table, env, options)) out.push_back(std::move(v));
}

template <class Options>
void append(std::vector<Setting>& out, const SettingTable<Options>& table) {
  for (auto& s : settings_of(table)) out.push_back(std::move(s));
}

}  // namespace

std::vector<Setting> all_settings() {
  std::vector<Setting> out;
  for (const auto* t : {&comm_settings(), &netif_settings(), &transport_settings(), &reduce_settings()})
    append(out, *t);
  append(out, log_settings());
  append(out, ring::ring_settings());
  append(out, ps::settings());
  append(out, launch::launch_settings());
  append(out, trainer::trainer_settings());
  return out;
}

std::vector<SettingValue> all_setting_values(const EnvLookup& env) {
  std::vector<SettingValue> out;
  CommOptions comm;
  for (const auto* t : {&comm_settings(), &netif_settings(), &transport_settings(), &reduce_settings()}) {
    read_settings(*t, env, comm);
    append(out, *t, env, comm);
  }
  append(out, log_settings(), env, log_options_from_env(env));
  append(out, ring::ring_settings(), env, ring::ring_options_from_env(env));
  append(out, ps::settings(), env, ps::ps_options_from_env(env));
  launch::LaunchOptions launch;
  read_settings(launch::launch_settings(), env, launch);
  append(out, launch::launch_settings(), env, launch);
  append(out, trainer::trainer_settings(), env, trainer::trainer_settings_from_env(env));
  return out;
}

int run_settings_info(bool markdown) {
  if (markdown) {
    std::printf("%s", settings_markdown(all_settings()).c_str());
  } else {
    std::printf("%s", settings_text(all_setting_values(process_env())).c_str());
  }
  return 0;
}

}  // namespace tandem::cli
