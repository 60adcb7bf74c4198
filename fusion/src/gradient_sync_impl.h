// The gradient-sync engine's state, shared by its three parts: gradient_sync.cc
// (set-up, layout, the public API), engine_thread.cc (the engine thread) and
// caller_side.cc (marking, waiting, ending a step). Terms as in gradient_sync.h; here also:
//  - tail: a few floats after the f32 arena (or alone) carrying the step's
//    metrics (sum, count per slot) and one "unused gradient" flag per rank.
//    It rides on the step's last bucket when that bucket is f32 and
//    uncompressed (contiguous with it), so metrics and the unused check cost
//    no extra collective; otherwise it is reduced on its own after the buckets.
//  - pending[b]: gradients of bucket b not yet ready this step. The hook that
//    takes it to zero pokes the engine; the engine launches buckets in order.
//  - armed: the caller arms the engine for each communicating step; the engine
//    reports each bucket reduced and the step done (or its error) through a
//    mutex and condition variable, which only the caller's waits touch.
//  - closed: the caller's first wait of the step (wait_gradient or wait) ends
//    the marking: gradients not marked by then are claimed as unused.
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "autotune.h"
#include "layout.h"
#include "tandem/fusion/gradient_sync.h"
#include "timeline.h"

namespace tandem::fusion {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
inline double us(int64_t ns) { return double(ns) / 1e3; }
inline double seconds(int64_t ns) { return double(ns) / 1e9; }

// A futex on a 32-bit atomic: sleep while it still holds `expected`, at most `timeout`.
inline void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{time_t(timeout.count() / 1000000000), long(timeout.count() % 1000000000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}
inline void futex_wake(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

enum GradState : uint8_t { kPending = 0, kReady = 1, kUnused = 2 };

inline std::string describe(const TensorSpec& t) {
  return "'" + t.name + "' (" + std::string(to_string(t.dtype)) + " x " + std::to_string(t.count) + ")";
}

struct GradientSync::Impl {
  std::shared_ptr<Collectives> coll;
  GradientSyncOptions opt;
  int rank = 0, size = 1;

  std::vector<TensorSpec> tensors;
  std::vector<void*> external;  // per id; null for gradients in the arena
  bool finalized = false;

  ArenaLayout layout;
  std::vector<std::byte*> arena;
  float* tail = nullptr;
  size_t tail_floats = 0;
  bool tail_rides = false;                   // the tail extends the last bucket's range (launched last)
  bool tail_owned = false;                   // allocated on its own
  std::vector<std::vector<float>> residual;  // per arena: error feedback of compressed f32 buckets

  FusionSettings settings;
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;
  std::vector<int> order;                            // buckets in launch order
  std::vector<size_t> position;                      // per bucket: its place in `order`
  std::unique_ptr<std::atomic<int>[]> pending;       // per bucket (at most one per gradient)
  std::unique_ptr<std::atomic<uint8_t>[]> state;     // per gradient
  std::unique_ptr<std::atomic<int64_t>[]> ready_at;  // per gradient, ns

  // Hook-side errors, raised by wait().
  std::atomic<int64_t> unknown_id{INT64_MIN};
  std::atomic<int> marked_twice{-1};
  std::atomic<int> marked_late{-1};

  // Engine wake-ups.
  std::atomic<uint32_t> wake{0};
  std::atomic<bool> sleeping{false};
  std::atomic<bool> closing{false};     // wait() entered this step
  std::atomic<bool> metrics_in{false};  // report_metrics() called this step
  std::atomic<uint64_t> armed{0};       // communicating steps armed so far
  std::atomic<bool> stop{false};

  std::mutex mu;
  std::condition_variable cv;
  uint64_t done = 0;           // communicating steps the engine finished
  size_t reduced = 0;          // buckets of the armed step reduced so far, in launch order
  std::exception_ptr failure;  // sticky
  std::thread engine;

  struct Timing {
    int64_t ready = 0, start = 0, end = 0;
  };
  std::vector<Timing> timings;  // per bucket of the current step, written by the engine
  Timing tail_timing;
  uint64_t wire_bytes = 0;
  uint64_t fallbacks = 0;    // compressed buckets re-sent in f32 this step
  double cast_seconds = 0;   // this step's compression casts
  double saved_seconds = 0;  // estimated: see StepStats::compression_saved

  uint64_t step = 0, communicated = 0;
  int64_t step_begin = 0;
  bool closed = false;               // this step's marking ended (caller side)
  int64_t early_exposed = 0;         // ns blocked in wait_gradient this step
  int first_unused = -1;             // this rank's first unused gradient of the step
  std::vector<bool> used_in_window;  // marked ready in some step since the last communicating one
  StepStats last;
  std::vector<Metric> metrics;

  std::unique_ptr<Timeline> timeline;
  std::unique_ptr<Autotuner> tuner;  // rank 0 only
  std::vector<double> sample;        // exposed seconds of the trial's steps
  std::vector<double> sample_steps;  // their step times (wait() return to wait() return)

  Impl(std::shared_ptr<Collectives> c, GradientSyncOptions o);
  static void check_settings(const FusionSettings& s);
  ~Impl();

  int post_divisor() const {
    const int k = opt.average_aggregated_gradients ? opt.aggregation_frequency : 1;
    return opt.average && k == 1 ? 1 : (opt.average ? size : 1) * k;
  }
  ReduceOp op() const { return post_divisor() == 1 && opt.average ? ReduceOp::avg : ReduceOp::sum; }
  size_t flag_base() const { return size_t(opt.metric_slots) * 2; }
  bool communicates(uint64_t step_no) const { return step_no % uint64_t(opt.aggregation_frequency) == 0; }

  size_t bytes_of(int id) const { return tensors[size_t(id)].count * dtype_size(tensors[size_t(id)].dtype); }
  std::byte* arena_ptr(int id) const {
    const Placement& p = layout.placement[size_t(id)];
    return arena[size_t(p.arena)] + p.offset;
  }
  void* storage(int id) const { return external[size_t(id)] ? external[size_t(id)] : arena_ptr(id); }

  void poke() {
    wake.fetch_add(1);
    if (sleeping.load()) futex_wake(wake);
  }

  // The engine sleeps until ready() (or stop), waking at least every cycle_time.
  template <class Ready>
  bool engine_wait(Ready ready) {
    const auto period =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::max(opt.cycle_time, std::chrono::milliseconds(1)));
    for (;;) {
      const uint32_t seen = wake.load();
      if (stop.load()) return false;
      if (ready()) return true;
      sleeping.store(true);
      if (!ready() && !stop.load()) futex_wait(wake, seen, period);
      sleeping.store(false);
    }
  }

  // ---- layout ----

  void cut();
  bool compressed(const Bucket& b) const { return opt.compression && b.dtype == DataType::f32; }
  void reset_pending();
  void check_registrations(Deadline deadline);
  void finalize(Deadline deadline);
  void arm();

  // ---- engine thread ----

  void engine_main();
  bool gate_open() const { return opt.metric_slots == 0 || metrics_in.load() || closing.load(); }
  void run_step();
  void run_bucket(size_t b, bool with_tail);

  // ---- caller side ----

  void mark_ready(int id) noexcept;
  void report_metrics(std::span<const Metric> m);
  void claim_unused(bool comm_step);
  void close_marking(bool comm_step);
  template <class Until>
  void await_engine(Deadline deadline, uint64_t step_no, const std::string& what, Until until);
  void rethrow_failure();
  void wait_gradient(int id, Deadline deadline);
  void wait(Deadline deadline);
  std::string pending_report() const;
  void finish_step(uint64_t step_no, bool comm_step, int64_t entered, int64_t left);
  std::string decode_tail(uint64_t step_no);
  std::string take_hook_error(uint64_t step_no);
  void write_timeline(const StepStats& s, int64_t entered, int64_t left);
  void autotune(const StepStats& s);
  void zero_gradients();
};

}  // namespace tandem::fusion
