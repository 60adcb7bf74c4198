#include "model.h"

#include <sstream>

#include "flags.h"
#include "tandem/bench/model.h"

namespace tandem::cli {

namespace {

// "4K:1G" (every factor of 4 from 4K) or a list "4K,1M,64M".
std::vector<double> size_list(const std::string& flag, const std::string& text) {
  std::vector<double> out;
  if (text.empty()) return out;
  if (auto colon = text.find(':'); colon != std::string::npos) {
    const double lo = double(size_flag(flag, text.substr(0, colon))),
                 hi = double(size_flag(flag, text.substr(colon + 1)));
    if (lo < 1 || hi < lo) throw UsageError(flag + ": '" + text + "' must be LOW:HIGH with 1 <= LOW <= HIGH");
    for (double b = lo; b <= hi; b *= 4) out.push_back(b);
    return out;
  }
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) out.push_back(double(size_flag(flag, item)));
  return out;
}

tandem::bench::Topology topology_flag(const std::string& text) {
  const auto x = text.find('x');
  try {
    tandem::bench::Topology t{std::stoi(text.substr(0, x)), std::stoi(text.substr(x + 1))};
    if (x != std::string::npos && t.hosts >= 1 && t.ranks_per_host >= 1) return t;
  } catch (const std::exception&) {
  }
  throw UsageError("--topology: '" + text + "' must be HOSTSxRANKS_PER_HOST, e.g. 8x8");
}

}  // namespace

void add_model(CLI::App& app, ModelFlags& f) {
  auto* m = app.add_subcommand("model", "The alpha-beta-gamma scale model of all-reduce: calibrate, predict, validate");
  m->require_subcommand(1);
  f.calibrate = m->add_subcommand("calibrate", "Measure alpha, beta (and gamma) between 2 ranks; add them to the file");
  f.calibrate->add_option("-o,--output", f.calibration, "Calibration file (read, updated, written)")
      ->capture_default_str();
  f.calibrate->add_option("--link", f.link, "Name of the inter-host link measured (empty: shared memory on one host)");
  f.calibrate->add_flag("--cpu-bound", f.cpu_bound, "The link's cost is the cores' (e.g. veth without a rate limit)");
  f.calibrate->add_option(
      "--sizes", f.sizes,
      "Sizes, LOW:HIGH (factor 4) or a list (default 4K:64M, by factors of 4 on one host, 2 for a link)");
  f.calibrate->add_option("-n,--iters", f.iters, "Timed iterations per size")->capture_default_str();
  f.calibrate->add_flag("--step-only", f.step_only,
                        "Only time the synchronisation step (a tiny allgather) and how bytes slow down (one host: a "
                        "1 MiB all-reduce; with --cpu-bound: a 16 MiB allgather), at any rank count: run it with more "
                        "ranks than cores to calibrate oversubscription; repeated launches keep the median");
  f.calibrate->footer(
      "Examples: tandem launch -n 2 -- tandem model calibrate\n"
      "          tandem launch -n 4 -- tandem model calibrate --step-only\n"
      "          bench/netns_run.sh -n 2 --rate 1gbit -- tandem model calibrate --link 1gbit");
  f.predict = m->add_subcommand("predict", "Predict all-reduce time and busbw per algorithm for any topology");
  f.predict->add_option("-c,--calibration", f.calibration, "Calibration file")->capture_default_str();
  f.predict->add_option("--link", f.link, "Inter-host link: a calibrated name or GBPS:ALPHA_US (e.g. 100:5)");
  f.predict->add_option("-t,--topology", f.topologies, "HOSTSxRANKS_PER_HOST, repeatable (e.g. -t 8x8 -t 64x8)")
      ->required();
  f.predict->add_option("--sizes", f.sizes, "Sizes, LOW:HIGH (factor 4) or a list (default 4K:1G)");
  f.predict->add_option("--format", f.format, "table or json")->capture_default_str();
  f.predict->add_option("--plot", f.plot, "Write predicted busbw vs size to this PNG");
  f.predict->add_option("--cores", f.cores, "Cores per host assumed (default: the calibrated machine's)");
  f.validate = m->add_subcommand("validate", "Compare predictions with `tandem bench allreduce --format json` sweeps");
  f.validate->add_option("-c,--calibration", f.calibration, "Calibration file")->capture_default_str();
  f.validate->add_option("--case", f.cases, "HOSTSxRANKS[:LINK]=FILE, repeatable")->required();
  f.validate->add_option("--tolerance", f.tolerance, "Relative error counted as a hit")->capture_default_str();
  f.validate->add_option("--small-message", f.small, "The communicators' small_message_bytes")->capture_default_str();
  f.validate->add_flag("--separate-hosts", f.separate_hosts,
                       "Cases ran on separate machines (default: all on this one)");
  f.validate->add_option("--format", f.format, "table or json")->capture_default_str();
}

int run_model(const ModelFlags& f) {
  namespace b = tandem::bench;
  if (f.format != "table" && f.format != "json")
    throw UsageError("--format: unknown '" + f.format + "'; valid: table, json");
  if (f.calibrate->parsed()) {
    b::CalibrateOptions o{f.calibration, f.link, f.cpu_bound, size_list("--sizes", f.sizes), f.iters, f.step_only};
    if (o.iters < 1) throw UsageError("--iters must be >= 1");
    return b::run_calibrate(o);
  }
  if (f.predict->parsed()) {
    b::PredictOptions o{f.calibration, f.link, {},     size_list("--sizes", f.sizes.empty() ? "4K:1G" : f.sizes),
                        f.format,      f.plot, f.cores};
    for (const auto& t : f.topologies) o.topologies.push_back(topology_flag(t));
    return b::run_predict(o);
  }
  b::ValidateOptions o;
  o.calibration = f.calibration;
  for (const auto& c : f.cases) o.cases.push_back(b::parse_case(c));
  o.tolerance = f.tolerance;
  o.small_message_bytes = double(size_flag("--small-message", f.small));
  o.one_machine = !f.separate_hosts;
  o.format = f.format;
  return b::run_validate(o);
}

}  // namespace tandem::cli
