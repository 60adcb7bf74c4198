#include "autotune.h"

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>

#include <nlohmann/json.hpp>

namespace tandem::fusion {
namespace {

constexpr size_t KiB = 1024, MiB = 1024 * 1024;
const std::vector<size_t> kThresholds = {1 * MiB, 2 * MiB, 4 * MiB, 8 * MiB, 16 * MiB, 32 * MiB, 64 * MiB};
const std::vector<size_t> kFirstBuckets = {128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB};
const std::vector<size_t> kChunks = {64 * KiB, 128 * KiB, 256 * KiB, 512 * KiB, 1 * MiB, 2 * MiB, 4 * MiB};
constexpr int kExploreTrials = 3;      // random grid points after the start, before the GP leads
constexpr double kNoise = 0.05;        // observation noise, in units of the scores' variance
constexpr double kXi = 0.01;           // EI's exploration margin (standardised units)
constexpr double kDriftFloor = 0.5e-3; // drifts smaller than this (seconds) are noise

double scaled(size_t v, const std::vector<size_t>& axis) {
  const double lo = std::log2(double(axis.front())), hi = std::log2(double(axis.back()));
  return std::clamp((std::log2(double(std::max<size_t>(v, 1))) - lo) / (hi - lo), 0.0, 1.0);
}

// Matern 5/2 with unit variance.
double kernel(const std::array<double, 3>& a, const std::array<double, 3>& b, double length) {
  double d2 = 0;
  for (int i = 0; i < 3; ++i) d2 += (a[i] - b[i]) * (a[i] - b[i]);
  const double r = std::sqrt(5.0 * d2) / length;
  return (1 + r + r * r / 3) * std::exp(-r);
}

}  // namespace

std::vector<double> expected_improvement(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                                         const std::vector<std::array<double, 3>>& candidates) {
  const Eigen::Index n = Eigen::Index(x.size());
  Eigen::VectorXd yv(n);
  for (Eigen::Index i = 0; i < n; ++i) yv(i) = y[size_t(i)];
  const double mean = yv.mean();
  const double sd = n > 1 ? std::sqrt((yv.array() - mean).square().sum() / double(n - 1)) : 1.0;
  const Eigen::VectorXd ys = (yv.array() - mean) / (sd > 0 ? sd : 1.0);

  // Length scale by marginal likelihood over a few values.
  double best_length = 0.3, best_lml = -std::numeric_limits<double>::infinity();
  Eigen::LLT<Eigen::MatrixXd> best_llt;
  for (double length : {0.1, 0.2, 0.4, 0.8}) {
    Eigen::MatrixXd K(n, n);
    for (Eigen::Index i = 0; i < n; ++i)
      for (Eigen::Index j = 0; j < n; ++j) K(i, j) = kernel(x[size_t(i)], x[size_t(j)], length) + (i == j ? kNoise : 0);
    Eigen::LLT<Eigen::MatrixXd> llt(K);
    if (llt.info() != Eigen::Success) continue;
    const Eigen::VectorXd alpha = llt.solve(ys);
    const double logdet = 2 * llt.matrixL().toDenseMatrix().diagonal().array().log().sum();
    const double lml = -0.5 * ys.dot(alpha) - 0.5 * logdet;
    if (lml > best_lml) best_lml = lml, best_length = length, best_llt = llt;
  }
  const Eigen::VectorXd alpha = best_llt.solve(ys);
  const double incumbent = ys.minCoeff();

  std::vector<double> ei(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) {
    Eigen::VectorXd k(n);
    for (Eigen::Index i = 0; i < n; ++i) k(i) = kernel(candidates[c], x[size_t(i)], best_length);
    const double mu = k.dot(alpha);
    const double var = std::max(1e-12, 1.0 - k.dot(best_llt.solve(k)));
    const double s = std::sqrt(var), gain = incumbent - mu - kXi, z = gain / s;
    const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0)), pdf = std::exp(-0.5 * z * z) / std::sqrt(2 * M_PI);
    ei[c] = gain * cdf + s * pdf;
  }
  return ei;
}

std::vector<FusionSettings> Autotuner::grid() {
  std::vector<FusionSettings> g;
  for (size_t t : kThresholds)
    for (size_t f : kFirstBuckets)
      for (size_t c : kChunks) g.push_back(FusionSettings{t, f, c});
  return g;
}

std::array<double, 3> Autotuner::coordinates(const FusionSettings& s) {
  // chunk 0 means the communicator's own: treat it as the middle of the axis.
  const size_t chunk = s.chunk_bytes ? s.chunk_bytes : 512 * KiB;
  return {scaled(s.fusion_threshold_bytes, kThresholds), scaled(s.first_bucket_bytes, kFirstBuckets),
          scaled(chunk, kChunks)};
}

Autotuner::Autotuner(const AutotuneOptions& options, const FusionSettings& start) : options_(options), current_(start) {
  if (!options_.log_path.empty()) std::ofstream(options_.log_path, std::ios::trunc);
}

void Autotuner::record(const FusionSettings& s, double score) {
  for (Point& p : points_) {
    if (p.settings == s) {
      p.sum += score;
      ++p.n;
      return;
    }
  }
  points_.push_back(Point{coordinates(s), s, score, 1});
}

std::pair<FusionSettings, double> Autotuner::best() const {
  const Point* best = nullptr;
  for (const Point& p : points_)
    if (!best || p.mean() < best->mean()) best = &p;
  return best ? std::pair{best->settings, best->mean()} : std::pair{current_, 0.0};
}

FusionSettings Autotuner::propose() {
  const auto candidates = grid();
  if (samples_ <= kExploreTrials) {
    std::uniform_int_distribution<size_t> pick(0, candidates.size() - 1);
    return candidates[pick(rng_)];
  }
  std::vector<std::array<double, 3>> x, cx;
  std::vector<double> y;
  for (const Point& p : points_) x.push_back(p.x), y.push_back(p.mean());
  for (const auto& c : candidates) cx.push_back(coordinates(c));
  const auto ei = expected_improvement(x, y, cx);
  return candidates[size_t(std::max_element(ei.begin(), ei.end()) - ei.begin())];
}

FusionSettings Autotuner::next(double score) {
  if (settled_) {
    // Watch for drift: two trials in a row off the settled score re-open the search.
    const double off = std::abs(score - settled_score_);
    drifted_ = options_.retune_drift > 0 && off > kDriftFloor && off > options_.retune_drift * settled_score_
                   ? drifted_ + 1
                   : 0;
    log(Trial{current_, score, "settled"});
    if (drifted_ < 2) return current_;
    settled_ = false;
    drifted_ = 0;
    points_.clear();
    samples_ = 0;
    log(Trial{current_, score, "retune"});
  }
  record(current_, score);
  const std::string phase = samples_ == 0 ? "start" : samples_ <= kExploreTrials ? "explore" : "bayes";
  log(Trial{current_, score, phase});
  ++samples_;
  if (samples_ >= options_.max_samples) {
    auto [settings, mean] = best();
    settled_ = true;
    settled_score_ = mean;
    current_ = settings;
    log(Trial{current_, mean, "chosen"});
    return current_;
  }
  current_ = propose();
  return current_;
}

void Autotuner::log(const Trial& t) {
  trials_.push_back(t);
  if (options_.log_path.empty()) return;
  std::ofstream out(options_.log_path, std::ios::app);
  out << nlohmann::json{{"trial", trials_.size() - 1},
                        {"phase", t.phase},
                        {"fusion_threshold_bytes", t.settings.fusion_threshold_bytes},
                        {"first_bucket_bytes", t.settings.first_bucket_bytes},
                        {"chunk_bytes", t.settings.chunk_bytes},
                        {"exposed_ms", t.score * 1e3}}
             .dump()
      << "\n";
}

}  // namespace tandem::fusion
