// `tandem launch`: its flags and entry point; the launching itself is the
// launch library's (tandem/launch/launch.h).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "tandem/launch/launch.h"

namespace tandem::cli {

struct LaunchFlags {
  launch::LaunchOptions options;
  std::string hosts;            // -H as given
  CLI::Option* bind = nullptr;  // --bind; when not given, TANDEM_BIND decides
};

void add_launch(CLI::App& app, LaunchFlags& flags);

// Splits `launch [flags] [--] cmd args...` so the command's own flags (e.g.
// the `-n` of `tandem bench`) never reach the launcher's parser.
std::vector<std::string> split_launch_command(std::vector<std::string>& args);

// Runs `tandem launch` with the parsed flags; returns the process exit code.
int run_launch(LaunchFlags flags, std::vector<std::string> command);

}  // namespace tandem::cli
