// Bayesian optimisation of the fusion settings (Horovod's parameter manager,
// with the score tandem cares about): a Gaussian process over the settings,
// the next trial where expected improvement is largest.
//
// Terms: a *trial* runs one setting for steps_per_sample communicating steps;
// its *score* is the mean time blocked in wait() per step (exposed
// communication), lower is better. The search space is a grid in log2 of
// fusion threshold (1-64 MiB), first bucket (128 KiB-4 MiB) and chunk
// (64 KiB-4 MiB); the GP sees each coordinate scaled to [0, 1].
//
// After max_samples trials the two best settings run once more (one noisy
// trial must not win), then the tuner settles on the best mean.
//
// Runs on rank 0 only; the caller broadcasts what next() returns.
#pragma once

#include <Eigen/Dense>
#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "tandem/fusion/gradient_sync.h"

namespace tandem::fusion {

struct Trial {
  FusionSettings settings;
  double score = 0;   // seconds of exposed communication per step
  std::string phase;  // "start", "explore", "bayes", "confirm", "chosen", "settled", "retune"
};

// A GP over log scores (standardised), Matern 5/2, length scale and noise by
// marginal likelihood.
class GaussianProcess {
 public:
  GaussianProcess(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                  const std::vector<int>& repeats);
  // Posterior mean and standard deviation, in standardised log-score units.
  std::pair<double, double> predict(const std::array<double, 3>& at) const;

 private:
  std::vector<std::array<double, 3>> x_;
  Eigen::VectorXd ys_, alpha_;
  Eigen::LLT<Eigen::MatrixXd> llt_;
  double length_ = 0.3;
};

class Autotuner {
 public:
  Autotuner(const AutotuneOptions& options, const FusionSettings& start);

  // The score of the trial just run under current() and its mean step time
  // (seconds); returns the setting for the next trial: current() once
  // settled, until the step time drifts from the settled one.
  FusionSettings next(double score, double step_time);

  const FusionSettings& current() const { return current_; }
  bool settled() const { return settled_; }
  const std::vector<Trial>& trials() const { return trials_; }
  // The best setting measured so far and its mean score.
  std::pair<FusionSettings, double> best() const;

  // The grid the search runs over, in GP coordinates.
  static std::vector<FusionSettings> grid();
  // Trials before settling: the samples and the re-measured best two.
  static int trials_to_settle(const AutotuneOptions& o) { return o.max_samples + 2; }

 private:
  struct Point {
    std::array<double, 3> x;
    FusionSettings settings;
    double sum = 0;
    int n = 0;
    double mean() const { return sum / n; }
  };
  static std::array<double, 3> coordinates(const FusionSettings& s);
  void record(const FusionSettings& s, double score);
  FusionSettings propose();
  GaussianProcess fit() const;
  void log(const Trial& t);

  AutotuneOptions options_;
  FusionSettings current_;
  std::vector<Point> points_;
  std::vector<Trial> trials_;
  std::mt19937_64 rng_{0x74616e64656dULL};
  int samples_ = 0;
  std::vector<FusionSettings> confirm_;  // settings still to re-measure before settling
  bool confirming_ = false;
  bool settled_ = false;
  double settled_step_ = 0;  // mean step time of the first trial after settling
  int drifted_ = 0;
};

// Expected improvement for minimisation at every candidate, from a GP fitted
// to (x, y), y[i] the mean of repeats[i] measurements; exposed for tests.
std::vector<double> expected_improvement(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                                         const std::vector<int>& repeats,
                                         const std::vector<std::array<double, 3>>& candidates);

}  // namespace tandem::fusion
