// `tandem launch`: its flags and entry point; the launching itself is the
// launch library's (tandem/launch/launch.h).
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tandem/launch/launch.h"

namespace tandem::cli {

struct LaunchFlags {
  launch::LaunchOptions options;
  std::string hosts;                  // -H as given
  std::string hostfile;               // --hostfile
  std::vector<std::string> exported;  // -x NAME or -x NAME=value, as given
  std::vector<std::string> env;       // --env NAME=value
  std::string elastic;                // --elastic as given
  CLI::Option* bind = nullptr;        // --bind; when not given, TANDEM_BIND decides
};

void add_launch(CLI::App& app, LaunchFlags& flags);

// `launch [flags] [--] cmd args...`: the launch subcommand is a CLI11 prefix
// command, so the words from the first one that is neither a flag nor a flag's
// value are the command and the command's own flags (the `-n` of `tandem
// bench`) never reach the launcher's parser. CLI11 2.1 does not stop at "--",
// so the words after it are set aside before parsing and returned.
std::optional<std::vector<std::string>> set_aside_after_separator(std::vector<std::string>& args);
// mpirun's single-dash spellings -np, -hostfile and -machinefile among the
// launcher's words (args[0] is "launch"; the command's words stay as they
// are) become -n, --hostfile and --machinefile: CLI11 would read -hostfile as
// -h (help).
void accept_mpirun_spellings(std::vector<std::string>& args);
// The command: the prefix command's words, then "--" and the words set aside.
std::vector<std::string> launch_command_words(const CLI::App& launch,
                                              const std::optional<std::vector<std::string>>& after_separator);

// Runs `tandem launch` with the parsed flags; returns the process exit code.
int run_launch(LaunchFlags flags, std::vector<std::string> command);

}  // namespace tandem::cli
