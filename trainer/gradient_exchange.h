// How one slot's gradients reach the other slots: the GradientExchange beside
// the Trial, as c10d's Reducer beside DistributedDataParallel. The Trial
// computes and steps the optimizer; the exchange owns everything between
// backward and the step:
//  - the fusion::GradientSync whose buffers the parameters' .grad tensors are
//    views of, with aggregation (k local batches, the k-th communicates) and
//    the compression state;
//  - what marks a part ready: each AccumulateGrad node's post-hook, or for a
//    sliced layer the model's gradient sink. Overlapped, a bucket is reduced
//    as soon as its parts are ready; otherwise all of them after backward;
//  - deferred updates: the model's gate updates each part as the next
//    forward first uses it, once its bucket has landed;
//  - the metric slots that travel with the gradients (trial.h).
#pragma once

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "config.h"
#include "model.h"
#include "tandem/communicator.h"
#include "tandem/compression/compression.h"
#include "tandem/fusion/gradient_sync.h"
#include "worker_options.h"

namespace tandem::trainer {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// What one step's exchange tells the loop.
struct Exchanged {
  bool communicated = false;
  double exposed = 0, communication = 0;
  uint64_t payload_bytes = 0, wire_bytes = 0, fallbacks = 0;  // of the gradients
};

// The gradients' bytes over an attempt.
struct ExchangeTotals {
  uint64_t payload_bytes = 0, wire_bytes = 0, fallbacks = 0;
};

// What the slots' metric slots summed to in the last communicating step.
struct ReducedMetrics {
  fusion::Metric loss, correct;
  std::span<const fusion::Metric> arrivals;  // one per rank
  int joiners_waiting = 0;                   // as one rank saw them (offer_joiners)
};

class GradientExchange {
 public:
  // Applies the optimizer to rows [first_row, first_row + rows) of parameter `param` (deferred updates).
  using RowUpdate = std::function<void(size_t param, int64_t first_row, int64_t rows)>;

  // Registers every parameter's parts and makes the .grad tensors views of the
  // fusion buffers, hooks them, sets the model's sink and gate, then (overlapped,
  // several slots) lowers this compute thread's priority to options.compute_nice.
  GradientExchange(Communicator& comm, Model& model, const std::vector<torch::Tensor>& params,
                   const std::vector<std::string>& names, const Optimizations& optimizations,
                   const WorkerOptions& options, RowUpdate update);
  ~GradientExchange();

  // After a shrink (elastic): the same parameters, hooks and options over the
  // survivors' communicator, on a new sync. The step in flight is dropped:
  // its gradients and unsent metrics are zero, the compression residual and
  // the autotuner start afresh. `comm` replaces the old one, which must
  // outlive this call (the old sync's engine leaves its failed call first).
  void rebind(Communicator& comm);
  // From parameter `param`'s gradient hook: its whole gradient is ready.
  void mark_ready(size_t param) noexcept;

  bool defers_updates() const { return defer_; }
  int compute_nice() const { return compute_nice_; }  // as applied (0 = unchanged)

  // One local batch's loss and correct predictions; send_metrics() hands what
  // added up since the last to this communicating step, with this rank's
  // previous batch time before its wait.
  void add_batch_metrics(fusion::Metric loss, fusion::Metric correct);
  void send_metrics(double arrival);
  // Before send_metrics, on one rank: processes waiting to join, which every
  // rank then reads in reduced_metrics() (elastic growth without a
  // collective of its own).
  void offer_joiners(int waiting);
  ReducedMetrics reduced_metrics() const;

  // This step's parts are updated as the next forward first uses them; finish() updates the rest.
  void defer_updates();
  // Waits until every bucket of the step has landed.
  Exchanged finish();
  // After the optimizer stepped on the reduced gradients.
  void zero();
  ExchangeTotals totals() const { return totals_; }

 private:
  // The compressor and the sync over comm_, every part registered, each .grad a view of its buffer.
  void build_sync();
  fusion::GradientSyncOptions sync_options() const;
  void hook_parameters(Model& model);
  void update_part(size_t param, int part);
  Deadline deadline() const;

  Communicator* comm_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  RowUpdate update_;
  Optimizations optimizations_;
  WorkerOptions options_;
  bool defer_ = false;
  bool pending_ = false;  // a deferred step's parts are still to be updated
  int compute_nice_ = 0;
  std::vector<std::vector<size_t>> part_counts_;                  // per parameter, per part: elements
  std::vector<std::vector<int64_t>> row_begin_;                   // per parameter: its parts' first rows, then the end
  std::unique_ptr<compression::CompressedAllreduce> compressor_;  // outlives the sync
  std::unique_ptr<fusion::GradientSync> sync_;
  std::vector<std::vector<int>> ids_;                                 // per parameter, per part
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;  // kept alive: they hold the hooks
  std::unordered_map<const void*, size_t> param_of_;
  std::vector<std::vector<char>> updated_;  // per parameter, per part
  // The metric slots: loss, correct, joiners waiting, then each rank's arrival.
  static constexpr size_t kJoinersAt = 2, kArrivalsAt = 3;
  std::vector<fusion::Metric> unsent_;  // the metric slots of the local batches since the last send
  ExchangeTotals totals_;
};

}  // namespace tandem::trainer
