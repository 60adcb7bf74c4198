// One slot's trial: resume, train_batch, complete, validate, checkpoint.
// Terms as in config.h, data.h and metrics.h; and:
//  - part: what is marked ready and reduced on its own: a parameter's whole
//    gradient, or one row block of a sliced layer's weight (model.h).
//  - exchange: how gradients reach the other slots, the GradientExchange
//    (gradient_exchange.h). Overlapped, buckets are reduced while backward
//    continues; not overlapped (--no-overlap), after backward.
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
//  - committed batch: the last communicating batch whose optimizer step this
//    rank took. Elastic (elastic.cc): a failed exchange or validation makes
//    the survivors shrink, agree on the smallest committed batch (a rank one
//    step ahead puts back its copy from before that step) and go on after it,
//    each global batch split over the slots there are; the survivor at rank 0
//    is the chief, the lost chief's duties passing to it. A process started in
//    a lost slot's place joins at a step boundary and takes the members'
//    state (join.cc).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint.h"
#include "config.h"
#include "data.h"
#include "gradient_exchange.h"
#include "metrics.h"
#include "model.h"
#include "stall_reporter.h"
#include "tandem/errors.h"
#include "worker_options.h"

namespace tandem::trainer {

class Trial {
 public:
  using Connect = std::function<std::unique_ptr<Communicator>()>;
  // `connect` makes the communicator. `joining` (TANDEM_JOIN=1): it returns
  // once the members admitted this process, which loads its data first.
  // `number`: this process's number in the job (TANDEM_RANK); a joiner's
  // names its slot, the others' is their starting rank.
  Trial(const WorkerOptions& options, ExperimentConfig config, const Connect& connect, bool joining, int number);
  ~Trial();

  // Continues from the newest complete checkpoint, if asked and one exists;
  // a joiner takes the members' state instead, in run().
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

  std::vector<std::string> load_data();  // returns the warnings, which the chief prints
  // hyperparameters.optimizer not given: the entrypoint module's own, when it names one.
  void adopt_entrypoint_optimizer();
  // An entrypoint's hyperparameters that set no attribute of its module, each with one warning.
  void warn_unused_hyperparameters() const;
  std::string metrics_path() const;
  void open_metrics();
  void train_batch(int64_t batch);
  // Whether a validation and a checkpoint are due after batch b.
  std::pair<bool, bool> due_after(int64_t batch) const;
  // The validation and checkpoint due after batch b, if any.
  void after_batch(int64_t batch);
  // Ends batch b's exchange (updating what the forward left when deferred), then logs it.
  void complete(const Open& b, bool was_deferred);
  ValidationRecord validate(int64_t batch);
  void checkpoint(int64_t batch, const std::optional<ValidationRecord>& validation);
  // Elastic (elastic.cc). Where the loop goes on after a failure: the batch, and
  // whether that batch's step is done (only its validation and checkpoint are redone).
  struct Resume {
    int64_t batch = 0;
    bool step_done = false;
  };
  Resume go_on_without_lost(const tandem::Error& failure, int64_t failed_batch);
  // One shrink; `lost` gathers the slots left out over the attempts.
  Resume shrink_and_agree(int64_t failed_batch, const std::string& reason, SteadyClock::time_point seen,
                          std::vector<int>& lost);
  // The survivor at rank 0 after the chief's loss: the metrics file (its lines
  // of the agreed steps kept), the checkpoints, the messages and the dump.
  void take_chief_duties(int64_t agreed);
  // Elastic: the step ending at `batch` trained its global batches once (the
  // slots' record counts, summed with the gradients), counted toward their
  // epochs (sign -1: the step was put back); a complete epoch is checked.
  void count_step_records(int64_t batch, int64_t slot_records_sum, int sign);
  void check_complete_epochs();
  // Elastic (join.cc): the chief, at most every kJoinersProbe, asks the
  // store who waits to join and sends the count with the step's metrics.
  void offer_joiners();
  // Elastic (join.cc): below max_slots, once a step's metrics said someone
  // waits, the members admit them at the next step boundary and hand them the state.
  void admit_joiners(int64_t batch);
  // Every rank of a grown communicator, from rank 0: the parameters, the
  // optimizer state and the cursors, which a joiner takes; returns the bytes.
  size_t share_state(bool take);
  // A joiner, before its first step: the members' numbers and state.
  void take_members_state();
  // Every rank's number in the job (originals_), and the oldest joiner's seconds since its process started.
  double share_numbers(int own_number, double own_age);
  void log_membership_changes();
  // Elastic, at the end: every slot holds the same parameters, bit for bit (a hash's min and max).
  void check_same_parameters();
  void save_step_copy();           // before the optimizer steps
  void restore_step_copy();        // back to before the committed step
  double now() const;              // the trial clock
  std::string model_name() const;  // the built-in model's name, or the TorchScript file

  WorkerOptions wo_;
  ExperimentConfig cfg_;
  std::unique_ptr<Communicator> comm_;
  int rank_ = 0, world_ = 1, k_ = 1;
  // Each rank's number in the job: its rank at the start (they differ after
  // a shrink), a joiner's TANDEM_RANK.
  std::vector<int> originals_;
  bool joiner_ = false;   // started as a replacement: its state comes from the members
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

  std::unique_ptr<GradientExchange> exchange_;

  int64_t committed_ = 0;
  // The parameters and optimizer state before the committed batch's step (elastic only).
  struct StepCopy {
    std::vector<torch::Tensor> params;
    c10::IValue optimizer;
  };
  std::optional<StepCopy> before_;
  int64_t last_validation_logged_ = 0;
  // Elastic: membership changes, written when the next step commits (recovery_seconds then known).
  std::vector<std::pair<MembershipRecord, SteadyClock::time_point>> changes_;
  std::map<int64_t, int64_t> epoch_records_;  // elastic: records trained in committed steps, by epoch
  int64_t first_epoch_counted_ = 0;           // the first epoch begun in this attempt
  int64_t next_epoch_checked_ = 0;            // from it on

  std::unique_ptr<MetricsWriter> log_;
  std::unique_ptr<StallReporter> stalls_;
  std::optional<Open> deferred_;  // its parameters are updated by the next forward
  double previous_arrival_ = 0;   // this rank's previous batch time before its wait
  SteadyClock::time_point last_end_;
  double validation_seconds_ = 0, checkpoint_seconds_ = 0;  // this attempt
  int64_t grow_calls_ = 0;                                  // elastic: grow() calls, with the seconds they took
  double grow_seconds_ = 0;
  int joiners_waiting_ = 0;                       // elastic: as the last committed step's metrics said
  SteadyClock::time_point next_joiners_probe_{};  // the chief's next joiners_waiting()
};

}  // namespace tandem::trainer
