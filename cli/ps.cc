// `tandem ps serve` and `tandem bench ps` (see ps.h).
#include "ps.h"

#include <spdlog/spdlog.h>

#include <cstdlib>

#include "flags.h"
#include "tandem/bench/ps.h"
#include "tandem/errors.h"
#include "tandem/paramserver.h"
#include "tandem/tandem.h"

namespace tandem::cli {

namespace {

size_t positive_size(const char* flag, const std::string& v) {
  const size_t n = size_flag(flag, v);
  if (n == 0) throw UsageError(std::string(flag) + ": must be > 0");
  return n;
}

int serve_from_env() {
  const ps::Options options = ps::ps_options_from_env();
  auto comm = ring::connect_from_env();
  const uint64_t applied = ps::serve(*comm, options);
  spdlog::info("tandem ps serve: rank {} applied {} steps over its shards", comm->rank(), applied);
  return 0;
}

}  // namespace

void add_ps(CLI::App& app, CLI::App& bench, PsFlags& f) {
  auto* ps = app.add_subcommand("ps", "Parameter server roles");
  f.serve = ps->add_subcommand("serve",
                               "Serve as one of the last TANDEM_SERVERS ranks of a job until every worker closes its "
                               "client (tandem launch --servers starts it)");
  ps->require_subcommand(1);
  auto* b = bench.add_subcommand("ps",
                                 "Parameter server next to all-reduce: dense push+pull and sparse rows; run "
                                 "under `tandem launch -n W --servers S`");
  f.bench = b;
  b->add_option("-b,--minbytes", f.min_bytes, "Smallest dense key, bytes with K/M/G suffix")->capture_default_str();
  b->add_option("-e,--maxbytes", f.max_bytes, "Largest dense key")->capture_default_str();
  b->add_option("-f,--stepfactor", f.factor, "Multiply the size by this between dense keys")->capture_default_str();
  b->add_option("-n,--iters", f.iters, "Timed iterations per dense size")->capture_default_str();
  b->add_option("-w,--warmup_iters", f.warmup, "Untimed iterations per dense size")->capture_default_str();
  b->add_option("--steps", f.steps, "Timed sparse steps (and all-reduces of the dense gradient)")
      ->capture_default_str();
  b->add_option("--rows", f.rows, "Embedding rows (sparse part)")->capture_default_str();
  b->add_option("--cols", f.cols, "Embedding columns (f32)")->capture_default_str();
  b->add_option("--fraction", f.fraction, "Fraction of rows each worker touches per step")->capture_default_str();
  b->add_option("--only", f.only, "dense, sparse or both")
      ->check(CLI::IsMember({"dense", "sparse", "both"}))
      ->capture_default_str();
  b->add_option("--format", f.format, "Output: table or json")->capture_default_str();
  b->add_option("--plot", f.plot, "Write ms per step vs bytes to this PNG (needs gnuplot)");
  b->footer("Example: tandem launch -n 2 --servers 1 -- tandem bench ps --plot ps.png");
}

int run_ps(const PsFlags& f) {
  if (f.serve && f.serve->parsed()) return serve_from_env();
  if (!f.bench || !f.bench->parsed()) return -1;
  bench::PsBenchOptions o;
  o.min_bytes = positive_size("--minbytes", f.min_bytes);
  o.max_bytes = positive_size("--maxbytes", f.max_bytes);
  if (!(f.factor > 1)) throw InvalidArgument("--stepfactor must be > 1");
  o.factor = f.factor;
  o.iters = f.iters;
  o.warmup = f.warmup;
  o.sparse_steps = f.steps;
  o.rows = positive_size("--rows", f.rows);
  o.cols = f.cols;
  o.fraction = f.fraction;
  o.dense = f.only != "sparse";
  o.sparse = f.only != "dense";
  o.format = f.format;
  o.plot = f.plot;
  return bench::run_ps_bench(o);
}

}  // namespace tandem::cli
