// Gradient synchronisation that overlaps the backward pass ("wait-free
// backprop"): gradients are reduced across ranks in fused buckets while
// backward is still computing earlier layers.
//
// Terms:
//  - gradient: one registered tensor (a parameter's gradient), by id in
//    registration (model) order.
//  - arena: one allocate_shared buffer per dtype holding every gradient in
//    *reverse* registration order (the order backward produces them), each
//    start aligned to 64 bytes. Gradients registered with register_gradient()
//    live there (DDP's gradient_as_bucket_view): the framework writes them in
//    place, nothing is copied in or out, and on one host the all-reduce reads
//    peers' arenas directly.
//  - bucket: a contiguous range of an arena, reduced by one all-reduce. The
//    first bucket (the last layers) is small so communication starts early;
//    the others fill up to the fusion threshold. Re-bucketing (autotune) moves
//    only range boundaries, never memory, so a new setting can never race a
//    gradient in flight.
//  - step: one backward pass, closed by wait(). With aggregation_frequency k,
//    only every k-th step communicates; the framework accumulates into the
//    gradient storage in between (as PyTorch adds into .grad, DDP's no_sync).
//
// Use: register every gradient, finalize() (collective: checks that every
// rank registered the same tensors), then per step call mark_ready(id) from
// the autograd hooks as gradients are produced, and wait() before the
// optimizer step. A bucket's all-reduce starts on the sync's engine thread the
// moment its last gradient is ready, in bucket order on every rank. While a
// step is open (from its first mark_ready to wait() returning) the engine
// owns the communicator: issue no other collective on it then, or ranks may
// order them differently (the rule NCCL and Horovod have for one stream).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tandem/communicator.h"

namespace tandem::compression {
class CompressedAllreduce;
}

namespace tandem::fusion {

// The knobs the autotuner moves; the same on every rank at every step.
struct FusionSettings {
  size_t fusion_threshold_bytes = 25 << 20;  // largest bucket (Horovod's fusion threshold, DDP's bucket_cap_mb)
  size_t first_bucket_bytes = 1 << 20;       // the bucket holding the last layers (DDP: 1 MiB)
  size_t chunk_bytes = 0;                    // the all-reduce's pipeline chunk; 0 = the communicator's
  bool operator==(const FusionSettings&) const = default;
};

struct AutotuneOptions {
  bool enabled = false;  // Determined's auto_tune_tensor_fusion
  int warmup_steps = 3;  // communicating steps ignored before the first sample
  int steps_per_sample = 3;
  int max_samples = 20;  // Bayesian-optimisation trials before settling
  // After settling, retune when the mean step time of two trials in a row
  // drifts from the settled one by more than this fraction (0 = never).
  double retune_drift = 0.5;
  std::string log_path;  // every trial and the choice as JSON lines; empty = none
};

struct GradientSyncOptions {
  FusionSettings fusion;
  bool average = true;  // divide by the world size (else sum)
  int aggregation_frequency = 1;
  bool average_aggregated_gradients = true;  // divide by aggregation_frequency too (Determined)
  // A gradient not marked ready by wait() is reduced as zeros on that rank
  // instead of failing every rank with its name.
  bool allow_unused = false;
  // false: a bucket waits for wait() (or wait_gradient()) before it is
  // reduced, whatever its readiness: every gradient after backward, none
  // during it (the baseline that shows what overlap buys; same arithmetic).
  bool overlap = true;
  // Determined's tensor_fusion_cycle_time. Buckets here are fixed and launch
  // the moment their last gradient is ready, so there is no batching cycle to
  // wait out: the value only bounds how long the idle engine sleeps between
  // checks for shutdown.
  std::chrono::milliseconds cycle_time{5};
  // Averaged (sum, count) training metrics carried by the step's last bucket.
  int metric_slots = 0;
  // With wait_gradient(): the last bucket (the input-side layers, needed first
  // by the next forward) holds at most input_bucket_bytes (at least one
  // gradient) and is reduced ahead of the buckets before it that together
  // hold at most input_layers_ahead_bytes, which follow it in reverse, so the
  // next forward can start on it while those are still in flight, and gets
  // them in the order it uses them (P3's priorities, in an order fixed on
  // every rank). The metrics then travel on their own. 0 = bucket order.
  size_t input_layers_ahead_bytes = 0;
  size_t input_bucket_bytes = 256 << 10;
  AutotuneOptions autotune;
  std::string timeline_path;  // Chrome trace-event JSON (Perfetto, chrome://tracing); empty = off
  // fp16/bf16 on the wire for f32 buckets (owned by the caller, outlives the
  // sync; needs the sync created on a Communicator); null = none. With its
  // error_feedback option the sync keeps a residual per f32 gradient element.
  // The metrics tail then travels on its own, in f32.
  compression::CompressedAllreduce* compression = nullptr;
};

// A training metric to average across ranks exactly: sum over ranks of `sum`
// divided by the sum over ranks of `count` (e.g. summed loss and sample count).
struct Metric {
  double sum = 0;
  double count = 0;
  double mean() const { return count > 0 ? sum / count : 0; }
};

// One step's account; times in seconds.
struct StepStats {
  uint64_t step = 0;
  bool communicated = false;           // false on the local steps of gradient aggregation
  double compute = 0;                  // from the previous wait() returning to this wait() being called
  double communication = 0;            // sum of the buckets' all-reduce times
  double exposed = 0;                  // time blocked in wait()
  double hidden_fraction = 0;          // 1 - exposed / communication, in [0, 1]
  uint64_t bytes_reduced = 0;          // payload bytes of this step's buckets
  uint64_t wire_bytes = 0;             // bytes actually reduced (less with compression)
  uint64_t compression_fallbacks = 0;  // compressed buckets re-sent in f32 (inf/NaN in 16 bits)
  double compression_casts = 0;        // seconds encoding, scanning and decoding compressed buckets
  // Estimated seconds of communication compression saved this step: each compressed
  // bucket's time less its casts, scaled by the bytes it did not send, less the casts.
  // Negative where copies, not a link, bound the time (one host). Measure with
  // `tandem bench overlap --compress none,fp16` to see the real difference.
  double compression_saved = 0;
  int buckets = 0;
  FusionSettings settings;  // in force during this step
};

// What the sync needs of a communicator. Communicator provides it; tests also
// run the engine over ranks that are threads of one process.
class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void allreduce(void* data, size_t count, DataType dtype, ReduceOp op, const CollectiveOptions& opts) = 0;
  virtual void allgather(const void* input, void* output, size_t count, DataType dtype,
                         const CollectiveOptions& opts) = 0;
  virtual void broadcast(void* data, size_t count, DataType dtype, int root, const CollectiveOptions& opts) = 0;
  virtual void* allocate_shared(size_t bytes) = 0;
  virtual void free_shared(void* p) = 0;
};

class GradientSync {
 public:
  GradientSync(Communicator& comm, GradientSyncOptions options);
  GradientSync(std::shared_ptr<Collectives> collectives, GradientSyncOptions options);
  ~GradientSync();
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;

  // Registration, in model order, before finalize(). Returns the id.
  // The storage lives in the fusion buffer: data(id) after finalize().
  int register_gradient(const std::string& name, size_t count, DataType dtype = DataType::f32);
  // The framework keeps the storage; it is copied into the bucket when the
  // bucket launches and the result copied back.
  int register_external(const std::string& name, void* data, size_t count, DataType dtype = DataType::f32);
  // One gradient that backward produces in parts, such as a large layer's
  // weight computed in row blocks: each part ("name[k]") is a gradient of its
  // own, marked ready and reduced on its own, so the first parts are on the
  // wire while backward computes the rest. The parts follow each other in the
  // arena, part 0 first, so data(ids[0]) holds the whole gradient. Backward
  // should produce part 0 first; with input_layers_ahead_bytes the last parts
  // land first after backward, so the next forward should use them last part
  // first. Every part but the last must hold a multiple of 64 bytes. Returns
  // the parts' ids, part 0 first (registered last: ids fall with k).
  std::vector<int> register_gradient_parts(const std::string& name, std::span<const size_t> part_counts,
                                           DataType dtype = DataType::f32);

  // Lays out arenas and buckets and starts the engine. Collective: every rank
  // must have registered the same names, counts and dtypes in the same order,
  // else every rank throws InvalidArgument naming the first differing tensor
  // and the ranks.
  void finalize(Deadline deadline);

  size_t gradient_count() const;
  const std::string& name(int id) const;
  // The gradient's storage (in the arena, or the external pointer); zero-filled at finalize().
  void* data(int id) const;
  template <class T>
  T* data_as(int id) const {
    return static_cast<T*>(data(id));
  }

  // From any thread (autograd hooks): records that gradient `id` holds this
  // step's value. Lock-free, no allocation, no communication here; errors
  // (unknown id, marked twice) are raised by wait().
  void mark_ready(int id) noexcept;

  // This step's metrics (metric_slots of them), before wait(); they travel
  // with the step's last bucket. Accumulated over aggregation's local steps.
  void report_metrics(std::span<const Metric> metrics);
  // The averaged metrics of the last communicating step.
  std::span<const Metric> metrics() const;

  // Ends the step: every gradient reduced in place (averaged unless
  // options.average is false). Call after backward returned, before the
  // optimizer step. Throws Timeout past the deadline, InvalidArgument naming
  // a gradient that was never marked ready (on every rank), and the
  // communicator's errors.
  void wait(Deadline deadline);

  // Blocks until the bucket holding gradient `id` has been reduced in the
  // open step, so the optimizer can update that parameter while later buckets
  // are still in flight, and the next forward can start before the last of
  // them lands (P3, ByteScheduler). Call after backward returned, then wait()
  // before the next backward; a step that does not communicate returns at
  // once. The time blocked here counts as the step's exposed communication.
  void wait_gradient(int id, Deadline deadline);

  // Zero every gradient (after the optimizer step, instead of the framework's zero_grad).
  void zero_gradients();

  const StepStats& last_step() const;
  const FusionSettings& settings() const;
  // Bucket boundaries in force: gradient ids per bucket, launch order.
  std::vector<std::vector<int>> buckets() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem::fusion
