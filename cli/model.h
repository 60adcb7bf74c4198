// `tandem model calibrate | predict | validate`: flags and entry point, kept out of main.cc.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace tandem::cli {

struct ModelFlags {
  CLI::App *calibrate = nullptr, *predict = nullptr, *validate = nullptr;
  std::string calibration = "tandem-model.json", link, sizes, format = "table", plot;
  std::vector<std::string> topologies, cases;
  bool cpu_bound = false, separate_hosts = false, step_only = false;
  int iters = 10, cores = 0;
  double tolerance = 0.25;
  std::string small = "64K";
};

void add_model(CLI::App& app, ModelFlags& flags);
int run_model(const ModelFlags& flags);

}  // namespace tandem::cli
