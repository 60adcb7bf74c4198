// How one slot's gradients reach the other slots (the "exchange" of
// worker.cc): overlapped through fusion::GradientSync, or one all-reduce after backward.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "tandem/communicator.h"
#include "tandem/compression/compression.h"
#include "tandem/fusion/gradient_sync.h"

namespace tandem::trainer {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// What one batch's exchange tells the loop.
struct Exchanged {
  bool communicated = false;
  double exposed = 0, communication = 0;
  uint64_t payload_bytes = 0, wire_bytes = 0, fallbacks = 0;  // of the gradients
};

// A parameter's gradient: its name and its parts' element counts, in row order.
struct GradientParts {
  std::string name;
  std::vector<size_t> counts;
};

class Exchange {
 public:
  virtual ~Exchange() = default;
  // The parameter's whole gradient (its parts back to back).
  virtual float* storage(size_t param) = 0;
  virtual void mark_ready(size_t param, int part) = 0;
  virtual void report(std::span<const fusion::Metric> metrics) = 0;
  virtual Exchanged finish(Deadline deadline) = 0;
  // Before finish(): until that part is reduced (deferred updates).
  virtual void wait_for(size_t param, int part, Deadline deadline) = 0;
  virtual std::span<const fusion::Metric> metrics() const = 0;
  virtual void zero() = 0;
};

class OverlappedExchange : public Exchange {
 public:
  OverlappedExchange(Communicator& comm, fusion::GradientSyncOptions o, const std::vector<GradientParts>& params)
      : sync_(comm, std::move(o)) {
    for (const auto& p : params)
      ids_.push_back(p.counts.size() == 1 ? std::vector<int>{sync_.register_gradient(p.name, p.counts[0])}
                                          : sync_.register_gradient_parts(p.name, p.counts));
    sync_.finalize(Clock::now() + std::chrono::seconds(60));
  }
  float* storage(size_t param) override { return sync_.data_as<float>(ids_[param][0]); }
  void mark_ready(size_t param, int part) override { sync_.mark_ready(ids_[param][size_t(part)]); }
  void report(std::span<const fusion::Metric> m) override { sync_.report_metrics(m); }
  Exchanged finish(Deadline deadline) override {
    sync_.wait(deadline);
    const auto& s = sync_.last_step();
    return {s.communicated, s.exposed, s.communication, s.bytes_reduced, s.wire_bytes, s.compression_fallbacks};
  }
  void wait_for(size_t param, int part, Deadline deadline) override {
    sync_.wait_gradient(ids_[param][size_t(part)], deadline);
  }
  std::span<const fusion::Metric> metrics() const override { return sync_.metrics(); }
  void zero() override { sync_.zero_gradients(); }

 private:
  fusion::GradientSync sync_;
  std::vector<std::vector<int>> ids_;  // per parameter, per part
};

// Gradients in one allocate_shared buffer, reduced after backward; metrics by a
// second small all-reduce. Aggregation as the overlapped sync: local batches
// accumulate, the k-th communicates (divided by k when averaging aggregated gradients).
class PlainExchange : public Exchange {
 public:
  PlainExchange(Communicator& comm, const std::vector<GradientParts>& params, int aggregation, bool average_aggregated,
                int metric_slots, compression::CompressedAllreduce* compressor)
      : comm_(comm), k_(aggregation), average_aggregated_(average_aggregated), compressor_(compressor),
        pending_(metric_slots), result_(metric_slots) {
    size_t total = 0;
    for (const auto& p : params) {
      offsets_.push_back(total);
      for (size_t c : p.counts) total += c;
      total = (total + 15) / 16 * 16;
    }
    count_ = total;
    buffer_ = static_cast<float*>(comm_.allocate_shared(total * sizeof(float)));
    if (compressor_ && compressor_->options().error_feedback) residual_.assign(count_, 0.0f);
  }
  ~PlainExchange() override { comm_.free_shared(buffer_); }
  float* storage(size_t param) override { return buffer_ + offsets_[param]; }
  void mark_ready(size_t, int) override {}
  void report(std::span<const fusion::Metric> m) override { std::copy_n(m.begin(), std::min(m.size(), pending_.size()), pending_.begin()); }
  Exchanged finish(Deadline) override {
    if (++local_ < k_) return {false, 0, 0};
    local_ = 0;
    const auto t = SteadyClock::now();
    Exchanged ex{true};
    ex.payload_bytes = ex.wire_bytes = count_ * sizeof(float);
    if (compressor_) {
      const auto before = compressor_->stats();
      compressor_->allreduce(buffer_, count_, ReduceOp::avg, {}, residual_.empty() ? nullptr : residual_.data());
      ex.wire_bytes = compressor_->stats().wire_bytes - before.wire_bytes;
      ex.fallbacks = compressor_->stats().fallbacks - before.fallbacks;
    } else {
      comm_.allreduce(buffer_, count_, DataType::f32, ReduceOp::avg);
    }
    if (k_ > 1 && average_aggregated_) {
      const float scale = 1.0f / static_cast<float>(k_);
      for (size_t i = 0; i < count_; ++i) buffer_[i] *= scale;
    }
    std::vector<double> m(2 * pending_.size());
    for (size_t i = 0; i < pending_.size(); ++i) m[2 * i] = pending_[i].sum, m[2 * i + 1] = pending_[i].count;
    comm_.allreduce(m.data(), m.size(), DataType::f64, ReduceOp::sum);
    for (size_t i = 0; i < pending_.size(); ++i) result_[i] = {m[2 * i], m[2 * i + 1]}, pending_[i] = {};
    ex.exposed = ex.communication = seconds_since(t);
    return ex;
  }
  void wait_for(size_t, int, Deadline) override {}  // finish() reduces everything
  std::span<const fusion::Metric> metrics() const override { return result_; }
  void zero() override { std::fill(buffer_, buffer_ + count_, 0.0f); }

 private:
  Communicator& comm_;
  int k_;
  bool average_aggregated_;
  compression::CompressedAllreduce* compressor_;
  std::vector<float> residual_;  // error feedback
  int local_ = 0;
  std::vector<size_t> offsets_;
  size_t count_ = 0;
  float* buffer_ = nullptr;
  std::vector<fusion::Metric> pending_, result_;
};

}  // namespace tandem::trainer
