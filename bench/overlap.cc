// `tandem bench overlap` (see overlap.h). Terms: a *step* is one backward
// pass plus wait(); *compute* is the backward pass's own time, *communication*
// the sum of the bucket all-reduces, *exposed* the time blocked in wait().
// Backward work per layer is a fixed number of arithmetic iterations in
// proportion to the layer's size, calibrated once (rank 0's rate, broadcast),
// so a communication thread that steals the CPU shows up as slower compute.
#include "tandem/bench/overlap.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "tandem/bench/plot.h"
#include "tandem/bench/report.h"
#include "tandem/compression/compression.h"
#include "tandem/tandem.h"

namespace tandem::bench {
namespace {

using fusion::FusionSettings;
using fusion::GradientSync;
using fusion::GradientSyncOptions;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
double ms(int64_t ns) { return double(ns) / 1e6; }

std::vector<GradientSpec> resnet50() {
  std::vector<GradientSpec> g;
  auto conv = [&](const std::string& n, size_t in, size_t out, size_t k) {
    g.push_back({n + ".weight", in * out * k * k});
  };
  auto bn = [&](const std::string& n, size_t c) {
    g.push_back({n + ".weight", c});
    g.push_back({n + ".bias", c});
  };
  conv("conv1", 3, 64, 7);
  bn("bn1", 64);
  size_t in = 64;
  const size_t blocks[] = {3, 4, 6, 3}, widths[] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s) {
    for (size_t b = 0; b < blocks[s]; ++b) {
      const std::string p = "layer" + std::to_string(s + 1) + "." + std::to_string(b);
      const size_t w = widths[s];
      conv(p + ".conv1", in, w, 1);
      bn(p + ".bn1", w);
      conv(p + ".conv2", w, w, 3);
      bn(p + ".bn2", w);
      conv(p + ".conv3", w, 4 * w, 1);
      bn(p + ".bn3", 4 * w);
      if (b == 0) {
        conv(p + ".downsample.0", in, 4 * w, 1);
        bn(p + ".downsample.1", 4 * w);
      }
      in = 4 * w;
    }
  }
  g.push_back({"fc.weight", 2048 * 1000});
  g.push_back({"fc.bias", 1000});
  return g;
}

std::vector<GradientSpec> vgg16() {
  std::vector<GradientSpec> g;
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  size_t in = 3;
  int i = 0;
  for (int c : cfg) {
    if (c == 0) continue;
    const std::string n = "features." + std::to_string(i++);
    g.push_back({n + ".weight", in * size_t(c) * 9});
    g.push_back({n + ".bias", size_t(c)});
    in = size_t(c);
  }
  const size_t fc[][2] = {{25088, 4096}, {4096, 4096}, {4096, 1000}};
  for (int k = 0; k < 3; ++k) {
    g.push_back({"classifier." + std::to_string(k) + ".weight", fc[k][0] * fc[k][1]});
    g.push_back({"classifier." + std::to_string(k) + ".bias", fc[k][1]});
  }
  return g;
}

// uniform:COUNT:MIN:MAX — COUNT gradients with sizes spread log-uniformly between MIN and MAX bytes.
std::vector<GradientSpec> uniform(const std::string& spec) {
  std::stringstream in(spec.substr(8));
  std::string parts[3];
  for (auto& p : parts) std::getline(in, p, ':');
  const auto count = parse_byte_size(parts[0]), lo = parse_byte_size(parts[1]), hi = parse_byte_size(parts[2]);
  if (!count || !lo || !hi || *count == 0 || *lo < 4 || *hi < *lo)
    throw InvalidArgument("--model '" + spec +
                          "': expected uniform:COUNT:MIN:MAX with sizes in bytes (K, M suffixes), "
                          "e.g. uniform:150:4K:400K");
  std::mt19937 rng(150);
  std::uniform_real_distribution<double> u(std::log(double(*lo)), std::log(double(*hi)));
  std::vector<GradientSpec> g;
  for (size_t i = 0; i < *count; ++i) g.push_back({"g" + std::to_string(i), size_t(std::exp(u(rng))) / 4});
  return g;
}

std::vector<GradientSpec> from_file(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw InvalidArgument("--model '" + path +
                          "': not a built-in model (resnet50, vgg16, uniform:COUNT:MIN:MAX) "
                          "and not a readable file");
  std::vector<GradientSpec> g;
  int line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty() || line[0] == '#') continue;
    std::stringstream ls(line);
    std::string a, b;
    ls >> a >> b;
    const std::string count = b.empty() ? a : b;
    char* end = nullptr;
    const unsigned long long n = std::strtoull(count.c_str(), &end, 10);
    if (*end != '\0' || n == 0)
      throw InvalidArgument(path + ":" + std::to_string(line_no) +
                            ": expected 'COUNT' or 'NAME COUNT' (f32 elements), got '" + line + "'");
    g.push_back({b.empty() ? "g" + std::to_string(g.size()) : a, size_t(n)});
  }
  if (g.empty()) throw InvalidArgument(path + ": no gradients in the file");
  return g;
}

float work_kernel(size_t iters) {
  alignas(64) float a[64];
  for (int j = 0; j < 64; ++j) a[j] = float(j);
  for (size_t it = 0; it < iters; ++it)
    for (int j = 0; j < 64; ++j) a[j] = a[j] * 0.99991f + 0.0001f;
  return a[7];
}
volatile float g_sink;

// Kernel iterations per millisecond on this core, alone.
double calibrate() {
  size_t iters = 1000;
  for (;;) {
    const int64_t t0 = now_ns();
    g_sink = work_kernel(iters);
    const double elapsed = ms(now_ns() - t0);
    if (elapsed > 50) return double(iters) / elapsed;
    iters *= 2;
  }
}

struct ModeResult {
  std::string mode;
  double step = 0, compute = 0, communication = 0, exposed = 0, hidden = 0;
  int buckets = 0;
  long wrong = 0;
  FusionSettings settings;
  double saved = 0;  // median estimated ms compression saved per step (StepStats::compression_saved)
  bool compressed = false;
};

struct Run {
  Communicator& comm;
  const OverlapOptions& o;
  std::vector<GradientSpec> grads;
  std::vector<size_t> work;  // kernel iterations per gradient's layer
  std::unique_ptr<compression::CompressedAllreduce> compressor;

  GradientSyncOptions sync_options(const FusionSettings& s) const {
    GradientSyncOptions so;
    so.fusion = s;
    so.compression = compressor.get();
    return so;
  }

  // `steps` steps after `warmup`; per-step medians.
  ModeResult run(const std::string& mode, GradientSyncOptions so, int warmup, int steps) {
    const bool overlap = mode != "none";
    GradientSync sync(comm, so);
    for (const auto& g : grads) sync.register_gradient(g.name, g.count);
    sync.finalize(Clock::now() + std::chrono::minutes(2));
    std::vector<double> step, compute, communication, exposed, hidden, saved;
    long wrong = 0;
    comm.barrier();
    for (int s = 0; s < warmup + steps; ++s) {
      const float mine = float(comm.rank() + 1 + s % 3);
      const int64_t t0 = now_ns();
      for (size_t i = grads.size(); i-- > 0;) {  // backward: last layer first
        g_sink = work_kernel(work[i]);
        std::fill_n(sync.data_as<float>(int(i)), grads[i].count, mine);
        if (overlap) sync.mark_ready(int(i));
      }
      if (!overlap)
        for (size_t i = 0; i < grads.size(); ++i) sync.mark_ready(int(i));
      const int64_t t1 = now_ns();
      sync.wait(Clock::now() + std::chrono::minutes(5));
      const int64_t t2 = now_ns();
      const int n = comm.size();
      const float want = float(n * (n + 1) / 2 + n * (s % 3)) / float(n);
      for (size_t i = 0; i < grads.size(); ++i) wrong += sync.data_as<float>(int(i))[grads[i].count - 1] != want;
      if (s < warmup) continue;
      const auto& st = sync.last_step();
      step.push_back(ms(t2 - t0));
      compute.push_back(ms(t1 - t0));
      communication.push_back(st.communication * 1e3);
      exposed.push_back(st.exposed * 1e3);
      hidden.push_back(st.hidden_fraction);
      saved.push_back(st.compression_saved * 1e3);
    }
    return ModeResult{mode,
                      median(step),
                      median(compute),
                      median(communication),
                      median(exposed),
                      median(hidden),
                      int(sync.buckets().size()),
                      wrong,
                      sync.settings(),
                      median(saved)};
  }
};

// One backward pass's compute alone (no gradient sync), in ms.
double backward_ms(const Run& run) {
  const int64_t t0 = now_ns();
  for (size_t i = run.grads.size(); i-- > 0;) g_sink = work_kernel(run.work[i]);
  return ms(now_ns() - t0);
}

std::string describe(const FusionSettings& s) {
  return human_bytes(s.fusion_threshold_bytes) + "/" + human_bytes(s.first_bucket_bytes) + "/" +
         (s.chunk_bytes ? human_bytes(s.chunk_bytes) : std::string("default"));
}

nlohmann::json to_json(const ModeResult& r, double baseline) {
  return {{"mode", r.mode},
          {"step_ms", r.step},
          {"compute_ms", r.compute},
          {"communication_ms", r.communication},
          {"exposed_ms", r.exposed},
          {"hidden_fraction", r.hidden},
          {"step_over_max", r.step / std::max(r.compute, r.communication)},
          {"speedup_vs_first_mode", baseline > 0 ? baseline / r.step : 0},
          {"buckets", r.buckets},
          {"compression_saved_estimate_ms", r.saved},
          {"wrong", r.wrong},
          {"fusion_threshold_bytes", r.settings.fusion_threshold_bytes},
          {"first_bucket_bytes", r.settings.first_bucket_bytes},
          {"chunk_bytes", r.settings.chunk_bytes}};
}

void print_row(const ModeResult& r, double baseline) {
  char saved[32] = "-";
  if (r.compressed) snprintf(saved, sizeof saved, "%.1f", r.saved);
  printf("%-15s %9.1f %10.1f %9.1f %10.1f %7.0f%% %9.2f %8.2f %7d %7ld %9s  %s\n", r.mode.c_str(), r.step, r.compute,
         r.communication, r.exposed, 100 * r.hidden, r.step / std::max(r.compute, r.communication),
         baseline > 0 ? baseline / r.step : 0.0, r.buckets, r.wrong, saved, describe(r.settings).c_str());
  fflush(stdout);
}

void plot(const OverlapOptions& o, const std::vector<ModeResult>& results, int nranks) {
  const std::string data = o.plot + ".dat";
  {
    std::ofstream f(data);
    for (const auto& r : results) f << r.mode << " " << r.compute << " " << r.exposed << "\n";
  }
  run_gnuplot(
      o.plot, data,
      "set title 'tandem bench overlap: " + o.model + ", " + std::to_string(nranks) +
          " ranks (step = compute + exposed communication)'\nset ylabel 'ms per step'\n"
          "set style data histograms\nset style histogram rowstacked\nset boxwidth 0.6\n"
          "set style fill solid border -1\nset key top left\n"
          "plot DATA_FILE using 2:xtic(1) title 'compute (backward)', '' using 3 title 'exposed communication'\n");
}

std::vector<FusionSettings> coarse_grid() {
  std::vector<FusionSettings> g;
  for (size_t t : {1u << 20, 4u << 20, 16u << 20, 64u << 20})
    for (size_t f : {128u << 10, 1u << 20, 4u << 20})
      for (size_t c : {64u << 10, 256u << 10, 1u << 20, 4u << 20}) g.push_back({t, f, c});
  return g;
}

}  // namespace

std::vector<GradientSpec> model_gradients(const std::string& model, double scale) {
  if (!(scale > 0)) throw InvalidArgument("--scale must be > 0");
  std::vector<GradientSpec> g = model == "resnet50"               ? resnet50()
                                : model == "vgg16"                ? vgg16()
                                : model.rfind("uniform:", 0) == 0 ? uniform(model)
                                                                  : from_file(model);
  for (auto& x : g) x.count = std::max<size_t>(1, size_t(std::llround(double(x.count) * scale)));
  return g;
}

int run_overlap(const OverlapOptions& o) {
  if (o.steps < 1 || o.warmup < 0) throw InvalidArgument("tandem bench overlap: --steps must be >= 1, --warmup >= 0");
  static const char* const kModes[] = {"none", "overlap", "autotune", "per-gradient", "grid"};
  for (const auto& m : o.modes)
    if (std::find(std::begin(kModes), std::end(kModes), m) == std::end(kModes))
      throw InvalidArgument("tandem bench overlap: unknown mode '" + m +
                            "'; valid: none, overlap, autotune, per-gradient, grid");
  auto comm = ring::connect_from_env();
  Run run{*comm, o, model_gradients(o.model, o.scale), {}, nullptr};
  // --compress none,fp16: every mode once per codec, in one run (the first codec sizes the compute).
  std::vector<std::pair<std::string, compression::Codec>> codecs;
  for (std::string rest = o.compress + ","; !rest.empty();) {
    const std::string name = rest.substr(0, rest.find(','));
    rest.erase(0, rest.find(',') + 1);
    const auto codec = compression::parse_codec(name);
    if (!codec)
      throw InvalidArgument("tandem bench overlap: --compress '" + name +
                            "': use none, fp16 or bf16 (a list: none,fp16)");
    codecs.emplace_back(name, *codec);
  }
  auto use_codec = [&](compression::Codec c) {
    run.compressor.reset();
    if (c != compression::Codec::none)
      run.compressor = std::make_unique<compression::CompressedAllreduce>(*comm, compression::CompressionOptions{c});
  };
  use_codec(codecs.front().second);
  const bool printer = comm->rank() == 0;
  size_t elements = 0;
  for (const auto& g : run.grads) elements += g.count;

  // Calibrate (rank 0's rate for everyone), then size the backward pass and
  // check it against a timed backward pass without communication.
  double rate = calibrate();
  comm->broadcast(&rate, 1, DataType::f64, 0);
  double compute_ms = o.compute_ms;
  if (compute_ms < 0) {
    run.work.assign(run.grads.size(), 0);
    const ModeResult probe = run.run("none", run.sync_options(o.fixed), 1, 3);
    compute_ms = probe.communication;
    comm->broadcast(&compute_ms, 1, DataType::f64, 0);
  }
  auto size_work = [&] {
    run.work.clear();
    for (const auto& g : run.grads) run.work.push_back(size_t(rate * compute_ms * double(g.count) / double(elements)));
  };
  size_work();
  if (compute_ms > 0) {
    double took = 0;
    for (int i = 0; i < 3; ++i) took += backward_ms(run) / 3;
    rate *= compute_ms / std::max(took, 1e-3);
    comm->broadcast(&rate, 1, DataType::f64, 0);
    size_work();
  }

  const bool table = o.format != "json";
  if (printer && table) {
    printf("# tandem bench overlap: model %s (%zu gradients, %.1f MiB f32), %d ranks\n", o.model.c_str(),
           run.grads.size(), double(elements) * 4 / (1 << 20), comm->size());
    printf("# transport: %s; gradients on the wire: %s\n", comm->transport_summary().c_str(),
           o.compress == "none" ? "f32" : o.compress.c_str());
    printf("# backward compute %.1f ms per step%s; %d steps after %d warm-up; medians of rank 0\n", compute_ms,
           o.compute_ms < 0 ? " (set to the no-overlap communication time)" : "", o.steps, o.warmup);
    printf("# settings: fusion threshold / first bucket / chunk; speedup: against the first mode (%s)\n",
           o.modes.front().c_str());
    if (o.compress != "none")
      printf("# saved_ms: estimated communication compression saved per step (StepStats::compression_saved)\n");
    printf("%-15s %9s %10s %9s %10s %8s %9s %8s %7s %7s %9s  %s\n", "mode", "step_ms", "compute_ms", "comm_ms",
           "exposed_ms", "hidden", "step/max", "speedup", "buckets", "wrong", "saved_ms", "settings");
  }
  std::vector<ModeResult> results;
  double baseline = 0;
  long wrong = 0;
  auto report = [&](const ModeResult& r) {
    if (results.empty()) baseline = r.step;  // speed-ups are against the first mode run
    wrong += r.wrong;
    results.push_back(r);
    if (!printer) return;
    if (table)
      print_row(r, baseline);
    else
      printf("%s\n", to_json(r, baseline).dump().c_str());
    fflush(stdout);
  };
  for (const auto& [codec_name, codec] : codecs)
    for (const auto& mode_name : o.modes) {
      use_codec(codec);
      const std::string mode = mode_name;
      const std::string label = codecs.size() > 1 && codec != compression::Codec::none ? mode + "+" + codec_name : mode;
      GradientSyncOptions so = run.sync_options(o.fixed);
      if (mode == "per-gradient") so.fusion = {4096, 4096, o.fixed.chunk_bytes};
      if (mode == "overlap" && printer) so.timeline_path = o.timeline;
      if (mode == "grid") {
        ModeResult best;
        for (const auto& s : coarse_grid()) {
          ModeResult r = run.run("grid", run.sync_options(s), 1, o.grid_steps);
          if (printer && !table)
            printf("%s\n", nlohmann::json{{"grid_point", describe(s)}, {"exposed_ms", r.exposed}, {"step_ms", r.step}}
                               .dump()
                               .c_str());
          if (printer && table)
            printf("#   grid %-22s step %8.1f ms, exposed %8.1f ms\n", describe(s).c_str(), r.step, r.exposed);
          if (best.mode.empty() || r.exposed < best.exposed) best = r;
        }
        best.mode = label;
        best.compressed = codec != compression::Codec::none;
        report(best);
        continue;
      }
      int warmup = o.warmup;
      if (mode == "autotune") {
        so.fusion = o.autotune_start;
        so.autotune.enabled = true;
        so.autotune.warmup_steps = o.warmup;
        so.autotune.steps_per_sample = o.steps_per_sample;
        so.autotune.max_samples = o.autotune_samples;
        so.autotune.log_path =
            printer ? (o.autotune_log.empty() ? "/tmp/tandem-autotune-" + std::to_string(getpid()) + ".jsonl"
                                              : o.autotune_log)
                    : "";
        warmup =
            o.warmup + o.steps_per_sample * (o.autotune_samples + 2);  // measure once settled (+2: the confirmations)
      }
      ModeResult r = run.run(mode, so, warmup, o.steps);
      r.mode = label;
      r.compressed = codec != compression::Codec::none;
      report(r);
      if (mode == "autotune" && printer) {
        std::ifstream in(so.autotune.log_path);
        int step = o.warmup;
        for (std::string line; std::getline(in, line);) {
          const auto j = nlohmann::json::parse(line);
          const FusionSettings s{j["fusion_threshold_bytes"], j["first_bucket_bytes"], j["chunk_bytes"]};
          if (j["phase"] != "chosen") step += o.steps_per_sample;
          if (table)
            printf("#   autotune %-8s after step %3d: %-22s exposed %8.2f ms\n", std::string(j["phase"]).c_str(), step,
                   describe(s).c_str(), double(j["exposed_ms"]));
        }
        if (o.autotune_log.empty()) std::remove(so.autotune.log_path.c_str());
      }
    }
  // The stricter ratio: against compute and communication each measured alone (the
  // calibrated backward pass; the `none` mode's all-reduces), so compute slowed by
  // communication competing for the cores counts against the overlap.
  const auto none = std::find_if(results.begin(), results.end(), [](const ModeResult& r) { return r.mode == "none"; });
  if (printer && table && none != results.end()) {
    const double ideal = std::max(compute_ms, none->communication);
    printf("# step / max(compute alone %.1f ms, communication alone %.1f ms):", compute_ms, none->communication);
    for (const auto& r : results) printf(" %s %.2f", r.mode.c_str(), r.step / ideal);
    printf("\n");
  }
  if (printer && table) printf("# wrong values: %ld %s\n", wrong, wrong ? "FAILED" : "OK");
  if (printer && !o.plot.empty()) plot(o, results, comm->size());
  return wrong ? 1 : 0;
}

}  // namespace tandem::bench
