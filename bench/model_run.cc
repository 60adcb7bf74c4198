// `tandem model calibrate | predict | validate`: measure alpha, beta and gamma
// here, predict any topology from them, and compare predictions with sweeps.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <vector>

#include "tandem/bench/model.h"
#include "tandem/bench/plot.h"
#include "tandem/bench/report.h"
#include "tandem/bench/sweep.h"
#include "tandem/bootstrap.h"
#include "tandem/errors.h"
#include "tandem/reduce.h"
#include "tandem/ring/ring.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds per output byte of a one-core f32 sum, the reduction kernels' steady state.
double measure_gamma() {
  const size_t count = 4 << 20;  // 16 MiB per operand: beyond the caches, as large messages are
  std::vector<float> a(count, 1.0f), b(count, 2.0f), dst(count);
  std::vector<double> t;
  for (int i = 0; i < 7; ++i) {
    const auto start = Clock::now();
    reduce(DataType::f32, ReduceOp::sum, dst.data(), a.data(), b.data(), count);
    t.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return median(t) / double(count * sizeof(float));
}

// Seconds per all-reduce of `bytes`, timed as `tandem bench` times it (the
// median of three loops of back-to-back calls after two warm-up calls).
double time_allreduce(Communicator& comm, std::vector<char>& buffer, size_t bytes, int iters) {
  const size_t count = bytes / sizeof(float);
  auto call = [&] { comm.allreduce(buffer.data(), count, DataType::f32, ReduceOp::sum); };
  call(), call();
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) t.push_back(time_per_op_us(comm, call, iters) * 1e-6);
  return median(t);
}

// Seconds per allgather of `bytes` in all (bytes / size from each rank), timed
// as above. In place, a rank's own block is already where it belongs: only
// the transfers count, not a local copy of the block (which a ring step never makes).
double time_allgather(Communicator& comm, std::vector<char>& buffer, size_t bytes, int iters, bool in_place = false) {
  const size_t count = bytes / sizeof(float) / size_t(comm.size());
  std::vector<char> separate(in_place ? 0 : count * sizeof(float));
  const char* input = in_place ? buffer.data() + size_t(comm.rank()) * count * sizeof(float) : separate.data();
  auto call = [&] { comm.allgather(input, buffer.data(), count, DataType::f32); };
  call(), call();
  std::vector<double> t;
  for (int i = 0; i < 3; ++i) t.push_back(time_per_op_us(comm, call, iters) * 1e-6);
  return median(t);
}

// This machine's cores' busy and total time so far (/proc/stat, all cores; zeros if unreadable).
struct CpuTime {
  double busy = 0, total = 0;
};
CpuTime cpu_time() {
  std::ifstream f("/proc/stat");
  std::string cpu;
  double user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  if (!(f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal) || cpu != "cpu") return {};
  const double busy = user + nice + system + irq + softirq;
  return {busy, busy + idle + iowait};
}

// How many of the communicator's ranks run on this machine (same boot id):
// namespaces on one machine share its cores.
int ranks_on_this_machine(Communicator& comm) {
  std::string id;
  std::getline(std::ifstream("/proc/sys/kernel/random/boot_id"), id);
  std::vector<char> mine(64, 0), all(64 * size_t(comm.size()));
  std::copy_n(id.begin(), std::min<size_t>(id.size(), 63), mine.begin());
  comm.allgather(mine.data(), all.data(), mine.size(), DataType::u8);
  int same = 0;
  for (int r = 0; r < comm.size(); ++r) same += std::equal(mine.begin(), mine.end(), all.begin() + 64 * r);
  return std::max(same, 1);
}

// Seconds per synchronisation step: a tiny allgather (4 floats a rank) timed
// as above with many calls, divided by its steps (shared memory: one
// rendezvous of all ranks; the ring over UCX: size - 1 steps of one message
// each way).
double time_step(Communicator& comm, int steps, int iters) {
  std::vector<float> in(4, 1.0f), out(4 * size_t(comm.size()));
  auto call = [&] { comm.allgather(in.data(), out.data(), in.size(), DataType::f32); };
  for (int i = 0; i < 10; ++i) call();
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) t.push_back(time_per_op_us(comm, call, iters) * 1e-6);
  return median(t) / steps;
}

// `value` joins what earlier launches measured for the same figure (`where`:
// shared_memory or the link; rho: ranks per core) in this calibration file;
// returns their median. One launch can settle into a faster or slower schedule
// than the next, so the script calibrates in several.
double sampled(Calibration& c, const std::string& where, double rho, const std::string& what, double value) {
  std::ostringstream key;
  key << where << ' ' << rho << ' ' << what;
  auto& values = c.samples[key.str()];
  values.push_back(value);
  return median(values);
}

// A calibrated link by name, else GBPS:ALPHA_US.
Link resolve_link(const Calibration& c, const std::string& name) {
  if (!c.links.count(name) && name.find(':') != std::string::npos) return parse_hypothetical_link(name);
  return link_named(c, name);  // throws, naming the known links
}

}  // namespace

int run_calibrate(const CalibrateOptions& o) {
  CommOptions options = comm_options_from_env();
  ring::RingOptions ring_options = ring::ring_options_from_env();
  // Pin the algorithm being measured: the one-host path, or the ring over UCX.
  ring_options.allreduce = o.link.empty() ? ring::AllreduceAlgorithm::shared_memory : ring::AllreduceAlgorithm::ring;
  auto comm = ring::connect(options, ring_options);
  const int cores = int(std::thread::hardware_concurrency());
  // Ranks per core: every rank of a calibration runs on this machine (namespaces share its cores).
  const double rho = double(comm->size()) / std::max(cores, 1);
  if (o.step_only) {
    if (comm->size() < 2) throw InvalidArgument("tandem model calibrate --step-only: run it with 2 or more ranks");
    const bool shm = o.link.empty();
    const double step = time_step(*comm, shm ? 1 : comm->size() - 1, 200);
    // Shared memory: an all-reduce that moves bytes through the caches. A
    // cpu-bound link: an allgather of large messages, each of its size - 1 steps
    // moving kLinkCopyBytes / size from every rank.
    const double copy_bytes = shm ? kCopyBytes : o.cpu_bound ? kLinkCopyBytes : 0;
    std::vector<char> buffer(size_t(copy_bytes) + 64);
    const double copy = shm              ? time_allreduce(*comm, buffer, size_t(copy_bytes), 50)
                        : copy_bytes > 0 ? time_allgather(*comm, buffer, size_t(copy_bytes), 5, /*in_place=*/true)
                                         : 0;
    if (comm->rank() != 0) return 0;
    Calibration c = load_calibration(o.output);
    if (!shm) link_named(c, o.link);  // throws unless its 2-rank calibration is there
    const std::string where = shm ? "shared_memory" : o.link;
    if (shm) {
      c.shm.step[rho] = sampled(c, where, rho, "step", step);
      c.shm.copy[rho] = sampled(c, where, rho, "copy", copy);
    } else {
      Link& link = c.links[o.link];
      link.step[rho] = sampled(c, where, rho, "step", step);
      if (copy > 0) {
        const double message = copy_bytes / comm->size();
        const double per_byte = std::max(copy / (comm->size() - 1) - step, 0.0) / message;
        if (link.beta_at(message) > 0)
          link.stretch[rho] = sampled(c, where, rho, "stretch", per_byte / link.beta_at(message));
      }
    }
    save_calibration(c, o.output);
    printf("tandem model calibrate: %d ranks on %d cores (%.2f per core): %.1f us per step; wrote %s\n  %s\n",
           comm->size(), cores, rho, step * 1e6, o.output.c_str(), c.describe().c_str());
    return 0;
  }
  if (comm->size() != 2) {
    throw InvalidArgument(
        "tandem model calibrate: run it with exactly 2 ranks (got " + std::to_string(comm->size()) +
        "), e.g. `tandem launch -n 2 -- tandem model calibrate` on one host; --step-only takes any number");
  }
  // A link by factors of 2: its beta can jump between neighbouring sizes (TCP
  // and UCX change protocol with the message size), too much to interpolate over 4x.
  std::vector<double> sizes = o.sizes;
  if (sizes.empty()) {
    for (double bytes = 4096; bytes <= (64 << 20); bytes *= o.link.empty() ? 4 : 2) sizes.push_back(bytes);
  }
  std::vector<char> buffer(size_t(std::max(*std::max_element(sizes.begin(), sizes.end()), kCopyBytes)) + 64);
  // Added to what is there (links are calibrated one at a time); a file that
  // exists but cannot be read stops every rank now, before it is overwritten.
  Calibration c;
  if (std::ifstream(o.output)) c = load_calibration(o.output);
  const double gamma = measure_gamma();
  double step = time_step(*comm, 1, 200);  // 2 ranks: one step either way
  const int here = ranks_on_this_machine(*comm);
  double copy = o.link.empty() ? time_allreduce(*comm, buffer, size_t(kCopyBytes), 50) : 0;

  std::vector<double> x, seconds;
  std::map<double, double> traffic;
  CpuTime large_cpu;  // the cores' time while the link moved the large sizes
  for (double bytes : sizes) {
    const uint64_t before = comm->shared_memory_traffic();
    const CpuTime cpu_before = cpu_time();
    double s;
    if (o.link.empty()) {
      // One host: the shared-memory all-reduce itself, per byte of the memory traffic it counts.
      s = time_allreduce(*comm, buffer, size_t(bytes), o.iters);
      const double moved = double(comm->shared_memory_traffic() - before) / (3 * o.iters + 2) / bytes;
      traffic[bytes] = moved;
      x.push_back(moved * bytes);
    } else {
      // A link: a 2-rank allgather, each rank sending bytes / 2 while it receives as much.
      s = time_allgather(*comm, buffer, size_t(bytes), o.iters, /*in_place=*/true);
      x.push_back(bytes / 2);
      if (bytes >= (1 << 20)) {
        const CpuTime cpu_after = cpu_time();
        large_cpu.busy += cpu_after.busy - cpu_before.busy, large_cpu.total += cpu_after.total - cpu_before.total;
      }
    }
    seconds.push_back(s);
    if (comm->rank() == 0)
      fprintf(stderr, "tandem model calibrate: %8s  %10.1f us\n", human_bytes(bytes).c_str(), s * 1e6);
  }
  if (comm->rank() != 0) return 0;

  // Each figure: the median of this and earlier launches' (the script repeats the calibration).
  const std::string where = o.link.empty() ? "shared_memory" : o.link;
  for (size_t i = 0; i < sizes.size(); ++i) {
    seconds[i] = sampled(c, where, rho, "seconds " + std::to_string(uint64_t(sizes[i])), seconds[i]);
  }
  step = sampled(c, where, rho, "step", step);
  if (o.link.empty()) copy = sampled(c, where, rho, "copy", copy);
  c.cores = cores;
  c.gamma = sampled(c, "gamma", 1, "seconds per byte", gamma);
  // One host: alpha from the small sizes alone (beyond them beta changes with
  // the caches). A link: beta from the large sizes (a rate limiter's burst
  // makes small ones look fast), alpha the step.
  if (o.link.empty()) {
    const size_t fitted = std::min<size_t>(3, x.size());
    const LineFit fit = fit_line({x.begin(), x.begin() + fitted}, {seconds.begin(), seconds.begin() + fitted});
    // beta per size from what alpha leaves of each time.
    // Oversubscribed entries measured earlier (--step-only) stay.
    c.shm = SharedMemoryCost{fit.a, {}, traffic, c.shm.step, c.shm.copy};
    for (size_t i = 0; i < sizes.size(); ++i) {
      c.shm.beta[sizes[i]] = std::max(seconds[i] - fit.a, 0.0) / x[i];
    }
    c.shm.step[rho] = step;
    c.shm.copy[rho] = copy;
  } else {
    // beta: the allgather's seconds per byte a rank sends (while it receives
    // as much), without arithmetic; alpha: the step, one small message each
    // way, what a recursive-doubling round or a ring step waits for.
    const LineFit fit = fit_bandwidth(x, seconds, 512 << 10);
    StepTable steps = c.links.count(o.link) ? c.links[o.link].step : StepTable{};
    steps[rho] = step;
    // The cores the two ranks kept busy (this machine's share of them, when
    // both ran here) per rank; the whole machine's time counts, the kernel's too.
    const double busy = sampled(c, where, rho, "busy", large_cpu.total > 0 ? large_cpu.busy / large_cpu.total : 1.0);
    Link& link = c.links[o.link];
    link = Link{step, fit.b, o.cpu_bound, steps, busy * cores / here, {}, {}};
    // beta per size: what alpha leaves of each time, per byte a rank sent.
    for (size_t i = 0; i < sizes.size(); ++i) link.beta_by_size[x[i]] = std::max(seconds[i] - step, 0.0) / x[i];
  }
  save_calibration(c, o.output);
  printf("tandem model calibrate: wrote %s\n  %s\n", o.output.c_str(), c.describe().c_str());
  return 0;
}

int run_predict(const PredictOptions& o) {
  Calibration c = load_calibration(o.calibration);
  if (o.cores > 0) c.cores = o.cores;
  const Link inter = o.link.empty() ? Link{} : resolve_link(c, o.link);
  const std::vector<Algorithm> all = {Algorithm::shared_memory, Algorithm::recursive_doubling, Algorithm::ring,
                                      Algorithm::hierarchical, Algorithm::parameter_server};
  std::ostringstream plot_data;
  std::vector<std::string> plot_titles;
  for (const Topology& t : o.topologies) {
    if (t.hosts > 1 && o.link.empty()) throw InvalidArgument("tandem model predict: more than one host needs --link");
    if (o.format == "table") {
      printf("# %d host(s) x %d rank(s), link %s\n#  %10s", t.hosts, t.ranks_per_host,
             t.hosts > 1 ? o.link.c_str() : "shared memory", "size");
      for (Algorithm a : all) {
        if (applies(a, t)) printf(" %18s", (std::string(to_string(a)) + " us").c_str());
      }
      printf(" %14s %s\n", "best busbw GB/s", "best");
    }
    std::map<Algorithm, std::vector<std::pair<double, double>>> curves;
    Algorithm previous{};
    bool first = true;
    double ring_from = 0;  // the smallest size where the ring beats recursive doubling
    for (double bytes : o.sizes) {
      const Algorithm best = fastest(c, inter, t, bytes);
      const double best_time = predict(c, inter, t, best, bytes);
      nlohmann::json row = {{"hosts", t.hosts},
                            {"ranks_per_host", t.ranks_per_host},
                            {"bytes", bytes},
                            {"best", to_string(best)},
                            {"best_busbw_gbps", busbw_gbps(t, bytes, best_time)}};
      if (o.format == "table") printf("   %10s", human_bytes(bytes).c_str());
      for (Algorithm a : all) {
        if (!applies(a, t)) continue;
        const double s = predict(c, inter, t, a, bytes);
        row[std::string(to_string(a)) + "_us"] = s * 1e6;
        curves[a].push_back({bytes, busbw_gbps(t, bytes, s)});
        if (o.format == "table") printf(" %18.1f", s * 1e6);
      }
      if (o.format == "table") {
        printf(" %14.2f %s\n", busbw_gbps(t, bytes, best_time), to_string(best));
      } else {
        printf("%s\n", row.dump().c_str());
      }
      if (!first && best != previous && o.format == "table") {
        printf("#  crossover: %s wins from %s\n", to_string(best), human_bytes(bytes).c_str());
      }
      if (t.hosts > 1 && ring_from == 0 &&
          predict(c, inter, t, Algorithm::ring, bytes) < predict(c, inter, t, Algorithm::recursive_doubling, bytes)) {
        ring_from = bytes;
      }
      previous = best, first = false;
    }
    if (t.hosts > 1 && ring_from > 0 && o.format == "table") {
      // What the automatic choice between the two takes as its threshold.
      printf("#  recursive doubling below %s: TANDEM_SMALL_MESSAGE_BYTES=%.0f for this topology\n",
             human_bytes(ring_from).c_str(), ring_from / 2);
    }
    for (const auto& [a, points] : curves) {
      for (const auto& [bytes, busbw] : points) plot_data << bytes << ' ' << busbw << '\n';
      plot_data << "\n\n";
      plot_titles.push_back(std::to_string(t.hosts) + "x" + std::to_string(t.ranks_per_host) + " " + to_string(a));
    }
  }
  if (!o.plot.empty()) {
    const std::string data = o.plot + ".dat";
    std::ofstream(data) << plot_data.str();
    std::ostringstream body;
    body << "set logscale x 2\nset format x '%.0b %BB'\nset xlabel 'message size'\nset ylabel 'predicted bus "
            "bandwidth (GB/s)'\nset key left top\nset title 'tandem model: all-reduce, link "
         << (o.link.empty() ? "shared memory" : o.link) << "'\nplot ";
    for (size_t i = 0; i < plot_titles.size(); ++i) {
      body << (i ? ", \\\n     " : "") << "DATA_FILE index " << i << " using 1:2 with linespoints title '"
           << plot_titles[i] << "'";
    }
    body << "\n";
    if (!run_gnuplot(o.plot, data, body.str())) return 1;
  }
  return 0;
}

int run_validate(const ValidateOptions& o) {
  const Calibration c = load_calibration(o.calibration);
  int within = 0, total = 0;
  std::vector<double> errors;
  if (o.format == "table") {
    printf("# %-18s %10s %12s %12s %8s %s\n", "case", "size", "measured us", "predicted us", "error", "algorithm");
  }
  for (ValidateCase v : o.cases) {
    if (o.one_machine) v.topology.ranks_on_cores = v.topology.ranks();
    const Link inter = v.link.empty() ? Link{} : resolve_link(c, v.link);
    std::ifstream f(v.file);
    if (!f) throw InvalidArgument("tandem model validate: cannot read '" + v.file + "'");
    // bytes -> the slowest rank's time of every in-place row, as the calibration times
    // (time_us before rows carried time_slowest_us; out-of-place rows are used only
    // when a sweep has no in-place ones)
    std::map<double, std::vector<double>> measured, out_of_place;
    std::string forced;  // the algorithm the sweep forced, if any
    std::string line;
    while (std::getline(f, line)) {
      // Rows as printed, or with the launchers' "[rank] " prefix.
      if (!line.empty() && line[0] == '[' && line.find("] {") != std::string::npos)
        line = line.substr(line.find("] {") + 2);
      if (line.empty() || line[0] != '{') continue;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || j.value("collective", "") != "allreduce") continue;
      if (j.value("nranks", 0) != v.topology.ranks()) {
        throw InvalidArgument("tandem model validate: '" + v.file + "' has " + std::to_string(j.value("nranks", 0)) +
                              " ranks but its case says " + std::to_string(v.topology.ranks()));
      }
      (j.value("inplace", true) ? measured : out_of_place)[j.value("bytes", 0.0)].push_back(
          j.value("time_slowest_us", j.value("time_us", 0.0)));
      forced = j.value("algorithm", "");
    }
    if (measured.empty()) measured = out_of_place;
    if (measured.empty()) throw InvalidArgument("tandem model validate: no all-reduce rows in '" + v.file + "'");
    const std::string label = std::to_string(v.topology.hosts) + "x" + std::to_string(v.topology.ranks_per_host) +
                              (v.link.empty() ? " shm" : " " + v.link) + (forced.empty() ? "" : " " + forced);
    for (const auto& [bytes, times] : measured) {
      const Algorithm a = forced.empty() || forced == "auto" ? tandem_choice(v.topology, bytes, o.small_message_bytes)
                                                             : parse_algorithm(forced);
      const double predicted = predict(c, inter, v.topology, a, bytes) * 1e6;
      const double m = median(times);
      const double error = (predicted - m) / m;
      const bool ok = std::abs(error) <= o.tolerance;
      within += ok, ++total;
      errors.push_back(std::abs(error));
      if (o.format == "table") {
        printf("  %-18s %10s %12.1f %12.1f %+7.0f%% %s%s\n", label.c_str(), human_bytes(bytes).c_str(), m, predicted,
               error * 100, to_string(a), ok ? "" : "  (outside)");
      } else {
        printf("%s\n", nlohmann::json{{"case", label},
                                      {"bytes", bytes},
                                      {"measured_us", m},
                                      {"predicted_us", predicted},
                                      {"error", error},
                                      {"algorithm", to_string(a)},
                                      {"within", ok}}
                           .dump()
                           .c_str());
      }
    }
  }
  printf("# within %.0f%%: %d of %d configurations (%.0f%%), median |error| %.0f%%\n", o.tolerance * 100, within, total,
         total ? 100.0 * within / total : 0.0, median(errors) * 100);
  return 0;
}

}  // namespace tandem::bench
