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
constexpr int kExploreTrials = 3;     // random grid points after the start, before the GP leads
constexpr double kScoreFloor = 1e-3;  // seconds added before the log: a fully hidden step scores ~0
constexpr double kXi = 0.01;          // EI's exploration margin (standardised units)
constexpr double kDriftFloor = 1e-3;  // step-time drifts smaller than this (seconds) are noise

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

GaussianProcess::GaussianProcess(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                                 const std::vector<int>& repeats)
    : x_(x) {
  const Eigen::Index n = Eigen::Index(x.size());
  // Log scores: step timings are noisy by a factor, not by an offset.
  Eigen::VectorXd yv(n);
  for (Eigen::Index i = 0; i < n; ++i) yv(i) = std::log(y[size_t(i)] + kScoreFloor);
  const double mean = yv.mean();
  const double sd = n > 1 ? std::sqrt((yv.array() - mean).square().sum() / double(n - 1)) : 1.0;
  ys_ = (yv.array() - mean) / (sd > 0 ? sd : 1.0);

  // Length scale and observation noise (in units of the scores' variance) by
  // marginal likelihood; a point measured k times has 1/k of the noise.
  double best_lml = -std::numeric_limits<double>::infinity();
  for (double length : {0.1, 0.2, 0.4, 0.8, 1.6}) {
    for (double noise : {0.02, 0.1, 0.3, 0.6}) {
      Eigen::MatrixXd K(n, n);
      for (Eigen::Index i = 0; i < n; ++i)
        for (Eigen::Index j = 0; j < n; ++j)
          K(i, j) = kernel(x[size_t(i)], x[size_t(j)], length) +
                    (i == j ? noise / (repeats.empty() ? 1 : std::max(1, repeats[size_t(i)])) : 0);
      Eigen::LLT<Eigen::MatrixXd> llt(K);
      if (llt.info() != Eigen::Success) continue;
      const Eigen::VectorXd alpha = llt.solve(ys_);
      const double logdet = 2 * llt.matrixL().toDenseMatrix().diagonal().array().log().sum();
      const double lml = -0.5 * ys_.dot(alpha) - 0.5 * logdet;
      if (lml > best_lml) best_lml = lml, length_ = length, llt_ = llt, alpha_ = alpha;
    }
  }
}

std::pair<double, double> GaussianProcess::predict(const std::array<double, 3>& at) const {
  const Eigen::Index n = Eigen::Index(x_.size());
  Eigen::VectorXd k(n);
  for (Eigen::Index i = 0; i < n; ++i) k(i) = kernel(at, x_[size_t(i)], length_);
  const double var = std::max(1e-12, 1.0 - k.dot(llt_.solve(k)));
  return {k.dot(alpha_), std::sqrt(var)};
}

std::vector<double> expected_improvement(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                                         const std::vector<int>& repeats,
                                         const std::vector<std::array<double, 3>>& candidates) {
  const GaussianProcess gp(x, y, repeats);
  // The incumbent is the best predicted mean where we measured, not the luckiest measurement.
  double incumbent = std::numeric_limits<double>::infinity();
  for (const auto& xi : x) incumbent = std::min(incumbent, gp.predict(xi).first);
  std::vector<double> ei(candidates.size());
  for (size_t c = 0; c < candidates.size(); ++c) {
    const auto [mu, s] = gp.predict(candidates[c]);
    const double gain = incumbent - mu - kXi, z = gain / s;
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

GaussianProcess Autotuner::fit() const {
  std::vector<std::array<double, 3>> x;
  std::vector<double> y;
  std::vector<int> repeats;
  for (const Point& p : points_) x.push_back(p.x), y.push_back(p.mean()), repeats.push_back(p.n);
  return GaussianProcess(x, y, repeats);
}

std::pair<FusionSettings, double> Autotuner::best() const {
  // By the GP's mean where we measured: it pools neighbours, so one lucky trial does not win.
  if (points_.empty()) return {current_, 0.0};
  const GaussianProcess gp = fit();
  const Point* best = nullptr;
  double best_mu = 0;
  for (const Point& p : points_) {
    const double mu = gp.predict(p.x).first;
    if (!best || mu < best_mu) best = &p, best_mu = mu;
  }
  return {best->settings, best->mean()};
}

FusionSettings Autotuner::propose() {
  const auto candidates = grid();
  if (samples_ <= kExploreTrials) {
    // Spread the first trials: the grid point farthest from every point tried (ties at random).
    std::vector<size_t> farthest;
    double far = -1;
    for (size_t c = 0; c < candidates.size(); ++c) {
      const auto cx = coordinates(candidates[c]);
      double nearest = std::numeric_limits<double>::infinity();
      for (const Point& p : points_) {
        double d2 = 0;
        for (int i = 0; i < 3; ++i) d2 += (cx[i] - p.x[i]) * (cx[i] - p.x[i]);
        nearest = std::min(nearest, d2);
      }
      if (nearest > far + 1e-12) far = nearest, farthest.clear();
      if (nearest > far - 1e-12) farthest.push_back(c);
    }
    std::uniform_int_distribution<size_t> pick(0, farthest.size() - 1);
    return candidates[farthest[pick(rng_)]];
  }
  std::vector<std::array<double, 3>> x, cx;
  std::vector<double> y;
  std::vector<int> repeats;
  for (const Point& p : points_) x.push_back(p.x), y.push_back(p.mean()), repeats.push_back(p.n);
  // Only settings not tried yet: with noisy scores EI would keep re-measuring the
  // incumbent; the confirmations re-measure at the end instead.
  std::vector<FusionSettings> untried;
  for (const auto& c : candidates)
    if (std::none_of(points_.begin(), points_.end(), [&](const Point& p) { return p.settings == c; }))
      untried.push_back(c), cx.push_back(coordinates(c));
  if (untried.empty()) return best().first;
  const auto ei = expected_improvement(x, y, repeats, cx);
  return untried[size_t(std::max_element(ei.begin(), ei.end()) - ei.begin())];
}

FusionSettings Autotuner::next(double score, double step_time) {
  if (settled_) {
    // Watch the step time: two trials in a row off the settled one re-open the search.
    if (settled_step_ == 0) settled_step_ = step_time;
    const double off = std::abs(step_time - settled_step_);
    drifted_ = options_.retune_drift > 0 && off > kDriftFloor && off > options_.retune_drift * settled_step_
                   ? drifted_ + 1
                   : 0;
    log(Trial{current_, score, "settled"});
    if (drifted_ < 2) return current_;
    settled_ = false;
    drifted_ = 0;
    settled_step_ = 0;
    points_.clear();
    samples_ = 0;
    log(Trial{current_, score, "retune"});
  }
  record(current_, score);
  const std::string phase = confirming_                  ? "confirm"
                            : samples_ == 0              ? "start"
                            : samples_ <= kExploreTrials ? "explore"
                                                         : "bayes";
  log(Trial{current_, score, phase});
  ++samples_;
  if (!confirming_ && samples_ >= options_.max_samples) {
    // Measure again the two settings of the grid the GP predicts best (tried or not).
    const GaussianProcess gp = fit();
    std::vector<std::pair<double, FusionSettings>> ranked;
    for (const auto& c : grid()) ranked.emplace_back(gp.predict(coordinates(c)).first, c);
    std::partial_sort(ranked.begin(), ranked.begin() + 2, ranked.end(),
                      [](const auto& a, const auto& b) { return a.first < b.first; });
    confirm_ = {ranked[0].second, ranked[1].second};
    confirming_ = true;
  }
  if (confirming_) {
    if (!confirm_.empty()) {
      current_ = confirm_.front();
      confirm_.erase(confirm_.begin());
      return current_;
    }
    confirming_ = false;
    settled_ = true;
    current_ = best().first;
    log(Trial{current_, best().second, "chosen"});
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
