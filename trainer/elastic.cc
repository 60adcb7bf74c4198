// An elastic trial's recovery (trial.h): the survivors of a lost slot shrink
// the communicator, agree on the last step every one of them took, and go on
// from memory with the global batch split over the slots there are. When the
// chief is lost, the survivor at rank 0 takes its duties.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "checkpoint.h"
#include "trial.h"

namespace tandem::trainer {

Trial::Resume Trial::go_on_without_lost(const tandem::Error& failure, int64_t failed_batch) {
  const auto seen = SteadyClock::now();
  std::string reason = failure.what();
  std::vector<int> lost;
  // Each shrink leaves at least one slot out: more attempts than slots would be a call failing on its own.
  for (int attempt = 1;; ++attempt) {
    try {
      return shrink_and_agree(failed_batch, reason, seen, lost);
    } catch (const tandem::Excluded&) {
      throw;
    } catch (const tandem::Error& again) {  // another slot lost while agreeing: shrink once more
      if (attempt >= cfg_.slots_per_trial) throw;
      reason += "; then " + std::string(again.what());
    }
  }
}

Trial::Resume Trial::shrink_and_agree(int64_t failed_batch, const std::string& reason, SteadyClock::time_point seen,
                                      std::vector<int>& lost) {
  auto shrunk = comm_->shrink();  // Excluded: left out, or no majority
  std::vector<int> kept;
  for (int member : shrunk.members) kept.push_back(originals_[size_t(member)]);
  for (int original : originals_)
    if (std::find(kept.begin(), kept.end(), original) == kept.end()) lost.push_back(original);
  if (int(kept.size()) < cfg_.elastic_min_slots)
    throw std::runtime_error(std::to_string(kept.size()) + " slots are left, below elastic.min_slots " +
                             std::to_string(cfg_.elastic_min_slots) + " (" + reason + "); the trial restarts");
  const std::unique_ptr<Communicator> old = std::move(comm_);  // outlives the old sync, in rebind()
  comm_ = std::move(shrunk.comm);
  originals_ = kept;
  rank_ = comm_->rank(), world_ = comm_->size();
  exchange_->rebind(*comm_);
  // The count a survivor may have read from the failed step is dropped. A
  // replacement (started at the loss) may be waiting already: every survivor
  // asks once at the redone batch, so it can take the lost slot's share of
  // that batch and the trial goes on as the failure-free one would.
  joiners_waiting_ = cfg_.max_restarts > 0 && world_ < cfg_.elastic_max() ? 1 : 0;
  previous_arrival_ = 0;

  // The failed call may have finished on some survivors: those took its step.
  int64_t range[2] = {committed_, -committed_};  // min, and -max
  comm_->allreduce(range, 2, DataType::i64, ReduceOp::min);
  const int64_t agreed = range[0], most = -range[1];
  if (committed_ > agreed) {
    if (committed_ - agreed != k_ || !before_)
      throw std::logic_error("slot " + std::to_string(originals_[size_t(rank_)]) + " took step " +
                             std::to_string(committed_) + " but the survivors agree on " + std::to_string(agreed) +
                             ": more than one step apart");
    restore_step_copy();
    count_step_records(committed_, k_ * plan_->global_batch(), -1);
    committed_ = agreed;
    while (next_epoch_checked_ > first_epoch_counted_ && next_epoch_checked_ * plan_->batches_per_epoch() > committed_)
      --next_epoch_checked_;  // the put-back step may have completed an epoch: it is checked again
  }
  if (rank_ == 0 && !chief_) take_chief_duties(agreed);
  stalls_ = std::make_unique<StallReporter>(wo_.stall_factor, world_, log_.get());
  // Every survivor took the step: the failure struck after it, in its validation, which is redone.
  const auto [validate_now, checkpoint_now] = due_after(agreed);
  const bool after_work = most == agreed && agreed > start_ && (validate_now || checkpoint_now);
  const Resume r = after_work ? Resume{agreed, true} : Resume{agreed + 1, false};
  const int64_t redone = failed_batch - (r.step_done ? r.batch : r.batch - 1);
  changes_.push_back({{failed_batch, now() - seconds_since(seen), lost, reason, 0, redone, world_, {}, 0, 0}, seen});
  if (chief_) {
    std::string who;
    for (int l : lost) who += (who.empty() ? "" : ",") + std::to_string(l);
    std::fprintf(stderr, "elastic: slot %s lost at batch %lld (%s); %d slots go on %s batch %lld (%.3f s)\n",
                 who.c_str(), static_cast<long long>(failed_batch), reason.c_str(), world_,
                 r.step_done ? "validating" : "from", static_cast<long long>(r.batch), seconds_since(seen));
  }
  return r;
}

void Trial::take_chief_duties(int64_t agreed) {
  chief_ = true;
  // Every slot started its own clock; the trial's is the lost chief's, in the first start line.
  if (const auto origin = clock_origin(metrics_path())) {
    const double shift = std::chrono::duration<double>(*origin_ - *origin).count();
    for (auto& change : changes_) change.first.time += shift;  // stamped on this slot's clock
    origin_ = origin;
  }
  log_ = std::make_unique<MetricsWriter>(metrics_path(), agreed);
  // A validation or epoch line of the agreed steps that the lost chief did not write is written again.
  last_validation_logged_ = std::min(last_validation_logged_, log_->last_kept("validation", "batch").value_or(0));
  const auto epoch = log_->last_kept("epoch", "epoch");
  next_epoch_checked_ = std::max(first_epoch_counted_, std::min(next_epoch_checked_, epoch ? *epoch + 1 : 0));
  // The next checkpoint due is this slot's; one the lost chief left unfinished is skipped and pruned.
  if (!wo_.checkpoint_dir.empty())
    checkpoints_ = std::make_unique<CheckpointWriter>(wo_.checkpoint_dir, keep_policy(cfg_));
  std::fprintf(stderr, "elastic: slot %d takes over as the chief after batch %lld (metrics, checkpoints)\n",
               originals_[0], static_cast<long long>(agreed));
}

void Trial::count_step_records(int64_t batch, int64_t slot_records_sum, int sign) {
  const int64_t global = plan_->global_batch();
  if (slot_records_sum != k_ * global)
    throw std::runtime_error("the step ending at batch " + std::to_string(batch) + " trained " +
                             std::to_string(slot_records_sum) + " records over " + std::to_string(world_) +
                             " slots, not its " + std::to_string(k_ * global) +
                             ": the global batch was not split once over the slots");
  for (int64_t b = batch - k_ + 1; b <= batch; ++b) epoch_records_[plan_->epoch_of(b - 1)] += sign * global;
}

void Trial::check_complete_epochs() {
  const int64_t per_epoch = plan_->batches_per_epoch();
  for (; (next_epoch_checked_ + 1) * per_epoch <= committed_; ++next_epoch_checked_) {
    const int64_t e = next_epoch_checked_, trained = epoch_records_[e], expected = per_epoch * plan_->global_batch();
    if (log_)
      log_->line(nlohmann::json{
          {"kind", "epoch"},
          {"batch", committed_},
          {"epoch", e},
          {"records", trained},
          {"expected", expected},
          {"slots",
           world_}}.dump());
    if (trained != expected)
      throw std::runtime_error("epoch " + std::to_string(e) + " trained " + std::to_string(trained) +
                               " records, not the " + std::to_string(expected) + " of its " +
                               std::to_string(per_epoch) + " global batches: records were lost or trained twice");
  }
}

void Trial::log_membership_changes() {
  for (auto& [m, seen] : changes_) {
    m.recovery_seconds = seconds_since(seen);
    if (log_)
      log_->line(nlohmann::json{
          {"kind", "membership"},
          {"batch", m.batch},
          {"time", m.time},
          {"lost", m.lost},
          {"joined", m.joined},
          {"state_bytes", m.state_bytes},
          {"state_seconds", m.state_seconds},
          {"reason", m.reason},
          {"recovery_seconds", m.recovery_seconds},
          {"batches_redone", m.batches_redone},
          {"slots",
           m.slots}}.dump());
  }
  changes_.clear();
}

void Trial::check_same_parameters() {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over every parameter's bytes
  for (const auto& p : params_) {
    const auto c = p.detach().contiguous();
    const auto* b = static_cast<const unsigned char*>(c.data_ptr());
    for (size_t i = 0, n = size_t(c.numel()) * c.element_size(); i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  const auto own = int64_t(h >> 1);
  int64_t range[2] = {own, -own};  // min, and -max
  comm_->allreduce(range, 2, DataType::i64, ReduceOp::min);
  if (range[0] != -range[1])
    throw std::logic_error("the slots end with different parameters: a shrink or a join did not leave them equal");
}

void Trial::save_step_copy() {
  torch::NoGradGuard no_grad;
  if (!before_) {
    before_.emplace();
    for (const auto& p : params_) before_->params.push_back(p.detach().clone());
  } else {
    for (size_t i = 0; i < params_.size(); ++i) before_->params[i].copy_(params_[i]);
  }
  before_->optimizer = optimizer_state(*optimizer_);  // clones every state tensor
}

void Trial::restore_step_copy() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) params_[i].copy_(before_->params[i]);
  LoadedCheckpoint copy;
  copy.path = "the copy from before the step";
  copy.optimizer = before_->optimizer;
  optimizer_->state().clear();  // a parameter without state before the step has none again
  restore_optimizer(copy, *optimizer_);
}

}  // namespace tandem::trainer
