// The `tandem` executable: parses flags and calls the libraries.
//   tandem launch -n N [--timeout S] [--grace S] [--] cmd args...
//   tandem bench <collective> [nccl-tests flags]   (allreduce ... sendrecv, hypercube; cli/bench.cc)
//   tandem bench --compare A.json B.json
//   tandem bench overlap [--model M] [--modes ...]
//   tandem bench ps [...]            (parameter server next to all-reduce; cli/ps.cc)
//   tandem ps serve                  (a parameter-server rank; cli/ps.cc)
//   tandem model calibrate|predict|validate ...
//   tandem info
//   tandem netif [--format table|json]
//   tandem train exp.yaml [flags]   (execs tandem-train from this executable's directory)
// Exit codes: 0 success, 2 usage error, otherwise what the subcommand returns.
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "bench.h"
#include "doctor.h"
#include "flags.h"
#include "launch_command.h"
#include "model.h"
#include "ps.h"
#include "settings_info.h"
#include "tandem/bench/compare.h"
#include "tandem/bench/overlap.h"
#include "tandem/bench/sweep.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/logging.h"
#include "tandem/netif.h"
#include "tandem/reduce.h"
#include "tandem/ring/ring.h"
#include "tandem/store.h"
#include "tandem/types.h"

#ifndef TANDEM_VERSION
#define TANDEM_VERSION "unknown"
#endif

namespace {

constexpr int kUsageError = 2;

using tandem::cli::lower;
using tandem::cli::size_flag;
using tandem::cli::UsageError;

struct OverlapFlags {
  std::string model = "resnet50", modes = "none,overlap,autotune", compute = "auto";
  double scale = 1.0;
  int steps = 20, warmup = 3, steps_per_sample = 2, samples = 16, grid_steps = 2;
  std::string threshold = "25M", first_bucket = "1M", chunk = "0";
  std::string start = "1M,4M,64K";
  std::string format = "table", plot, timeline, autotune_log, compress = "none";
};

tandem::fusion::FusionSettings settings_flag(const std::string& flag, const std::string& t, const std::string& f,
                                             const std::string& c) {
  return {size_flag(flag, t), size_flag(flag, f), size_flag(flag, c)};
}

tandem::bench::OverlapOptions to_overlap_options(const OverlapFlags& f) {
  tandem::bench::OverlapOptions o;
  o.model = f.model;
  o.scale = f.scale;
  if (f.compute != "auto") {
    char* end = nullptr;
    o.compute_ms = std::strtod(f.compute.c_str(), &end);
    if (*end != '\0' || o.compute_ms < 0)
      throw UsageError("--compute-ms: '" + f.compute + "' is neither 'auto' nor a number of milliseconds >= 0");
  }
  o.steps = f.steps;
  o.warmup = f.warmup;
  o.steps_per_sample = f.steps_per_sample;
  o.autotune_samples = f.samples;
  o.grid_steps = f.grid_steps;
  o.modes.clear();
  std::stringstream modes(f.modes);
  for (std::string m; std::getline(modes, m, ',');) o.modes.push_back(m);
  o.fixed = settings_flag("--threshold/--first-bucket/--chunk", f.threshold, f.first_bucket, f.chunk);
  std::stringstream start(f.start);
  std::string parts[3];
  for (auto& p : parts) std::getline(start, p, ',');
  o.autotune_start = settings_flag("--autotune-start", parts[0], parts[1], parts[2]);
  const std::string format = lower(f.format);
  if (format != "table" && format != "json")
    throw UsageError("--format: unknown '" + f.format + "'; valid: table, json");
  o.format = format;
  if (!f.plot.empty() && lower(f.plot).ends_with(".png") == false)
    throw UsageError("--plot expects a .png file name (got '" + f.plot + "')");
  o.plot = f.plot;
  o.timeline = f.timeline;
  o.autotune_log = f.autotune_log;
  o.compress = f.compress;
  return o;
}

CLI::App* add_overlap(CLI::App& bench, OverlapFlags& f) {
  auto* b = bench.add_subcommand(
      "overlap", "How much gradient communication the gradient-sync engine hides behind a synthetic backward pass");
  b->add_option("--model", f.model, "resnet50, vgg16, uniform:COUNT:MIN:MAX (bytes), or a file of sizes (f32 elements)")
      ->capture_default_str();
  b->add_option("--scale", f.scale, "Multiply every gradient's size")->capture_default_str();
  b->add_option("--compute-ms", f.compute, "Backward compute per step in ms, or auto (= no-overlap communication)")
      ->capture_default_str();
  b->add_option("--modes", f.modes, "Comma list of none, overlap, autotune, per-gradient, grid")->capture_default_str();
  b->add_option("--steps", f.steps, "Measured steps per mode")->capture_default_str();
  b->add_option("--warmup", f.warmup, "Warm-up steps per mode")->capture_default_str();
  b->add_option("--threshold", f.threshold, "Fusion threshold (bucket cap)")->capture_default_str();
  b->add_option("--first-bucket", f.first_bucket, "First bucket's cap")->capture_default_str();
  b->add_option("--chunk", f.chunk, "All-reduce pipeline chunk (0 = the communicator's)")->capture_default_str();
  b->add_option("--autotune-start", f.start, "THRESHOLD,FIRST,CHUNK the autotuner starts from")->capture_default_str();
  b->add_option("--steps-per-sample", f.steps_per_sample, "Autotune: steps per trial")->capture_default_str();
  b->add_option("--autotune-samples", f.samples, "Autotune: trials before settling")->capture_default_str();
  b->add_option("--grid-steps", f.grid_steps, "Grid mode: measured steps per grid point")->capture_default_str();
  b->add_option("--compress", f.compress,
                "Gradients on the wire: none, fp16 or bf16; a list (none,fp16) runs every mode with each")
      ->capture_default_str();
  b->add_option("--format", f.format, "Output: table or json")->capture_default_str();
  b->add_option("--plot", f.plot, "Write compute and exposed communication per mode to this PNG");
  b->add_option("--timeline", f.timeline, "Chrome trace of the overlap mode (rank 0)");
  b->add_option("--autotune-log", f.autotune_log, "JSON lines of the autotuner's trials");
  b->footer("Example: tandem launch -n 2 -- tandem bench overlap --model resnet50 --plot overlap.png");
  return b;
}

// ---------------------------------------------------------------- info

// "0-1,4": the CPUs this process may run on, as ranges.
std::string allowed_cpu_ranges() {
  const std::vector<int> cpus = tandem::launch::allowed_cpus();
  if (cpus.empty()) return "unknown";
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t last = i;
    while (last + 1 < cpus.size() && cpus[last + 1] == cpus[last] + 1) ++last;
    out += (out.empty() ? "" : ",") + std::to_string(cpus[i]) + (last > i ? "-" + std::to_string(cpus[last]) : "");
    i = last + 1;
  }
  return out;
}

int run_info() {
  std::printf("tandem %s\n", TANDEM_VERSION);
  std::printf("reduce kernels: %s (CPU)", std::string(tandem::reduce_isa()).c_str());
#ifdef TANDEM_WITH_CUDA
  std::printf(", CUDA kernels built\n");
#else
  std::printf(", CUDA kernels not built\n");
#endif
  // The CLI does not include UCX; `ucx_info -v` reports the library's version.
  std::printf("transport: UCX (linked into tandem_comm; see `ucx_info -v` for its version)\n");
  if (tandem::detect_launcher() == "none") {
    std::printf("job environment: none (run under `tandem launch`, mpirun or srun to see rank options)\n");
    try {
      // The path table depends on this host and the settings, not on the job.
      const auto ring = tandem::ring::ring_options_from_env();
      std::printf("%s",
                  tandem::ring::describe_shm_paths(ring.shm_paths, tandem::ring::cross_memory_attach_limit()).c_str());
    } catch (const std::exception& e) {
      std::printf("shared-memory paths: invalid: %s\n", e.what());
    }
    return 0;
  }
  try {
    tandem::CommOptions o = tandem::comm_options_from_env();
    std::printf("job environment (%s): rank %d of %d, local rank %d of %d, store %s%s\n",
                tandem::detect_launcher().c_str(), o.rank, o.size, o.local_rank, o.local_size, o.store_address.c_str(),
                o.host_store ? " (hosted by rank 0)" : "");
    std::printf(
        "cpus: %s of this host's %ld (tandem launch binds each rank to its share, or to one CPU "
        "round-robin when ranks outnumber them; --bind none or TANDEM_BIND=none leaves placement to the "
        "scheduler)\n",
        allowed_cpu_ranges().c_str(), ::sysconf(_SC_NPROCESSORS_ONLN));
    const auto ring = tandem::ring::fit_to_host(tandem::ring::ring_options_from_env(), o);
    if (ring.shared_memory) {
      const std::string plan =
          tandem::ring::shared_memory_plan(ring, o.local_size, tandem::ring::cross_memory_attach_limit());
      std::printf("%s", plan.c_str());
    } else {
      std::printf("shared memory: off (TANDEM_SHM=0): every collective goes through UCX\n");
    }
  } catch (const std::exception& e) {
    std::printf("job environment: invalid: %s\n", e.what());
  }
  return 0;
}

// ---------------------------------------------------------------- netif

// Alone: this host's interfaces. In a job (world size > 1): the selection every
// rank runs at connect time, as a decision matrix; rank 0 prints the table,
// every rank its own JSON line.
int run_netif(const std::string& format_flag) {
  const std::string format = lower(format_flag);
  if (format != "table" && format != "json")
    throw UsageError("--format: unknown '" + format_flag + "'; valid: table, json");
  const bool in_job = tandem::detect_launcher() != "none";
  std::optional<tandem::CommOptions> job;
  if (in_job) job = tandem::comm_options_from_env();
  if (!job || job->size <= 1) {
    const auto interfaces = tandem::discover_interfaces();
    const auto host = tandem::local_host_identity();
    if (format == "json") {
      std::printf("%s\n", tandem::interfaces_to_json(interfaces, host).c_str());
    } else {
      std::printf("host %s (network namespace %s)\n%s", host.hostname.c_str(), host.netns.c_str(),
                  tandem::interfaces_to_text(interfaces).c_str());
    }
    return 0;
  }
  const tandem::CommOptions& o = *job;
  const tandem::Deadline deadline = tandem::Clock::now() + o.connect_timeout;
  auto [host, port] = tandem::parse_host_port(o.store_address);
  std::unique_ptr<tandem::StoreServer> server;
  if (o.host_store) {
    tandem::StoreServerOptions so;
    so.host = host;
    so.port = port;
    so.secret = o.secret;
    server = std::make_unique<tandem::StoreServer>(so);
  }
  // No hello(): a short-lived tool, it needs no failure detection (and so no goodbye race at exit).
  tandem::StoreClient store(host, port, deadline, o.secret);
  spdlog::set_level(spdlog::level::warn);  // the decision is printed below, not logged
  tandem::NetifDecision d = tandem::select_interface(store, o, deadline);
  if (format == "json") {
    std::printf("%s\n", d.to_json().c_str());
  } else if (o.rank == 0) {
    std::printf("%s\n", d.to_text().c_str());
  } else {
    std::printf("rank %d: %s\n", o.rank, d.chosen.empty() ? "no interface chosen (UCX chooses)" : d.chosen.c_str());
  }
  std::fflush(stdout);
  // The rank hosting the store keeps it up until every rank has read what it needs.
  const std::string left = o.prefix + "/netif/left";
  store.add(left, 1, deadline);
  while (server && store.add(left, 0, deadline) < o.size && tandem::Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return 0;
}

// ---------------------------------------------------------------- train

// `tandem train ...` is `tandem-train ...`: the trainer links LibTorch, this executable never does.
int exec_trainer(const char* argv0, const std::vector<std::string>& args) {
  char self[4096];
  ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv0);
  dir = dir.substr(0, dir.find_last_of('/') + 1);
  const std::string trainer = dir + "tandem-train";
  std::vector<char*> argv{const_cast<char*>(trainer.c_str())};
  for (size_t i = 1; i < args.size(); ++i) argv.push_back(const_cast<char*>(args[i].c_str()));
  argv.push_back(nullptr);
  ::execv(trainer.c_str(), argv.data());
  std::fprintf(stderr,
               "tandem: error: cannot run %s: %s (was tandem built with the trainer? it needs libtorch-dev; "
               "see TANDEM_BUILD_TRAINER)\n",
               trainer.c_str(), std::strerror(errno));
  return 127;
}

// Library errors often name tandem already; avoid "tandem: tandem: ...".
std::string with_prefix(std::string_view message) {
  if (message.starts_with("tandem")) return std::string(message);
  return "tandem: error: " + std::string(message);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tandem: collective communication for data-parallel training"};
  app.set_version_flag("--version", std::string("tandem ") + TANDEM_VERSION);
  app.require_subcommand(1);

  tandem::cli::LaunchFlags launch;
  tandem::cli::BenchFlags bench;
  tandem::cli::add_launch(app, launch);
  auto* bench_cmd = tandem::cli::add_bench(app, bench);
  OverlapFlags overlap;
  auto* overlap_cmd = add_overlap(*bench_cmd, overlap);
  tandem::cli::PsFlags ps_flags;
  tandem::cli::add_ps(app, *bench_cmd, ps_flags);
  tandem::cli::ModelFlags model;
  tandem::cli::add_model(app, model);
  bool info_settings = false, info_markdown = false;
  auto* info = app.add_subcommand("info", "Show version, kernel ISA and the job environment");
  info->add_flag("--settings", info_settings, "List every setting: layer, variable, value and where it came from");
  info->add_flag("--markdown", info_markdown, "With --settings: the configuration reference (docs/configuration.md)");
  std::string netif_format = "table";
  auto* netif = app.add_subcommand(
      "netif", "List network interfaces; under `tandem launch` (or across hosts) show how the ranks choose one");
  netif->add_option("--format", netif_format, "Output: table or json")->capture_default_str();
  std::vector<std::string> doctor_dumps;
  app.add_subcommand("doctor", "Compare the ranks' flight-recorder dumps: the first call where they diverge")
      ->add_option("dumps", doctor_dumps, "tandem-flight-*.json files, one per rank")
      ->required();

  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "train") return exec_trainer(argv[0], args);
  app.add_subcommand("train",
                     "Train a Determined-style experiment (exp.yaml) through tandem; see `tandem train --help`");
  std::optional<std::vector<std::string>> after_separator;
  if (!args.empty() && args[0] == "launch") {
    after_separator = tandem::cli::set_aside_after_separator(args);
    tandem::cli::accept_mpirun_spellings(args);
  }
  std::vector<char*> parse_argv{argv[0]};
  for (auto& a : args) parse_argv.push_back(a.data());

  try {
    app.parse(static_cast<int>(parse_argv.size()), parse_argv.data());
  } catch (const CLI::Success& e) {  // --help, --version
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return kUsageError;
  }

  try {
    tandem::configure_logging();
    if (app.got_subcommand("launch")) {
      auto command = tandem::cli::launch_command_words(*app.get_subcommand("launch"), after_separator);
      return tandem::cli::run_launch(launch, std::move(command));
    }
    if (overlap_cmd->parsed()) return tandem::bench::run_overlap(to_overlap_options(overlap));
    if (const int rc = tandem::cli::run_ps(ps_flags); rc >= 0) return rc;
    if (app.got_subcommand("bench")) {
      if (!bench.compare.empty()) return tandem::bench::run_compare(bench.compare[0], bench.compare[1], std::cout);
      if (bench.collective.empty())
        throw UsageError("bench: name a collective, --compare A.json B.json or the overlap subcommand");
      return tandem::bench::run_sweep(tandem::cli::to_sweep_options(bench));
    }
    if (app.got_subcommand("model")) return tandem::cli::run_model(model);
    if (app.got_subcommand("info")) return info_settings ? tandem::cli::run_settings_info(info_markdown) : run_info();
    if (app.got_subcommand("netif")) return run_netif(netif_format);
    if (app.got_subcommand("doctor")) return tandem::cli::run_doctor(doctor_dumps, std::cout);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "tandem: %s\nRun with --help for more information.\n", e.what());
    return kUsageError;
  } catch (const tandem::InvalidArgument& e) {
    std::fprintf(stderr, "%s\n", with_prefix(e.what()).c_str());
    return kUsageError;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", with_prefix(e.what()).c_str());
    return 1;
  }
  return kUsageError;
}
