#include "trial.h"

#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "config_keys.h"
#include "config_reader.h"
#include "optimizer.h"
#include "tandem/fusion/gradient_sync.h"

namespace tandem::trainer {
namespace {

using fusion::Metric;

// A batch of records as a normalised [N, 1, 28, 28] float tensor and [N] labels.
std::pair<torch::Tensor, torch::Tensor> make_batch(const Dataset& d, const int64_t* idx, int64_t n) {
  auto x = torch::empty({n, 1, d.rows, d.cols}, torch::kFloat32);
  auto y = torch::empty({n}, torch::kInt64);
  float* xp = x.data_ptr<float>();
  int64_t* yp = y.data_ptr<int64_t>();
  const int64_t px = d.pixels();
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* src = d.images.data() + idx[i] * px;
    for (int64_t p = 0; p < px; ++p) xp[i * px + p] = (static_cast<float>(src[p]) / 255.0f - 0.2860f) / 0.3530f;
    yp[i] = d.labels[static_cast<size_t>(idx[i])];
  }
  return {x, y};
}

}  // namespace

Trial::Trial(const WorkerOptions& options, ExperimentConfig config, const Connect& connect, bool joining, int number)
    : wo_(options), cfg_(std::move(config)) {
  // Elastic: a failed step must find the parameters as they were before it,
  // not updated in part by the next forward.
  if (cfg_.elastic()) wo_.deferred_updates = false;
  k_ = cfg_.optimizations.aggregation_frequency;
  // A joiner loads its data before it is admitted: the members wait for none of it.
  std::vector<std::string> warnings;
  if (joining) warnings = load_data();
  comm_ = connect();
  rank_ = comm_->rank(), world_ = comm_->size();
  joiner_ = comm_->joined();
  if (world_ != cfg_.slots_per_trial && !joiner_)
    throw std::runtime_error("started with " + std::to_string(world_) + " ranks for " +
                             std::to_string(cfg_.slots_per_trial) + " slots");
  chief_ = rank_ == 0;
  originals_.resize(size_t(world_));
  std::iota(originals_.begin(), originals_.end(), 0);
  if (joiner_) originals_[size_t(rank_)] = number;  // the others' from them, in run()
  if (!joining) warnings = load_data();
  if (chief_)
    for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());

  // The same initial parameters everywhere (seeded, then the chief's broadcast).
  torch::manual_seed(cfg_.seed);
  // An elastic trial's slicing follows the configured hosts, which a joiner reads as the members did at the
  // start: its grown communicator may span fewer hosts than they did, and the slicing shapes the exchange.
  layer_slices_ = layer_slices_for(cfg_, cfg_.elastic() ? placed_hosts(cfg_) : comm_->topology().hosts());
  model_ = cfg_.entrypoint.empty() ? make_model(cfg_.model, cfg_.mlp_hidden, cfg_.dropout, layer_slices_)
                                   : load_torchscript(cfg_.entrypoint, cfg_.user_hyperparameters);
  for (const auto& [name, p] : model_.parameters) params_.push_back(p), names_.push_back(name);
  if (!joiner_) {  // a joiner's come with the members' state
    torch::NoGradGuard no_grad;
    for (auto& p : params_) comm_->broadcast(p.data_ptr<float>(), static_cast<size_t>(p.numel()), DataType::f32, 0);
  }
  if (chief_) warn_unused_hyperparameters();
  adopt_entrypoint_optimizer();
  optimizer_ = make_optimizer(cfg_, params_);
  if (chief_ && !wo_.checkpoint_dir.empty())
    checkpoints_ = std::make_unique<CheckpointWriter>(wo_.checkpoint_dir, keep_policy(cfg_));
}

Trial::~Trial() = default;

void Trial::warn_unused_hyperparameters() const {
  std::vector<std::string> known;
  for (const ExperimentKey* k : keys_under("hyperparameters")) known.push_back(k->name());
  for (const std::string& name : model_.unused_hyperparameters) {
    const std::string hint = did_you_mean(name, known);
    std::fprintf(stderr,
                 "warning: hyperparameters.%s is neither a key tandem reads nor an attribute of the entrypoint's "
                 "module: unused%s\n",
                 name.c_str(), hint.empty() ? "" : (" (did you mean '" + hint + "'?)").c_str());
  }
}

void Trial::adopt_entrypoint_optimizer() {
  if (model_.optimizer.empty() || cfg_.optimizer_given) return;
  if (std::find(kOptimizers.begin(), kOptimizers.end(), model_.optimizer) == kOptimizers.end())
    throw std::runtime_error("entrypoint '" + cfg_.entrypoint + "': its optimizer attribute '" + model_.optimizer +
                             "' is not one tandem has (" + join(kOptimizers) +
                             "); set hyperparameters.optimizer to choose one");
  cfg_.optimizer = model_.optimizer;
  if (chief_)
    std::fprintf(stderr, "optimizer: %s, as the entrypoint's module names it (hyperparameters.optimizer overrides)\n",
                 cfg_.optimizer.c_str());
}

std::vector<std::string> Trial::load_data() {
  if (cfg_.data == "synthetic") {
    train_ = synthetic_dataset(cfg_.records_per_epoch > 0 ? cfg_.records_per_epoch : 60000, cfg_.seed, true);
    test_ = synthetic_dataset(10000, cfg_.seed, false);
  } else {
    train_ = load_fashion_mnist(cfg_.data_path, true);
    test_ = load_fashion_mnist(cfg_.data_path, false);
  }
  std::vector<std::string> warnings;
  const int64_t records_per_epoch = epoch_records(cfg_, train_.size, warnings);
  per_slot_ = cfg_.per_slot_batch();
  plan_.emplace(records_per_epoch, cfg_.effective_global_batch(), cfg_.seed);
  total_ = wo_.max_batches > 0 ? wo_.max_batches : cfg_.to_batches(cfg_.max_length, records_per_epoch);
  auto round_up = [&](int64_t b) { return b <= 0 ? int64_t{0} : (b + k_ - 1) / k_ * k_; };
  total_ = round_up(total_);  // whole optimizer steps
  validate_every_ =
      cfg_.min_validation_period.set() ? round_up(cfg_.to_batches(cfg_.min_validation_period, records_per_epoch)) : 0;
  checkpoint_every_ = cfg_.min_checkpoint_period.set()
                          ? round_up(cfg_.to_batches(cfg_.min_checkpoint_period, records_per_epoch))
                          : validate_every_;
  return warnings;
}

void Trial::resume() {
  if (!wo_.resume || wo_.checkpoint_dir.empty() || joiner_) return;
  std::vector<std::string> warnings;
  auto found = latest_checkpoint(wo_.checkpoint_dir, &warnings);
  if (chief_)
    for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());
  if (!found) return;
  start_ = committed_ = found->batch;
  resumed_time_ = found->meta.at("time").get<double>();
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto t = found->model.find(names_[i]);
    if (t == found->model.end())
      throw CorruptCheckpoint("checkpoint '" + found->path + "' has no parameter '" + names_[i] +
                              "': it was written for another model");
    params_[i].copy_(t->second);
  }
  restore_optimizer(*found, *optimizer_);
  if (chief_)
    std::fprintf(stderr, "resuming from %s (batch %lld)\n", found->path.c_str(), static_cast<long long>(start_));
}

std::string Trial::model_name() const { return cfg_.entrypoint.empty() ? cfg_.model : cfg_.entrypoint; }

double Trial::now() const { return std::chrono::duration<double>(std::chrono::system_clock::now() - *origin_).count(); }

std::string Trial::metrics_path() const { return wo_.output_dir + "/metrics.jsonl"; }

void Trial::open_metrics() {
  const std::string path = metrics_path();
  // A restart or resume continues the trial clock and keeps the lines up to its checkpoint.
  const bool continuing = wo_.attempt > 0 || start_ > 0;
  if (continuing) origin_ = clock_origin(path);
  if (!origin_)
    origin_ = std::chrono::system_clock::now() - std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                                     std::chrono::duration<double>(resumed_time_));
  if (!chief_) return;
  std::filesystem::create_directories(wo_.output_dir);
  log_ = std::make_unique<MetricsWriter>(path, continuing ? start_ : -1);
  const auto& opt = cfg_.optimizations;
  const double origin = std::chrono::duration<double>(origin_->time_since_epoch()).count();
  log_->line(nlohmann::json{{"kind", "start"},
                            {"batch", start_},
                            {"time", now()},
                            {"origin", origin},
                            {"slots", world_},
                            {"global_batch", cfg_.effective_global_batch()},
                            {"per_slot_batch", per_slot_},
                            {"model", model_name()},
                            {"optimizer", cfg_.optimizer},
                            {"data", cfg_.data},
                            {"layer_slices", layer_slices_},
                            {"total_batches", total_},
                            {"overlap", wo_.overlap},
                            {"compute_nice", exchange_->compute_nice()},
                            {"deferred_updates", exchange_->defers_updates()},
                            {"attempt", wo_.attempt},
                            {"gradient_compression", opt.gradient_compression},
                            {"gradient_predivide_factor", opt.gradient_predivide_factor},
                            {"error_feedback", opt.error_feedback},
                            {"transport", comm_->transport_summary()},
                            {"resumed_from", start_ > 0 ? start_ : -1},
                            {"resumed_time", resumed_time_}}
                 .dump());
}

void Trial::complete(const Open& b, bool was_deferred) {
  const Exchanged ex = exchange_->finish();  // a deferred step's parts are updated by now
  if (!was_deferred && ex.communicated) {
    if (cfg_.elastic()) save_step_copy();
    optimizer_->step();
    exchange_->zero();
    committed_ = b.batch;
    if (cfg_.elastic()) {
      const ReducedMetrics reduced = exchange_->reduced_metrics();
      count_step_records(b.batch, std::llround(reduced.loss.count), 1);
      joiners_waiting_ = world_ < cfg_.elastic_max() ? reduced.joiners_waiting : 0;
      check_complete_epochs();
      log_membership_changes();
    }
  }
  const auto end = SteadyClock::now();
  // From the batch's start, or from the previous batch's end where that came later (a deferred one).
  const double step_s = std::chrono::duration<double>(end - std::max(b.start, last_end_)).count();
  last_end_ = end;
  if (!chief_) return;
  TrainRecord r;
  r.batch = b.batch;
  r.epoch = plan_->epoch_of(b.batch - 1);
  r.time = now();
  const ReducedMetrics m = exchange_->reduced_metrics();
  if (cfg_.optimizations.average_training_metrics && ex.communicated) {
    r.loss = m.loss.mean(), r.accuracy = m.correct.mean();
  } else {
    r.loss = b.own_loss, r.accuracy = b.own_accuracy;  // the chief's own (Determined without averaging)
  }
  r.step = step_s;
  r.data = b.data;
  r.exposed = ex.exposed;
  r.communication = ex.communication;
  r.compute = std::max(0.0, step_s - b.data - ex.exposed);
  r.samples_per_s = static_cast<double>(cfg_.effective_global_batch()) / step_s;
  r.communicated = ex.communicated;
  log_->train(r);
  stalls_->add(r, ex.communicated, m.arrivals);
}

void Trial::train_batch(int64_t batch) {
  Open b{batch, SteadyClock::now()};
  const auto idx = plan_->shard(batch - 1, rank_, world_);
  const auto n = static_cast<int64_t>(idx.size());
  auto [x, y] = make_batch(train_, idx.data(), n);
  b.data = seconds_since(b.start);
  torch::manual_seed(cfg_.seed * 1000003 + static_cast<uint64_t>(batch) * 131 +
                     static_cast<uint64_t>(rank_));  // dropout
  auto logits = model_.forward(x);
  if (deferred_) {
    complete(*deferred_, true);
    deferred_.reset();
  }
  // The gradients are averaged over the slots: where they hold unequal shares
  // of the global batch (elastic, after a shrink), each slot's summed loss is
  // weighted so that the average is the global batch's mean.
  const int64_t global = plan_->global_batch();
  const bool equal_shares = global % world_ == 0;
  const double weight = equal_shares ? 1.0 / static_cast<double>(n) : static_cast<double>(world_) / global;
  auto loss = equal_shares ? torch::nn::functional::cross_entropy(logits, y)
                           : torch::nn::functional::cross_entropy(
                                 logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
                                 weight;
  {
    torch::NoGradGuard no_grad;
    const double records = static_cast<double>(n);
    const double loss_sum = equal_shares ? loss.item<double>() * records : loss.item<double>() / weight;
    const Metric batch_loss{loss_sum, records}, batch_correct{logits.argmax(1).eq(y).sum().item<double>(), records};
    b.own_loss = batch_loss.mean(), b.own_accuracy = batch_correct.mean();
    // Sent once per communicating batch, summed over aggregation's local batches.
    exchange_->add_batch_metrics(batch_loss, batch_correct);
    if (batch % k_ == 0) {
      offer_joiners();
      exchange_->send_metrics(previous_arrival_);
    }
  }
  loss.backward();
  previous_arrival_ = seconds_since(b.start);
  if (batch % k_ == 0) {  // the optimizer step this batch ends, at its scheduled learning rate
    optimizer_step_ = batch / k_;
    set_learning_rate(*optimizer_, learning_rate_at(cfg_, optimizer_step_, total_ / k_,
                                                    std::max<int64_t>(1, plan_->batches_per_epoch() / k_)));
  }
  const auto [validate_now, checkpoint_now] = due_after(batch);
  if (exchange_->defers_updates() && batch % k_ == 0 && !validate_now && !checkpoint_now) {
    deferred_ = b;
    exchange_->defer_updates();
    return;
  }
  complete(b, false);
}

std::pair<bool, bool> Trial::due_after(int64_t batch) const {
  const bool last_batch = batch == total_;
  return {(validate_every_ > 0 && batch % validate_every_ == 0) || last_batch,
          (checkpoint_every_ > 0 && batch % checkpoint_every_ == 0) || last_batch};
}

void Trial::after_batch(int64_t batch) {
  const auto [validate_now, checkpoint_now] = due_after(batch);
  std::optional<ValidationRecord> v;
  if (validate_now) v = validate(batch);
  if (checkpoint_now) checkpoint(batch, v);
  if (validate_now || checkpoint_now) stalls_->skip_next();
}

ValidationRecord Trial::validate(int64_t batch) {
  const auto t = SteadyClock::now();
  model_.set_training(false);
  double forward_s = 0;
  double sums[3] = {0, 0, 0};
  {
    torch::NoGradGuard no_grad;  // not InferenceMode: a TorchScript executor would keep its inference tensors
    const auto [begin, end] = validation_range(test_.size, rank_, world_);
    const int64_t step = wo_.validation_batch > 0 ? wo_.validation_batch : std::max<int64_t>(per_slot_, 64);
    std::vector<int64_t> idx;
    for (int64_t i = begin; i < end; i += step) {
      const int64_t n = std::min(step, end - i);
      idx.resize(static_cast<size_t>(n));
      std::iota(idx.begin(), idx.end(), i);
      auto [x, y] = make_batch(test_, idx.data(), n);
      const auto f = SteadyClock::now();
      auto logits = model_.forward(x);
      forward_s += seconds_since(f);
      sums[0] += torch::nn::functional::cross_entropy(
                     logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
                     .item<double>();
      sums[1] += logits.argmax(1).eq(y).sum().item<double>();
      sums[2] += static_cast<double>(n);
    }
  }
  comm_->allreduce(sums, 3, DataType::f64, ReduceOp::sum);
  model_.set_training(true);
  // Stamped when the result is known on every rank: what time to accuracy means.
  ValidationRecord v{batch, now(), sums[0] / sums[2], sums[1] / sums[2], static_cast<int64_t>(sums[2])};
  v.seconds = seconds_since(t);
  v.forward_seconds = forward_s;
  validation_seconds_ += v.seconds;
  if (log_ && batch > last_validation_logged_) log_->validation(v);  // once, when an elastic trial redoes it
  last_validation_logged_ = batch;
  return v;
}

void Trial::checkpoint(int64_t batch, const std::optional<ValidationRecord>& validation) {
  if (!checkpoints_) return;
  const auto t = SteadyClock::now();
  // The data position and every random draw (epoch order, dropout) follow from (seed, batch).
  nlohmann::json meta{{"batch", batch},       {"epoch", plan_->epoch_of(batch)},
                      {"time", now()},        {"seed", cfg_.seed},
                      {"slots", world_},      {"global_batch", cfg_.effective_global_batch()},
                      {"model", model_name()}};
  std::optional<double> metric;
  if (validation) {
    meta["metrics"] = {{"validation_loss", validation->loss}, {"validation_accuracy", validation->accuracy}};
    metric = cfg_.searcher_metric == "validation_loss" ? validation->loss : validation->accuracy;
  }
  if (batch == wo_.fail_checkpoint_batch && wo_.attempt == 0) {
    // Fault injection: this checkpoint's write kills the process midway.
    checkpoints_->drain();
    checkpoints_ = std::make_unique<CheckpointWriter>(wo_.checkpoint_dir, keep_policy(cfg_), 4096);
  }
  checkpoints_->submit(take_snapshot(batch, names_, params_, *optimizer_, std::move(meta), metric));
  const double waited = seconds_since(t);  // the snapshot, and a previous write still in flight
  checkpoint_seconds_ += waited;
  log_->line(nlohmann::json{{"kind", "checkpoint"}, {"batch", batch}, {"time", now()}, {"waited", waited}}.dump());
}

void Trial::run() {
  exchange_ = std::make_unique<GradientExchange>(
      *comm_, model_, params_, names_, cfg_.optimizations, wo_, [this](size_t i, int64_t first_row, int64_t rows) {
        update_rows(*optimizer_, params_[i], first_row, rows, optimizer_step_);
      });
  open_metrics();
  stalls_ = std::make_unique<StallReporter>(wo_.stall_factor, world_, log_.get());
  model_.set_training(true);
  last_end_ = SteadyClock::now();
  committed_ = start_;
  // Epochs begun before a resumed checkpoint are not counted whole here.
  first_epoch_counted_ = next_epoch_checked_ = (start_ + plan_->batches_per_epoch() - 1) / plan_->batches_per_epoch();
  if (joiner_) take_members_state();
  bool step_done = false;  // after a failure in validation: only the after-work is redone
  for (int64_t batch = committed_ + 1; batch <= total_;) {
    if (batch == wo_.fail_at_batch && originals_[size_t(rank_)] == wo_.fail_rank && wo_.attempt == 0) {
      const double unix_time =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
      std::fprintf(stderr, "fault injection: rank %d %s at batch %lld (unix time %.3f, pid %d)\n", rank_,
                   wo_.fail_stop ? "stopped" : "killed", static_cast<long long>(batch), unix_time, int(::getpid()));
      std::fflush(stderr);
      ::raise(wo_.fail_stop ? SIGSTOP : SIGKILL);
    }
    try {
      // An optimizer step's first batch: no gradients held yet.
      if (joiners_waiting_ > 0 && !step_done && (batch - 1) % k_ == 0) admit_joiners(batch);
      if (!step_done) train_batch(batch);
      after_batch(batch);
      ++batch;
      step_done = false;
    } catch (const tandem::Excluded&) {
      throw;  // left out, or no majority: the trial restarts from its checkpoint
    } catch (const tandem::Error& e) {
      if (!cfg_.elastic()) throw;
      const Resume r = go_on_without_lost(e, batch);
      batch = r.batch, step_done = r.step_done;
    }
  }
  log_membership_changes();  // a failure in the last validation: no step follows its redo
  if (cfg_.elastic()) check_same_parameters();
  if (chief_ && !wo_.dump_params.empty()) {
    std::ofstream out(wo_.dump_params, std::ios::binary);
    for (const auto& p : params_) {
      auto c = p.detach().contiguous();
      out.write(reinterpret_cast<const char*>(c.data_ptr<float>()),
                static_cast<std::streamsize>(c.numel() * sizeof(float)));
    }
  }
  if (checkpoints_) {
    const auto t = SteadyClock::now();
    checkpoints_->drain();  // the last checkpoint is complete before the trial ends
    checkpoint_seconds_ += seconds_since(t);
  }
  if (log_)
    log_->line(nlohmann::json{{"kind", "end"},
                              {"batch", total_},
                              {"time", now()},
                              {"gradient_bytes", exchange_->totals().payload_bytes},
                              {"wire_bytes", exchange_->totals().wire_bytes},
                              {"compression_fallbacks", exchange_->totals().fallbacks},
                              {"validation_seconds", validation_seconds_},
                              {"checkpoint_seconds", checkpoint_seconds_},
                              {"grow_calls", grow_calls_},
                              {"grow_seconds", grow_seconds_}}
                   .dump());
  comm_->barrier();
}

}  // namespace tandem::trainer
