#include "metrics.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tandem/bench/plot.h"

namespace tandem::trainer {

using nlohmann::json;

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_upto_batch) {
  std::vector<std::string> kept;
  if (keep_upto_batch >= 0) {
    std::ifstream in(path);
    for (std::string l; std::getline(in, l);) {
      auto j = json::parse(l, nullptr, false);
      if (j.is_discarded() || !j.is_object()) continue;  // a line cut by the crash
      // Every attempt's start line stays: the summary counts restarts and the time they lost.
      const std::string kind = j.value("kind", "");
      if (j.value("batch", int64_t{0}) <= keep_upto_batch || kind == "start") {
        kept.push_back(l);
        last_kept_[kind] = l;
      }
    }
  }
  // The kept lines go to a new file renamed over the old one: a writer that
  // still holds the old file (a chief left out while alive) writes past it.
  const std::string fresh = keep_upto_batch >= 0 ? path + ".tmp" : path;
  f_ = std::fopen(fresh.c_str(), "w");
  if (!f_) throw std::runtime_error("cannot write metrics file '" + fresh + "'");
  for (const auto& l : kept) std::fprintf(f_, "%s\n", l.c_str());
  std::fflush(f_);
  if (fresh != path && std::rename(fresh.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot rename metrics file '" + fresh + "' to '" + path + "'");
}

std::optional<std::chrono::system_clock::time_point> clock_origin(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  std::string first;
  if (!std::getline(in, first)) return std::nullopt;
  const auto j = json::parse(first, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("kind", "") != "start" || !j.contains("origin"))
    return std::nullopt;
  const auto since_epoch = std::chrono::duration<double>(j.at("origin").get<double>());
  return std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(since_epoch));
}

std::optional<int64_t> MetricsWriter::last_kept(const std::string& kind, const std::string& field) const {
  const auto it = last_kept_.find(kind);
  if (it == last_kept_.end()) return std::nullopt;
  const auto j = json::parse(it->second, nullptr, false);
  if (j.is_discarded() || !j.contains(field) || !j.at(field).is_number_integer()) return std::nullopt;
  return j.at(field).get<int64_t>();
}

MetricsWriter::~MetricsWriter() {
  if (f_) std::fclose(f_);
}

void MetricsWriter::line(const std::string& s) {
  if (!f_) return;
  std::fprintf(f_, "%s\n", s.c_str());
  std::fflush(f_);
}

namespace {
json to_json(const TrainRecord& r) {
  return json{{"kind", "train"},
              {"batch", r.batch},
              {"epoch", r.epoch},
              {"time", r.time},
              {"loss", r.loss},
              {"accuracy", r.accuracy},
              {"samples_per_s", r.samples_per_s},
              {"step", r.step},
              {"data", r.data},
              {"compute", r.compute},
              {"exposed", r.exposed},
              {"communication", r.communication},
              {"communicated", r.communicated}};
}
}  // namespace

void MetricsWriter::train(const TrainRecord& r) { line(to_json(r).dump()); }

void MetricsWriter::validation(const ValidationRecord& r) {
  line(json{{"kind", "validation"},
            {"batch", r.batch},
            {"time", r.time},
            {"loss", r.loss},
            {"accuracy", r.accuracy},
            {"records", r.records},
            {"seconds", r.seconds},
            {"forward_seconds", r.forward_seconds},
            {"images_per_s", r.seconds > 0 ? static_cast<double>(r.records) / r.seconds : 0.0}}
           .dump());
}

void MetricsWriter::stall(const TrainRecord& r, double median, int last_rank, double last_rank_compute) {
  json j = to_json(r);
  j["kind"] = "stall";
  j["median_step"] = median;
  j["last_rank"] = last_rank;
  j["last_rank_compute"] = last_rank_compute;
  line(j.dump());
}

bool StallDetector::add(double seconds) {
  bool stalled = recent_.size() >= 10 && seconds > factor_ * median_;
  recent_.push_back(seconds);
  if (recent_.size() > window_) recent_.pop_front();
  std::vector<double> v(recent_.begin(), recent_.end());
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  median_ = v[v.size() / 2];
  return stalled;
}

double TrialSummary::samples_per_s() const {
  if (train.empty()) return 0;
  std::vector<double> v;
  for (size_t i = train.size() / 10; i < train.size(); ++i) v.push_back(train[i].samples_per_s);
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

double TrialSummary::mean(double TrainRecord::*field) const {
  if (train.empty()) return 0;
  double s = 0;
  for (const auto& r : train) s += r.*field;
  return s / static_cast<double>(train.size());
}

double TrialSummary::hidden_fraction() const {
  double comm = 0, exposed = 0;
  for (const auto& r : train)
    if (r.communicated) comm += r.communication, exposed += r.exposed;
  return comm > 0 ? std::clamp(1 - exposed / comm, 0.0, 1.0) : 0;
}

double TrialSummary::time_to_accuracy(double target) const {
  for (const auto& v : validation)
    if (v.accuracy >= target) return v.time;
  return -1;
}

double TrialSummary::final_accuracy() const { return validation.empty() ? 0 : validation.back().accuracy; }

TrialSummary read_metrics(const std::string& path) {
  TrialSummary s;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) {
    auto j = json::parse(l, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    const std::string kind = j.value("kind", "");
    if (kind == "train") {
      TrainRecord r;
      r.batch = j.value("batch", int64_t{0});
      r.epoch = j.value("epoch", int64_t{0});
      r.time = j.value("time", 0.0);
      r.loss = j.value("loss", 0.0);
      r.accuracy = j.value("accuracy", 0.0);
      r.samples_per_s = j.value("samples_per_s", 0.0);
      r.step = j.value("step", 0.0);
      r.data = j.value("data", 0.0);
      r.compute = j.value("compute", 0.0);
      r.exposed = j.value("exposed", 0.0);
      r.communication = j.value("communication", 0.0);
      r.communicated = j.value("communicated", true);
      s.train.push_back(r);
    } else if (kind == "validation") {
      s.validation.push_back({j.value("batch", int64_t{0}), j.value("time", 0.0), j.value("loss", 0.0),
                              j.value("accuracy", 0.0), j.value("records", int64_t{0}), j.value("seconds", 0.0),
                              j.value("forward_seconds", 0.0)});
    } else if (kind == "stall") {
      ++s.stalls;
    } else if (kind == "membership") {
      s.membership.push_back({j.value("batch", int64_t{0}), j.value("time", 0.0), j.value("lost", std::vector<int>{}),
                              j.value("reason", std::string()), j.value("recovery_seconds", 0.0),
                              j.value("batches_redone", int64_t{0}), j.value("slots", 0),
                              j.value("joined", std::vector<int>{}), j.value("state_bytes", int64_t{0}),
                              j.value("state_seconds", 0.0)});
    } else if (kind == "epoch") {
      const EpochRecords e{j.value("epoch", int64_t{0}), j.value("records", int64_t{0}),
                           j.value("expected", int64_t{0})};
      if (!s.epochs.empty() && s.epochs.back().epoch >= e.epoch)
        s.epochs.erase(std::find_if(s.epochs.begin(), s.epochs.end(), [&](auto& o) { return o.epoch >= e.epoch; }),
                       s.epochs.end());
      s.epochs.push_back(e);
    } else if (kind == "start") {
      s.slots = j.value("slots", 0);
      s.global_batch = j.value("global_batch", int64_t{0});
      if (j.value("attempt", 0) > 0) {
        ++s.restarts;
        s.lost_time += std::max(0.0, j.value("time", 0.0) - j.value("resumed_time", 0.0));
      }
      s.compression = j.value("gradient_compression", std::string("none"));
    } else if (kind == "end") {
      s.wall_time = j.value("time", 0.0);
      s.gradient_bytes = j.value("gradient_bytes", uint64_t{0});
      s.wire_bytes = j.value("wire_bytes", uint64_t{0});
      s.compression_fallbacks = j.value("compression_fallbacks", uint64_t{0});
      s.checkpoint_wait = j.value("checkpoint_seconds", 0.0);
    }
  }
  return s;
}

double TrialSummary::validation_total_seconds() const {
  double sum = 0;
  for (const auto& v : validation) sum += v.seconds;
  return sum;
}

double TrialSummary::validation_seconds() const {
  return validation.empty() ? 0 : validation_total_seconds() / double(validation.size());
}

std::string progress_line(const TrialSummary& s, int64_t total) {
  if (s.train.empty()) return "starting...";
  const auto& r = s.train.back();
  char buf[256];
  int n = std::snprintf(buf, sizeof buf, "batch %lld/%lld  epoch %lld  loss %.4f  acc %.3f  %.0f samples/s  %.1fs",
                        static_cast<long long>(r.batch), static_cast<long long>(total), static_cast<long long>(r.epoch),
                        r.loss, r.accuracy, r.samples_per_s, r.time);
  std::string out(buf, static_cast<size_t>(n));
  if (!s.validation.empty()) {
    std::snprintf(buf, sizeof buf, "  val acc %.4f", s.validation.back().accuracy);
    out += buf;
  }
  return out;
}

namespace {

// An elastic trial's rows: records trained once per epoch, then each membership change.
void elastic_rows(const TrialSummary& s, const std::function<void(const char*, const std::string&)>& row) {
  auto num = [](const char* fmt, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  if (!s.epochs.empty()) {
    const auto short_of =
        std::find_if(s.epochs.begin(), s.epochs.end(), [](auto& e) { return e.records != e.expected; });
    row("records trained once",
        short_of == s.epochs.end()
            ? "every record of " + std::to_string(s.epochs.size()) + " epoch" + (s.epochs.size() == 1 ? "" : "s") +
                  " (" + std::to_string(s.epochs.front().expected) + " each)"
            : "NO: epoch " + std::to_string(short_of->epoch) + " trained " + std::to_string(short_of->records) +
                  " of " + std::to_string(short_of->expected));
  }
  auto listed = [](const std::vector<int>& numbers) {
    std::string out;
    for (int n : numbers) out += (out.empty() ? "" : ",") + std::to_string(n);
    return out;
  };
  for (const auto& m : s.membership) {
    if (m.is_join()) {
      row("membership change", "slot " + listed(m.joined) + " joined at batch " + std::to_string(m.batch) + " (" +
                                   num("%.1f s", m.time) + "), " + std::to_string(m.slots) +
                                   " slots on, contributing " + num("%.2f s", m.recovery_seconds) +
                                   " after it started (state " + num("%.0f KiB", double(m.state_bytes) / 1024) + ")");
      continue;
    }
    row("membership change",
        "slot " + listed(m.lost) + " lost at batch " + std::to_string(m.batch) + " (" + num("%.1f s", m.time) + "), " +
            std::to_string(m.slots) + " slots on, " + num("%.2f s", m.recovery_seconds) + " to the next step, " +
            std::to_string(m.batches_redone) + " batch" + (m.batches_redone == 1 ? "" : "es") + " redone");
  }
}

}  // namespace

std::string summary_table(const TrialSummary& s, double target) {
  std::ostringstream o;
  char buf[256];
  auto row = [&](const char* name, const std::string& value) {
    std::snprintf(buf, sizeof buf, "  %-34s %s\n", name, value.c_str());
    o << buf;
  };
  auto num = [&](const char* fmt, double v) {
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  const double step = s.mean(&TrainRecord::step);
  auto share = [&](double v) { return step > 0 ? num("%.1f%%", 100 * v / step) : std::string("-"); };
  o << "summary\n";
  auto restarts = [&] {
    row("restarts",
        std::to_string(s.restarts) + (s.restarts ? ", " + num("%.1f s", s.lost_time) + " lost to failures" : ""));
  };
  if (s.train.empty()) {  // stopped before its first step: no figures to show
    row("batches trained", "0 (the trial stopped before its first step)");
    if (s.wall_time > 0) row("wall time", num("%.1f s", s.wall_time));
    restarts();
    return o.str();
  }
  std::string slots = std::to_string(s.slots);
  if (!s.membership.empty()) {
    const int fewest = std::min_element(s.membership.begin(), s.membership.end(), [](auto& a, auto& b) {
                         return a.slots < b.slots;
                       })->slots;
    slots += ", " + std::to_string(s.membership.back().slots) + " at the end";
    if (fewest < s.membership.back().slots) slots += " (" + std::to_string(fewest) + " at the fewest)";
  }
  row("slots", slots);
  row("global batch", std::to_string(s.global_batch));
  row("batches trained", std::to_string(s.train.back().batch));
  const double wall = s.wall_time > 0 ? s.wall_time : s.train.back().time;
  row("wall time", num("%.1f s", wall));
  row("throughput (median)", num("%.1f samples/s", s.samples_per_s()));
  row("step time (mean)", num("%.1f ms", 1e3 * step));
  const double data = s.mean(&TrainRecord::data), compute = s.mean(&TrainRecord::compute),
               exposed = s.mean(&TrainRecord::exposed);
  row("  data loading", num("%.1f ms", 1e3 * data) + " (" + share(data) + ")");
  row("  compute", num("%.1f ms", 1e3 * compute) + " (" + share(compute) + ")");
  row("  exposed communication", num("%.1f ms", 1e3 * exposed) + " (" + share(exposed) + ")");
  row("communication hidden", num("%.1f%%", 100 * s.hidden_fraction()));
  if (s.gradient_bytes > 0)
    row("gradients on the wire", s.compression + ", " + num("%.0f%%", 100.0 * s.wire_bytes / s.gradient_bytes) +
                                     " of their f32 bytes, " + std::to_string(s.compression_fallbacks) +
                                     " f32 fallback" + (s.compression_fallbacks == 1 ? "" : "s"));
  row("final training loss", num("%.4f", s.train.back().loss));
  if (!s.validation.empty()) {
    row("final validation loss", num("%.4f", s.validation.back().loss));
    row("final validation accuracy", num("%.4f", s.final_accuracy()));
  }
  const double t = s.time_to_accuracy(target);
  std::snprintf(buf, sizeof buf, "time to %.1f%% validation accuracy", 100 * target);
  const std::string label = buf;
  row(label.c_str(), t >= 0 ? num("%.1f s", t) : std::string("not reached"));
  if (!s.validation.empty()) {
    double forward = 0, records = 0;
    for (const auto& v : s.validation) forward += v.forward_seconds, records += double(v.records);
    const double n = double(s.validation.size()), total = s.validation_total_seconds();
    row("validation (mean of passes)", num("%.2f s", total / n) + " a pass (forward " + num("%.2f s", forward / n) +
                                           "), " + num("%.0f images/s", total > 0 ? records / total : 0) + ", " +
                                           std::to_string(s.validation.size()) + " passes");
  }
  if (s.checkpoint_wait > 0) row("training waited for checkpoints", num("%.2f s", s.checkpoint_wait));
  // What validating and checkpointing cost the trial: the time training did not run.
  const double off_training = s.validation_total_seconds() + s.checkpoint_wait;
  if (wall > 0 && off_training > 0)
    row("validation and checkpoints",
        num("%.1f s", off_training) + " (" + num("%.1f%%", 100 * off_training / wall) + " of the wall time)");
  elastic_rows(s, row);
  row("stalls", std::to_string(s.stalls));
  restarts();
  return o.str();
}

std::vector<std::string> plot_metrics(const TrialSummary& s, const std::string& prefix, std::string* error) {
  if (s.train.empty()) return {};
  const std::string dat = prefix + ".dat", vdat = prefix + "-validation.dat";
  {
    std::ofstream d(dat);
    for (const auto& r : s.train) d << r.batch << ' ' << r.time << ' ' << r.loss << ' ' << r.accuracy << '\n';
    std::ofstream v(vdat);
    for (const auto& r : s.validation) v << r.batch << ' ' << r.time << ' ' << r.loss << ' ' << r.accuracy << '\n';
    if (s.validation.empty()) v << "0 0 NaN NaN\n";
  }
  std::vector<std::string> files;
  std::ostringstream g;
  g << "set terminal pngcairo size 1100,420 noenhanced\nset grid\nset key bottom right\nTRAINING = "
    << bench::gnuplot_quoted(dat) << "\nVALIDATION = " << bench::gnuplot_quoted(vdat) << "\n";
  for (auto [x, col, label] : {std::tuple{"time", 2, "seconds"}, std::tuple{"batches", 1, "batches"}}) {
    const std::string png = prefix + "-" + x + ".png";
    files.push_back(png);
    g << "set output " << bench::gnuplot_quoted(png) << "\nset multiplot layout 1,2 title 'loss and accuracy against "
      << x << "'\nset xlabel '" << label << "'\nset ylabel 'loss'\nset logscale y\n"
      << "plot TRAINING using " << col << ":3 with lines title 'training' lc rgb '#88aadd', VALIDATION using " << col
      << ":3 with linespoints title 'validation' lc rgb '#cc3311'\n"
      << "unset logscale y\nset ylabel 'accuracy'\nset yrange [0:1]\n"
      << "plot TRAINING using " << col << ":4 with lines title 'training' lc rgb '#88aadd', VALIDATION using " << col
      << ":4 with linespoints title 'validation' lc rgb '#cc3311'\n"
      << "set autoscale y\nunset multiplot\n";
  }
  if (!s.membership.empty()) {  // the slots against time, a step at each change
    const std::string sdat = prefix + "-slots.dat", png = prefix + "-slots.png";
    std::ofstream d(sdat);
    d << "0 " << s.slots << '\n';
    for (const auto& m : s.membership) d << m.time << ' ' << m.slots << '\n';
    d << std::max(s.wall_time, s.train.back().time) << ' ' << s.membership.back().slots << '\n';
    files.push_back(png);
    g << "set terminal pngcairo size 550,300 noenhanced\nset output " << bench::gnuplot_quoted(png)
      << "\nset title 'slots against time'\nset xlabel 'seconds'\nset ylabel 'slots'\nset yrange [0:*]\n"
      << "plot " << bench::gnuplot_quoted(sdat) << " using 1:2 with steps lw 2 title 'slots'\n";
  }
  std::string err = bench::run_gnuplot_script(g.str());
  if (!err.empty()) {
    if (error) *error = err;
    return {};
  }
  return files;
}

}  // namespace tandem::trainer
