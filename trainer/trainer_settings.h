// The trainer's settings table (tandem train): the variables its driver and
// slots read, each declared once, for the trainer to read through and for
// `tandem info --settings` to list.
#pragma once

#include "tandem/settings.h"

namespace tandem::trainer {

// The interface override is comm's (network_interface_from_env() in tandem/bootstrap.h).
struct TrainerSettings {
  // Nice value of each slot's compute thread while gradients overlap backward (--compute-nice).
  int compute_nice = 19;
};

inline const SettingTable<TrainerSettings>& trainer_settings() {
  static const SettingTable<TrainerSettings> table = [] {
    Setting nice = setting_row("trainer", "TANDEM_COMPUTE_NICE", "compute_nice", SettingKind::count, "19",
                               "Nice value of each slot's compute thread while gradients overlap backward, so "
                               "communication runs first when it has work (0: unchanged; --compute-nice).");
    nice.max = 19;
    return SettingTable<TrainerSettings>{number_field(nice, &TrainerSettings::compute_nice)};
  }();
  return table;
}

// TrainerSettings from the variables of trainer_settings(); throws InvalidArgument naming a malformed one.
inline TrainerSettings trainer_settings_from_env(const EnvLookup& env = process_env()) {
  TrainerSettings s;
  read_settings(trainer_settings(), env, s);
  return s;
}

}  // namespace tandem::trainer
