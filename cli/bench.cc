#include "bench.h"

#include <cstdio>

#include "flags.h"
#include "tandem/ring/ring.h"
#include "tandem/types.h"

namespace tandem::cli {
namespace {

using tandem::bench::Format;
using tandem::bench::SweepOptions;

template <typename T, size_t N>
std::string join_names(const T (&values)[N]) {
  std::string out;
  for (const auto& v : values) out += (out.empty() ? "" : ", ") + std::string(tandem::to_string(v));
  return out;
}

void read_sizes(const BenchFlags& f, SweepOptions& o) {
  o.min_bytes = size_flag("-b/--minbytes", f.min_bytes);
  o.max_bytes = size_flag("-e/--maxbytes", f.max_bytes);
  o.increment = size_flag("-i/--stepbytes", f.increment);
  o.factor = f.factor;
  if (o.max_bytes < o.min_bytes) {
    throw UsageError("-e/--maxbytes (" + f.max_bytes + ") must be >= -b/--minbytes (" + f.min_bytes + ")");
  }
  if (o.increment == 0 && !(o.factor > 1.0)) {
    char got[32];
    std::snprintf(got, sizeof got, "%g", f.factor);
    throw UsageError(std::string("-f/--stepfactor must be > 1 (got ") + got + "), or set -i/--stepbytes");
  }
  if (o.increment == 0 && o.min_bytes == 0 && o.max_bytes > 0) {
    throw UsageError("-b 0 cannot grow by a factor; use -b >= 1 or set -i/--stepbytes");
  }
}

void expect_flag(bool ok, const std::string& message) {
  if (!ok) throw UsageError(message);
}

// -d, -o and -r, each a value or "all".
void read_type_op_root(const BenchFlags& f, SweepOptions& o) {
  if (lower(f.dtype) == "all") {
    o.dtypes.assign(std::begin(tandem::kAllDataTypes), std::end(tandem::kAllDataTypes));
  } else {
    auto dtype = tandem::parse_dtype(f.dtype);
    expect_flag(dtype.has_value(),
                "-d/--datatype: unknown '" + f.dtype + "'; valid: " + join_names(tandem::kAllDataTypes) + " or all");
    o.dtype = *dtype;
  }
  if (lower(f.op) == "all") {
    o.ops.assign(std::begin(tandem::kAllReduceOps), std::end(tandem::kAllReduceOps));
  } else {
    auto op = tandem::parse_reduce_op(f.op);
    expect_flag(lower(f.op) != "mulsum",
                "-o/--op: mulsum (NCCL's pre-multiplied sum) has no tandem counterpart; valid: " +
                    join_names(tandem::kAllReduceOps) + " or all");
    expect_flag(op.has_value(),
                "-o/--op: unknown '" + f.op + "'; valid: " + join_names(tandem::kAllReduceOps) + " or all");
    o.op = *op;
  }
  if (lower(f.root) == "all") {
    o.every_root = true;
  } else {
    char* end = nullptr;
    const long root = std::strtol(f.root.c_str(), &end, 10);
    expect_flag(!f.root.empty() && *end == '\0' && root >= 0 && root < (1 << 30),
                "-r/--root: '" + f.root + "' is not a rank; give a rank >= 0 or all");
    o.root = int(root);
  }
}

// nccl-tests' flags about threads, GPUs and CUDA: what a CPU run can honour.
void read_gpu_flags(const BenchFlags& f) {
  expect_flag(f.threads == 1 && f.gpus == 1,
              "-t/--nthreads and -g/--ngpus: tandem runs one rank per process and no GPUs (got -t " +
                  std::to_string(f.threads) + " -g " + std::to_string(f.gpus) +
                  "); use 1, and tandem launch -n N for N ranks");
  expect_flag(f.parallel_init == 0 || f.parallel_init == 1, "-p/--parallel_init must be 0 or 1");
  expect_flag(f.stream_null == 0, "-y/--stream_null: there are no CUDA streams in a CPU run; use 0");
  expect_flag(f.cuda_graph == 0, "-G/--cudagraph: CUDA graphs need a GPU; use 0");
  expect_flag(f.csv_file_flag.empty(),
              "-F: older nccl-tests' CSV file (newer ones read -F as a cache flush); use -J FILE.csv");
}

void read_nccl_tests_flags(const BenchFlags& f, SweepOptions& o) {
  read_gpu_flags(f);
  expect_flag(f.average >= 0 && f.average <= 3,
              "-a/--average must be 0 (rank 0), 1 (mean over ranks), 2 (fastest rank) or 3 (slowest rank)");
  o.rank_time = static_cast<tandem::bench::RankTime>(f.average);
  expect_flag(f.agg_iters >= 1, "-m/--agg_iters must be >= 1 (operations per iteration)");
  o.agg_iters = f.agg_iters;
  expect_flag(f.blocking == 0 || f.blocking == 1, "-z/--blocking must be 0 or 1");
  o.blocking = f.blocking == 1;
  expect_flag(f.cycles >= 0, "-N/--run_cycles must be >= 0 (0: until interrupted)");
  o.cycles = f.cycles;
  expect_flag(f.timeout >= 0, "-T/--timeout must be >= 0 seconds (0: none)");
  o.timeout_s = f.timeout;
  expect_flag(f.cpu_time == 0 || f.cpu_time == 1, "-C/--report_cputime must be 0 or 1");
  o.cpu_time = f.cpu_time == 1;
  expect_flag(f.timestamps == 0 || f.timestamps == 1, "-S/--report_timestamps must be 0 or 1");
  o.timestamps = f.timestamps == 1;
  o.output_file = f.output_file;
}

void read_output(const BenchFlags& f, SweepOptions& o) {
  const std::string format = lower(f.format);
  if (format == "table")
    o.format = Format::table;
  else if (format == "csv")
    o.format = Format::csv;
  else if (format == "json")
    o.format = Format::json;
  else
    throw UsageError("--format: unknown '" + f.format + "'; valid: table, csv, json");
  if (!f.plot.empty()) {
    const std::string p = lower(f.plot);
    expect_flag(p.size() >= 5 && p.ends_with(".png"), "--plot expects a .png file name (got '" + f.plot + "')");
    o.plot = f.plot;
  }
}

}  // namespace

SweepOptions to_sweep_options(const BenchFlags& f) {
  SweepOptions o;
  o.collective = tandem::bench::canonical_collective(f.collective);  // InvalidArgument lists the tests
  read_sizes(f, o);
  expect_flag(f.iters >= 1, "-n/--iters must be >= 1");
  expect_flag(f.warmup >= 0, "-w/--warmup_iters must be >= 0");
  expect_flag(f.check >= 0, "-c/--check must be 0 (off) or >= 1 (on)");
  // nccl-tests' -R 2 (symmetric registration) is registration too: the same buffers here.
  expect_flag(f.registered >= 0 && f.registered <= 2,
              "-R/--registered must be 0 (heap) or 1 (allocate_shared; nccl-tests' 2 reads as 1)");
  o.iters = f.iters;
  o.warmup = f.warmup;
  o.check = f.check > 0;
  o.registered = f.registered != 0;
  read_type_op_root(f, o);
  read_nccl_tests_flags(f, o);

  auto codec = tandem::compression::parse_codec(f.compress);
  expect_flag(codec.has_value(), "--compress: unknown '" + f.compress + "'; valid: fp16, bf16, none");
  o.compress = *codec;
  if (!f.algorithm.empty()) {
    tandem::ring::parse_allreduce_algorithm(f.algorithm);  // names the valid ones if not
    o.algorithm = f.algorithm;
  }
  read_output(f, o);
  return o;
}

namespace {

void add_nccl_tests_flags(CLI::App* b, BenchFlags& f) {
  b->add_option("-m,--agg_iters", f.agg_iters, "Operations per iteration: started together, then all waited")
      ->capture_default_str();
  b->add_option("-z,--blocking", f.blocking, "1: wait for each operation before starting the next, even under -m")
      ->capture_default_str();
  b->add_option("-a,--average", f.average,
                "Time across ranks: 0 rank 0's, 1 the mean over ranks, 2 the fastest rank's, 3 the slowest rank's")
      ->capture_default_str();
  b->add_option("-N,--run_cycles", f.cycles, "Run the sweep this many times, printing each (0: until interrupted)")
      ->capture_default_str();
  b->add_option("-T,--timeout", f.timeout, "Fail a size that takes longer than this many seconds (0: never)")
      ->capture_default_str();
  b->add_option("-C,--report_cputime", f.cpu_time, "1: report the calling thread's CPU time instead of wall time")
      ->capture_default_str();
  b->add_option("-S,--report_timestamps", f.timestamps, "1: each row carries the UTC time it was measured")
      ->capture_default_str();
  b->add_option("-J,--output_file", f.output_file,
                "Rank 0 writes the rows to this file: CSV if it ends in .csv, else JSON lines (never prefixed)");
  b->add_option("-t,--nthreads", f.threads, "Threads per process: 1 (one rank per process)")->capture_default_str();
  b->add_option("-g,--ngpus", f.gpus, "GPUs per thread: 1 (tandem bench runs on CPUs)")->capture_default_str();
  b->add_option("-p,--parallel_init", f.parallel_init, "Accepted (0 or 1): every rank is its own process")
      ->capture_default_str();
  b->add_option("-y,--stream_null", f.stream_null, "0 only (no CUDA streams)")->capture_default_str();
  b->add_option("-G,--cudagraph", f.cuda_graph, "0 only (no CUDA graphs)")->capture_default_str();
  b->add_option("-F", f.csv_file_flag, "Refused: use -J FILE.csv");
  b->add_option("--compare", f.compare,
                "Compare two JSON runs size by size (A.json B.json): B/A of the median, and whether they differ "
                "beyond their spread")
      ->expected(2);
}

}  // namespace

CLI::App* add_bench(CLI::App& app, BenchFlags& f) {
  auto* b = app.add_subcommand(
      "bench", "Sweep one collective over message sizes (nccl-tests flags); run it under `tandem launch`");
  std::string listed;
  for (const auto& n : tandem::bench::sweep_collectives()) listed += (listed.empty() ? "" : ", ") + n;
  b->add_option(
      "collective", f.collective,
      "Test: " + listed + "; or nccl-tests' names (all_reduce_perf, all_gather, ...); or the overlap subcommand");
  b->add_option("-b,--minbytes", f.min_bytes, "Smallest message, bytes with K/M/G suffix")->capture_default_str();
  b->add_option("-e,--maxbytes", f.max_bytes, "Largest message")->capture_default_str();
  b->add_option("-f,--stepfactor", f.factor, "Multiply the size by this between steps")->capture_default_str();
  b->add_option("-i,--stepbytes", f.increment, "Add this many bytes between steps instead (0 = use -f)")
      ->capture_default_str();
  b->add_option("-n,--iters", f.iters, "Timed iterations per size")->capture_default_str();
  b->add_option("-w,--warmup_iters", f.warmup, "Untimed warm-up iterations per size")->capture_default_str();
  b->add_option("-c,--check", f.check, "Check results: 0 off, 1 on")->capture_default_str();
  b->add_option("-d,--datatype", f.dtype, "Element type: " + join_names(tandem::kAllDataTypes) + ", or all")
      ->capture_default_str();
  b->add_option("-o,--op", f.op, "Reduction: " + join_names(tandem::kAllReduceOps) + ", or all")->capture_default_str();
  b->add_option("-r,--root", f.root, "Root rank (broadcast, reduce, gather, scatter), or all")->capture_default_str();
  b->add_option("-R,--registered,--local_register", f.registered,
                "Buffers: 0 heap memory, 1 Communicator::allocate_shared memory (registered; ranks on one host "
                "then reduce straight from each other's buffers); 2 reads as 1")
      ->capture_default_str();
  add_nccl_tests_flags(b, f);
  b->add_option("--format", f.format, "Output: table, csv or json")->capture_default_str();
  b->add_option("--compress", f.compress,
                "All-reduce f32 (sum/avg) through the fp16 or bf16 codec: 16-bit values on the wire, f32 "
                "accumulation; adds wire bytes and the error against the f32 result")
      ->capture_default_str();
  b->add_option("--plot", f.plot, "Write busbw vs size to this PNG (needs gnuplot)");
  b->add_option("--algorithm", f.algorithm,
                "All-reduce algorithm: auto, ring, recursive_doubling, shared_memory, hierarchical (default: "
                "TANDEM_ALGO, else auto)");
  return b;
}

}  // namespace tandem::cli
