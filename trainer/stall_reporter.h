// Names a stalled batch and the rank that held it up. A batch slower than
// `factor` times the running median is reported one communicating batch
// later, when every rank's arrival time (its previous batch time before its
// wait, carried in the metric slots) has come in. The batch after a
// validation or checkpoint is left out (skip_next).
#pragma once

#include <span>

#include "metrics.h"
#include "tandem/fusion/gradient_sync.h"

namespace tandem::trainer {

class StallReporter {
 public:
  // `log` is the chief's metrics file (null on the other ranks: they report nothing).
  StallReporter(double factor, int world, MetricsWriter* log) : detector_(factor, 50), world_(world), log_(log) {}

  // After batch `r` is logged; `arrivals[i]` is rank i's arrival (sum), valid when `communicated`.
  void add(const TrainRecord& r, bool communicated, std::span<const fusion::Metric> arrivals);
  // The next batch follows a validation or a checkpoint: it is neither judged
  // nor counted in the median, as the pause slows it (docs/training.md, "Stalls").
  void skip_next() { skip_next_ = true; }

 private:
  StallDetector detector_;
  int world_;
  MetricsWriter* log_;
  bool pending_ = false;
  bool skip_next_ = false;
  TrainRecord stalled_;
  double median_ = 0;
};

}  // namespace tandem::trainer
