// `tandem ps serve` (the server role of a parameter-server job) and
// `tandem bench ps`: their flags and entry points, kept out of main.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace tandem::cli {

struct PsFlags {
  CLI::App* serve = nullptr;  // tandem ps serve
  CLI::App* bench = nullptr;  // tandem bench ps
  std::string min_bytes = "1M", max_bytes = "64M";
  double factor = 4;
  int iters = 5, warmup = 1, steps = 5;
  std::string rows = "1000000";
  size_t cols = 64;
  double fraction = 0.01;
  std::string only = "both";  // dense, sparse or both
  std::string format = "table", plot;
};

// Adds `ps serve` to app and `ps` to the bench subcommand.
void add_ps(CLI::App& app, CLI::App& bench, PsFlags& flags);
// Runs whichever was parsed; returns -1 if neither.
int run_ps(const PsFlags& flags);

}  // namespace tandem::cli
