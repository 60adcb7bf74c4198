// tandem-train: `tandem train` execs it.
//   tandem-train exp.yaml [--slots N | --scaling 1,2,4] [--resume] [--output DIR] [--no-overlap] ...
// Each slot the driver starts runs
//   tandem-train --worker-options <trial dir>/worker-options.json   (written by the driver);
// by hand, or under mpirun or srun, a slot takes the driver's flags instead:
//   tandem-train --worker exp.yaml --slots N --output DIR [--checkpoint-dir DIR] ...
// and `tandem-train --print-keys [--markdown | --update-doc FILE]` prints the experiment keys.
// Exit codes: 0 success, 2 bad configuration or flags, 1 the trial failed.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string_view>

#include "config.h"
#include "config_keys.h"
#include "driver.h"
#include "trainer_settings.h"
#include "worker.h"

namespace tr = tandem::trainer;

// Runs `body`; a configuration error exits 2, a trial that cannot be set up
// tr::kSetupFailedExit, any other error 1.
template <typename Body>
int reporting_errors(Body body) {
  try {
    return body();
  } catch (const tr::ConfigError& e) {
    std::fprintf(stderr, "tandem train: %s\n", e.what());
    return 2;
  } catch (const tr::SetupError& e) {
    std::fprintf(stderr, "tandem train: cannot set up the trial: %s\n", e.what());
    return tr::kSetupFailedExit;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem train: error: %s\n", e.what());
    return 1;
  }
}

// Everything the command line sets: the driver's and each slot's options, and what to run.
struct CommandLine {
  tr::DriverOptions driver;
  bool worker = false, no_overlap = false, no_deferred = false;
  std::string scaling;
  bool print_keys = false, markdown = false;
  std::string update_doc;
};

// The experiment keys as text, as docs/training.md's Markdown table, or rewritten into a document's reference.
int print_experiment_keys(const CommandLine& cl) {
  if (cl.update_doc.empty()) {
    std::fputs((cl.markdown ? tr::experiment_keys_markdown() : tr::experiment_keys_text()).c_str(), stdout);
    return 0;
  }
  std::ifstream in(cl.update_doc);
  if (!in) throw std::runtime_error("cannot read '" + cl.update_doc + "'");
  std::stringstream doc;
  doc << in.rdbuf();
  const std::string updated = tr::with_key_reference(doc.str());
  in.close();
  std::ofstream(cl.update_doc) << updated;
  return 0;
}

void add_flags(CLI::App& app, CommandLine& cl) {
  tr::DriverOptions& o = cl.driver;
  tr::WorkerOptions& w = o.worker;
  w.compute_nice = tr::trainer_settings_from_env().compute_nice;  // the flag overrides it
  app.add_option("--slots", w.slots, "Slots for this run (overrides resources.slots_per_trial)");
  app.add_option("--scaling", cl.scaling, "Run once per slot count, e.g. 1,2,4, and compare");
  app.add_flag("--resume", w.resume, "Continue from the newest intact checkpoint");
  app.add_option("--output", o.output_dir, "Directory for metrics, plots and checkpoints (default runs/<name>)");
  app.add_flag("--no-overlap", cl.no_overlap,
               "Reduce the gradients after backward, none during it (no wait-free backprop)");
  app.add_option(
      "--dtrain-network-interface", o.network_interface,
      "Interface(s) for the slots (as dtrain_network_interface; else TANDEM_NETWORK_INTERFACE, else the config)");
  app.add_option("--rsh", o.rsh, "With resources.hosts: how `tandem launch` reaches a host (default ssh)");
  app.add_option("--store-addr", o.store_address,
                 "With resources.hosts: HOST[:PORT] where the other hosts reach the launcher's store");
  app.add_option("--host-discovery-script", o.host_discovery_script,
                 "With elastic: a command printing the hosts and slots on offer (host:slots lines, as "
                 "horovodrun's); slots beyond those running join the trial, up to elastic.max_slots");
  app.add_option("--max-batches", w.max_batches, "Stop after this many batches (overrides searcher.max_length)");
  app.add_option("--per-slot-batch", w.per_slot_batch,
                 "Samples per slot per batch at every slot count: the global batch grows with the slots "
                 "(overrides hyperparameters.global_batch_size)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--compare", o.compare,
                 "Only tabulate finished runs: LABEL=DIR (repeatable; DIR holds metrics.jsonl)");
  app.add_option("--target-accuracy", o.target_accuracy, "Validation accuracy the time-to-accuracy figures use")
      ->capture_default_str();
  app.add_option("--stall-factor", w.stall_factor, "Report a batch slower than this many times the running median")
      ->capture_default_str();
  app.add_option("--validation-batch", w.validation_batch,
                 "Images a validation forward takes at once (default: the per-slot batch, at least 64)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--dump-params", w.dump_params, "Write the final parameters (float32, model order) to this file");
  app.add_flag("--timeline", w.timeline,
               "Each slot writes a Chrome trace (compute, waits, bucket all-reduces) to OUTPUT/timeline-rank<r>.json");
  app.add_option("--compute-nice", w.compute_nice,
                 "Nice value of each slot's compute thread while gradients overlap backward, so communication runs "
                 "first when it has work (0 = unchanged; default TANDEM_COMPUTE_NICE, else 19)")
      ->check(CLI::Range(0, 19))
      ->capture_default_str();
  app.add_flag("--no-deferred-updates", cl.no_deferred,
               "Update every parameter after the last bucket lands, not each as the next forward first uses it");
  app.add_option("--input-layers-ahead", w.input_layers_ahead_bytes,
                 "With deferred updates, reduce the input-side layers' bucket ahead of the last buckets holding up "
                 "to this many bytes, so the next forward can start (0 = bucket order)")
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "No progress line and no summary");
  app.add_flag("--anchor", o.anchor, "Also train each slot count with PyTorch DDP (gloo) and compare in one table");
  app.add_flag("--anchor-fp16", o.anchor_fp16, "The anchor with DDP's fp16 compression hook (implies --anchor)");
  app.add_flag("--print-keys", cl.print_keys,
               "Print the experiment keys (type, values, defaults, Determined's defaults) instead of training");
  app.add_flag("--markdown", cl.markdown, "With --print-keys: as the Markdown table of docs/training.md");
  app.add_option("--update-doc", cl.update_doc,
                 "With --print-keys: rewrite this document's key reference (between its markers) instead of printing");
  // Internal: one slot started by hand or by another launcher, and fault injection for tests.
  app.add_flag("--worker", cl.worker, "")->group("");
  app.add_option("--checkpoint-dir", w.checkpoint_dir, "")->group("");
  app.add_option("--attempt", w.attempt, "")->group("");
  app.add_option("--fail-at-batch", w.fail_at_batch, "")->group("");
  app.add_option("--fail-rank", w.fail_rank, "")->group("");
  app.add_flag("--fail-stop", w.fail_stop, "")->group("");
  app.add_option("--fail-checkpoint-batch", w.fail_checkpoint_batch, "")->group("");
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--worker-options")
    return reporting_errors([&] { return tr::run_worker(tr::load_worker_options(argv[2])); });
  CLI::App app{"tandem train: a Determined-style experiment trained through tandem"};
  CommandLine cl;
  tr::DriverOptions& o = cl.driver;
  tr::WorkerOptions& w = o.worker;
  CLI::Option* config = app.add_option("config", w.config_path, "Experiment configuration (YAML)");
  add_flags(app, cl);
  try {
    app.parse(argc, argv);
    if (!cl.print_keys && config->count() == 0) throw CLI::RequiredError(config->get_name());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  if (cl.print_keys) return reporting_errors([&] { return print_experiment_keys(cl); });
  w.overlap = !cl.no_overlap;
  w.deferred_updates = !cl.no_deferred;

  return reporting_errors([&] {
    if (cl.worker) {
      if (w.output_dir.empty()) w.output_dir = o.output_dir;
      return tr::run_worker(w);
    }
    if (!cl.scaling.empty()) o.scaling = tr::parse_slot_list(cl.scaling);
    o.anchor = o.anchor || o.anchor_fp16;
    o.anchor_script = TANDEM_ANCHOR_SCRIPT;
    char self[PATH_MAX];
    ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    o.self = n > 0 ? std::string(self, static_cast<size_t>(n)) : std::string(argv[0]);
    return tr::run_driver(o);
  });
}
