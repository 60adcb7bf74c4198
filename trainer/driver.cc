// Terms: a trial is one training run at one slot count; an attempt is one
// start of its slots by the launcher (the first, then each restart).
#include "driver.h"

#include <sched.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "checkpoint.h"
#include "config.h"
#include "metrics.h"
#include "tandem/bench/plot.h"
#include "tandem/bootstrap.h"
#include "tandem/launch/launch.h"
#include "worker.h"

namespace tandem::trainer {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

struct Trial {
  int slots = 0;
  std::string system = "tandem";
  std::string dir, checkpoint_dir;
  TrialSummary summary;
  std::string best_checkpoint;  // by searcher.metric, when one was validated
  bool ok = false;
};

class Driver {
 public:
  Driver(DriverOptions o, ExperimentConfig cfg) : o_(std::move(o)), cfg_(std::move(cfg)) {
    tty_ = ::isatty(STDERR_FILENO) && !o_.quiet;
  }

  Trial run_trial(int slots, const std::string& dir, const std::string& checkpoint_dir) {
    Trial t;
    t.slots = slots, t.dir = dir, t.checkpoint_dir = checkpoint_dir;
    ExperimentConfig cfg = cfg_;
    set_slots(cfg, slots, o_.worker.per_slot_batch);
    for (const auto& w : cfg.warnings) std::fprintf(stderr, "tandem train: warning: %s\n", w.c_str());
    fs::create_directories(dir);
    if (!o_.worker.resume) {
      // A fresh trial: no stale checkpoints or metrics.
      std::error_code ec;
      fs::remove_all(checkpoint_dir, ec);
      fs::remove(dir + "/metrics.jsonl", ec);
    }
    fs::create_directories(checkpoint_dir);
    const std::string metrics = dir + "/metrics.jsonl";
    const int64_t total = o_.worker.max_batches;  // 0: the progress line reads the chief's start line
    for (int attempt = 0;; ++attempt) {
      WorkerOptions w = o_.worker;
      w.output_dir = dir;
      w.checkpoint_dir = checkpoint_dir;
      w.slots = slots;
      w.attempt = attempt;
      w.resume = o_.worker.resume || attempt > 0;
      const std::string options_file = dir + "/worker-options.json";
      save_worker_options(w, options_file);
      const int code = launch_slots(cfg, slots, {o_.self, "--worker-options", options_file}, metrics, total);
      if (code == 0) {
        t.ok = true;
        break;
      }
      if (code == kSetupFailedExit) {
        std::fprintf(stderr,
                     "tandem train: trial failed: a worker could not set it up (its error is above); "
                     "every restart would fail the same way, so none is made\n");
        break;
      }
      if (attempt >= cfg.max_restarts) {
        std::fprintf(stderr, "tandem train: trial failed (exit %d) after %d restart%s (max_restarts %d)\n", code,
                     attempt, attempt == 1 ? "" : "s", cfg.max_restarts);
        break;
      }
      std::vector<std::string> warnings;
      auto found = latest_checkpoint(checkpoint_dir, &warnings);
      for (const auto& w : warnings) std::fprintf(stderr, "tandem train: warning: %s\n", w.c_str());
      std::fprintf(stderr, "tandem train: a worker failed (exit %d); restart %d of %d from %s\n", code, attempt + 1,
                   cfg.max_restarts,
                   found ? ("the checkpoint at batch " + std::to_string(found->batch)).c_str() : "the start");
    }
    t.summary = read_metrics(metrics);
    if (auto best = tandem::trainer::best_checkpoint(checkpoint_dir, keep_policy(cfg))) t.best_checkpoint = *best;
    return t;
  }

  // One attempt: the slots run `worker` under the launch library's supervisor,
  // in this process (as `tandem launch --grace 5` would); returns its exit code.
  // Local slots, or across resources.hosts, whole hosts of slots_per_host
  // (default: the slots spread evenly) in list order.
  int launch_slots(const ExperimentConfig& cfg, int slots, std::vector<std::string> worker, const std::string& metrics,
                   int64_t total) {
    launch::LaunchOptions lo;
    lo.grace_seconds = 5;
    lo.bind = launch::default_bind();
    lo.command = std::move(worker);
    if (!network_interface().empty()) lo.environment.push_back("TANDEM_NETWORK_INTERFACE=" + network_interface());
    if (cfg.elastic()) {
      lo.elastic_min = cfg.elastic_min_slots, lo.elastic_max = cfg.elastic_max();
      // A lost slot is replaced by a process that joins the running attempt;
      // each attempt may replace max_restarts slots (a budget apart from the trial's restarts).
      lo.max_restarts = cfg.max_restarts;
      lo.host_discovery_script = o_.host_discovery_script;
    }
    if (cfg.hosts.empty()) {
      lo.nprocs = slots;
    } else {
      const int per_host = slots_per_placed_host(cfg);
      std::string list;
      for (int h = 0; h < placed_hosts(cfg); ++h) {
        list += (h ? "," : "") + cfg.hosts[size_t(h)] + ":" + std::to_string(std::min(per_host, slots - h * per_host));
      }
      try {
        lo.hosts = launch::parse_hosts(list);
      } catch (const std::invalid_argument& e) {
        std::fprintf(stderr, "tandem launch: %s\n", e.what());
        return 2;
      }
      if (!o_.rsh.empty()) lo.rsh = o_.rsh;
      if (!o_.store_address.empty()) lo.store_address = o_.store_address;
    }
    auto next_progress = std::chrono::steady_clock::now();
    if (tty_) {
      lo.on_tick = [&] {
        if (std::chrono::steady_clock::now() < next_progress) return;
        show_progress(metrics, total);
        next_progress = std::chrono::steady_clock::now() + 500ms;
      };
    }
    std::fflush(stdout);
    std::fflush(stderr);
    const launch::LaunchResult result = launch::launch(lo);
    if (tty_) std::fprintf(stderr, "\r\033[K");
    if (result.interrupt_signal != 0) {
      // Stopped by the user (Ctrl-C, kill): no restart; this process ends by
      // the same signal, the ranks having been stopped first.
      std::signal(result.interrupt_signal, SIG_DFL);
      std::raise(result.interrupt_signal);
    }
    return result.exit_code;
  }

  // The same experiment under PyTorch DDP (gloo), metrics in the same format.
  Trial run_anchor(int slots, const std::string& dir) {
    Trial t;
    t.slots = slots, t.dir = dir, t.system = o_.anchor_fp16 ? "DDP gloo + fp16 hook" : "DDP gloo";
    fs::create_directories(dir);
    std::vector<std::string> argv = {
        "/usr/bin/python3", o_.anchor_script, o_.worker.config_path, "--slots", std::to_string(slots), "--output", dir};
    if (o_.worker.max_batches > 0) argv.insert(argv.end(), {"--max-batches", std::to_string(o_.worker.max_batches)});
    if (o_.worker.per_slot_batch > 0)
      argv.insert(argv.end(), {"--per-slot-batch", std::to_string(o_.worker.per_slot_batch)});
    if (o_.anchor_fp16) argv.push_back("--fp16-hook");
    std::string error;
    const int code = launch::run_and_wait(
        argv,
        [&] {
          if (tty_) show_progress(dir + "/metrics.jsonl", o_.worker.max_batches);
        },
        tty_ ? 500ms : 100ms, error);
    if (!error.empty()) std::fprintf(stderr, "tandem train: %s\n", error.c_str());
    if (tty_) std::fprintf(stderr, "\r\033[K");
    t.ok = code == 0;
    if (!t.ok) std::fprintf(stderr, "tandem train: the DDP anchor failed (see its output above)\n");
    t.summary = read_metrics(dir + "/metrics.jsonl");
    return t;
  }

  const std::string& network_interface() const { return network_interface_; }
  std::string network_interface_;

 private:
  void show_progress(const std::string& metrics, int64_t total) {
    if (total <= 0) {
      std::ifstream in(metrics);
      std::string first;
      std::getline(in, first);
      auto at = first.find("\"total_batches\":");
      if (at == std::string::npos) return;
      total = std::atoll(first.c_str() + at + 16);
    }
    std::fprintf(stderr, "\r\033[K%s", progress_line(read_metrics(metrics), total).c_str());
    std::fflush(stderr);
  }

  DriverOptions o_;
  ExperimentConfig cfg_;
  bool tty_ = false;
};

// The plots are written either way (a comparison plot reads their data); quiet prints nothing.
void report_trial(const Trial& t, double target, bool quiet) {
  std::string error;
  auto files = plot_metrics(t.summary, t.dir + "/metrics", &error);
  if (quiet) return;
  std::printf("%s", summary_table(t.summary, target).c_str());
  for (const auto& f : files) std::printf("  plot: %s\n", f.c_str());
  if (!error.empty()) std::fprintf(stderr, "tandem train: warning: no plots: %s\n", error.c_str());
  std::printf("  metrics: %s/metrics.jsonl\n", t.dir.c_str());
  if (!t.best_checkpoint.empty()) std::printf("  best checkpoint: %s\n", t.best_checkpoint.c_str());
  std::fflush(stdout);
}

// One row per trial; speed-up and efficiency against the first trial whose
// system names a prefix of its own ("tandem" is the base of "tandem + fp16").
void report_comparison(const std::vector<Trial>& trials, const std::string& dir, double target) {
  if (trials.empty()) return;
  std::ostringstream table;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "| system | slots | global batch | samples/s | speed-up | efficiency | validation (s a pass) | time to "
                "%.0f%% (s) | final val acc |\n",
                100 * target);
  table << buf << "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  auto label = [](const Trial& t) {
    return t.system + ", " + std::to_string(t.slots) + (t.slots == 1 ? " slot" : " slots");
  };
  // One bar a trial: its samples/s beside what perfect scaling of its base would give.
  std::ofstream bars(dir + "/scaling.dat");
  for (const auto& t : trials) {
    const Trial* base = &t;
    for (const auto& b : trials)
      if (t.system.starts_with(b.system)) {
        base = &b;
        break;
      }
    const double base_sps = base->summary.samples_per_s();
    const double sps = t.summary.samples_per_s();
    const double speedup = base_sps > 0 ? sps / base_sps : 0;
    const double eff = speedup * base->slots / t.slots;
    const double tt = t.summary.time_to_accuracy(target);
    std::snprintf(
        buf, sizeof buf, "| %s | %d | %lld | %.1f | %.2f | %.2f | %.2f | %s | %.4f |\n", t.system.c_str(), t.slots,
        static_cast<long long>(t.summary.global_batch), sps, speedup, eff, t.summary.validation_seconds(),
        tt >= 0 ? std::to_string(static_cast<int>(tt + 0.5)).c_str() : "not reached", t.summary.final_accuracy());
    table << buf;
    bars << sps << ' ' << base_sps * t.slots / base->slots << " \"" << label(t) << "\"\n";
  }
  bars.close();
  std::printf("\ncomparison\n%s", table.str().c_str());
  std::ofstream(dir + "/scaling.md") << table.str();
  std::ostringstream g;
  g << "set terminal pngcairo size 1400,640 noenhanced\nset output " << bench::gnuplot_quoted(dir + "/scaling.png")
    << "\n"
    << "set multiplot layout 1,2\nset bmargin 13\nset grid ytics\nset ylabel 'samples/s'\nset yrange [0:*]\n"
    << "set offsets 0,0,graph 0.1,0\nset xtics rotate by 30 right font ',9'\nset style fill solid 0.6\n"
    << "set boxwidth 0.6\nset key outside top center horizontal\nplot " << bench::gnuplot_quoted(dir + "/scaling.dat")
    << " using 0:1:xtic(3) with boxes title 'samples/s', '' using 0:2 with points pt 6 ps 2 "
       "title 'perfect scaling of its 1-slot run', '' using 0:1:(sprintf('%.0f', $1)) with labels offset 0,0.8 "
       "notitle\n"
    << "set offsets 0,0,0,0\nset xtics norotate font ''\nset grid xtics ytics\nset yrange [*:*]\n"
    << "set xlabel 'seconds'\nset ylabel 'validation accuracy'\nset key inside bottom right vertical font ',9'\n"
    << "set arrow from graph 0, first " << target << " to graph 1, first " << target << " nohead dt 2\nplot ";
  for (size_t i = 0; i < trials.size(); ++i)
    g << (i ? ", " : "") << bench::gnuplot_quoted(trials[i].dir + "/metrics-validation.dat")
      << " using 2:4 with linespoints title " << bench::gnuplot_quoted(label(trials[i]));
  g << "\nunset multiplot\n";
  std::string err = bench::run_gnuplot_script(g.str());
  if (err.empty())
    std::printf("  plot: %s/scaling.png\n  table: %s/scaling.md\n", dir.c_str(), dir.c_str());
  else
    std::fprintf(stderr, "tandem train: warning: no comparison plot: %s\n", err.c_str());
}

// resources.slots_per_trial on this host, at most one slot a core: Determined
// would wait for slots the cluster lacks, tandem runs on the cores it has.
// --slots (or --scaling) runs any count.
int fitted_slots(const ExperimentConfig& cfg) {
  cpu_set_t cpus;
  const int cores = ::sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 0;
  if (!cfg.hosts.empty() || cores <= 0 || cfg.slots_per_trial <= cores) return cfg.slots_per_trial;
  std::fprintf(stderr,
               "tandem train: warning: resources.slots_per_trial %d is more than the %d cores this host gives "
               "tandem train: the trial runs %d slots; --slots %d runs %d, sharing the cores\n",
               cfg.slots_per_trial, cores, cores, cfg.slots_per_trial, cfg.slots_per_trial);
  return cores;
}

}  // namespace

std::vector<int> parse_slot_list(const std::string& text) {
  std::vector<int> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    long v = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || v < 1 || v > 1024)
      throw ConfigError("--scaling: '" + item + "' is not a slot count; use a comma-separated list like 1,2,4");
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) throw ConfigError("--scaling: empty list; use a comma-separated list like 1,2,4");
  return out;
}

int run_driver(DriverOptions o) {
  ExperimentConfig cfg = load_config(o.worker.config_path, o.compare.empty() && o.worker.max_batches == 0);
  if (!o.compare.empty()) {
    std::vector<Trial> trials;
    for (const auto& c : o.compare) {
      const auto eq = c.find('=');
      if (eq == std::string::npos || eq == 0)
        throw ConfigError("--compare: '" + c + "' is not LABEL=DIR (e.g. 'tandem=runs/x/slots-1')");
      Trial t;
      t.system = c.substr(0, eq), t.dir = c.substr(eq + 1);
      if (!fs::exists(t.dir + "/metrics.jsonl"))
        throw ConfigError("--compare: " + t.dir + "/metrics.jsonl does not exist (a finished run's directory)");
      t.summary = read_metrics(t.dir + "/metrics.jsonl");
      t.slots = t.summary.slots;
      t.ok = true;
      std::string error;
      plot_metrics(t.summary, t.dir + "/metrics", &error);
      trials.push_back(std::move(t));
    }
    if (o.output_dir.empty()) o.output_dir = "runs/" + cfg.name;
    fs::create_directories(o.output_dir);
    report_comparison(trials, o.output_dir, o.target_accuracy);
    return 0;
  }
  if (!o.host_discovery_script.empty() && !cfg.elastic())
    throw ConfigError("--host-discovery-script adds slots to an elastic trial: give elastic: {min_slots, max_slots}");
  // Every slot count is checked before anything starts.
  std::vector<int> counts =
      o.scaling.empty() ? std::vector<int>{o.worker.slots > 0 ? o.worker.slots : fitted_slots(cfg)} : o.scaling;
  for (int s : counts) {
    ExperimentConfig c = cfg;
    set_slots(c, s, o.worker.per_slot_batch);
  }
  if (o.output_dir.empty()) o.output_dir = "runs/" + cfg.name;
  fs::create_directories(o.output_dir);
  o.worker.config_path = fs::absolute(o.worker.config_path).string();
  o.output_dir = fs::absolute(o.output_dir).string();
  if (!o.worker.dump_params.empty()) o.worker.dump_params = fs::absolute(o.worker.dump_params).string();

  Driver driver(o, cfg);
  // TANDEM_NETWORK_INTERFACE or DTRAIN_NETWORK_INTERFACE, read and checked (they must agree) as the slots read them.
  const std::string env_if = tuning_from_env().network_interface;
  driver.network_interface_ = !o.network_interface.empty() ? o.network_interface
                              : !env_if.empty()            ? env_if
                                                           : cfg.network_interface;
  if (!driver.network_interface().empty())
    std::fprintf(stderr, "tandem train: dtrain_network_interface = %s\n", driver.network_interface().c_str());

  auto checkpoint_dir = [&](const std::string& dir, int slots) {
    if (cfg.checkpoint_dir.empty()) return dir + "/checkpoints";
    return checkpoint_storage_dir(cfg, o.output_dir) + (o.scaling.empty() ? "" : "/slots-" + std::to_string(slots));
  };
  if (o.scaling.empty() && !o.anchor) {
    Trial t = driver.run_trial(counts[0], o.output_dir, checkpoint_dir(o.output_dir, counts[0]));
    report_trial(t, o.target_accuracy, o.quiet);
    return t.ok ? 0 : 1;
  }
  std::vector<Trial> trials, anchors;
  for (int s : counts) {
    const std::string dir = o.output_dir + "/slots-" + std::to_string(s);
    std::printf("\n== %s: tandem, %d slot%s ==\n", cfg.name.c_str(), s, s == 1 ? "" : "s");
    std::fflush(stdout);
    Trial t = driver.run_trial(s, dir, checkpoint_dir(dir, s));
    report_trial(t, o.target_accuracy, o.quiet);
    if (!t.ok) return 1;
    trials.push_back(std::move(t));
    if (o.anchor) {
      std::printf("\n== %s: PyTorch DDP (gloo), %d rank%s ==\n", cfg.name.c_str(), s, s == 1 ? "" : "s");
      std::fflush(stdout);
      Trial a = driver.run_anchor(s, o.output_dir + "/ddp-slots-" + std::to_string(s));
      report_trial(a, o.target_accuracy, o.quiet);
      if (!a.ok) return 1;
      anchors.push_back(std::move(a));
    }
  }
  trials.insert(trials.end(), std::make_move_iterator(anchors.begin()), std::make_move_iterator(anchors.end()));
  report_comparison(trials, o.output_dir, o.target_accuracy);
  return 0;
}

}  // namespace tandem::trainer
