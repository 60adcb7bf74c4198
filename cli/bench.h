// `tandem bench <test>`: nccl-tests' flags (and the names of its binaries),
// read into SweepOptions; `tandem bench --compare A.json B.json`.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "tandem/bench/sweep.h"

namespace tandem::cli {

struct BenchFlags {
  std::string collective;
  std::string min_bytes = "32M", max_bytes = "32M", increment = "0";
  double factor = 2.0;
  int iters = 20, warmup = 5, check = 1, registered = 0;
  std::string dtype = "float", op = "sum", root = "0", format = "table", plot, compress = "none", algorithm;
  // nccl-tests' flags beyond the sweep's sizes
  int agg_iters = 1, blocking = 0, average = 1, cycles = 1, timeout = 0, cpu_time = 0, timestamps = 0;
  int threads = 1, gpus = 1, parallel_init = 0, stream_null = 0, cuda_graph = 0;
  std::string output_file, csv_file_flag;
  std::vector<std::string> compare;  // --compare A B
};

// Adds the bench subcommand to app.
CLI::App* add_bench(CLI::App& app, BenchFlags& flags);
// The flags as sweep options; UsageError naming the flag otherwise.
tandem::bench::SweepOptions to_sweep_options(const BenchFlags& flags);

}  // namespace tandem::cli
