// One slot's training loop. Terms as in config.h, data.h and metrics.h; and:
//  - part: what is marked ready and reduced on its own: a parameter's whole
//    gradient, or one row block of a sliced layer's weight (model.h).
//  - exchange: how gradients reach the other slots. Overlapped: through
//    fusion::GradientSync, the parameters' .grad tensors being views of its
//    fusion buffers and each AccumulateGrad node's post-hook (or, for a
//    sliced layer, the model's gradient sink) marking a part ready, so
//    buckets are reduced while backward continues.
//    Not overlapped (--no-overlap): the same views into one shared buffer,
//    reduced by one all-reduce after backward. Either way a
//    compression::CompressedAllreduce puts fp16/bf16 on the wire when
//    optimizations.gradient_compression asks for it.
//  - deferred update (overlapped, by default): a communicating batch ends
//    after backward. Each part is updated when the next forward first uses
//    it (the model's gate), as soon as its bucket has landed, so that
//    forward starts while the last buckets are still on the wire; the
//    exchange closes after it. Every batch with a validation or checkpoint
//    after it, and the last, ends at once.
//  - metric slots: what travels with the gradients each communicating batch:
//    summed loss and correct predictions with their sample counts, then one
//    slot per rank holding that rank's previous batch time before its wait
//    (so the chief can name the rank that arrived last at a stall).
#include "worker.h"

#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <torch/torch.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "checkpoint.h"
#include "config.h"
#include "data.h"
#include "exchange.h"
#include "metrics.h"
#include "model.h"
#include "tandem/compression/compression.h"
#include "tandem/fusion/gradient_sync.h"
#include "tandem/ring/ring.h"

namespace tandem::trainer {
namespace {

using fusion::Metric;

// Marks a parameter's gradient ready once AccumulateGrad has added into it.
struct ReadyHook : torch::autograd::FunctionPostHook {
  ReadyHook(Exchange& e, size_t param) : exchange(e), param(param) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list&) override {
    exchange.mark_ready(param, 0);
    return outputs;
  }
  Exchange& exchange;
  size_t param;
};

// torch::optim::SGD's step for rows [begin, begin + rows) of one parameter,
// in its arithmetic and on its state (so checkpoints and results are the same
// as optimizer.step()). A momentum buffer first made for a part of the
// parameter starts at zero: with no dampening, the same first step as SGD's
// copy of the gradient.
void sgd_update(torch::optim::SGD& optimizer, const torch::Tensor& p, int64_t begin, int64_t rows) {
  torch::NoGradGuard no_grad;
  const auto& o = static_cast<const torch::optim::SGDOptions&>(optimizer.param_groups().at(0).options());
  const bool whole = rows == p.size(0);
  auto param = p.data().narrow(0, begin, rows);
  auto d_p = p.grad().data().narrow(0, begin, rows);
  if (o.weight_decay() != 0) d_p = d_p.add(param, o.weight_decay());
  if (o.momentum() != 0) {
    const std::string key = c10::guts::to_string(p.unsafeGetTensorImpl());
    auto& state = optimizer.state();
    const auto found = state.find(key);
    const bool fresh = found == state.end();
    torch::Tensor buf;  // the whole parameter's
    if (fresh && whole) {
      buf = torch::clone(d_p).detach();
    } else {
      if (fresh && o.dampening() != 0) throw std::logic_error("row-block SGD updates need dampening 0");
      buf = fresh ? torch::zeros_like(p.data())
                  : static_cast<torch::optim::SGDParamState&>(*found->second).momentum_buffer();
      buf.narrow(0, begin, rows).mul_(o.momentum()).add_(d_p, 1 - o.dampening());
    }
    if (fresh) {
      auto entry = std::make_unique<torch::optim::SGDParamState>();
      entry->momentum_buffer(buf);
      state[key] = std::move(entry);
    }
    buf = buf.narrow(0, begin, rows);
    d_p = o.nesterov() ? d_p.add(buf, o.momentum()) : buf;
  }
  param.add_(d_p, -1 * o.lr());
}

std::string save_to_string(const std::function<void(torch::serialize::OutputArchive&)>& fill) {
  torch::serialize::OutputArchive archive;
  fill(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

torch::serialize::InputArchive archive_from(const std::string& blob) {
  std::istringstream in(blob);
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  return archive;
}

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

int run_worker(const WorkerOptions& wo) {
  ExperimentConfig cfg = load_config(wo.config_path);
  if (wo.slots > 0 || wo.per_slot_batch > 0) set_slots(cfg, wo.slots > 0 ? wo.slots : cfg.slots_per_trial, wo.per_slot_batch);
  torch::set_num_threads(1);
  at::set_num_interop_threads(1);

  auto comm = ring::connect_from_env();
  const int rank = comm->rank(), world = comm->size();
  if (world != cfg.slots_per_trial)
    throw std::runtime_error("started with " + std::to_string(world) + " ranks for " +
                             std::to_string(cfg.slots_per_trial) + " slots");
  const bool chief = rank == 0;
  const auto& opt = cfg.optimizations;
  const int k = opt.aggregation_frequency;

  // Data
  const auto t_load = SteadyClock::now();
  Dataset train, test;
  if (cfg.data == "synthetic") {
    train = synthetic_dataset(cfg.records_per_epoch > 0 ? cfg.records_per_epoch : 60000, cfg.seed, true);
    test = synthetic_dataset(10000, cfg.seed, false);
  } else {
    train = load_fashion_mnist(cfg.data_path, true);
    test = load_fashion_mnist(cfg.data_path, false);
  }
  const int64_t records_per_epoch = cfg.records_per_epoch > 0 ? std::min(cfg.records_per_epoch, train.size) : train.size;
  const int64_t per_slot = cfg.per_slot_batch();
  BatchPlan plan(records_per_epoch, cfg.effective_global_batch(), per_slot, cfg.seed);
  int64_t total = wo.max_batches > 0 ? wo.max_batches : cfg.to_batches(cfg.max_length, records_per_epoch);
  total = (total + k - 1) / k * k;  // whole optimizer steps
  auto round_up = [&](int64_t b) { return b <= 0 ? int64_t{0} : (b + k - 1) / k * k; };
  const int64_t validate_every = cfg.min_validation_period.set() ? round_up(cfg.to_batches(cfg.min_validation_period, records_per_epoch)) : 0;
  const int64_t checkpoint_every = cfg.min_checkpoint_period.set() ? round_up(cfg.to_batches(cfg.min_checkpoint_period, records_per_epoch)) : validate_every;

  // Model: the same initial parameters everywhere (seeded, then the chief's broadcast).
  torch::manual_seed(cfg.seed);
  Model model = make_model(cfg.model, cfg.mlp_hidden, cfg.dropout, cfg.layer_slices);
  std::vector<torch::Tensor> params;
  std::vector<std::string> names;
  for (const auto& p : model.module->named_parameters()) params.push_back(p.value()), names.push_back(p.key());
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params) comm->broadcast(p.data_ptr<float>(), static_cast<size_t>(p.numel()), DataType::f32, 0);
  }
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(cfg.learning_rate)
                                          .momentum(cfg.momentum)
                                          .weight_decay(cfg.weight_decay));

  // Resume
  int64_t start = 0;
  double elapsed_before = 0;
  std::vector<std::string> warnings;
  if (wo.resume && !wo.checkpoint_dir.empty()) {
    if (auto found = latest_checkpoint(wo.checkpoint_dir, &warnings)) {
      auto meta = nlohmann::json::parse(found->blobs.at("meta"));
      start = meta.at("batch").get<int64_t>();
      elapsed_before = meta.at("time").get<double>();
      auto ma = archive_from(found->blobs.at("model"));
      torch::NoGradGuard no_grad;
      for (size_t i = 0; i < params.size(); ++i) {
        torch::Tensor t;
        ma.read(names[i], t);
        params[i].copy_(t);
      }
      auto oa = archive_from(found->blobs.at("optimizer"));
      optimizer.load(oa);
      if (chief) std::fprintf(stderr, "resuming from %s (batch %lld)\n", found->path.c_str(), static_cast<long long>(start));
    }
  }
  if (chief)
    for (const auto& w : warnings) std::fprintf(stderr, "warning: %s\n", w.c_str());

  // Exchange and gradient views. A part's rows: [row_begin[i][k], row_begin[i][k + 1]).
  std::vector<GradientParts> parts;
  std::vector<std::vector<int64_t>> row_begin;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto sunk = model.sunk_parts.find(params[i].unsafeGetTensorImpl());
    parts.push_back({names[i], sunk != model.sunk_parts.end() ? sunk->second
                                                               : std::vector<size_t>{size_t(params[i].numel())}});
    const size_t row = size_t(params[i].numel() / params[i].size(0));
    row_begin.push_back({0});
    for (size_t c : parts.back().counts) row_begin.back().push_back(row_begin.back().back() + int64_t(c / row));
  }
  const int metric_slots = 2 + world;
  const compression::Codec codec = *compression::parse_codec(opt.gradient_compression);  // checked by the config
  std::unique_ptr<compression::CompressedAllreduce> compressor;  // outlives the exchange
  if (codec != compression::Codec::none)
    compressor = std::make_unique<compression::CompressedAllreduce>(
        *comm, compression::CompressionOptions{codec, opt.gradient_predivide_factor, opt.error_feedback});
  std::unique_ptr<Exchange> exchange;
  if (wo.overlap) {
    fusion::GradientSyncOptions so;
    so.fusion.fusion_threshold_bytes = static_cast<size_t>(opt.tensor_fusion_threshold_mb) << 20;
    so.aggregation_frequency = k;
    so.average_aggregated_gradients = opt.average_aggregated_gradients;
    so.cycle_time = std::chrono::milliseconds(opt.tensor_fusion_cycle_time_ms);
    if (wo.deferred_updates) so.input_layers_ahead_bytes = wo.input_layers_ahead_bytes;
    so.metric_slots = metric_slots;
    so.compression = compressor.get();
    so.autotune.enabled = opt.auto_tune_tensor_fusion;
    if (chief && opt.auto_tune_tensor_fusion) so.autotune.log_path = wo.output_dir + "/autotune.jsonl";
    if (wo.timeline) {
      std::filesystem::create_directories(wo.output_dir);
      so.timeline_path = wo.output_dir + "/timeline-rank" + std::to_string(rank) + ".json";
    }
    exchange = std::make_unique<OverlappedExchange>(*comm, so, parts);
  } else {
    exchange = std::make_unique<PlainExchange>(*comm, parts, k, opt.average_aggregated_gradients, metric_slots,
                                               compressor.get());
  }
  // The engine thread exists now; from here this thread computes. Lowering its
  // priority lets the engine and the kernel's network work run the moment they
  // have something to do, instead of waiting out the compute thread's time
  // slice (the CPU counterpart of NCCL's high-priority streams).
  const int compute_nice = wo.overlap && world > 1 ? wo.compute_nice : 0;
  if (compute_nice > 0 && ::setpriority(PRIO_PROCESS, 0, compute_nice) != 0 && chief)
    std::fprintf(stderr, "warning: could not lower the compute thread's priority (nice %d): %s\n", compute_nice,
                 std::strerror(errno));
  std::unordered_map<const void*, size_t> param_of;
  for (size_t i = 0; i < params.size(); ++i) param_of[params[i].unsafeGetTensorImpl()] = i;
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators;  // kept alive: they hold the hooks
  for (size_t i = 0; i < params.size(); ++i) {
    params[i].mutable_grad() = torch::from_blob(exchange->storage(i), params[i].sizes(), torch::kFloat32);
    if (model.sunk_parts.count(params[i].unsafeGetTensorImpl())) continue;  // the model's sink marks it
    auto acc = torch::autograd::impl::grad_accumulator(params[i]);
    acc->add_post_hook(std::make_unique<ReadyHook>(*exchange, i));
    accumulators.push_back(acc);
  }
  *model.sink = [&](const torch::Tensor& p, int part) { exchange->mark_ready(param_of.at(p.unsafeGetTensorImpl()), part); };

  std::unique_ptr<MetricsWriter> log;
  if (chief) {
    std::filesystem::create_directories(wo.output_dir);
    log = std::make_unique<MetricsWriter>(wo.output_dir + "/metrics.jsonl", start > 0 ? start : -1);
    log->line(nlohmann::json{{"kind", "start"}, {"batch", start}, {"time", elapsed_before}, {"slots", world},
                             {"global_batch", cfg.effective_global_batch()}, {"per_slot_batch", per_slot},
                             {"model", cfg.model}, {"data", cfg.data}, {"total_batches", total},
                             {"overlap", wo.overlap}, {"compute_nice", compute_nice},
                             {"deferred_updates", wo.overlap && wo.deferred_updates}, {"attempt", wo.attempt},
                             {"gradient_compression", opt.gradient_compression},
                             {"gradient_predivide_factor", opt.gradient_predivide_factor},
                             {"error_feedback", opt.error_feedback},
                             {"transport", comm->transport_summary()},
                             {"load_seconds", seconds_since(t_load)},
                             {"resumed_from", start > 0 ? start : -1}}
                  .dump());
  }

  auto validate = [&](int64_t batch, double now) {
    model.module->eval();
    torch::NoGradGuard no_grad;
    auto [begin, end] = validation_range(test.size, rank, world);
    double sums[3] = {0, 0, 0};
    std::vector<int64_t> idx;
    for (int64_t i = begin; i < end; i += 500) {
      const int64_t n = std::min<int64_t>(500, end - i);
      idx.resize(static_cast<size_t>(n));
      std::iota(idx.begin(), idx.end(), i);
      auto [x, y] = make_batch(test, idx.data(), n);
      auto logits = model.forward(x);
      sums[0] += torch::nn::functional::cross_entropy(logits, y, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)).item<double>();
      sums[1] += logits.argmax(1).eq(y).sum().item<double>();
      sums[2] += static_cast<double>(n);
    }
    comm->allreduce(sums, 3, DataType::f64, ReduceOp::sum);
    model.module->train();
    ValidationRecord v{batch, now, sums[0] / sums[2], sums[1] / sums[2], static_cast<int64_t>(sums[2])};
    if (log) log->validation(v);
    return v;
  };

  auto checkpoint = [&](int64_t batch, double now) {
    if (!chief || wo.checkpoint_dir.empty()) return;
    std::filesystem::create_directories(wo.checkpoint_dir);
    Blobs blobs;
    blobs["model"] = save_to_string([&](auto& a) {
      for (size_t i = 0; i < params.size(); ++i) a.write(names[i], params[i].detach());
    });
    blobs["optimizer"] = save_to_string([&](auto& a) { optimizer.save(a); });
    // The data position and every random draw (epoch order, dropout) follow from (seed, batch).
    blobs["meta"] = nlohmann::json{{"batch", batch}, {"epoch", plan.epoch_of(batch)}, {"time", now},
                                   {"seed", cfg.seed}, {"slots", world}, {"global_batch", cfg.effective_global_batch()},
                                   {"model", cfg.model}}
                        .dump();
    write_checkpoint(checkpoint_path(wo.checkpoint_dir, batch), blobs);
    prune_checkpoints(wo.checkpoint_dir, 2);
    log->line(nlohmann::json{{"kind", "checkpoint"}, {"batch", batch}, {"time", now}}.dump());
  };

  // Training
  model.module->train();
  StallDetector stalls(wo.stall_factor, 50);
  const auto t0 = SteadyClock::now();
  double previous_arrival = 0;  // this rank's previous batch time before its wait
  TrainRecord pending_stall;
  double pending_median = 0;
  bool stall_pending = false;
  std::vector<Metric> unreported(static_cast<size_t>(metric_slots));
  uint64_t payload_bytes = 0, wire_bytes = 0, fallbacks = 0;  // gradients, this attempt
  const Deadline far = Clock::now() + std::chrono::hours(24 * 365);

  // A batch past backward whose exchange has not ended yet.
  struct Open {
    int64_t batch = 0;
    SteadyClock::time_point start;
    double data = 0, own_loss = 0, own_accuracy = 0;
  };
  std::optional<Open> deferred;  // its parameters are updated by the next forward
  std::vector<std::vector<char>> updated;  // per parameter, per part
  for (const auto& p : parts) updated.emplace_back(p.counts.size(), 1);
  auto update = [&](size_t i, int part) {
    char& done = updated[i][size_t(part)];
    if (done) return;
    exchange->wait_for(i, part, far);
    const int64_t begin = row_begin[i][size_t(part)], rows = row_begin[i][size_t(part) + 1] - begin;
    sgd_update(optimizer, params[i], begin, rows);
    torch::NoGradGuard no_grad;
    params[i].mutable_grad().narrow(0, begin, rows).zero_();
    done = 1;
  };
  *model.gate = [&](const torch::Tensor& p, int part) {
    if (deferred) update(param_of.at(p.unsafeGetTensorImpl()), part);
  };
  const bool defer = wo.overlap && wo.deferred_updates;
  auto last_end = t0;

  // Ends batch b's exchange (updating what the forward left), then logs it.
  auto complete = [&](const Open& b, bool was_deferred) {
    Exchanged ex;
    if (was_deferred) {
      for (size_t i = 0; i < params.size(); ++i)
        for (size_t part = 0; part < updated[i].size(); ++part) update(i, int(part));
      ex = exchange->finish(far);
    } else {
      ex = exchange->finish(far);
      if (ex.communicated) {
        optimizer.step();
        exchange->zero();
      }
    }
    payload_bytes += ex.payload_bytes, wire_bytes += ex.wire_bytes, fallbacks += ex.fallbacks;
    const auto end = SteadyClock::now();
    // From the batch's start, or from the previous batch's end where that came later (a deferred one).
    const double step_s = std::chrono::duration<double>(end - std::max(b.start, last_end)).count();
    last_end = end;
    if (!chief) return;
    TrainRecord r;
    r.batch = b.batch;
    r.epoch = plan.epoch_of(b.batch - 1);
    r.time = elapsed_before + std::chrono::duration<double>(end - t0).count();
    const auto m = exchange->metrics();
    if (opt.average_training_metrics && ex.communicated) {
      r.loss = m[0].mean(), r.accuracy = m[1].mean();
    } else {
      r.loss = b.own_loss, r.accuracy = b.own_accuracy;  // the chief's own (Determined without averaging)
    }
    r.step = step_s;
    r.data = b.data;
    r.exposed = ex.exposed;
    r.communication = ex.communication;
    r.compute = std::max(0.0, step_s - b.data - ex.exposed);
    r.samples_per_s = static_cast<double>(cfg.effective_global_batch()) / step_s;
    r.communicated = ex.communicated;
    log->train(r);
    // A stall is reported one communicating batch later, when every rank's arrival time has come in.
    if (stall_pending && ex.communicated) {
      int last = 0;
      for (int i = 1; i < world; ++i)
        if (m[static_cast<size_t>(2 + i)].sum > m[static_cast<size_t>(2 + last)].sum) last = i;
      const double arrival = m[static_cast<size_t>(2 + last)].sum;
      log->stall(pending_stall, pending_median, last, arrival);
      std::fprintf(stderr,
                   "stall: batch %lld took %.0f ms (%.1fx the median %.0f ms): data %.0f ms, compute %.0f ms, "
                   "exposed communication %.0f ms; rank %d arrived last (%.0f ms before its wait)\n",
                   static_cast<long long>(pending_stall.batch), 1e3 * pending_stall.step,
                   pending_stall.step / pending_median, 1e3 * pending_median, 1e3 * pending_stall.data,
                   1e3 * pending_stall.compute, 1e3 * pending_stall.exposed, last, 1e3 * arrival);
      stall_pending = false;
    }
    const double median_before = stalls.median();
    if (stalls.add(step_s)) pending_stall = r, pending_median = median_before, stall_pending = true;
  };

  for (int64_t batch = start + 1; batch <= total; ++batch) {
    if (batch == wo.fail_at_batch && rank == wo.fail_rank && wo.attempt == 0) {
      std::fprintf(stderr, "fault injection: rank %d killed at batch %lld\n", rank, static_cast<long long>(batch));
      std::fflush(stderr);
      ::raise(SIGKILL);
    }
    Open b{batch, SteadyClock::now()};
    const auto idx = plan.shard(batch - 1, rank);
    auto [x, y] = make_batch(train, idx.data(), per_slot);
    b.data = seconds_since(b.start);
    torch::manual_seed(cfg.seed * 1000003 + static_cast<uint64_t>(batch) * 131 + static_cast<uint64_t>(rank));  // dropout
    auto logits = model.forward(x);
    if (deferred) {
      complete(*deferred, true);
      deferred.reset();
    }
    auto loss = torch::nn::functional::cross_entropy(logits, y);
    {
      torch::NoGradGuard no_grad;
      const double n = static_cast<double>(per_slot);
      const Metric batch_loss{loss.item<double>() * n, n}, batch_correct{logits.argmax(1).eq(y).sum().item<double>(), n};
      b.own_loss = batch_loss.mean(), b.own_accuracy = batch_correct.mean();
      // Reported once per communicating batch, summed over aggregation's local batches.
      unreported[0].sum += batch_loss.sum, unreported[0].count += n;
      unreported[1].sum += batch_correct.sum, unreported[1].count += n;
      if (batch % k == 0) {
        unreported[static_cast<size_t>(2 + rank)] = {previous_arrival, 1.0 / world};
        exchange->report(unreported);
        std::fill(unreported.begin(), unreported.end(), Metric{});
      }
    }
    loss.backward();
    previous_arrival = seconds_since(b.start);
    const bool last_batch = batch == total;
    const bool validate_now = (validate_every > 0 && batch % validate_every == 0) || last_batch;
    const bool checkpoint_now = (checkpoint_every > 0 && batch % checkpoint_every == 0) || last_batch;
    if (defer && batch % k == 0 && !validate_now && !checkpoint_now) {
      deferred = b;
      for (auto& u : updated) std::fill(u.begin(), u.end(), 0);
      continue;
    }
    complete(b, false);
    if (validate_now) validate(batch, elapsed_before + seconds_since(t0));
    if (checkpoint_now) checkpoint(batch, elapsed_before + seconds_since(t0));
  }

  if (chief && !wo.dump_params.empty()) {
    std::ofstream out(wo.dump_params, std::ios::binary);
    for (const auto& p : params) {
      auto c = p.detach().contiguous();
      out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), static_cast<std::streamsize>(c.numel() * sizeof(float)));
    }
  }
  if (log)
    log->line(nlohmann::json{{"kind", "end"}, {"batch", total}, {"time", elapsed_before + seconds_since(t0)},
                             {"gradient_bytes", payload_bytes}, {"wire_bytes", wire_bytes},
                             {"compression_fallbacks", fallbacks}}
                  .dump());
  comm->barrier();
  return 0;
}

}  // namespace tandem::trainer
