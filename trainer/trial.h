// One slot's trial: resume, train_batch, complete, validate, checkpoint.
// Terms as in config.h, data.h and metrics.h; and:
//  - part: what is marked ready and reduced on its own: a parameter's whole
//    gradient, or one row block of a sliced layer's weight (model.h).
//  - exchange: how gradients reach the other slots (exchange.h). Overlapped:
//    through fusion::GradientSync, the parameters' .grad tensors being views
//    of its fusion buffers and each AccumulateGrad node's post-hook (or, for a
//    sliced layer, the model's gradient sink) marking a part ready, so
//    buckets are reduced while backward continues. Not overlapped
//    (--no-overlap): the same views, reduced after backward.
//  - deferred update (overlapped, by default, for models that gate their
//    parameters): a communicating batch ends after backward. Each part is
//    updated when the next forward first uses it (the model's gate), as soon
//    as its bucket has landed, so that forward starts while the last buckets
//    are still on the wire; the exchange closes after it. Every batch with a
//    validation or checkpoint after it, and the last, ends at once.
//  - metric slots: what travels with the gradients each communicating batch:
//    summed loss and correct predictions with their sample counts, then one
//    slot per rank holding that rank's previous batch time before its wait
//    (so the chief can name the rank that arrived last at a stall).
//  - trial clock: seconds since the first attempt started training, across
//    restarts (the origin is kept in metrics.jsonl's first start line), so
//    time to accuracy and wall time include what failures cost.
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "config.h"
#include "data.h"
#include "exchange.h"
#include "metrics.h"
#include "model.h"
#include "stall_reporter.h"
#include "worker_options.h"

namespace tandem::trainer {

class Trial {
 public:
  Trial(const WorkerOptions& options, ExperimentConfig config, std::unique_ptr<Communicator> comm);
  ~Trial();

  // Continues from the newest complete checkpoint, if asked and one exists.
  void resume();
  // Trains to the end, validating and checkpointing on the config's periods.
  void run();

 private:
  // A batch past backward whose exchange has not ended yet.
  struct Open {
    int64_t batch = 0;
    SteadyClock::time_point start;
    double data = 0, own_loss = 0, own_accuracy = 0;
  };

  void load_data();
  void build_exchange();
  void open_metrics();
  void train_batch(int64_t batch);
  // Ends batch b's exchange (updating what the forward left when deferred), then logs it.
  void complete(const Open& b, bool was_deferred);
  // Updates one part once its reduction has landed (deferred updates).
  void update_part(size_t param, int part);
  ValidationRecord validate(int64_t batch);
  void checkpoint(int64_t batch, const std::optional<ValidationRecord>& validation);
  double now() const;              // the trial clock
  std::string model_name() const;  // the built-in model's name, or the TorchScript file

  WorkerOptions wo_;
  ExperimentConfig cfg_;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0, world_ = 1, k_ = 1;
  int layer_slices_ = 1;  // hyperparameters.layer_slices as resolved for these hosts
  bool chief_ = false;

  Dataset train_, test_;
  std::optional<BatchPlan> plan_;
  int64_t per_slot_ = 0, total_ = 0, validate_every_ = 0, checkpoint_every_ = 0;

  Model model_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  int64_t optimizer_step_ = 0;                     // 1-based, of the step being applied
  std::unique_ptr<CheckpointWriter> checkpoints_;  // the chief's, with a checkpoint directory

  int64_t start_ = 0;                                            // the batch resumed from
  double resumed_time_ = 0;                                      // the trial clock of that checkpoint
  std::optional<std::chrono::system_clock::time_point> origin_;  // of the trial clock

  std::vector<GradientParts> parts_;
  std::vector<std::vector<int64_t>> row_begin_;                   // per parameter: its parts' first rows, then the end
  std::unique_ptr<compression::CompressedAllreduce> compressor_;  // outlives the exchange
  std::unique_ptr<Exchange> exchange_;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive: they hold the hooks
  std::unordered_map<const void*, size_t> param_of_;
  int metric_slots_ = 0;
  bool defer_ = false;
  int compute_nice_ = 0;

  std::unique_ptr<MetricsWriter> log_;
  std::unique_ptr<StallReporter> stalls_;
  std::optional<Open> deferred_;            // its parameters are updated by the next forward
  std::vector<std::vector<char>> updated_;  // per parameter, per part
  std::vector<fusion::Metric> unreported_;
  double previous_arrival_ = 0;  // this rank's previous batch time before its wait
  SteadyClock::time_point last_end_;
  uint64_t payload_bytes_ = 0, wire_bytes_ = 0, fallbacks_ = 0;  // gradients, this attempt
  double validation_seconds_ = 0, checkpoint_seconds_ = 0;       // this attempt
};

}  // namespace tandem::trainer
