#include "gradient_exchange.h"

#include <sys/resource.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace tandem::trainer {
namespace {

// Marks a parameter's gradient ready once AccumulateGrad has added into it
// (through the exchange: its sync is replaced after a shrink).
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(GradientExchange& exchange, size_t param) : exchange(exchange), param(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    exchange.mark_ready(param);
    return outputs;
  }
  GradientExchange& exchange;
  size_t param;
};

}  // namespace

GradientExchange::GradientExchange(Communicator& comm, Model& model, const std::vector<torch::Tensor>& params,
                                   const std::vector<std::string>& names, const Optimizations& optimizations,
                                   const WorkerOptions& options, RowUpdate update)
    : comm_(&comm),
      params_(params),
      names_(names),
      update_(std::move(update)),
      optimizations_(optimizations),
      options_(options) {
  defer_ = options.overlap && options.deferred_updates && model.gated;
  for (const auto& p : params_) {
    const auto sunk = model.sunk_parts.find(p.unsafeGetTensorImpl());
    part_counts_.push_back(sunk != model.sunk_parts.end() ? sunk->second : std::vector<size_t>{size_t(p.numel())});
    // A scalar parameter (a TorchScript module may have one) is one row.
    const size_t row = p.dim() == 0 ? 1 : size_t(p.numel() / p.size(0));
    row_begin_.push_back({0});
    for (size_t c : part_counts_.back()) row_begin_.back().push_back(row_begin_.back().back() + int64_t(c / row));
  }
  build_sync();
  // The engine thread exists now; from here this thread computes. Lowering its
  // priority lets the engine and the kernel's network work run the moment they
  // have something to do, instead of waiting out the compute thread's time
  // slice (the CPU counterpart of NCCL's high-priority streams).
  compute_nice_ = options.overlap && comm_->size() > 1 ? options.compute_nice : 0;
  if (compute_nice_ > 0 && ::setpriority(PRIO_PROCESS, 0, compute_nice_) != 0 && comm_->rank() == 0)
    std::fprintf(stderr, "warning: could not lower the compute thread's priority (nice %d): %s\n", compute_nice_,
                 std::strerror(errno));
  hook_parameters(model);
}

GradientExchange::~GradientExchange() = default;

void GradientExchange::rebind(Communicator& comm) {
  sync_.reset();  // joins the engine: the revoked communicator failed its call
  compressor_.reset();
  comm_ = &comm;
  // The new engine thread inherits this thread's nice value: it starts at 0
  // where this thread may raise its priority back (root, or RLIMIT_NICE).
  const bool renice = compute_nice_ > 0 && ::setpriority(PRIO_PROCESS, 0, 0) == 0;
  build_sync();
  if (renice) ::setpriority(PRIO_PROCESS, 0, compute_nice_);
  pending_ = false;
}

void GradientExchange::mark_ready(size_t param) noexcept { sync_->mark_ready(ids_[param][0]); }

void GradientExchange::build_sync() {
  const compression::Codec codec = *compression::parse_codec(optimizations_.gradient_compression);  // checked
  if (codec != compression::Codec::none)
    compressor_ = std::make_unique<compression::CompressedAllreduce>(
        *comm_, compression::CompressionOptions{codec, optimizations_.gradient_predivide_factor,
                                                optimizations_.error_feedback});
  sync_ = std::make_unique<fusion::GradientSync>(*comm_, sync_options());
  ids_.clear();
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& counts = part_counts_[i];
    ids_.push_back(counts.size() == 1 ? std::vector<int>{sync_->register_gradient(names_[i], counts[0])}
                                      : sync_->register_gradient_parts(names_[i], counts));
  }
  sync_->finalize(Clock::now() + std::chrono::seconds(60));
  // With the parameter's own strides (a channels-last weight's too): autograd accumulates in place.
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].mutable_grad() =
        torch::from_blob(sync_->data_as<float>(ids_[i][0]), params_[i].sizes(), params_[i].strides(), torch::kFloat32);
  unsent_.assign(size_t(kArrivalsAt + comm_->size()), fusion::Metric{});
}

fusion::GradientSyncOptions GradientExchange::sync_options() const {
  const Optimizations& opt = optimizations_;
  const WorkerOptions& options = options_;
  fusion::GradientSyncOptions so;
  so.overlap = options.overlap;
  so.fusion.fusion_threshold_bytes = static_cast<size_t>(opt.tensor_fusion_threshold_mb) << 20;
  so.aggregation_frequency = opt.aggregation_frequency;
  so.average_aggregated_gradients = opt.average_aggregated_gradients;
  so.cycle_time = std::chrono::milliseconds(opt.tensor_fusion_cycle_time_ms);
  if (defer_) so.input_layers_ahead_bytes = options.input_layers_ahead_bytes;
  so.metric_slots = kArrivalsAt + comm_->size();
  so.compression = compressor_.get();
  so.autotune.enabled = opt.auto_tune_tensor_fusion;
  if (comm_->rank() == 0 && opt.auto_tune_tensor_fusion) so.autotune.log_path = options.output_dir + "/autotune.jsonl";
  if (options.timeline) {
    std::filesystem::create_directories(options.output_dir);
    so.timeline_path = options.output_dir + "/timeline-rank" + std::to_string(comm_->rank()) + ".json";
  }
  return so;
}

void GradientExchange::hook_parameters(Model& model) {
  for (size_t i = 0; i < params_.size(); ++i) param_of_[params_[i].unsafeGetTensorImpl()] = i;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (model.sunk_parts.count(params_[i].unsafeGetTensorImpl())) continue;  // the model's sink marks it
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    acc->add_post_hook(std::make_unique<ReadyHook>(*this, i));
    accumulators_.push_back(acc);
  }
  *model.sink = [this](const torch::Tensor& p, int part) {
    sync_->mark_ready(ids_[param_of_.at(p.unsafeGetTensorImpl())][size_t(part)]);
  };
  for (const auto& counts : part_counts_) updated_.emplace_back(counts.size(), 1);
  *model.gate = [this](const torch::Tensor& p, int part) {
    if (pending_) update_part(param_of_.at(p.unsafeGetTensorImpl()), part);
  };
}

// A wait on the exchange: each bucket's collective fails first, at the
// communicator's timeout naming the peer; this bounds the wait itself.
Deadline GradientExchange::deadline() const { return Clock::now() + 2 * comm_->options().timeout; }

void GradientExchange::add_batch_metrics(fusion::Metric loss, fusion::Metric correct) {
  unsent_[0].sum += loss.sum, unsent_[0].count += loss.count;
  unsent_[1].sum += correct.sum, unsent_[1].count += correct.count;
}

void GradientExchange::send_metrics(double arrival) {
  unsent_[static_cast<size_t>(kArrivalsAt + comm_->rank())] = {arrival, 1.0 / comm_->size()};
  sync_->report_metrics(unsent_);
  std::fill(unsent_.begin(), unsent_.end(), fusion::Metric{});
}

void GradientExchange::offer_joiners(int waiting) { unsent_[kJoinersAt].sum = waiting; }

ReducedMetrics GradientExchange::reduced_metrics() const {
  const auto m = sync_->metrics();
  return {m[0], m[1], m.subspan(kArrivalsAt), int(std::lround(m[kJoinersAt].sum))};
}

void GradientExchange::defer_updates() {
  pending_ = true;
  for (auto& u : updated_) std::fill(u.begin(), u.end(), 0);
}

void GradientExchange::update_part(size_t i, int part) {
  char& done = updated_[i][size_t(part)];
  if (done) return;
  sync_->wait_gradient(ids_[i][size_t(part)], deadline());
  const int64_t begin = row_begin_[i][size_t(part)], rows = row_begin_[i][size_t(part) + 1] - begin;
  update_(i, begin, rows);
  torch::NoGradGuard no_grad;
  params_[i].mutable_grad().narrow(0, begin, rows).zero_();
  done = 1;
}

Exchanged GradientExchange::finish() {
  if (pending_) {
    for (size_t i = 0; i < params_.size(); ++i)
      for (size_t part = 0; part < updated_[i].size(); ++part) update_part(i, int(part));
    pending_ = false;
  }
  sync_->wait(deadline());
  const auto& s = sync_->last_step();
  totals_.payload_bytes += s.bytes_reduced, totals_.wire_bytes += s.wire_bytes,
      totals_.fallbacks += s.compression_fallbacks;
  return {s.communicated, s.exposed, s.communication, s.bytes_reduced, s.wire_bytes, s.compression_fallbacks};
}

void GradientExchange::zero() { sync_->zero_gradients(); }

}  // namespace tandem::trainer
