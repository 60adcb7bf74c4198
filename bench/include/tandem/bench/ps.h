// `tandem bench ps`: the parameter server next to all-reduce.
//  - dense: push + pull of one key of each size, against an all-reduce of the
//    same bytes among the workers (the servers take no part in it);
//  - sparse: an embedding of rows x cols f32 of which each worker touches
//    `fraction` of the rows per step (push_rows + pull_rows of those rows),
//    against an all-reduce of the whole dense gradient.
// Run with servers: `tandem launch -n W --servers S -- tandem bench ps`, or
// any launcher with TANDEM_SERVERS=S (then the server ranks serve inside the
// bench). Times are the slowest worker's mean per iteration.
#pragma once

#include <cstddef>
#include <string>

namespace tandem::bench {

struct PsBenchOptions {
  size_t min_bytes = 1 << 20;
  size_t max_bytes = 64 << 20;
  double factor = 4.0;
  int iters = 5;
  int warmup = 1;
  size_t rows = 1000000;  // sparse embedding
  size_t cols = 64;
  double fraction = 0.01;
  int sparse_steps = 5;
  bool dense = true, sparse = true;
  std::string format = "table";  // table or json
  std::string plot;              // PNG: time vs bytes, dense PS vs all-reduce, and the sparse pair
};

int run_ps_bench(const PsBenchOptions& options);

}  // namespace tandem::bench
