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
// Runs on rank 0 only; the caller broadcasts what next() returns.
#pragma once

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
  double score = 0;          // seconds of exposed communication per step
  std::string phase;         // "start", "explore", "bayes", "settled", "retune"
};

class Autotuner {
 public:
  Autotuner(const AutotuneOptions& options, const FusionSettings& start);

  // The score of the trial just run under current(); returns the setting for
  // the next trial (current() once settled, unless the score drifted).
  FusionSettings next(double score);

  const FusionSettings& current() const { return current_; }
  bool settled() const { return settled_; }
  const std::vector<Trial>& trials() const { return trials_; }
  // The best setting measured so far and its mean score.
  std::pair<FusionSettings, double> best() const;

  // The grid the search runs over, in GP coordinates.
  static std::vector<FusionSettings> grid();

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
  void log(const Trial& t);

  AutotuneOptions options_;
  FusionSettings current_;
  std::vector<Point> points_;
  std::vector<Trial> trials_;
  std::mt19937_64 rng_{0x74616e64656dULL};
  int samples_ = 0;
  bool settled_ = false;
  double settled_score_ = 0;
  int drifted_ = 0;
};

// Expected improvement for minimisation at every candidate, from a GP fitted
// to (x, y); exposed for tests.
std::vector<double> expected_improvement(const std::vector<std::array<double, 3>>& x, const std::vector<double>& y,
                                         const std::vector<std::array<double, 3>>& candidates);

}  // namespace tandem::fusion
